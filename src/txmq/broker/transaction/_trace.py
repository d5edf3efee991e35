"""Transactions' lives: what the broker did with each half message, in memory and bounded, sans-IO.

The :class:`~txmq.broker.transaction.TransactionService` tells :class:`TransactionTraces` when a
half message is stored, when it sends a check-back (to which producer), when an end request
answers without settling or answers a check-back (what, by whom, after how long), and when the
transaction is settled (outcome, decided by whom). Each transaction's record is a
:class:`~txmq.protocol.TransactionLife` (the wire type of GET_TRANSACTION_TRACE, so a query
encodes what is kept, unconverted).

Bounds (docs/tracing.md, "The broker's leg"): the lives of at most ``max_lives`` pending
transactions (a half stored while that many are pending is not recorded, and counted in
``stats["untraced"]``) and of the ``max_lives`` most recently settled ones (a ring: each
settlement overwrites the oldest), at most :data:`TRANSACTION_TRACE_STEPS_MAX` steps each.

What survives a restart: nothing of this; it is memory only. What the log keeps is the half
message itself (producer group, client id, born host, store time, ``traceparent``) and the op
record of the end (``TXMQ_OUTCOME``, ``TXMQ_DECIDED_BY``, an operator's name and reason), which the
console reads when the life is gone. A transaction pending across a restart gets a new life at its
next check-back (``stored_ms`` 0: the half's store time is not known without reading it).

An optional :class:`TraceListener` (the broker's OTLP export, ``txmq.broker._otlp``) is told of
each stored half, each closed check-back and each end of the transactions whose half carried a
``traceparent``; what it raises is logged and counted (``stats["listener_errors"]``), never
passed on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from txmq.protocol import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRACEPARENT,
    PROPERTY_TRACESTATE,
    PROPERTY_TXMQ_SENDER_CLIENT_ID,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TransactionLife,
    TransactionStep,
    trace_id_of,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from txmq.broker.transaction._index import HalfEntry

__all__ = ["TRANSACTION_TRACE_STEPS_MAX", "TraceListener", "TransactionTraces"]

log = logging.getLogger("txmq.broker.transaction")

TRANSACTION_TRACE_STEPS_MAX = 64
"""Steps kept per transaction (txmq): a check-back and its answer for each of RocketMQ's
``transactionCheckMax`` (15) check-backs, twice over; later check-backs and answers are not
recorded, the end always is."""

_ANSWERS = {TRANSACTION_COMMIT_TYPE: "COMMIT", TRANSACTION_ROLLBACK_TYPE: "ROLLBACK"}
"""END_TRANSACTION ``commitOrRollback`` → answer; anything else (``TRANSACTION_NOT_TYPE``) is UNKNOWN."""


class TraceListener(Protocol):
    """Told of the life of each transaction whose half carried a ``traceparent``, as it happens
    (on the broker's event loop: it must not block). Times are ms since the epoch."""

    def half_stored(self, life: TransactionLife) -> None:
        """The half message was stored at ``life.stored_ms``."""

    def check_closed(self, life: TransactionLife, check: TransactionStep,
                     answer: TransactionStep | None, closed_ms: int) -> None:
        """Check-back ``check`` got ``answer``, or none: ``answer`` None when the next check-back
        was sent, or the transaction ended, first (``closed_ms``: when it stopped waiting)."""

    def ended(self, life: TransactionLife, end: TransactionStep) -> None:
        """The transaction was settled (``end.kind`` is ``end``)."""


class TransactionTraces:
    """The lives of the pending and the most recently settled transactions.

    Args:
        max_lives: the bound of each kind (BrokerConfig ``transaction_trace_max``); 0 records
            nothing (:attr:`enabled` False; the service then does not call in at all).
        check_answer_timeout_ms: a check-back unanswered this long is closed at this age
            (``limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS``).
        listener: see :class:`TraceListener`.

    Attributes:
        stats: ``recorded`` (lives begun), ``untraced`` (halves not recorded: the pending bound),
            ``evicted`` (settled lives dropped by the ring), ``listener_errors``.
    """

    def __init__(self, max_lives: int, check_answer_timeout_ms: int,
                 listener: TraceListener | None = None) -> None:
        self.max_lives = max(0, max_lives)
        self.enabled = self.max_lives > 0
        self.listener = listener
        self._timeout_ms = check_answer_timeout_ms
        self._lives: dict[int, TransactionLife] = {}
        """Half offset → life, pending and settled, in the order they began."""
        self._ring = [-1] * self.max_lives
        """Half offsets of settled lives; a settlement overwrites the oldest."""
        self._next = 0
        self._pending = 0
        self.stats = {"recorded": 0, "untraced": 0, "evicted": 0, "listener_errors": 0}

    def __len__(self) -> int:
        return len(self._lives)

    @property
    def pending(self) -> int:
        """How many of the lives kept are of pending transactions."""
        return self._pending

    # -- recording (called by the TransactionService) ---------------------------------------------
    def half(self, entry: HalfEntry, props: Mapping[str, str], stored_ms: int, address: str) -> None:
        """A half message was stored (``props``: its properties; ``address``: the sender's
        ``ip:port``, the record's born host)."""
        if self._pending >= self.max_lives:
            self.stats["untraced"] += 1
            return
        life = TransactionLife(
            half_offset=entry.half_offset, commit_log_offset=entry.commit_log_offset,
            msg_id=entry.msg_id, topic=entry.real_topic, producer_group=entry.producer_group,
            client_id=entry.sender_client_id, address=address, born_ms=entry.born_ms,
            stored_ms=stored_ms, traceparent=props.get(PROPERTY_TRACEPARENT, ""),
            tracestate=props.get(PROPERTY_TRACESTATE, ""))
        self._lives[entry.half_offset] = life  # (_begin, inlined: once per transaction)
        self._pending += 1
        self.stats["recorded"] += 1
        if self.listener is not None and life.traceparent:
            self._tell(self.listener.half_stored, life)

    def _begin(self, life: TransactionLife) -> None:
        self._lives[life.half_offset] = life
        self._pending += 1
        self.stats["recorded"] += 1

    def check_sent(self, entry: HalfEntry, props: Mapping[str, str], born_host: str, now_ms: int,
                   client_id: str, address: str) -> None:
        """Check-back number ``entry.check_count`` was sent to producer ``client_id`` at
        ``address``. A transaction without a life (stored before the broker's start) gets one
        here, from its half's properties ``props`` and ``born_host``, if the bound allows."""
        life = self._lives.get(entry.half_offset)
        if life is None:
            if self._pending >= self.max_lives:
                return
            life = TransactionLife(
                half_offset=entry.half_offset, commit_log_offset=entry.commit_log_offset,
                msg_id=entry.msg_id, topic=entry.real_topic, producer_group=entry.producer_group,
                client_id=props.get(PROPERTY_TXMQ_SENDER_CLIENT_ID, "") or entry.sender_client_id,
                address=born_host, born_ms=entry.born_ms,
                traceparent=props.get(PROPERTY_TRACEPARENT, ""),
                tracestate=props.get(PROPERTY_TRACESTATE, ""))
            if not life.producer_group:
                life.producer_group = props.get(PROPERTY_PRODUCER_GROUP, "")
            self._begin(life)
        self._close_open_check(life, now_ms)
        self._add(life, TransactionStep(kind="check-back", time_ms=now_ms,
                                        check_count=entry.check_count, client_id=client_id,
                                        address=address))

    def answered(self, half_offset: int, commit_or_rollback: int, from_check: bool, now_ms: int,
                 client_id: str, address: str) -> None:
        """An end request from ``client_id`` at ``address`` answered ``commit_or_rollback``
        (END_TRANSACTION's ``commitOrRollback``) for a pending transaction: a check-back's
        answer (``from_check``), or the producer's own UNKNOWN."""
        life = self._lives.get(half_offset)
        if life is None:
            return
        answer = _ANSWERS.get(commit_or_rollback, "UNKNOWN")
        if not from_check:
            self._add(life, TransactionStep(kind="answer", time_ms=now_ms, answer=answer,
                                            client_id=client_id, address=address))
            return
        check = _open_check(life)
        last = check or _last_check(life)
        step = TransactionStep(kind="answer", time_ms=now_ms, answer=answer, client_id=client_id,
                               address=address, check_count=last.check_count if last else 0,
                               sent_ms=last.time_ms if last else 0)
        self._add(life, step)
        if check is not None and self.listener is not None and life.traceparent:
            self._tell(self.listener.check_closed, life, check, step, now_ms)

    def ended(self, entry: HalfEntry, outcome: str, now_ms: int, decided_by: str,
              client_id: str = "", address: str = "", operator: str = "", reason: str = "") -> None:
        """The transaction was settled: ``outcome`` COMMIT, ROLLBACK or DISCARD, ``decided_by``
        producer, check-back or operator, through a request of ``client_id`` at ``address``
        (none for the checker's discards) or by ``operator``, with ``reason``."""
        life = self._lives.get(entry.half_offset)
        if life is None:
            return
        if self.listener is not None:
            self._close_open_check(life, now_ms)
        end = TransactionStep(kind="end", time_ms=now_ms, outcome=outcome, decided_by=decided_by,
                              client_id=client_id, address=address, operator=operator,
                              reason=reason)
        life.steps.append(end)  # (the end is kept past the step bound)
        self._pending -= 1
        # the ring: this life takes the place of the oldest settled one
        i = self._next
        old = self._ring[i]
        if old >= 0 and self._lives.pop(old, None) is not None:
            self.stats["evicted"] += 1
        self._ring[i] = entry.half_offset
        self._next = i + 1 if i + 1 < self.max_lives else 0
        if self.listener is not None and life.traceparent:
            self._tell(self.listener.ended, life, end)

    def drop_pending(self) -> int:
        """Forget the lives of pending transactions (the service's index is rebuilt, e.g. when
        the broker becomes master: its transactions get new lives at their next check-back).
        Returns how many were dropped; O(lives)."""
        gone = [off for off, life in self._lives.items() if not _has_ended(life)]
        for off in gone:
            del self._lives[off]
        self._pending = 0
        return len(gone)

    def _add(self, life: TransactionLife, step: TransactionStep) -> None:
        if len(life.steps) < TRANSACTION_TRACE_STEPS_MAX:
            life.steps.append(step)

    def _close_open_check(self, life: TransactionLife, now_ms: int) -> None:
        """Tell the listener that the life's unanswered check-back will not be answered."""
        if self.listener is None or not life.traceparent:
            return
        check = _open_check(life)
        if check is not None:
            self._tell(self.listener.check_closed, life, check, None,
                       min(now_ms, check.time_ms + self._timeout_ms))

    def _tell(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # the listener must never break the broker
            self.stats["listener_errors"] += 1
            if self.stats["listener_errors"] == 1 or self.stats["listener_errors"] % 1000 == 0:
                log.exception("transaction trace listener failed (%d failures so far)",
                              self.stats["listener_errors"])

    # -- queries ------------------------------------------------------------------------------------
    def get(self, half_offset: int) -> TransactionLife | None:
        """The life of the transaction of half offset ``half_offset``, if kept."""
        return self._lives.get(half_offset)

    def newest(self) -> Iterator[TransactionLife]:
        """Every life kept, the most recently begun first."""
        return reversed(self._lives.values())

    def by_msg_id(self, msg_id: str, limit: int) -> list[TransactionLife]:
        """Lives of message id ``msg_id`` (a resumed transaction has one per half), newest
        first, at most ``limit``; O(lives)."""
        out = []
        for life in self.newest():
            if life.msg_id == msg_id:
                out.append(life)
                if len(out) >= limit:
                    break
        return out

    def by_trace_id(self, trace_id: str, limit: int) -> list[TransactionLife]:
        """Lives whose ``traceparent`` carries W3C trace id ``trace_id`` (32 lowercase hex
        digits), newest first, at most ``limit``; O(lives)."""
        out = []
        for life in self.newest():
            tp = life.traceparent
            if tp and tp[3:35] == trace_id and trace_id_of(tp) == trace_id:
                out.append(life)
                if len(out) >= limit:
                    break
        return out


def _open_check(life: TransactionLife) -> TransactionStep | None:
    """The life's last check-back if nothing answered it and the transaction has not ended."""
    for step in reversed(life.steps):
        if step.kind == "check-back":
            return step
        if step.kind == "end" or (step.kind == "answer" and step.check_count > 0):
            return None
    return None


def _last_check(life: TransactionLife) -> TransactionStep | None:
    return next((s for s in reversed(life.steps) if s.kind == "check-back"), None)


def _has_ended(life: TransactionLife) -> bool:
    return any(s.kind == "end" for s in life.steps)
