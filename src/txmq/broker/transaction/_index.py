"""The transaction state index: every half message's state, check count and next check time.

RocketMQ keeps no per-transaction state (docs/rocketmq.md §1.4): it re-scans the op queue and
re-puts whole half messages to count checks, which causes #8158 (double commit), #8311/#9320 (immunity
eating the check budget) and #1517/#1543 (disks filled by re-puts). txmq keeps this index instead; it
is rebuilt on start from its last snapshot plus the half topic, the op topic and committed real
messages (which carry ``TRAN_PREPARED_QUEUE_OFFSET``) stored after it, so a commit is recognised
even if its op record was torn off.

Pending transactions live in memory; decided outcomes (needed to answer a late duplicate end with
the recorded outcome, I4) live in a :class:`~txmq.store.StateTable` of 1 byte per half offset
(RocketMQ 3.x's ``tranStateTable`` in spirit), so neither memory nor restart time grows with the
settled history.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator, MutableMapping
from enum import StrEnum

import msgspec

from txmq.store import StateTable

__all__ = ["HalfEntry", "LatencyHistogram", "Outcome", "SettledOutcomes", "TransactionIndex"]


class Outcome(StrEnum):
    """A transaction's state. PENDING until decided; the first decision is final (I4)."""

    PENDING = "PENDING"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    DISCARD = "DISCARD"


class HalfEntry(msgspec.Struct, kw_only=True):
    """A pending half message.

    Attributes:
        half_offset: queue offset in ``RMQ_SYS_TRANS_HALF_TOPIC`` (the transaction's identity).
        commit_log_offset: where the half message is stored.
        first_check_ms: earliest check time: born + max(transaction timeout, immunity).
        next_check_ms: when the checker looks at it next (ms since the epoch).
        check_count: check-backs sent so far.
    """

    half_offset: int
    commit_log_offset: int
    producer_group: str
    sender_client_id: str
    msg_id: str
    real_topic: str
    keys: str
    born_ms: int
    first_check_ms: int
    next_check_ms: int
    check_count: int = 0
    sink_batch: str = ""
    """For a Spark sink's half message, ``"<sink id>/<batch id>"`` (settled by batch commit)."""
    sink_task: str = ""
    """For a Spark sink's half message, ``"<partition>.<attempt>"``."""


_CODE = {Outcome.COMMIT: 1, Outcome.ROLLBACK: 2, Outcome.DISCARD: 3}
_OUTCOME = {v: k for k, v in _CODE.items()}


class SettledOutcomes(MutableMapping[int, Outcome]):
    """Decided outcomes by half offset, one byte each in a state table (0: none, 1 COMMIT,
    2 ROLLBACK, 3 DISCARD; any other byte reads as none). Look-ups are O(1) (a ``pread`` for old
    offsets); iterating reads the whole table (tools and tests only).

    Attributes:
        counts: decided transactions per outcome (restored from the index snapshot).
    """

    def __init__(self, table: StateTable) -> None:
        self.table = table
        self.counts = dict.fromkeys(_CODE, 0)

    def __getitem__(self, half_offset: int) -> Outcome:
        v = self.table.get(half_offset) if half_offset >= 0 else 0
        if v not in _OUTCOME:
            raise KeyError(half_offset)
        return _OUTCOME[v]

    def __contains__(self, half_offset: object) -> bool:
        return isinstance(half_offset, int) and half_offset >= 0 and \
            self.table.get(half_offset) in _OUTCOME

    def __setitem__(self, half_offset: int, outcome: Outcome) -> None:
        old = self.table.get(half_offset)
        if old in _OUTCOME:
            self.counts[_OUTCOME[old]] -= 1
        self.table.set(half_offset, _CODE[outcome])
        self.counts[outcome] += 1

    def __delitem__(self, half_offset: int) -> None:
        outcome = self[half_offset]
        self.counts[outcome] -= 1
        self.table.set(half_offset, 0)

    def __iter__(self) -> Iterator[int]:
        return iter([k for k, v in self.table.items() if v in _OUTCOME])

    def __len__(self) -> int:
        return sum(self.counts.values())

    def trim(self, below: int) -> int:
        """Forget the outcomes of half offsets below ``below`` (retention deleted those halves);
        they read as none from now on. Counts are not touched (decided since the history began).
        Returns how many offsets the bound moved over."""
        return self.table.trim(below)

    def clear_stale(self, half_offset: int) -> None:
        """Forget a byte left by a settlement the log no longer holds (recovery re-adds the half
        as pending: the log, not the table, decides). Counts are not touched."""
        if self.table.get(half_offset):
            self.table.set(half_offset, 0)

    def reset(self) -> None:
        """Forget every outcome (before a full rebuild from the log)."""
        self.table.reset()
        self.counts = dict.fromkeys(_CODE, 0)

    def sync(self) -> None:
        """Make the outcomes recorded so far durable. Raises OSError."""
        self.table.sync()


class TransactionIndex:
    """Pending half messages (with a check schedule) and decided outcomes.

    Args:
        table: where decided outcomes live (the store's state table); in memory if None.
    """

    def __init__(self, table: StateTable | None = None) -> None:
        self.pending: dict[int, HalfEntry] = {}
        self.settled = SettledOutcomes(table if table is not None else StateTable())
        self.version = 0
        """Bumped by every add and settle (the snapshot is saved only when it moved)."""
        self.by_msg_id: dict[str, int] = {}
        """Message id → half offset of pending and discarded transactions (operator look-ups)."""
        self.discarded: dict[int, int] = {}
        """Half offset → commit log offset of its copy in TRANS_CHECK_MAX_TIME_TOPIC."""
        self.discarded_ids: dict[str, int] = {}
        """Message id → half offset of discarded transactions (the part of ``by_msg_id`` the
        snapshot keeps; pending ones come with their entries)."""
        self.resumed: set[int] = set()
        """Half offsets of discarded transactions an operator resumed (each resumes once)."""
        self._heap: list[tuple[int, int]] = []

    def add(self, entry: HalfEntry) -> None:
        """Register a new half message (or one found by recovery)."""
        assert entry.half_offset not in self.pending
        self.settled.clear_stale(entry.half_offset)
        self.version += 1
        self.pending[entry.half_offset] = entry
        if entry.msg_id:
            self.by_msg_id[entry.msg_id] = entry.half_offset
        heapq.heappush(self._heap, (entry.next_check_ms, entry.half_offset))

    def outcome(self, half_offset: int) -> Outcome | None:
        """The state of a transaction, or None if no such half message is known."""
        if half_offset in self.pending:
            return Outcome.PENDING
        return self.settled.get(half_offset)

    def settle(self, half_offset: int, outcome: Outcome) -> bool:
        """Record a decision. Returns False (and changes nothing) if one was recorded already."""
        assert outcome is not Outcome.PENDING
        entry = self.pending.pop(half_offset, None)
        if entry is None and half_offset in self.settled:
            return False
        self.version += 1
        self.settled[half_offset] = outcome
        if entry is not None and entry.msg_id and outcome is not Outcome.DISCARD:
            self.by_msg_id.pop(entry.msg_id, None)
        return True

    def discard(self, half_offset: int, commit_log_offset: int, msg_id: str) -> None:
        """Record where a discarded half's copy is stored (:meth:`settle` records the outcome)."""
        self.discarded[half_offset] = commit_log_offset
        if msg_id:
            self.by_msg_id[msg_id] = half_offset
            self.discarded_ids[msg_id] = half_offset

    def trim(self, half_low: int, log_low: int) -> tuple[int, int]:
        """Forget what retention made moot: outcomes of half offsets below ``half_low`` (the half
        queue's first stored offset) and discarded transactions whose copy lies below commit log
        offset ``log_low`` (nothing is left to resume), with their ids and resume marks. Pending
        transactions are never dropped. Returns (offsets the outcome bound moved over,
        discarded transactions forgotten); O(discarded)."""
        moved = self.settled.trim(half_low)
        gone = {h for h, clo in self.discarded.items() if clo < log_low}
        if not gone:
            return moved, 0
        for h in gone:
            del self.discarded[h]
            self.resumed.discard(h)
        for m in [m for m, h in self.discarded_ids.items() if h in gone]:
            del self.discarded_ids[m]
            if self.by_msg_id.get(m) in gone:
                del self.by_msg_id[m]
        self.version += 1
        return moved, len(gone)

    def reschedule(self, entry: HalfEntry, at_ms: int) -> None:
        entry.next_check_ms = at_ms
        heapq.heappush(self._heap, (at_ms, entry.half_offset))

    def due(self, now_ms: int, limit: int) -> list[HalfEntry]:
        """Pending entries whose check time has come, oldest schedule first, at most ``limit``.

        Cost is O(k log n) for k due entries: settled history is never scanned.
        """
        out: list[HalfEntry] = []
        while self._heap and len(out) < limit and self._heap[0][0] <= now_ms:
            at, off = heapq.heappop(self._heap)
            e = self.pending.get(off)
            if e is not None and e.next_check_ms == at:
                out.append(e)
        return out

    def counts(self) -> dict[str, int]:
        """Number of transactions per state."""
        out = {o.value: self.settled.counts.get(o, 0) for o in Outcome}
        out[Outcome.PENDING.value] = len(self.pending)
        return out

    def parked(self) -> int:
        """Discarded transactions that no operator has resumed yet, and that can still be
        resumed (their copy is stored: :meth:`trim`)."""
        return sum(1 for h in self.discarded if h not in self.resumed)


class LatencyHistogram:
    """Cumulative-bucket histogram in seconds (Prometheus style), bounded memory.

    Buckets follow RocketMQ's ``rocketmq_finish_message_latency`` spirit (RIP-46): from 5 ms to
    1 h, since a transaction may wait for check-backs.
    """

    BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                 900.0, 3600.0)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BUCKETS_S) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.BUCKETS_S, seconds)] += 1  # the first bound >= seconds
        self.total += seconds
        self.n += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(upper bound, count ≤ bound), …, ("+Inf", n)]``."""
        out, acc = [], 0
        for bound, c in zip((*map(str, self.BUCKETS_S), "+Inf"), self.counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out
