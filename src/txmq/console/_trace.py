"""A message's trace: half → commit/rollback → stored → per consumer group delivered, retries,
dead letter; and reading queues without committing offsets.

Where each step comes from:

- the message's copies by id (``VIEW_MESSAGE_BY_UNIQ_KEY``: the broker keeps ``UNIQ_KEY`` on the
  half, the committed message, retry (``%RETRY%<group>``) and DLQ (``%DLQ%<group>``) copies; a
  retry copy also names the original in ``ORIGIN_MESSAGE_ID``);
- the decision: an operator's op record through the key index (its KEYS hold the message id);
  else the op record that lists the half offset, read from the op topic from the time of the
  commit (the committed copy's store time) or of the half, at most
  ``CONSOLE_TRACE_OP_SCAN_MAX`` records; ``TXMQ_DECIDED_BY`` says producer, check-back or
  operator. A half message discarded after ``transactionCheckMax`` shows as a rollback by
  check-back with the reason;
- delivery: for each group that subscribes to (or has offsets of) the real topic, whether its
  consumer offset of that queue is past the message's queue offset;
- the check-backs, their answers and who decided, from the broker's record of the transaction's
  life while it keeps it (:mod:`txmq.console._tx_life`), and the W3C trace id.

The op record property names below are the broker's (``txmq.broker.transaction._op``); the
console reads them from the wire and does not import the broker.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from txmq import limits
from txmq.client import AsyncPullConsumer, PullStatus
from txmq.console import _tx_life
from txmq.console._convert import message_detail
from txmq.console._models import MessageTrace, TraceEvent
from txmq.errors import InvalidRequest, RemoteError, ResponseCode
from txmq.protocol import (
    DLQ_PREFIX,
    HALF_TOPIC,
    OP_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_TXMQ_DECIDED_BY,
    PROPERTY_TXMQ_HALF_OFFSET,
    PROPERTY_TXMQ_OPERATOR,
    PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_PARK_REASON,
    PROPERTY_TXMQ_REASON,
    PROPERTY_TXMQ_RESUMED_FROM,
    PROPERTY_TXMQ_TX_ID,
    RETRY_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    MessageExt,
    is_broker_topic,
)

if TYPE_CHECKING:
    from txmq.console._backend_common import BrokerClients

__all__ = [
    "message_trace",
    "read_queue", "read_topic",
]


_NOT_FOUND = (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.QUERY_NOT_FOUND)


async def read_queue(reader: AsyncPullConsumer, topic: str, queue_id: int, offset: int,
                     limit: int) -> list[MessageExt]:
    """Up to ``limit`` messages of one queue from ``offset`` (no offset is committed)."""
    out: list[MessageExt] = []
    while len(out) < limit:
        r = await reader.pull(topic, queue_id, offset, min(limit - len(out), limits.PULL_BATCH_MAX))
        if r.status is not PullStatus.FOUND and r.next_begin_offset == offset:
            break
        out += r.messages
        offset = r.next_begin_offset
    return out[:limit]


async def read_topic(reader: AsyncPullConsumer, topic: str, queue_id: int, limit: int) -> list[MessageExt]:
    """Up to ``limit`` messages of ``topic``'s queue ``queue_id`` from its first; [] when the
    topic does not exist."""
    try:
        start = await reader.min_offset(topic, queue_id)
    except RemoteError as exc:
        if exc.response_code in _NOT_FOUND:
            return []
        raise
    return await read_queue(reader, topic, queue_id, start, limit)


async def _view(b: BrokerClients, msg_id: str) -> list[MessageExt]:
    try:
        found = await b.admin.view_message(msg_id)
    except RemoteError as exc:
        if exc.response_code in _NOT_FOUND:
            return []
        raise
    return [m for m in found if msg_id in (m.msg_id, m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID))]


async def message_trace(brokers: list[BrokerClients], msg_id: str) -> MessageTrace:
    """The message ``msg_id`` and its trace (see the module docstring).

    Raises:
        InvalidRequest: QUERY_NOT_FOUND when no broker holds the id.
        RemoteError, BrokerUnavailable, RequestTimeout: a broker's failure.
    """
    per = await asyncio.gather(*(_view(b, msg_id) for b in brokers))
    for b, copies in zip(brokers, per, strict=True):
        if copies:
            return await _trace_on(b, msg_id, sorted(copies, key=lambda m: m.commit_log_offset))
    raise InvalidRequest(ResponseCode.QUERY_NOT_FOUND, f"no message with id {msg_id}")


def _is_real(m: MessageExt) -> bool:
    return not (is_broker_topic(m.topic) or m.topic.startswith((RETRY_PREFIX, DLQ_PREFIX))
                or m.topic in (SCHEDULE_TOPIC, HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC))


async def _trace_on(b: BrokerClients, msg_id: str, copies: list[MessageExt]) -> MessageTrace:
    halves = [m for m in copies if m.topic == HALF_TOPIC]
    reals = [m for m in copies if _is_real(m)]
    primary = reals[0] if reals else halves[-1] if halves else copies[0]
    events = [TraceEvent(kind="half", time_ms=h.store_timestamp_ms, detail=_half_detail(h)) for h in halves]
    decision = await _decision(b, msg_id, halves, copies, reals)
    if decision is not None:
        events.append(decision)
    events += [TraceEvent(kind="stored", time_ms=m.store_timestamp_ms,
                          detail=f"{m.topic} queue {m.queue_id} offset {m.queue_offset}") for m in reals]
    events = _tx_life.add_life(events, await _tx_life.lives_of(b, halves))
    events += await _deliveries(b, reals, copies)
    return MessageTrace(message=message_detail(primary), trace=events,
                        trace_id=_tx_life.trace_id(primary))


def _half_detail(h: MessageExt) -> str:
    text = f"half offset {h.queue_offset}, producer group {h.properties.get(PROPERTY_PRODUCER_GROUP, '')}"
    resumed = h.properties.get(PROPERTY_TXMQ_RESUMED_FROM)
    return f"{text} (resumed from half offset {resumed})" if resumed else text


def _from_op(op: MessageExt, fallback: str = "") -> TraceEvent:
    p = op.properties
    outcome = p.get(PROPERTY_TXMQ_OUTCOME, fallback)
    by = p.get(PROPERTY_TXMQ_DECIDED_BY) or ("operator" if PROPERTY_TXMQ_OPERATOR in p else "")
    return TraceEvent(kind="commit" if outcome == "COMMIT" else "rollback", time_ms=op.store_timestamp_ms,
                      by=by, operator=p.get(PROPERTY_TXMQ_OPERATOR, ""),
                      reason=p.get(PROPERTY_TXMQ_REASON, ""),
                      detail="discarded" if outcome == "DISCARD" else "")


async def _decision(b: BrokerClients, msg_id: str, halves: list[MessageExt], copies: list[MessageExt],
                    reals: list[MessageExt]) -> TraceEvent | None:
    """The commit or rollback of the message's (latest) half, or None (not transactional, or
    still pending)."""
    if not halves:
        return None
    try:
        ops = await b.admin.query_messages(OP_TOPIC, msg_id, max_num=8)
    except RemoteError as exc:
        if exc.response_code not in _NOT_FOUND:
            raise
        ops = []
    mine = [o for o in ops if o.properties.get(PROPERTY_TXMQ_TX_ID) == msg_id]
    if mine:
        return _from_op(max(mine, key=lambda o: o.commit_log_offset))
    half = halves[-1]
    committed = [m for m in reals if m.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
                 == str(half.queue_offset)]
    if committed:
        op = await _find_op(b, half.queue_offset, committed[0].store_timestamp_ms)
        if op is not None:
            return _from_op(op, "COMMIT")
        return TraceEvent(kind="commit", time_ms=committed[0].store_timestamp_ms)
    discarded = [m for m in copies if m.topic == TRANS_CHECK_MAX_TIME_TOPIC
                 and m.properties.get(PROPERTY_TXMQ_HALF_OFFSET) == str(half.queue_offset)]
    if discarded:
        d = discarded[-1]
        reason = d.properties.get(PROPERTY_TXMQ_PARK_REASON) or "no decision after the last check-back"
        return TraceEvent(kind="rollback", time_ms=d.store_timestamp_ms, by="check-back", reason=reason,
                          detail=f"discarded to {TRANS_CHECK_MAX_TIME_TOPIC} (resumable)")
    try:
        state = str((await b.admin.query_transaction(f"half:{half.queue_offset}")).get("state", ""))
    except RemoteError:
        state = ""
    if state not in ("COMMIT", "ROLLBACK"):
        return None
    op = await _find_op(b, half.queue_offset, half.store_timestamp_ms)
    if op is not None:
        return _from_op(op, state)
    return TraceEvent(kind="commit" if state == "COMMIT" else "rollback", time_ms=0,
                      detail="op record not found")


async def _find_op(b: BrokerClients, half_offset: int, from_ms: int) -> MessageExt | None:
    """The op record listing ``half_offset``, read from the first one stored at ``from_ms``."""
    token = str(half_offset)
    try:
        offset = await b.reader.search_offset(OP_TOPIC, 0, from_ms)
    except RemoteError as exc:
        if exc.response_code in _NOT_FOUND:
            return None
        raise
    read = 0
    while read < limits.CONSOLE_TRACE_OP_SCAN_MAX:
        batch = await read_queue(b.reader, OP_TOPIC, 0, offset, limits.PULL_BATCH_MAX // 8)
        if not batch:
            return None
        for op in batch:
            if token in op.body.decode("utf-8", "replace").split(","):
                return op
        read += len(batch)
        offset = batch[-1].queue_offset + 1
    return None


async def _deliveries(b: BrokerClients, reals: list[MessageExt],
                      copies: list[MessageExt]) -> list[TraceEvent]:
    """Per consumer group: delivered (or not yet), then its retries and dead letters in time order."""
    copies_of: dict[str, list[MessageExt]] = {}
    for m in copies:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if m.topic.startswith(prefix):
                copies_of.setdefault(m.topic[len(prefix):], []).append(m)
    real = reals[0] if reals else None
    groups = set(copies_of)
    if real is not None:
        groups |= {g.group for g in await b.admin.groups()
                   if real.topic in g.subscriptions or real.topic in g.offset_topics}
    out: list[TraceEvent] = []
    for g in sorted(groups):
        if real is not None:
            out.append(await _delivered(b, g, real))
        for m in sorted(copies_of.get(g, []), key=lambda m: m.store_timestamp_ms):
            dlq = m.topic.startswith(DLQ_PREFIX)
            out.append(TraceEvent(kind="dlq" if dlq else "retry", time_ms=m.store_timestamp_ms, group=g,
                                  detail=f"{m.topic} offset {m.queue_offset}, reconsume times "
                                         f"{m.reconsume_times}"))
    return out


async def _delivered(b: BrokerClients, group: str, m: MessageExt) -> TraceEvent:
    try:
        stats = await b.admin.consume_stats(group, m.topic)
    except RemoteError as exc:
        if exc.response_code not in _NOT_FOUND:
            raise
        stats = []
    q = next((s for s in stats if s.queue_id == m.queue_id), None)
    if q is None or q.consumer_offset < 0:
        detail = "not yet consumed (the group has no offset stored for this queue)"
    elif q.consumer_offset > m.queue_offset:
        detail = f"consumed (consumer offset {q.consumer_offset} > queue offset {m.queue_offset})"
    else:
        detail = f"not yet consumed (consumer offset {q.consumer_offset} <= queue offset {m.queue_offset})"
    return TraceEvent(kind="delivered", time_ms=0, group=group, detail=detail)
