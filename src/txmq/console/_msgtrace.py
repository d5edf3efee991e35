"""A message's RocketMQ message trace: the records RocketMQ clients (and txmq's, with
``enable_msg_trace``) wrote about it to the trace topics, as a timeline.

The records are found the way RocketMQ's ``QueryMsgTraceByIdSubCommand`` and Dashboard find them:
QUERY_MESSAGE of each trace topic by the message id, a key of every trace message that holds a
record of it (the broker's key index), then the records of that id in each body (RocketMQ
``TraceView.decodeFromTraceTransData``). The trace topics of a broker are ``RMQ_SYS_TRACE_TOPIC``,
every ``rmq_sys_TRACE_DATA_<region>`` topic it has (the C++ client's, and Java's with access channel
CLOUD), and any topic the caller names (a client's ``customizedTraceTopic``).

Each record becomes a :class:`MsgTraceRecord`: Pub (producer group, client host, cost, status),
EndTransaction (commit, rollback or unknown, by the producer or a check-back answer), SubBefore and
SubAfter per consumer group (retry times, cost, success). A SubAfter without time or group (the C++
client's and the cloud layout) takes them from its SubBefore (same request id). A record that does
not decode is reported in ``errors``, never hides the others.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from txmq import limits
from txmq.errors import MalformedMessage, RemoteError, ResponseCode, TxmqError
from txmq.protocol import (
    RMQ_SYS_TRACE_TOPIC,
    ConsumeReturnType,
    EndTransactionRecord,
    MessageExt,
    PubRecord,
    RecallRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceMessageType,
    TraceRecord,
    check_topic,
    decode_trace_record,
    is_trace_topic,
    split_trace_records,
)

if TYPE_CHECKING:
    from txmq.console._backend import Backend, BrokerClients

__all__ = ["MsgTracePage", "MsgTraceRecord", "msg_trace", "msg_trace_context"]

_NOT_FOUND = (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.QUERY_NOT_FOUND)
_ORDER = {"Pub": 0, "Recall": 1, "EndTransaction": 2, "SubBefore": 3, "SubAfter": 4}
"""Records of one ms in the order things happen."""
_BY = {False: "producer", True: "check-back"}
_STATE = {"COMMIT_MESSAGE": "commit", "ROLLBACK_MESSAGE": "rollback", "UNKNOW": "unknown"}


class MsgTraceRecord(BaseModel):
    """One trace record of the message, for the timeline.

    ``type``: Pub, EndTransaction, SubBefore, SubAfter or Recall. ``time_ms``: when it was
    recorded (0 unknown); ``group``: producer group (Pub, EndTransaction) or consumer group;
    ``client_host``: the writer (Pub's ``clientHost``, else the trace message's born host);
    ``cost_ms``: send time (Pub) or listener time per message (SubAfter); ``success``: Pub's
    and SubAfter's status; ``retry_times``: the delivery's reconsume times (SubBefore, and the
    SubAfter of the same request); ``consume_result``: SubAfter's ``ConsumeReturnType``;
    ``transaction_state``: commit, rollback or unknown and ``by`` producer or check-back
    (EndTransaction); ``trace_topic``: where the record was found.
    """

    type: Literal["Pub", "EndTransaction", "SubBefore", "SubAfter", "Recall"]
    time_ms: int
    group: str = ""
    client_host: str = ""
    cost_ms: int | None = None
    success: bool | None = None
    retry_times: int | None = None
    consume_result: str = ""
    transaction_state: str = ""
    by: str = ""
    msg_type: str = ""
    topic: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    region_id: str = ""
    request_id: str = ""
    offset_msg_id: str = ""
    trace_topic: str = ""


class MsgTracePage(BaseModel):
    """GET /api/messages/{msg_id}/msg-trace: the records in time order, the trace topics read
    (``broker address: topic``), and the records that did not decode (one line each)."""

    msg_id: str
    records: list[MsgTraceRecord]
    topics: list[str]
    errors: list[str]


def _msg_type(t: TraceMessageType) -> str:
    return t.name


def _view(r: TraceRecord, carrier: MessageExt, topic: str) -> MsgTraceRecord:
    """One decoded record as a timeline row (``carrier``: the trace message holding it)."""
    base: dict[str, Any] = {"trace_topic": topic, "client_host": carrier.born_host}
    if isinstance(r, PubRecord):
        return MsgTraceRecord(
            type="Pub", time_ms=r.timestamp_ms, group=r.group_name, cost_ms=r.cost_time_ms,
            success=r.success, msg_type=_msg_type(r.msg_type), topic=r.topic, tags=r.tags,
            keys=r.keys, store_host=r.store_host, region_id=r.region_id,
            offset_msg_id=r.offset_msg_id, **{**base, "client_host": r.client_host or carrier.born_host})
    if isinstance(r, EndTransactionRecord):
        return MsgTraceRecord(
            type="EndTransaction", time_ms=r.timestamp_ms, group=r.group_name,
            transaction_state=_STATE.get(r.transaction_state, r.transaction_state),
            by=_BY[r.from_transaction_check], msg_type=_msg_type(r.msg_type), topic=r.topic,
            tags=r.tags, keys=r.keys, store_host=r.store_host, region_id=r.region_id, **base)
    if isinstance(r, SubBeforeRecord):
        return MsgTraceRecord(type="SubBefore", time_ms=r.timestamp_ms, group=r.group_name,
                              retry_times=r.retry_times, keys=r.keys, region_id=r.region_id,
                              request_id=r.request_id, **base)
    if isinstance(r, SubAfterRecord):
        known = r.context_code in ConsumeReturnType._value2member_map_
        result = ConsumeReturnType(r.context_code).name if known else str(r.context_code)
        return MsgTraceRecord(type="SubAfter", time_ms=r.timestamp_ms, group=r.group_name,
                              cost_ms=r.cost_time_ms, success=r.success, consume_result=result,
                              keys=r.keys, request_id=r.request_id, **base)
    assert isinstance(r, RecallRecord)
    return MsgTraceRecord(type="Recall", time_ms=r.timestamp_ms, group=r.group_name, success=r.success,
                          topic=r.topic, region_id=r.region_id, **base)


def records_of(msg_id: str, carriers: list[tuple[str, MessageExt]]
               ) -> tuple[list[MsgTraceRecord], list[str]]:
    """The records about ``msg_id`` in trace messages ``(trace topic, message)``, in time order,
    each SubAfter completed from its SubBefore; and one line per record that did not decode."""
    out: list[MsgTraceRecord] = []
    errors: list[str] = []
    seen: set[tuple[str, str, int]] = set()
    for topic, m in carriers:
        where = (topic, m.store_host, m.commit_log_offset)
        if where in seen:
            continue
        seen.add(where)
        for i, text in enumerate(split_trace_records(m.body)):
            try:
                rec = decode_trace_record(text)
            except MalformedMessage as exc:
                errors.append(f"{topic} message {m.msg_id} record {i}: {exc}")
                continue
            if rec is not None and rec.msg_id == msg_id:
                out.append(_view(rec, m, topic))
    befores = {(v.request_id, v.group): v for v in out if v.type == "SubBefore"}
    by_request = {v.request_id: v for v in out if v.type == "SubBefore"}
    for v in out:
        if v.type != "SubAfter":
            continue
        b = befores.get((v.request_id, v.group)) or by_request.get(v.request_id)
        if b is not None:
            v.group = v.group or b.group
            v.retry_times = b.retry_times
            v.region_id = b.region_id
            if not v.time_ms:
                v.time_ms = b.time_ms + (v.cost_ms or 0)
    out.sort(key=lambda v: (v.time_ms, _ORDER[v.type]))
    return out, errors


async def _topics_of(b: BrokerClients, extra: list[str]) -> list[str]:
    """The trace topics ``b`` has: RMQ_SYS_TRACE_TOPIC, region topics, and ``extra``."""
    table = (await b.admin.topic_configs()).topic_config_table
    wanted = [t for t in table if is_trace_topic(t)] + [t for t in extra if t in table]
    return sorted(dict.fromkeys(wanted))


async def _query(b: BrokerClients, topic: str, msg_id: str) -> list[MessageExt]:
    try:
        return await b.admin.query_messages(topic, msg_id, max_num=limits.QUERY_MESSAGE_MAX_NUM)
    except RemoteError as exc:
        if exc.response_code in _NOT_FOUND:
            return []
        raise


async def _on_broker(b: BrokerClients, msg_id: str, extra: list[str]
                    ) -> tuple[list[str], list[tuple[str, MessageExt]]]:
    topics = await _topics_of(b, extra)
    found = await asyncio.gather(*(_query(b, t, msg_id) for t in topics))
    return ([f"{b.name or b.addr}: {t}" for t in topics],
            [(t, m) for t, ms in zip(topics, found, strict=True) for m in ms])


async def msg_trace(brokers: list[BrokerClients], msg_id: str,
                    trace_topics: list[str] | None = None) -> MsgTracePage:
    """The message trace of ``msg_id`` on ``brokers`` (see the module docstring);
    ``trace_topics``: custom trace topics to read too.

    Raises:
        InvalidRequest: a trace topic that is not a legal topic name.
        RemoteError, BrokerUnavailable, RequestTimeout: a broker's failure.
    """
    extra = list(dict.fromkeys(trace_topics or []))
    for t in extra:
        check_topic(t)
    per = await asyncio.gather(*(_on_broker(b, msg_id, [RMQ_SYS_TRACE_TOPIC, *extra]) for b in brokers))
    records, errors = records_of(msg_id, [c for _, cs in per for c in cs])
    return MsgTracePage(msg_id=msg_id, records=records, topics=[t for ts, _ in per for t in ts],
                        errors=errors)


async def msg_trace_context(backend: Backend, msg_id: str, trace_topics: list[str]) -> dict[str, Any]:
    """What ``msg_trace.html`` shows on a message's page: ``msg_trace`` (a :class:`MsgTracePage`,
    None when it could not be read) and ``msg_trace_error`` (why). Never raises a
    ``txmq.errors`` error: the rest of the page does not depend on it."""
    try:
        page = await backend.msg_trace(msg_id, trace_topics)
    except TxmqError as exc:
        return {"msg_trace": None, "msg_trace_error": str(exc) or type(exc).__name__}
    return {"msg_trace": page, "msg_trace_error": ""}
