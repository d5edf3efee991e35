"""RocketMQ 4's message trace records: the text RocketMQ clients write to ``RMQ_SYS_TRACE_TOPIC``.

A trace message's body is a run of records, each ended by ``FIELD_SPLITOR`` (char 2), whose fields
are separated by ``CONTENT_SPLITOR`` (char 1); the first field names the record's type. Its keys
are the traced messages' ids and keys, so the broker's key index finds a message's records by its
id. The layouts below are RocketMQ's ``TraceDataEncoder.encoderFromContextBean`` (writing) and
``decoderFromTraceDataString`` (reading), package ``org.apache.rocketmq.client.trace``;
docs/tracing.md draws them.

::

    Pub            Pub|timestamp|regionId|groupName|topic|msgId|tags|keys|storeHost|bodyLength|
                   costTime|msgType|offsetMsgId|success[|clientHost]
    SubBefore      SubBefore|timestamp|regionId|groupName|requestId|msgId|retryTimes|keys
    SubAfter       SubAfter|requestId|msgId|costTime|success|keys[|contextCode[|timestamp|groupName]]
    EndTransaction EndTransaction|timestamp|regionId|groupName|topic|msgId|tags|keys|storeHost|
                   msgType|transactionId|transactionState|fromTransactionCheck
    Recall         Recall|timestamp|regionId|groupName|topic|msgId|success

(``|`` is CONTENT_SPLITOR; every record ends with FIELD_SPLITOR.) Reading follows Java's decoder,
field count by field count, with three differences, all toward keeping a record: Java's
``String.split`` drops trailing empty fields, so a SubBefore with empty keys (which Java itself
writes as ``null``) makes Java throw, and here reads as keys ""; ``null`` (what Java's
``StringBuilder`` writes for a null tags or keys) reads as ""; and a record that does not parse
raises :class:`~txmq.errors.MalformedMessage` naming the field, where Java throws whatever
``parseInt`` or an array index throws. A record of an unknown type is skipped, as Java skips it.
Writing follows Java's encoder: empty tags and keys are written ``null``; SubAfter in the
non-cloud layout (9 fields); Pub in 14 fields, 15 when ``client_host`` is set.

The RocketMQ C++ client (``src/trace/TraceUtil.cpp``) writes the same Pub and SubBefore, a
6-field SubAfter, ``dKey`` for empty keys of its Sub records, and no EndTransaction; it names its
trace topic ``rmq_sys_TRACE_DATA_<region>`` (:data:`TRACE_TOPIC_PREFIX`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from enum import IntEnum, StrEnum
from typing import ClassVar

import msgspec

from txmq import limits
from txmq.errors import MalformedMessage

__all__ = [
    "CONTENT_SPLITOR",
    "CPP_DEFAULT_TRACE_REGION_ID",
    "DEFAULT_TRACE_REGION_ID",
    "FIELD_SPLITOR",
    "RMQ_SYS_TRACE_TOPIC",
    "TRACE_GROUP_NAME_PREFIX",
    "TRACE_TOPIC_PREFIX",
    "TRANSACTION_STATES",
    "ConsumeReturnType",
    "EndTransactionRecord",
    "PubRecord",
    "RecallRecord",
    "SubAfterRecord",
    "SubBeforeRecord",
    "TraceBatch",
    "TraceMessageType",
    "TraceRecord",
    "TraceType",
    "decode_trace_record",
    "decode_trace_records",
    "encode_trace_record",
    "is_trace_topic",
    "split_trace_records",
    "trace_batches",
    "trace_keys",
]

CONTENT_SPLITOR = "\u0001"
"""Separates a record's fields (RocketMQ ``TraceConstants.CONTENT_SPLITOR``, char 1)."""
FIELD_SPLITOR = "\u0002"
"""Ends each record (RocketMQ ``TraceConstants.FIELD_SPLITOR``, char 2)."""
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
"""The default trace topic (RocketMQ ``TopicValidator.RMQ_SYS_TRACE_TOPIC``; a client's
``customizedTraceTopic`` replaces it)."""
TRACE_TOPIC_PREFIX = "rmq_sys_TRACE_DATA_"
"""Prefix of a region's trace topic ``rmq_sys_TRACE_DATA_<regionId>``: RocketMQ
``TraceConstants.TRACE_TOPIC_PREFIX`` (Java clients with access channel CLOUD) and the C++
client's ``TraceConstant::TRACE_TOPIC`` (always)."""
DEFAULT_TRACE_REGION_ID = "DefaultRegion"
"""A broker's region when none is configured (RocketMQ ``MixAll.DEFAULT_TRACE_REGION_ID``): sent back
in every send response's ``MSG_REGION``."""
CPP_DEFAULT_TRACE_REGION_ID = "DEFAULT_REGION"
"""The region the C++ client's consumers use when a message has no ``MSG_REGION`` property
(``TraceConstant::DEFAULT_REDION``)."""
TRACE_GROUP_NAME_PREFIX = "_INNER_TRACE_PRODUCER"
"""Prefix of the producer group trace messages are sent as (RocketMQ
``TraceConstants.GROUP_NAME_PREFIX``)."""
TRANSACTION_STATES = ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW")
"""``transactionState`` values: RocketMQ ``LocalTransactionState`` names (``UNKNOW`` is its
spelling)."""

_JAVA_NULL = "null"
"""What Java's ``StringBuilder.append`` writes for a null string: tags and keys of a message
without them."""
_KEY_SEPARATOR = " "
"""RocketMQ ``MessageConst.KEY_SEPARATOR``."""
_INT = re.compile(r"[+-]?[0-9]{1,19}", re.ASCII)
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class TraceType(StrEnum):
    """A record's type (RocketMQ ``TraceType``)."""

    Pub = "Pub"
    Recall = "Recall"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class TraceMessageType(IntEnum):
    """What kind of message a Pub or EndTransaction record traces, written as its ordinal
    (RocketMQ ``MessageType``; the C++ client's ``TraceMessageType`` has the first four)."""

    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3
    Order_Msg = 4


class ConsumeReturnType(IntEnum):
    """How a listener call ended, written as SubAfter's ``contextCode`` (RocketMQ
    ``ConsumeReturnType`` ordinal)."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


class PubRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A producer sent a message (``Pub``). Times in ms since the epoch, ``cost_time_ms`` in ms,
    ``body_length`` in bytes; ``store_host`` the broker address it went to."""

    type: ClassVar[TraceType] = TraceType.Pub
    timestamp_ms: int
    region_id: str
    group_name: str
    topic: str
    msg_id: str
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    body_length: int = 0
    cost_time_ms: int = 0
    msg_type: TraceMessageType = TraceMessageType.Normal_Msg
    offset_msg_id: str = ""
    success: bool = True
    client_host: str = ""


class SubBeforeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A consumer group is about to consume a message (``SubBefore``); ``request_id`` ties it to
    its :class:`SubAfterRecord`, ``retry_times`` is the message's reconsume times."""

    type: ClassVar[TraceType] = TraceType.SubBefore
    timestamp_ms: int
    region_id: str
    group_name: str
    request_id: str
    msg_id: str
    retry_times: int = 0
    keys: str = ""


class SubAfterRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A consumer group consumed a message (``SubAfter``): ``cost_time_ms`` per message of the
    call, ``success`` (the listener said CONSUME_SUCCESS), ``context_code`` a
    :class:`ConsumeReturnType`. ``timestamp_ms`` 0 and ``group_name`` "" when the writer left them
    out (access channel CLOUD, the C++ client)."""

    type: ClassVar[TraceType] = TraceType.SubAfter
    request_id: str
    msg_id: str
    cost_time_ms: int = 0
    success: bool = True
    keys: str = ""
    context_code: int = 0
    timestamp_ms: int = 0
    group_name: str = ""


class EndTransactionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A transaction producer ended a half message (``EndTransaction``): ``transaction_state`` one
    of :data:`TRANSACTION_STATES`, ``from_transaction_check`` when it answered a check-back."""

    type: ClassVar[TraceType] = TraceType.EndTransaction
    timestamp_ms: int
    region_id: str
    group_name: str
    topic: str
    msg_id: str
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    msg_type: TraceMessageType = TraceMessageType.Trans_msg_Commit
    transaction_id: str = ""
    transaction_state: str = "UNKNOW"
    from_transaction_check: bool = False


class RecallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A producer recalled a delay message (``Recall``, RocketMQ 5.3)."""

    type: ClassVar[TraceType] = TraceType.Recall
    timestamp_ms: int
    region_id: str
    group_name: str
    topic: str
    msg_id: str
    success: bool = True


TraceRecord = PubRecord | SubBeforeRecord | SubAfterRecord | EndTransactionRecord | RecallRecord
"""One record of a trace message (RocketMQ ``TraceContext`` with its ``TraceBean``)."""


class TraceBatch(msgspec.Struct, frozen=True):
    """One trace message to send: its body (records, UTF-8) and its keys (RocketMQ
    ``TraceTransferBean``: the traced messages' ids and keys)."""

    body: bytes
    keys: list[str]


def is_trace_topic(topic: str) -> bool:
    """Whether ``topic`` is a trace topic by name: :data:`RMQ_SYS_TRACE_TOPIC` or a region's
    ``rmq_sys_TRACE_DATA_<region>``. Never raises."""
    return topic == RMQ_SYS_TRACE_TOPIC or topic.startswith(TRACE_TOPIC_PREFIX)


# -- writing --------------------------------------------------------------------------------------
def _text(value: str) -> str:
    """A string field as Java writes it: "" (a null tags or keys) as ``null``."""
    return value or _JAVA_NULL


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _fields(r: TraceRecord) -> list[str]:
    if isinstance(r, PubRecord):
        out = ["Pub", str(r.timestamp_ms), r.region_id, r.group_name, r.topic, r.msg_id,
               _text(r.tags), _text(r.keys), r.store_host, str(r.body_length), str(r.cost_time_ms),
               str(int(r.msg_type)), r.offset_msg_id, _bool(r.success)]
        return [*out, r.client_host] if r.client_host else out
    if isinstance(r, SubBeforeRecord):
        return ["SubBefore", str(r.timestamp_ms), r.region_id, r.group_name, r.request_id, r.msg_id,
                str(r.retry_times), _text(r.keys)]
    if isinstance(r, SubAfterRecord):
        return ["SubAfter", r.request_id, r.msg_id, str(r.cost_time_ms), _bool(r.success),
                _text(r.keys), str(r.context_code), str(r.timestamp_ms), r.group_name]
    if isinstance(r, EndTransactionRecord):
        return ["EndTransaction", str(r.timestamp_ms), r.region_id, r.group_name, r.topic, r.msg_id,
                _text(r.tags), _text(r.keys), r.store_host, str(int(r.msg_type)), r.transaction_id,
                r.transaction_state, _bool(r.from_transaction_check)]
    return ["Recall", str(r.timestamp_ms), r.region_id, r.group_name, r.topic, r.msg_id,
            _bool(r.success)]


def encode_trace_record(r: TraceRecord) -> str:
    """One record as RocketMQ's ``TraceDataEncoder.encoderFromContextBean`` writes it, ending with
    FIELD_SPLITOR.

    Raises:
        MalformedMessage: a field holds CONTENT_SPLITOR or FIELD_SPLITOR (the record would not
            read back), or ``transaction_state`` is not one of :data:`TRANSACTION_STATES`.
    """
    fields = _fields(r)
    for f in fields:
        if CONTENT_SPLITOR in f or FIELD_SPLITOR in f:
            raise MalformedMessage(f"{r.type} trace record field {f[:40]!r} holds a trace separator")
    if isinstance(r, EndTransactionRecord) and r.transaction_state not in TRANSACTION_STATES:
        raise MalformedMessage(f"transaction state {r.transaction_state!r} is not one of "
                               f"{', '.join(TRANSACTION_STATES)}")
    return CONTENT_SPLITOR.join(fields) + FIELD_SPLITOR


def trace_keys(r: TraceRecord) -> list[str]:
    """The keys a trace message carries for ``r``: its message id, then its keys (RocketMQ
    ``TraceTransferBean.transKey``), without empties."""
    keys = "" if isinstance(r, RecallRecord) else r.keys
    return [k for k in (r.msg_id, *keys.split(_KEY_SEPARATOR)) if k]


def trace_batches(records: Iterable[TraceRecord], *,
                  max_msg_size: int = limits.TRACE_MSG_SIZE_MAX_BYTES,
                  keys_max_chars: int = limits.PROPERTY_VALUE_MAX_CHARS) -> list[TraceBatch]:
    """Records as trace messages (RocketMQ ``AsyncTraceDispatcher.flushData``): bodies
    concatenated, a message cut once its body reaches ``max_msg_size`` bytes (so one may exceed it
    by its last record, as in RocketMQ), or (txmq) before its space-separated keys would pass
    ``keys_max_chars``, the broker's limit of a property value. Keys are deduplicated in order.

    Raises:
        MalformedMessage: a record that cannot be written (:func:`encode_trace_record`).
    """
    out: list[TraceBatch] = []
    body: list[bytes] = []
    keys: dict[str, None] = {}
    size = key_chars = 0
    for r in records:
        data = encode_trace_record(r).encode()
        new = [k for k in dict.fromkeys(trace_keys(r)) if k not in keys]
        extra = sum(len(k) + 1 for k in new)
        if body and key_chars + extra > keys_max_chars:
            out.append(TraceBatch(b"".join(body), list(keys)))
            body, keys, size, key_chars = [], {}, 0, 0
            new = list(dict.fromkeys(trace_keys(r)))
            extra = sum(len(k) + 1 for k in new)
        body.append(data)
        keys.update(dict.fromkeys(new))
        size += len(data)
        key_chars += extra
        if size >= max_msg_size:
            out.append(TraceBatch(b"".join(body), list(keys)))
            body, keys, size, key_chars = [], {}, 0, 0
    if body:
        out.append(TraceBatch(b"".join(body), list(keys)))
    return out


# -- reading --------------------------------------------------------------------------------------
def split_trace_records(data: bytes | str) -> list[str]:
    """A trace message body as its record texts (empty ones dropped). Bytes are read as UTF-8,
    malformed sequences replaced (as Java's ``new String(body, UTF_8)``). Never raises."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    return [r for r in text.split(FIELD_SPLITOR) if r]


def _int(line: list[str], i: int, what: str, bounds: tuple[int, int] = _INT32) -> int:
    s = line[i]
    if not _INT.fullmatch(s) or not bounds[0] <= int(s) <= bounds[1]:
        raise MalformedMessage(f"{line[0]} trace record: {what} {s[:40]!r} is not an integer "
                               f"in {bounds[0]}..{bounds[1]}")
    return int(s)


def _flag(s: str) -> bool:
    """Java ``Boolean.parseBoolean``: "true" in any case, anything else false."""
    return s.lower() == "true"


def _opt(s: str) -> str:
    return "" if s == _JAVA_NULL else s


def _msg_type(line: list[str], i: int) -> TraceMessageType:
    n = _int(line, i, "msgType")
    if n not in TraceMessageType._value2member_map_:
        raise MalformedMessage(f"{line[0]} trace record: msgType {n} is not a MessageType ordinal 0..4")
    return TraceMessageType(n)


def _need(line: list[str], n: int) -> None:
    if len(line) < n:
        raise MalformedMessage(f"{line[0]} trace record has {len(line)} fields, needs at least {n}")


def _pub(line: list[str]) -> PubRecord:
    _need(line, 12)
    n = len(line)
    return PubRecord(
        timestamp_ms=_int(line, 1, "timestamp", _INT64), region_id=line[2], group_name=line[3],
        topic=line[4], msg_id=line[5], tags=_opt(line[6]), keys=_opt(line[7]), store_host=line[8],
        body_length=_int(line, 9, "bodyLength"), cost_time_ms=_int(line, 10, "costTime"),
        msg_type=_msg_type(line, 11), offset_msg_id=line[12] if n >= 14 else "",
        success=_flag(line[13] if n >= 14 else line[12]) if n >= 13 else True,
        client_host=line[14] if n >= 15 else "")


def _sub_before(line: list[str]) -> SubBeforeRecord:
    _need(line, 7)
    return SubBeforeRecord(
        timestamp_ms=_int(line, 1, "timestamp", _INT64), region_id=line[2], group_name=line[3],
        request_id=line[4], msg_id=line[5], retry_times=_int(line, 6, "retryTimes"),
        keys=_opt(line[7]) if len(line) > 7 else "")


def _sub_after(line: list[str]) -> SubAfterRecord:
    _need(line, 6)
    n = len(line)
    return SubAfterRecord(
        request_id=line[1], msg_id=line[2], cost_time_ms=_int(line, 3, "costTime"),
        success=_flag(line[4]), keys=_opt(line[5]),
        context_code=_int(line, 6, "contextCode") if n >= 7 else 0,
        timestamp_ms=_int(line, 7, "timestamp", _INT64) if n >= 9 else 0,
        group_name=line[8] if n >= 9 else "")


def _end_transaction(line: list[str]) -> EndTransactionRecord:
    _need(line, 13)
    if line[11] not in TRANSACTION_STATES:
        raise MalformedMessage(f"EndTransaction trace record: transactionState {line[11][:40]!r} is "
                               f"not one of {', '.join(TRANSACTION_STATES)}")
    return EndTransactionRecord(
        timestamp_ms=_int(line, 1, "timestamp", _INT64), region_id=line[2], group_name=line[3],
        topic=line[4], msg_id=line[5], tags=_opt(line[6]), keys=_opt(line[7]), store_host=line[8],
        msg_type=_msg_type(line, 9), transaction_id=line[10], transaction_state=line[11],
        from_transaction_check=_flag(line[12]))


def _recall(line: list[str]) -> RecallRecord:
    _need(line, 7)
    return RecallRecord(timestamp_ms=_int(line, 1, "timestamp", _INT64), region_id=line[2],
                        group_name=line[3], topic=line[4], msg_id=line[5], success=_flag(line[6]))


_READERS: dict[str, Callable[[list[str]], TraceRecord]] = {
    "Pub": _pub, "SubBefore": _sub_before, "SubAfter": _sub_after,
    "EndTransaction": _end_transaction, "Recall": _recall}


def decode_trace_record(text: str) -> TraceRecord | None:
    """One record's text (without its FIELD_SPLITOR), read as RocketMQ's
    ``TraceDataEncoder.decoderFromTraceDataString`` reads it (see the module docstring); None for a
    record of an unknown type (Java skips it).

    Raises:
        MalformedMessage: too few fields for its type, an integer field that is not a Java ``int``
            (``long`` for timestamps), a msgType that is no ``MessageType`` ordinal, a
            transactionState that is no ``LocalTransactionState``.
    """
    line = text.split(CONTENT_SPLITOR)
    reader = _READERS.get(line[0])
    return None if reader is None else reader(line)


def decode_trace_records(data: bytes | str) -> list[TraceRecord]:
    """Every record of a trace message body, in order (records of unknown types skipped).

    Raises:
        MalformedMessage: the first record that does not read (:func:`decode_trace_record`).
    """
    out = []
    for text in split_trace_records(data):
        r = decode_trace_record(text)
        if r is not None:
            out.append(r)
    return out
