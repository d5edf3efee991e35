"""Pop consumption, sans-IO, with RocketMQ 5's semantics (the gRPC door's consumer model).

A pop (RocketMQ ``PopMessageProcessor``) reads up to ``max_nums`` messages of a group's retry topic
and of the topic, advances the group's consumer offsets at once, and writes one checkpoint (CK)
record per popped run of a queue to the revive topic. The messages stay invisible to the group for
``invisible_ms``; an ack (``AckMessageProcessor``) writes an ack record; a change of invisible
time (``ChangeInvisibleTimeProcessor``) acks the old handle and writes a new CK for the message.
:meth:`PopService.tick` (``PopReviveService``) re-puts every un-acked message of an expired CK to
the group's retry topic with reconsume times + 1, or to its DLQ past the group's max attempts
(``SubscriptionGroupConfig.retryMaxTimes`` + 1), and writes acks for what it re-put.

FIFO groups (``consumeMessageOrderly``, RocketMQ ``ConsumerOrderInfoManager``): a queue with
un-acked, unexpired messages is not popped; once they expire the same offsets come again with the
next delivery attempt (no retry topic), and past max attempts they go to the DLQ.

State: the in-flight CKs, in memory, rebuilt at construction by replaying the revive queue from
the revive offset (the consumer offset of ``CID_RMQ_SYS_REVIVE_GROUP`` on the revive topic: the
first CK not resolved yet). Replayed CKs also move the group's offsets past what they popped, in
case consumer offsets were not saved before a crash. See :mod:`txmq.broker._pop_records` for the
record and handle formats.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING, Protocol

import msgspec

from txmq import limits
from txmq.broker._config import SubscriptionGroupConfig
from txmq.broker._pop_records import (
    ACK_TAG,
    CK_TAG,
    AckMsg,
    Handle,
    PopCheckPoint,
    decode_record,
)
from txmq.broker._retry import retry_record
from txmq.errors import CorruptRecord, InvalidReceiptHandle, InvalidRequest, ResponseCode
from txmq.protocol import (
    DLQ_PREFIX,
    PROPERTY_RETRY_TOPIC,
    RETRY_PREFIX,
    MessageExt,
    check_group,
    check_queue_id,
    check_topic,
    dlq_topic,
    is_broker_topic,
    retry_topic,
    revive_topic,
)
from txmq.store import AppendResult, Record

if TYPE_CHECKING:
    from txmq.broker._broker import Broker

__all__ = ["REVIVE_GROUP", "PopService", "Popped", "build_pop_service"]

log = logging.getLogger("txmq.broker.pop")

REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"
"""The system group whose consumer offset on the revive topic is the revive progress (RocketMQ
``PopAckConstants.REVIVE_GROUP``)."""
_REVIVE_QID = 0
_POP_CK = "POP_CK"
"""Property a popped message carries its handle in (RocketMQ ``MessageConst.PROPERTY_POP_CK``)."""


class PopStore(Protocol):
    """What pop reads from the store (:class:`txmq.store.Store` has it)."""

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]: ...
    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def read_at(self, commit_log_offset: int) -> MessageExt: ...
    def commit_log_offset_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None: ...
    def iter_records(self, start_offset: int = 0,
                     topics: Collection[str] | None = None) -> Iterator[tuple[int, Record]]: ...
    def set_retention_hook(self, name: str, hook: Callable[[], int | None] | None) -> None: ...
    @property
    def flushed_offset(self) -> int: ...


class PopOffsets(Protocol):
    """Consumer offsets (the broker's offset table, COMMON.md contract §1)."""

    def get(self, group: str, topic: str, queue_id: int) -> int | None: ...
    def set(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...


class PopTopics(Protocol):
    """The topic table (COMMON.md contract §2)."""

    def queue_nums(self, topic: str) -> int: ...
    def create(self, topic: str, queue_nums: int) -> int: ...


Append = Callable[[list[Record]], list[AppendResult]]


class Popped(msgspec.Struct):
    """One popped message.

    Attributes:
        message: the message; a retry shows its original topic (``RETRY_TOPIC``), and carries its
            handle in the ``POP_CK`` property.
        receipt_handle: opaque text for ack, change of invisible time and forward to the DLQ.
        delivery_attempt: ≥ 1 (reconsume times + 1; in a FIFO group, the queue's attempt).
        invisible_until_ms: when it is delivered again unless acked.
    """

    message: MessageExt
    receipt_handle: str
    delivery_attempt: int
    invisible_until_ms: int


@dataclass(eq=False)
class _Inflight:
    ck: PopCheckPoint
    offset: int
    """The CK record's queue offset in the revive queue (its key)."""
    clo_min: int
    """Lowest commit log offset this CK needs kept (its first message or its own record)."""
    acked: set[int] = field(default_factory=set)
    """Indexes into ``ck.d`` that are acked (RocketMQ's bitmap)."""

    def unacked(self) -> list[int]:
        return [i for i in range(self.ck.n) if i not in self.acked]


@dataclass(eq=False)
class _Run:
    """A popped run of one queue, staged before its CK is appended."""

    topic: str
    queue_id: int
    msgs: list[MessageExt]
    attempt: int  # FIFO delivery attempt, 0 when not FIFO
    next_offset: int | None  # the group's new consumer offset of the queue
    resolves: list[tuple[_Inflight, list[int]]] = field(default_factory=list)
    """Indexes of expired FIFO CKs this run delivers again (acked when its CK is stored)."""


class PopService:
    """Pop, ack, change of invisible time, forward to the DLQ and revive, for every group.

    Args:
        store: reads (queues, records, retention hook).
        append: appends records (the broker's append: one store append, wakes long polls).
        offsets: the consumer offset table.
        topics: the topic table (queue counts, creation of retry and DLQ topics).
        groups: group settings by name (unknown groups: not FIFO, 16 retries).
        broker_name: written into CKs and handles (a handle of another broker is refused).
        cluster: the revive topic is ``rmq_sys_REVIVE_LOG_<cluster>``.
    """

    def __init__(self, *, store: PopStore, append: Append, offsets: PopOffsets, topics: PopTopics,
                 groups: dict[str, SubscriptionGroupConfig], broker_name: str,
                 cluster: str, delivered: Callable[[str, str, int, int], None] | None = None) -> None:
        self.store, self._append, self.offsets, self.topics = store, append, offsets, topics
        self._delivered = delivered
        """``(group, topic, messages, bytes)`` of each pop that returned messages (metrics)."""
        self.groups = groups
        self.broker_name = broker_name
        self.revive_topic = revive_topic(cluster)
        self.durable_offset = 0
        """Commit log offset the last pop's records end at: answer it once durable up to here."""
        self._cks: dict[int, _Inflight] = {}  # by revive queue offset, ascending
        self._due: list[tuple[int, int]] = []  # heap of (revive time, CK offset)
        self._fifo: dict[tuple[str, str, int], dict[int, None]] = {}  # queue → its CK offsets
        self._revive_end = 0  # one past the last revive queue offset seen
        self._rr: dict[tuple[str, str], int] = {}
        self._ahead: dict[tuple[str, str, int], tuple[int, int]] = {}
        """Offsets whose records are not durable yet: key → (offset, commit log end to wait for).
        The offset table (saved on a timer) only gets them once durable, so a crash can never
        leave a saved pop or revive offset past a CK, ack or retry record the log lost."""
        self._pops = count()
        self.recover()
        store.set_retention_hook("pop", self._needed)

    # -- group settings ---------------------------------------------------------------------------
    def max_attempts(self, group: str) -> int:
        """Deliveries of a message before the DLQ: ``retryMaxTimes + 1`` (17 by default)."""
        gc = self.groups.get(group)
        return (gc.retry_max_times if gc is not None else limits.RETRY_MAX_TIMES) + 1

    def is_fifo(self, group: str) -> bool:
        """Whether ``group`` is configured ``consume_message_orderly``."""
        gc = self.groups.get(group)
        return gc is not None and gc.consume_message_orderly

    # -- pop --------------------------------------------------------------------------------------
    def pop(self, group: str, topic: str, queue_id: int | None, max_nums: int, invisible_ms: int,
            tags: set[str] | None, now_ms: int, fifo: bool = False) -> list[Popped]:
        """Up to ``max_nums`` messages of ``topic`` (and the group's retry topic) for ``group``,
        invisible to it for ``invisible_ms``. ``queue_id`` None: any queue, round robin (the
        proxy's queue -1). ``tags`` None: every tag. ``fifo`` (or the group's setting): FIFO.

        Raises:
            InvalidRequest: a bad group or topic name, queue id, ``max_nums`` (1..32) or
                ``invisible_ms`` (1..12 h); TOPIC_NOT_EXIST for an unknown topic; NO_PERMISSION
                for a broker, retry or DLQ topic.
            StoreError: the append failed; nothing was popped (offsets unchanged).
        """
        check_group(group)
        if is_broker_topic(check_topic(topic)) or topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            raise InvalidRequest(ResponseCode.NO_PERMISSION,
                                 f"topic {topic!r} is not popped: pop the topic itself (a "
                                 f"group's retry topic comes with it)")
        if not 0 < max_nums <= limits.POP_BATCH_MAX:
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER,
                                 f"max message number {max_nums} not in 1..{limits.POP_BATCH_MAX}")
        _check_invisible(invisible_ms, 1)
        n = self.topics.queue_nums(topic)
        if queue_id is not None:
            check_queue_id(queue_id, n, topic)
        fifo = fifo or self.is_fifo(group)
        self._settle()
        runs: list[_Run] = []
        left = max_nums
        for t, q in self._queue_order(group, topic, queue_id, n, fifo):
            if left <= 0:
                break
            got = (self._fifo_runs(group, t, q, left, tags, now_ms) if fifo
                   else self._plain_run(group, t, q, left, tags))
            runs += got
            left -= sum(len(r.msgs) for r in got)
        popped = self._commit_runs(group, topic, runs, invisible_ms, now_ms)
        if popped and self._delivered is not None:
            self._delivered(group, topic, len(popped), sum(p.message.store_size for p in popped))
        return popped

    def _queue_order(self, group: str, topic: str, queue_id: int | None, n: int,
                     fifo: bool) -> list[tuple[str, int]]:
        if queue_id is not None:
            queues = [(topic, queue_id)]
        else:
            start = self._rr.get((group, topic), 0)
            self._rr[(group, topic)] = (start + 1) % n
            queues = [(topic, (start + i) % n) for i in range(n)]
        if fifo:
            return queues
        retry = (retry_topic(group), 0)
        first = next(self._pops) % limits.POP_RETRY_FIRST_EVERY == 0
        return [retry, *queues] if first else [*queues, retry]

    def _start_offset(self, group: str, topic: str, qid: int) -> int:
        off = self._offset(group, topic, qid)
        lo, hi = self.store.queue_bounds(topic, qid)
        if off is None:  # PopMessageProcessor.getInitOffset (initPopOffsetByCheckMsgInMem)
            return 0 if lo == 0 else hi
        return max(off, lo)

    def _plain_run(self, group: str, topic: str, qid: int, left: int,
                   tags: set[str] | None) -> list[_Run]:
        start = self._start_offset(group, topic, qid)
        msgs = self.store.read_queue(topic, qid, start, left, limits.POP_READ_BYTES_MAX)
        if not msgs:
            return []
        nxt = msgs[-1].queue_offset + 1
        return [_Run(topic, qid, [m for m in msgs if tags is None or m.tags in tags], 0, nxt)]

    def _fifo_runs(self, group: str, topic: str, qid: int, left: int, tags: set[str] | None,
                   now: int) -> list[_Run]:
        """A FIFO queue: nothing while a run is in flight; else the un-acked messages of expired
        runs again (the next attempt), else new messages (attempt 1)."""
        expired = []
        for off in self._fifo.get((group, topic, qid), {}):
            inf = self._cks[off]
            if inf.ck.revive_time_ms > now:
                return []  # blocked: a run of this queue is in flight
            expired.append(inf)
        if expired:
            if any(inf.ck.at >= self.max_attempts(group) for inf in expired):
                return []  # the next tick moves them to the DLQ; order holds until then
            runs = []
            for inf in sorted(expired, key=lambda i: i.ck.so + i.ck.d[min(i.unacked())]):
                idxs = inf.unacked()[:left]
                msgs = [m for m in (self._read(inf.ck, i) for i in idxs) if m is not None]
                runs.append(_Run(topic, qid, msgs, inf.ck.at + 1, None, [(inf, idxs)]))
                left -= len(idxs)
                if left <= 0:
                    break
            return runs
        runs = self._plain_run(group, topic, qid, left, tags)
        for r in runs:
            r.attempt = 1
        return runs

    def _commit_runs(self, group: str, topic: str, runs: list[_Run], invisible_ms: int,
                     now: int) -> list[Popped]:
        """Append the runs' CKs (and acks of the FIFO runs they redeliver) in one append, then
        move offsets and hand out handles. Nothing changes if the append fails."""
        recs: list[Record] = []
        staged: list[tuple[_Run, PopCheckPoint, int]] = []  # (run, its CK, index of its record)
        for r in runs:
            if r.msgs:
                so = r.msgs[0].queue_offset
                ck = PopCheckPoint(so=so, pt=now, it=invisible_ms, n=len(r.msgs), q=r.queue_id,
                                   t=r.topic, c=group, d=[m.queue_offset - so for m in r.msgs],
                                   bn=self.broker_name, at=r.attempt)
                staged.append((r, ck, len(recs)))
                recs.append(self._record(CK_TAG, ck, now))
            recs += [self._record(ACK_TAG, self._ack_msg(inf, i), now)
                     for inf, idxs in r.resolves for i in idxs]
        results = self._append_all(recs)
        out: list[Popped] = []
        for r, ck, i in staged:  # tracked before the CKs they resolve go (the revive offset)
            res = results[i]
            inf = self._track(ck, res.queue_offset,
                              min(res.commit_log_offset, r.msgs[0].commit_log_offset))
            out += [self._popped(inf, m, topic) for m in r.msgs]
        for r in runs:
            if r.next_offset is not None:
                self._set_offset(group, r.topic, r.queue_id, r.next_offset)
            for old, idxs in r.resolves:
                self._ack_indexes(old, idxs)
        return out

    def _popped(self, inf: _Inflight, m: MessageExt, topic: str) -> Popped:
        ck = inf.ck
        h = Handle(ck_offset=inf.offset, start_offset=ck.so, pop_time_ms=ck.pt, invisible_ms=ck.it,
                   revive_qid=_REVIVE_QID, retry=ck.t != topic, broker_name=self.broker_name,
                   queue_id=ck.q, queue_offset=m.queue_offset,
                   commit_log_offset=m.commit_log_offset).encode()
        attempt = ck.at or m.reconsume_times + 1
        shown = msgspec.structs.replace(
            m, topic=m.properties.get(PROPERTY_RETRY_TOPIC, topic) if ck.t != topic else topic,
            properties={**m.properties, _POP_CK: h}, reconsume_times=attempt - 1)
        return Popped(shown, h, attempt, ck.revive_time_ms)

    # -- ack, change of invisible time, DLQ -------------------------------------------------------
    def ack(self, group: str, topic: str, receipt_handle: str, now_ms: int) -> int:
        """Ack one popped message: it is never delivered to ``group`` again. Returns the commit
        log offset to answer at once durable.

        Raises:
            InvalidReceiptHandle: forged, expired, already acked, or of another group or topic.
            StoreError: the append failed; nothing changed.
        """
        inf, idx = self._resolve(group, topic, receipt_handle, now_ms)
        res = self._append_all([self._record(ACK_TAG, self._ack_msg(inf, idx), now_ms)])
        self._ack_indexes(inf, [idx])
        return _end(res)

    def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int,
                         now_ms: int) -> tuple[str, int]:
        """Make a popped message invisible for ``invisible_ms`` from now (0..12 h) instead: the
        old handle is acked and refused from now on. Returns (new handle, durable offset).

        Raises:
            InvalidReceiptHandle: as :meth:`ack`. InvalidRequest: ``invisible_ms`` out of range.
        """
        _check_invisible(invisible_ms, 0)
        inf, idx = self._resolve(group, topic, receipt_handle, now_ms)
        old = inf.ck
        off = old.so + old.d[idx]
        ck = PopCheckPoint(so=off, pt=now_ms, it=invisible_ms, n=1, q=old.q, t=old.t, c=group,
                           d=[0], bn=self.broker_name, at=old.at)
        res = self._append_all([self._record(ACK_TAG, self._ack_msg(inf, idx), now_ms),
                                self._record(CK_TAG, ck, now_ms)])
        new = self._track(ck, res[1].queue_offset, min(inf.clo_min, res[1].commit_log_offset))
        self._ack_indexes(inf, [idx])  # after tracking the new CK: the revive offset stays below it
        h = Handle.parse(receipt_handle)
        handle = msgspec.structs.replace(h, ck_offset=new.offset, start_offset=off,
                                         pop_time_ms=now_ms, invisible_ms=invisible_ms)
        return handle.encode(), _end(res)

    def forward_to_dlq(self, group: str, topic: str, receipt_handle: str, now_ms: int) -> int:
        """Move a popped message to ``%DLQ%<group>`` now and ack it. Returns the durable offset.

        Raises:
            InvalidReceiptHandle: as :meth:`ack`. StoreError: the append failed.
        """
        inf, idx = self._resolve(group, topic, receipt_handle, now_ms)
        recs = [self._record(ACK_TAG, self._ack_msg(inf, idx), now_ms)]
        m = self._read(inf.ck, idx)
        if m is not None:
            recs.insert(0, self._requeue(m, group, dlq=True, now=now_ms))
        res = self._append_all(recs)
        self._ack_indexes(inf, [idx])
        return _end(res)

    def _resolve(self, group: str, topic: str, text: str, now: int) -> tuple[_Inflight, int]:
        """The in-flight CK and index a handle names, or InvalidReceiptHandle."""
        check_group(group)
        check_topic(topic)
        h = Handle.parse(text)
        if h.broker_name != self.broker_name:
            raise InvalidReceiptHandle(f"receipt handle of broker {h.broker_name!r}, not of "
                                       f"{self.broker_name!r}")
        if h.invisible_until_ms <= now:
            raise InvalidReceiptHandle("receipt handle has expired")
        inf = self._cks.get(h.ck_offset)
        ck = inf.ck if inf is not None else None
        if (inf is None or ck is None or (ck.so, ck.pt, ck.it, ck.q) !=
                (h.start_offset, h.pop_time_ms, h.invisible_ms, h.queue_id)):
            raise InvalidReceiptHandle("receipt handle names no message in flight: it was acked, "
                                       "its invisible time was changed, or it is forged")
        if ck.c != group:
            raise InvalidReceiptHandle(f"receipt handle belongs to another consumer group, "
                                       f"not {group!r}")
        if ck.t != (retry_topic(group) if h.retry else topic):
            raise InvalidReceiptHandle(f"receipt handle belongs to another topic, not {topic!r}")
        diff = h.queue_offset - ck.so
        idx = ck.d.index(diff) if diff in ck.d else -1
        if idx < 0 or self.store.commit_log_offset_at(ck.t, ck.q, h.queue_offset) != \
                h.commit_log_offset:
            raise InvalidReceiptHandle("receipt handle names no message in flight (forged)")
        if idx in inf.acked:
            raise InvalidReceiptHandle("receipt handle was acked already")
        return inf, idx

    # -- revive -----------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        """Revive expired CKs (at most ``POP_REVIVE_CHECKPOINTS_PER_TICK_MAX``): un-acked
        messages go to the group's retry topic with reconsume times + 1, or to its DLQ past max
        attempts; a FIFO group's go to the DLQ past max attempts, else wait for the next pop of
        their queue.

        Raises:
            StoreError: an append failed; that CK is revived by a later tick.
        """
        self._settle()
        done = 0
        while self._due and self._due[0][0] <= now_ms and done < \
                limits.POP_REVIVE_CHECKPOINTS_PER_TICK_MAX:
            rt, off = self._due[0]
            inf = self._cks.get(off)
            if inf is not None and inf.ck.revive_time_ms == rt:
                if inf.ck.at and inf.ck.at < self.max_attempts(inf.ck.c):
                    pass  # FIFO: the next pop of the queue delivers it again
                else:
                    self._revive(inf, now_ms)
                    done += 1
            heapq.heappop(self._due)

    def _revive(self, inf: _Inflight, now: int) -> None:
        ck = inf.ck
        dlq_at = self.max_attempts(ck.c)
        recs: list[Record] = []
        for idx in inf.unacked():
            m = self._read(ck, idx)
            if m is None:
                continue
            attempt = ck.at or m.reconsume_times + 1
            recs.append(self._requeue(m, ck.c, dlq=ck.at > 0 or attempt >= dlq_at, now=now))
        acks = self._acks(inf)
        self._append_all(recs + [self._record(ACK_TAG, a, now) for a in acks])
        self._ack_indexes(inf, inf.unacked())

    def _requeue(self, m: MessageExt, group: str, *, dlq: bool, now: int) -> Record:
        """The retry (or DLQ) copy of ``m``: reconsume times + 1, same ``UNIQ_KEY``, the original
        topic in ``RETRY_TOPIC`` (RocketMQ ``PopReviveService.reviveRetry``)."""
        topic = dlq_topic(group) if dlq else retry_topic(group)
        self.topics.create(topic, 1)
        rec = retry_record(m, topic, now)
        rec.properties.pop(_POP_CK, None)
        return rec

    # -- recovery ---------------------------------------------------------------------------------
    def recover(self) -> None:
        """Replay the revive queue from the revive offset: every CK not resolved comes back in
        flight (an expired one is revived by the first tick), acks apply, and each group's
        offsets move past what its CKs popped. Records that do not decode are logged and skipped.
        """
        t = self.revive_topic
        lo = self.store.queue_bounds(t, _REVIVE_QID)[0]
        start = max(self.offsets.get(REVIVE_GROUP, t, _REVIVE_QID) or 0, lo)
        self._revive_end = start
        clo = self.store.commit_log_offset_at(t, _REVIVE_QID, start)
        if clo is None:
            return
        for rec_clo, rec in self.store.iter_records(clo, topics=[t]):
            if rec.queue_id != _REVIVE_QID or rec.queue_offset < start:
                continue
            try:
                body = decode_record(rec.tags, rec.body)
            except msgspec.DecodeError as exc:
                log.error("revive record at %d skipped: %s", rec.queue_offset, exc)
                continue
            self._revive_end = max(self._revive_end, rec.queue_offset + 1)
            if isinstance(body, PopCheckPoint):
                self._replay_ck(body, rec.queue_offset, rec_clo)
            elif isinstance(body, AckMsg):
                inf = self._cks.get(body.co)
                if inf is not None and body.ao - inf.ck.so in inf.ck.d:
                    self._ack_indexes(inf, [inf.ck.d.index(body.ao - inf.ck.so)])
        self._move_revive_offset()
        log.info("pop: %d checkpoints in flight after replay", len(self._cks))

    def _replay_ck(self, ck: PopCheckPoint, offset: int, rec_clo: int) -> None:
        first = self.store.commit_log_offset_at(ck.t, ck.q, ck.so)
        self._track(ck, offset, min(rec_clo, first if first is not None else rec_clo))
        end = max(ck.offsets()) + 1 if ck.d else ck.so
        cur = self.offsets.get(ck.c, ck.t, ck.q)
        if cur is None or cur < end:
            self.offsets.set(ck.c, ck.t, ck.q, end)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _track(self, ck: PopCheckPoint, offset: int, clo_min: int) -> _Inflight:
        inf = self._cks[offset] = _Inflight(ck, offset, clo_min)
        heapq.heappush(self._due, (ck.revive_time_ms, offset))
        if ck.at:
            self._fifo.setdefault((ck.c, ck.t, ck.q), {})[offset] = None
        self._revive_end = max(self._revive_end, offset + 1)
        return inf

    def _ack_indexes(self, inf: _Inflight, idxs: list[int]) -> None:
        inf.acked.update(idxs)
        if len(inf.acked) < inf.ck.n:
            return
        del self._cks[inf.offset]
        if inf.ck.at:
            key = (inf.ck.c, inf.ck.t, inf.ck.q)
            self._fifo[key].pop(inf.offset, None)
            if not self._fifo[key]:
                del self._fifo[key]
        self._move_revive_offset()

    def _move_revive_offset(self) -> None:
        """The revive offset: the first CK still in flight, else past everything seen."""
        first = next(iter(self._cks), self._revive_end)
        t = self.revive_topic
        if self._offset(REVIVE_GROUP, t, _REVIVE_QID) != first:
            self._set_offset(REVIVE_GROUP, t, _REVIVE_QID, first)

    def _offset(self, group: str, topic: str, qid: int) -> int | None:
        ahead = self._ahead.get((group, topic, qid))
        return ahead[0] if ahead is not None else self.offsets.get(group, topic, qid)

    def _set_offset(self, group: str, topic: str, qid: int, offset: int) -> None:
        """Set an offset once the records behind it (up to ``durable_offset``) are durable."""
        if self.durable_offset <= self.store.flushed_offset:
            self._ahead.pop((group, topic, qid), None)
            self.offsets.set(group, topic, qid, offset)
        else:
            self._ahead[(group, topic, qid)] = (offset, self.durable_offset)

    def _settle(self) -> None:
        """Move offsets whose records became durable into the offset table."""
        flushed = self.store.flushed_offset
        for key, (offset, end) in list(self._ahead.items()):
            if end <= flushed:
                del self._ahead[key]
                self.offsets.set(*key, offset)

    def _needed(self) -> int | None:
        """Retention hook: the lowest commit log offset an in-flight CK still needs."""
        return min((inf.clo_min for inf in self._cks.values()), default=None)

    def _append_all(self, recs: list[Record]) -> list[AppendResult]:
        if not recs:
            return []
        results = self._append(recs)
        for rec, res in zip(recs, results, strict=True):
            if rec.topic == self.revive_topic:
                self._revive_end = max(self._revive_end, res.queue_offset + 1)
        self.durable_offset = _end(results)
        return results

    def _record(self, tag: str, body: PopCheckPoint | AckMsg, now: int) -> Record:
        return Record(topic=self.revive_topic, queue_id=_REVIVE_QID, body=_ENC.encode(body),
                      tags=tag, store_timestamp_ms=now, born_timestamp_ms=now)

    def _ack_msg(self, inf: _Inflight, idx: int) -> AckMsg:
        ck = inf.ck
        return AckMsg(ao=ck.so + ck.d[idx], so=ck.so, c=ck.c, t=ck.t, q=ck.q, pt=ck.pt,
                      bn=ck.bn, co=inf.offset)

    def _acks(self, inf: _Inflight) -> list[AckMsg]:
        return [self._ack_msg(inf, i) for i in inf.unacked()]

    def _read(self, ck: PopCheckPoint, idx: int) -> MessageExt | None:
        """The message at index ``idx`` of a CK, or None (logged) if it is gone."""
        off = ck.so + ck.d[idx]
        clo = self.store.commit_log_offset_at(ck.t, ck.q, off)
        try:
            if clo is None:
                raise CorruptRecord(f"no entry at queue offset {off}")
            return self.store.read_at(clo)
        except CorruptRecord as exc:
            log.error("pop: message %s:%d:%d of group %s is gone (%s); it counts as acked",
                      ck.t, ck.q, off, ck.c, exc)
            return None


_ENC = msgspec.json.Encoder()


def _end(results: list[AppendResult]) -> int:
    return results[-1].commit_log_offset + results[-1].size if results else 0


def _check_invisible(invisible_ms: int, lowest: int) -> None:
    if not lowest <= invisible_ms <= limits.POP_INVISIBLE_TIME_MAX_MS:
        raise InvalidRequest(ResponseCode.INVALID_PARAMETER,
                             f"invisible time {invisible_ms} ms not in {lowest}.."
                             f"{limits.POP_INVISIBLE_TIME_MAX_MS} ms")


def build_pop_service(broker: Broker) -> PopService:
    """The :class:`PopService` of a broker over its store, offset table and topic table,
    recovered from the revive topic (a system topic of the topic table)."""
    c = broker.config
    return PopService(store=broker.store, append=broker.append, offsets=broker.offsets,
                      topics=broker.topics, groups=c.groups, broker_name=c.broker_name,
                      cluster=c.broker_cluster_name, delivered=broker.traffic.delivered)
