"""Sans-IO cores of replication (issue #25): what a slave appends, what a master has acknowledged,
and which SYNC_MASTER replies may go out. No sockets, no clock: time comes in as ``now_ms``.

RocketMQ's classes they follow: ``DefaultHAClient`` (the slave), ``HAConnection`` /
``GroupTransferService`` (the master's acknowledgements), ``CommitLog.handleHA`` (the SYNC_MASTER
wait).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from txmq import limits
from txmq.errors import HaProtocolError
from txmq.protocol import (
    HaHeartbeat,
    HaTransfer,
    TransferDecoder,
    encode_auto_report,
    encode_report,
)

__all__ = ["AckTable", "ReplicaWait", "SlaveCore"]

T = TypeVar("T")

_RECORD_SIZE_MIN = 8
"""A record's total size field and magic code: the least a record can be (the store checks the
real minimum when it appends)."""


class SlaveCore:
    """One HA connection of a slave whose commit log ends at ``end``.

    :meth:`hello` is the first report. :meth:`feed` takes the master's bytes and returns the
    ``(offset, bytes)`` runs of whole records to append, in order; bytes of a record not yet
    complete wait here (a transfer frame need not end on a record boundary). After appending, the
    slave reports its new end with :meth:`report`.

    ``last_epoch`` (controller mode, the AutoSwitch frames): the newest epoch of the slave's
    epoch file (0 if none).

    Raises:
        HaProtocolError: (from :meth:`feed`) a frame breaks the protocol, or a record's declared
            size is out of ``[8, limits.HA_RECORD_SIZE_MAX_BYTES]``, or (controller mode) is of an
            older epoch than the slave's newest.
    """

    def __init__(self, end: int, last_epoch: int | None = None) -> None:
        self.decoder = TransferDecoder(end, auto=last_epoch is not None)
        self._pending = bytearray()
        self._pending_at = end
        self.last_frame_offset = end
        self._encode = encode_report if last_epoch is None else encode_auto_report
        self.last_epoch = -1 if last_epoch is None else last_epoch
        """Controller mode: the newest epoch this slave holds or received (None: plain)."""
        self.new_epochs: list[tuple[int, int]] = []
        """Controller mode: ``(epoch, start offset)`` of epochs newer than :attr:`last_epoch`
        the last :meth:`feed` met, in order: append them to the epoch file before its runs."""
        self.confirm = -1
        """Controller mode: the master's last confirm offset."""

    def hello(self) -> bytes:
        return self._encode(self._pending_at)

    def report(self, end: int) -> bytes:
        """The report of a slave whose commit log now ends at ``end`` (8 bytes; 12 in
        controller mode)."""
        return self._encode(end)

    def _epoch(self, ev: HaTransfer | HaHeartbeat) -> None:
        """Controller mode: a frame of an epoch older than the newest held is refused; a newer
        one is recorded (RocketMQ ``AutoSwitchHAClient``)."""
        if ev.epoch < 0:
            return
        if ev.epoch < self.last_epoch:
            raise HaProtocolError(f"HA frame of master epoch {ev.epoch}, older than this slave's "
                                  f"{self.last_epoch}")
        if ev.epoch > self.last_epoch and isinstance(ev, HaTransfer):
            self.new_epochs.append((ev.epoch, ev.epoch_start))
            self.last_epoch = ev.epoch
        self.confirm = max(self.confirm, ev.confirm)

    def feed(self, data: bytes | memoryview) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        self.new_epochs = []
        for ev in self.decoder.feed(data):
            self.last_frame_offset = ev.offset
            self._epoch(ev)
            if isinstance(ev, HaHeartbeat):
                continue
            assert isinstance(ev, HaTransfer)
            self._pending += ev.data
            cut = self._whole_records()
            if cut:
                out.append((self._pending_at, bytes(self._pending[:cut])))
                del self._pending[:cut]
                self._pending_at += cut
        return out

    def _whole_records(self) -> int:
        """Length of the prefix of the pending bytes made of whole records."""
        pos, buf = 0, self._pending
        while len(buf) - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
            if not _RECORD_SIZE_MIN <= size <= limits.HA_RECORD_SIZE_MAX_BYTES:
                raise HaProtocolError(f"record at commit log offset {self._pending_at + pos} "
                                      f"declares size {size}")
            if len(buf) - pos < size:
                break
            pos += size
        return pos


HA_CATCH_UP_MARKS_MAX = 1024
"""Transfers per slave an :class:`AckTable` remembers (master end, time) to date a report's
catch-up (txmq; RocketMQ keeps the last one): a report older than all of them dates nothing."""


class AckTable:
    """The master's view of its slaves: the offset each connected one acknowledged (its last
    report), keyed by connection id, and when each last caught up with the master.

    Catching up follows RocketMQ 5 ``AutoSwitchHAConnection``: each transfer records the
    master's end then (``lastMasterMaxOffset``) and the time (``lastTransferTimeMs``); a report
    at or past that end moves the slave's catch-up time (``lastCaughtUpTimeMs``) to that transfer
    time. txmq keeps the last ``HA_CATCH_UP_MARKS_MAX`` transfers, not only the last one, so a
    slave whose report trails the next transfer by a frame (a steady write load) still catches up
    as of the transfer it covers. A report at or past the master's end now counts at once. A
    slave that has not caught up since it connected is not caught up (RocketMQ expands the
    SyncStateSet only with a slave whose ack reached the confirm offset,
    ``AutoSwitchHAService.maybeExpandInSyncStateSet``)."""

    def __init__(self) -> None:
        self.acks: dict[int, int] = {}
        self.caught_up_ms: dict[int, int] = {}
        """Link → when its report last reached the master's end (absent: not since it connected)."""
        self.connected_ms: dict[int, int] = {}
        """Link → when its first report arrived."""
        self.sent: dict[int, deque[tuple[int, int]]] = {}
        """Link → (the master's end, when) at its recent transfers to it, oldest first."""

    def transferred(self, link: int, end: int, now_ms: int) -> None:
        """The master sent ``link`` a frame (data or heartbeat) while its log ended at ``end``."""
        marks = self.sent.setdefault(link, deque(maxlen=HA_CATCH_UP_MARKS_MAX))
        if marks and marks[-1][0] == end:  # (a heartbeat, or nothing new: the later time)
            marks[-1] = (end, now_ms)
        else:
            marks.append((end, now_ms))

    def report(self, link: int, offset: int, end: int = -1, now_ms: int = 0) -> None:
        """The slave on ``link`` acknowledged ``offset`` while the master's log ended at ``end``."""
        self.connected_ms.setdefault(link, now_ms)
        marks = self.sent.get(link)
        covered = None
        while marks and marks[0][0] <= offset:
            covered = marks.popleft()[1]
        if offset >= end:
            self.caught_up_ms[link] = now_ms
        elif covered is not None:
            self.caught_up_ms[link] = max(self.caught_up_ms.get(link, covered), covered)
        self.acks[link] = offset

    def gone(self, link: int) -> None:
        for table in (self.acks, self.caught_up_ms, self.connected_ms, self.sent):
            table.pop(link, None)

    def clear(self) -> None:
        """Forget every slave (the broker stopped being a master)."""
        for table in (self.acks, self.caught_up_ms, self.connected_ms, self.sent):
            table.clear()

    def lag_ms(self, link: int, end: int, now_ms: int) -> int:
        """How long the slave on ``link`` has lacked bytes of a log ending at ``end``: 0 when its
        last report reached ``end``, else the time since it last caught up (or connected)."""
        if self.acks.get(link, -1) >= end:
            return 0
        since = self.caught_up_ms.get(link, self.connected_ms.get(link, now_ms))
        return max(0, now_ms - since)

    def caught_up(self, link: int, end: int, now_ms: int, max_lag_ms: int) -> bool:
        """Whether the slave on ``link`` belongs in the SyncStateSet: its last report reached
        ``end``, or it caught up within ``max_lag_ms`` of ``now_ms`` (``haMaxTimeSlaveNotCatchup``;
        a slave that never caught up since it connected is out however recent its connection)."""
        if self.acks.get(link, -1) >= end:
            return True
        last = self.caught_up_ms.get(link)
        return last is not None and now_ms - last < max_lag_ms

    def acked_by(self, count: int) -> int:
        """The highest offset that at least ``count`` slaves acknowledged (-1 if fewer connected;
        every offset when ``count`` is 0)."""
        if count <= 0:
            return 2**63 - 1
        ranked = sorted(self.acks.values(), reverse=True)
        return ranked[count - 1] if len(ranked) >= count else -1

    def in_sync(self, end: int, max_gap: int) -> bool:
        """Some slave is within ``max_gap`` bytes of ``end`` (RocketMQ 4.9.7 ``isSlaveOK``:
        ``wroteEnd - push2SlaveMaxOffset < haMaxGapNotInSync``)."""
        return any(end - a < max_gap for a in self.acks.values())


class ReplicaWait(Generic[T]):
    """SYNC_MASTER replies waiting for slave acknowledgements, in offset order.

    Args:
        timeout_ms: how long one may wait (``sync_flush_timeout_ms``; RocketMQ ``slaveTimeout``).
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._q: deque[tuple[int, int, T]] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def park(self, end: int, item: T, now_ms: int) -> None:
        """Wait until slaves acknowledged ``end``; give up at ``now_ms + timeout_ms``."""
        self._q.append((end, now_ms + self.timeout_ms, item))

    def release(self, acked: int) -> list[T]:
        """The items whose ``end`` is at or below ``acked`` (the queue is in ``end`` order: the
        broker appends, and parks, in commit log order)."""
        out: list[T] = []
        while self._q and self._q[0][0] <= acked:
            out.append(self._q.popleft()[2])
        return out

    def expired(self, now_ms: int) -> list[T]:
        """The items whose deadline passed (from the head: deadlines ascend with ``end``)."""
        out: list[T] = []
        while self._q and self._q[0][1] <= now_ms:
            out.append(self._q.popleft()[2])
        return out
