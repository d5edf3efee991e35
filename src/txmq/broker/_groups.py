"""Consumer groups on the broker, sans-IO: offset search by time, orderly queue locks, and the
operator requests (group list, consume stats, offset reset).

Handlers take ``(conn, command, now_ms)`` and return actions, like :class:`~txmq.broker.Broker`'s own;
the broker registers :meth:`GroupService.handlers` in its dispatch table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from txmq import limits
from txmq.broker._actions import Action, Reply, SendTo, ok_reply
from txmq.errors import ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    Command,
    ConsumerGroupInfo,
    ConsumeStatsRequestHeader,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetResponseHeader,
    QueueConsumeStats,
    RequestCode,
    ResetConsumerClientOffsetBody,
    ResetOffsetEntry,
    ResetOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UnlockBatchRequestBody,
    check_group,
    check_timestamp,
    decode_body,
    encode_body,
    from_ext,
    to_ext,
)

if TYPE_CHECKING:
    from txmq.broker._broker import Broker

__all__ = ["GroupService", "QueueLocks"]

log = logging.getLogger("txmq.broker.groups")

Handler = Callable[[int, Command, int], list[Action]]


class _Lock(msgspec.Struct):
    client_id: str
    conn: int
    last_ms: int


class QueueLocks:
    """Who may consume a queue in orderly mode (RocketMQ ``RebalanceLockManager``).

    A lock belongs to a client id and the connection it was taken or last renewed on. It expires
    when not renewed for ``max_live_ms``; unlike RocketMQ it is also released at once when that
    connection closes, so a killed member's queues move on without waiting for the expiry.

    Args:
        max_live_ms: lock lifetime without renewal (RocketMQ 60 s).
    """

    def __init__(self, max_live_ms: int = limits.REBALANCE_LOCK_MAX_LIVE_TIME_MS) -> None:
        self.max_live_ms = max_live_ms
        self._locks: dict[tuple[str, MessageQueue], _Lock] = {}

    def try_lock(self, group: str, client_id: str, conn: int, mqs: list[MessageQueue],
                 now_ms: int) -> list[MessageQueue]:
        """Lock or renew each queue that is free, expired or already ``client_id``'s; returns
        the queues ``client_id`` holds afterwards (a subset of ``mqs``)."""
        out = []
        for mq in mqs:
            cur = self._locks.get((group, mq))
            if cur is None or cur.client_id == client_id or now_ms - cur.last_ms > self.max_live_ms:
                if cur is not None and cur.client_id != client_id:
                    log.info("lock of %s/%s/%d expired for %s; now %s", group, mq.topic, mq.queue_id,
                             cur.client_id, client_id)
                self._locks[(group, mq)] = _Lock(client_id, conn, now_ms)
                out.append(mq)
        return out

    def unlock(self, group: str, client_id: str, mqs: list[MessageQueue]) -> None:
        """Release the queues of ``mqs`` that ``client_id`` holds."""
        for mq in mqs:
            cur = self._locks.get((group, mq))
            if cur is not None and cur.client_id == client_id:
                del self._locks[(group, mq)]

    def release_conn(self, conn: int) -> int:
        """Release every lock taken or last renewed over ``conn``; returns how many."""
        gone = [k for k, v in self._locks.items() if v.conn == conn]
        for k in gone:
            del self._locks[k]
        return len(gone)

    def holder(self, group: str, mq: MessageQueue, now_ms: int) -> str:
        """Client id holding the live lock of ``mq`` for ``group``, or ""."""
        cur = self._locks.get((group, mq))
        return cur.client_id if cur is not None and now_ms - cur.last_ms <= self.max_live_ms else ""


def _error(conn: int, cmd: Command, code: ResponseCode, remark: str) -> list[Action]:
    return [] if cmd.is_oneway else [Reply(conn, cmd.response(code, remark))]


class GroupService:
    """The consumption requests that are not send, pull or plain offsets.

    Args:
        broker: the broker whose topics, store, offsets and clients it reads and updates.
    """

    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.locks = QueueLocks()

    def handlers(self) -> dict[int, Handler]:
        """Request code → handler, for the broker's dispatch table."""
        return {
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset,
            RequestCode.LOCK_BATCH_MQ: self._lock,
            RequestCode.UNLOCK_BATCH_MQ: self._unlock,
            RequestCode.GET_CONSUMER_GROUPS: self._group_list,
            RequestCode.GET_CONSUME_STATS: self._consume_stats,
            RequestCode.RESET_OFFSET: self._reset_offset,
        }

    # -- offsets by time ----------------------------------------------------------------------------
    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store timestamp is at or after ``timestamp_ms``: binary
        search over the consume queue (store timestamps grow with the offset), O(log n) reads.
        Returns the max offset when every message is older."""
        lo, hi = self.b.store.queue_bounds(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            [m] = self.b.store.read_queue(topic, queue_id, mid, 1, 1)
            if m.store_timestamp_ms < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _search_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, SearchOffsetRequestHeader)
        check_timestamp(h.timestamp)
        n = self.b.queue_nums(h.topic)
        if not 0 <= h.queue_id < n:
            return _error(conn, cmd, ResponseCode.MESSAGE_ILLEGAL, f"queue {h.queue_id} not in {h.topic!r}")
        off = self.search_offset(h.topic, h.queue_id, h.timestamp)
        return ok_reply(conn, cmd, to_ext(OffsetResponseHeader(offset=off)))

    # -- orderly locks ------------------------------------------------------------------------------
    def _lock(self, conn: int, cmd: Command, now: int) -> list[Action]:
        body = decode_body(cmd.body, LockBatchRequestBody)
        check_group(body.consumer_group)
        name = body.mq_set[0].broker_name if body.mq_set else ""
        mqs = [MessageQueue(m.topic, m.queue_id) for m in body.mq_set]  # one broker: no name
        locked = self.locks.try_lock(body.consumer_group, body.client_id, conn, mqs, now)
        answer = [MessageQueue(m.topic, m.queue_id, name) for m in locked]
        return ok_reply(conn, cmd, body=encode_body(LockBatchResponseBody(lock_ok_mq_set=answer)))

    def _unlock(self, conn: int, cmd: Command, now: int) -> list[Action]:
        unlock = decode_body(cmd.body, UnlockBatchRequestBody)
        mqs = [MessageQueue(m.topic, m.queue_id) for m in unlock.mq_set]
        self.locks.unlock(unlock.consumer_group, unlock.client_id, mqs)
        return ok_reply(conn, cmd)

    # -- operators ----------------------------------------------------------------------------------
    def groups(self) -> list[ConsumerGroupInfo]:
        """Every group that is online or has stored offsets, sorted by name."""
        info: dict[str, ConsumerGroupInfo] = {}
        for group, data in self.b.clients.consumer_groups().items():
            info[group] = ConsumerGroupInfo(
                group=group, message_model=str(data.message_model),
                client_ids=sorted(self.b.clients.consumer_conns(group)),
                subscriptions=dict(data.subscriptions))
        for group, topics in self.b.offsets.group_topics().items():
            gi = info.setdefault(group, ConsumerGroupInfo(group=group))
            gi.offset_topics += [t for t in topics if t not in gi.offset_topics]
        for gi in info.values():
            gi.offset_topics.sort()
        return [info[g] for g in sorted(info)]

    def _group_list(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return ok_reply(conn, cmd, body=encode_body(self.groups()))

    def consume_stats(self, group: str, topic: str, now_ms: int) -> list[QueueConsumeStats]:
        """Per queue of the group's topics (or of ``topic``): broker offset, committed offset, lag."""
        if topic:
            topics = {topic}
        else:
            gi = next((g for g in self.groups() if g.group == group), None)
            topics = set(gi.offset_topics) | set(gi.subscriptions) if gi else set()
        out = []
        for t in sorted(x for x in topics if x in self.b.topics):
            for qid in range(self.b.topics[t]):
                lo, hi = self.b.store.queue_bounds(t, qid)
                stored = self.b.offsets.get(group, t, qid)
                off = -1 if stored is None else stored
                lag = max(0, hi - max(off, lo))
                holder = self.locks.holder(group, MessageQueue(t, qid), now_ms)
                out.append(QueueConsumeStats(topic=t, queue_id=qid, min_offset=lo, broker_offset=hi,
                                             consumer_offset=off, lag=lag, locked_by=holder))
        return out

    def _consume_stats(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, ConsumeStatsRequestHeader)
        check_group(h.consumer_group)
        if h.topic:
            self.b.queue_nums(h.topic)
        return ok_reply(conn, cmd, body=encode_body(self.consume_stats(h.consumer_group, h.topic, now)))

    def _reset_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, ResetOffsetRequestHeader)
        check_group(h.consumer_group)
        check_timestamp(h.timestamp_ms, none_ok=True)
        n = self.b.queue_nums(h.topic)
        if (h.timestamp_ms < 0) == (h.offset < 0):
            return _error(conn, cmd, ResponseCode.INVALID_PARAMETER,
                          "give exactly one of timestamp_ms and offset")
        qids = range(n) if h.queue_id < 0 else [h.queue_id]
        if any(not 0 <= q < n for q in qids):
            return _error(conn, cmd, ResponseCode.MESSAGE_ILLEGAL, f"queue {h.queue_id} not in {h.topic!r}")
        entries = []
        for q in qids:
            lo, hi = self.b.store.queue_bounds(h.topic, q)
            new = (self.search_offset(h.topic, q, h.timestamp_ms) if h.timestamp_ms >= 0
                   else max(lo, min(h.offset, hi)))
            old = self.b.offsets.get(h.consumer_group, h.topic, q)
            entries.append(ResetOffsetEntry(queue_id=q, old_offset=-1 if old is None else old,
                                            new_offset=new))
            self.b.set_offset(h.consumer_group, h.topic, q, new)
        log.info("offsets of %s on %s reset: %s", h.consumer_group, h.topic,
                 {e.queue_id: e.new_offset for e in entries})
        note = ResetConsumerClientOffsetBody(consumer_group=h.consumer_group, topic=h.topic,
                                             offsets={e.queue_id: e.new_offset for e in entries})
        notify: list[Action] = [
            SendTo(c, Command(code=RequestCode.RESET_CONSUMER_OFFSETS, flag=FLAG_ONEWAY,
                              body=encode_body(note)))
            for c in self.b.clients.consumer_conns(h.consumer_group).values()]
        return ok_reply(conn, cmd, body=encode_body(entries)) + notify
