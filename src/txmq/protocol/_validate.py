"""Validation at the door: RocketMQ's rules for names, properties and numbers, or stricter.

Every request the broker handles passes what it names through these pure functions before anything
is stored, so nothing a client sends becomes a file path (a topic is a consume queue directory) or
a property the broker later trusts without passing here. Each raises
:class:`~txmq.errors.InvalidRequest` carrying the RocketMQ response code to answer with:

- ``MESSAGE_ILLEGAL`` (13): an illegal name, property, queue id, offset or timestamp
  (RocketMQ ``SendMessageProcessor``/``AbstractSendMessageProcessor.msgCheck``);
- ``NO_PERMISSION`` (16): a write to a topic only the broker writes, or a property only the broker
  sets (RocketMQ ``TopicValidator.isNotAllowedSendTopic``);
- ``INVALID_PARAMETER`` (2000, txmq): a value that does not parse (``DELAY=abc``).

Names follow RocketMQ ``TopicValidator``: ``^[%|a-zA-Z0-9_-]+$`` and at most
``TOPIC_NAME_MAX_CHARS`` (127) characters. The charset has no ``.``, ``/`` or ``@``, so ``.`` and
``..`` are not names, and a topic never leaves the consume queue directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from txmq import limits
from txmq.errors import InvalidRequest, ResponseCode
from txmq.protocol._message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_RESUMED_FROM,
    PROPERTY_TXMQ_SENDER_CLIENT_ID,
)
from txmq.protocol._msg_trace import TRACE_TOPIC_PREFIX
from txmq.protocol._parked import PARK_PROPERTY_NAMES
from txmq.protocol._topics import (
    HALF_TOPIC,
    OP_TOPIC,
    SCHEDULE_TOPIC,
    SINK_BATCH_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)

__all__ = [
    "BROKER_ONLY_PROPERTIES",
    "BROKER_TOPICS",
    "check_group",
    "check_offset",
    "check_properties",
    "check_queue_id",
    "check_send_properties",
    "check_send_topic",
    "check_timestamp",
    "check_topic",
    "delay_level",
    "is_broker_topic",
    "is_valid_topic",
    "parse_int",
]

_NAME = re.compile(r"[%|a-zA-Z0-9_-]+", re.ASCII)
"""RocketMQ ``TopicValidator`` ``VALID_CHAR_BIT_MAP``: ``^[%|a-zA-Z0-9_-]+$`` (topics and groups)."""
assert not _NAME.fullmatch(".") and not _NAME.fullmatch("..") and not _NAME.fullmatch("a/b")

BROKER_TOPICS = frozenset({
    SCHEDULE_TOPIC, "SCHEDULE_TOPIC_XXXX_V2", HALF_TOPIC, OP_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", SINK_BATCH_TOPIC,
})
"""Topics only the broker writes: RocketMQ ``TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET`` and txmq's
Spark sink batch marker topic. Topics starting with ``rmq_sys_`` (RocketMQ ``SYSTEM_TOPIC_PREFIX``)
or ``TXMQ_SYS_`` (txmq's prefix for later system topics) are reserved too. Clients may read them
(``txmq tx``, the tests), not send to or create them. A region's trace topic
``rmq_sys_TRACE_DATA_<region>`` is not reserved: clients write message trace records there
(RocketMQ ``TraceConstants.TRACE_TOPIC_PREFIX``; docs/tracing.md)."""
_BROKER_TOPIC_PREFIXES = ("rmq_sys_", "TXMQ_SYS_")

BROKER_ONLY_PROPERTIES = frozenset({
    PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_TRANSACTION_CHECK_TIMES, PROPERTY_TXMQ_SENDER_CLIENT_ID, PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_RESUMED_FROM, "TXMQ_HALF_OFFSET", "TXMQ_OPERATOR", "TXMQ_REASON",
    *PARK_PROPERTY_NAMES,
})
"""Properties the broker sets on the records it writes (half, op, schedule, discard, committed
copies) and trusts on recovery. A client that sends one is refused with NO_PERMISSION. (The
client-settable ones are ``TRAN_MSG``, ``PGROUP``, ``DELAY``, ``UNIQ_KEY``, ``KEYS``, ``TAGS``,
``CHECK_IMMUNITY_TIME_IN_SECONDS``, ``RETRY_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``RECONSUME_TIME``,
``MAX_RECONSUME_TIMES``, ``__transactionId__``, the Spark sink's ``TXMQ_SINK_BATCH`` /
``TXMQ_SINK_TASK`` and user properties.)"""

_SINK_PROPERTIES = ("TXMQ_SINK_BATCH", "TXMQ_SINK_TASK")
_NAME_VALUE_SEPARATOR = "\u0001"
"""RocketMQ ``MessageDecoder.NAME_VALUE_SEPARATOR``."""
_PROPERTY_SEPARATOR = "\u0002"
"""RocketMQ ``MessageDecoder.PROPERTY_SEPARATOR``."""
_BAD_IN_KEY = re.compile("[\u0001\u0002\u0000\n\r]")
_BAD_IN_VALUE = re.compile("[\u0001\u0002]")
_INT = re.compile(r"-?[0-9]{1,19}", re.ASCII)
_INT32_MAX = 2**31 - 1


def _illegal(remark: str) -> InvalidRequest:
    return InvalidRequest(ResponseCode.MESSAGE_ILLEGAL, remark)


def is_valid_topic(topic: object) -> bool:
    """Whether ``topic`` is a legal topic name (charset and length); never raises."""
    return (isinstance(topic, str) and 0 < len(topic) <= limits.TOPIC_NAME_MAX_CHARS
            and _NAME.fullmatch(topic) is not None)


_PASSED: dict[str, set[str]] = {"topic": set(), "send topic": set(), "group": set()}
"""Names that passed a check, per check: every send names a topic and a group, and a few names
recur, so the regex runs once per name (at most ``VALIDATION_CACHE_NAMES_MAX`` remembered each)."""
_PROPERTY_NAME_BYTES: dict[str, int] = {}
"""Property names that passed :func:`check_properties` → their UTF-8 length (same bound)."""


def _remember(kind: str, name: str) -> None:
    seen = _PASSED[kind]
    if len(seen) < limits.VALIDATION_CACHE_NAMES_MAX:
        seen.add(name)


def check_topic(topic: str) -> str:
    """Return ``topic`` if it is a legal topic name. Raises InvalidRequest (MESSAGE_ILLEGAL)."""
    if topic in _PASSED["topic"]:
        return topic
    if not is_valid_topic(topic):
        raise _illegal(f"illegal topic name {topic[:160]!r}: need 1..{limits.TOPIC_NAME_MAX_CHARS} "
                       f"characters of [%|a-zA-Z0-9_-]")
    _remember("topic", topic)
    return topic


def is_broker_topic(topic: str) -> bool:
    """Whether only the broker writes ``topic`` (:data:`BROKER_TOPICS` and reserved prefixes,
    but not a region's trace topic)."""
    return topic in BROKER_TOPICS or (topic.startswith(_BROKER_TOPIC_PREFIXES)
                                      and not topic.startswith(TRACE_TOPIC_PREFIX))


def check_send_topic(topic: str) -> str:
    """Return ``topic`` if a client may send to (or create) it. Raises InvalidRequest:
    MESSAGE_ILLEGAL for an illegal name, NO_PERMISSION for a broker topic (RocketMQ
    ``TopicValidator.isNotAllowedSendTopic``)."""
    if topic in _PASSED["send topic"]:
        return topic
    check_topic(topic)
    if is_broker_topic(topic):
        raise InvalidRequest(ResponseCode.NO_PERMISSION,
                             f"sending to or creating topic {topic!r} is forbidden: only the broker "
                             f"writes it")
    _remember("send topic", topic)
    return topic


def check_group(group: str) -> str:
    """Return ``group`` if it is a legal producer or consumer group name: the topic charset and at
    most ``GROUP_NAME_MAX_CHARS`` (120), so its retry and DLQ topics are legal topics. Raises
    InvalidRequest (MESSAGE_ILLEGAL)."""
    if group in _PASSED["group"]:
        return group
    if not (isinstance(group, str) and 0 < len(group) <= limits.GROUP_NAME_MAX_CHARS
            and _NAME.fullmatch(group)):
        raise _illegal(f"illegal group name {str(group)[:160]!r}: need "
                       f"1..{limits.GROUP_NAME_MAX_CHARS} characters of [%|a-zA-Z0-9_-]")
    _remember("group", group)
    return group


def check_queue_id(queue_id: int, queue_nums: int, topic: str) -> int:
    """Return ``queue_id`` if it is in ``0 .. queue_nums - 1``. Raises InvalidRequest
    (MESSAGE_ILLEGAL)."""
    if not 0 <= queue_id < queue_nums:
        raise _illegal(f"queue {queue_id} not in topic {topic!r} (queues 0..{queue_nums - 1})")
    return queue_id


def check_offset(offset: int, what: str = "offset", *, none_ok: bool = False) -> int:
    """Return ``offset`` if it is ``>= 0`` (or -1 with ``none_ok``, where -1 means "none").
    Raises InvalidRequest (MESSAGE_ILLEGAL)."""
    if not (offset >= 0 or (none_ok and offset == -1)) or offset > limits.TIMESTAMP_MAX_MS:
        raise _illegal(f"{what} {offset} out of range")
    return offset


def check_timestamp(ms: int, what: str = "timestamp", *, none_ok: bool = False) -> int:
    """Return ``ms`` if it is in ``0 .. TIMESTAMP_MAX_MS`` (or -1 with ``none_ok``). Raises
    InvalidRequest (MESSAGE_ILLEGAL)."""
    if not (0 <= ms <= limits.TIMESTAMP_MAX_MS or (none_ok and ms == -1)):
        raise _illegal(f"{what} {ms} ms out of range 0..{limits.TIMESTAMP_MAX_MS}")
    return ms


def parse_int(value: object, what: str, lo: int, hi: int) -> int:
    """``value`` (a decimal string or an int) as an int in ``lo .. hi``. Raises InvalidRequest:
    INVALID_PARAMETER when it does not parse, MESSAGE_ILLEGAL when out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidRequest(ResponseCode.INVALID_PARAMETER, f"{what} must be an integer")
    if isinstance(value, str):
        if not _INT.fullmatch(value):
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER,
                                 f"{what} {value[:40]!r} is not an integer")
        value = int(value)
    if not lo <= value <= hi:
        raise _illegal(f"{what} {value} not in {lo}..{hi}")
    return value


def check_properties(props: Mapping[str, str]) -> int:
    """Check keys and values of message properties; return their encoded size in bytes.

    Keys are non-empty, at most ``PROPERTY_KEY_MAX_CHARS`` and free of RocketMQ's separators
    (``\\u0001``, ``\\u0002``), NUL and line breaks; values at most ``PROPERTY_VALUE_MAX_CHARS``
    and free of the separators; all of them together at most ``PROPERTIES_MAX_BYTES`` as
    RocketMQ's ``MessageDecoder.messageProperties2String`` encodes them. Raises InvalidRequest
    (MESSAGE_ILLEGAL).

    Every send pays for this: property names recur, so each is checked once and remembered, and
    the values are checked with one search over all of them (the culprit is named afterwards).
    """
    total = 2 * len(props)
    for k in props:
        n = _PROPERTY_NAME_BYTES.get(k)
        total += n if n is not None else _check_property_name(k)
    try:
        values = "".join(props.values())
    except TypeError:
        raise _illegal("property values must be strings") from None
    if _BAD_IN_VALUE.search(values) or (len(values) > limits.PROPERTY_VALUE_MAX_CHARS and max(
            map(len, props.values())) > limits.PROPERTY_VALUE_MAX_CHARS):
        _name_bad_value(props)
    total += len(values) if values.isascii() else len(values.encode())
    if total > limits.PROPERTIES_MAX_BYTES:
        raise _illegal(f"properties exceed {limits.PROPERTIES_MAX_BYTES} bytes")
    return total


def _check_property_name(k: object) -> int:
    """The UTF-8 length of a legal property name (remembered). Raises InvalidRequest."""
    if not isinstance(k, str):
        raise _illegal("property names must be strings")
    if not 0 < len(k) <= limits.PROPERTY_KEY_MAX_CHARS or _BAD_IN_KEY.search(k):
        raise _illegal(f"illegal property name {k[:80]!r}: 1..{limits.PROPERTY_KEY_MAX_CHARS} "
                       f"characters without separators, NUL or line breaks")
    n = len(k.encode())
    if len(_PROPERTY_NAME_BYTES) < limits.VALIDATION_CACHE_NAMES_MAX:
        _PROPERTY_NAME_BYTES[k] = n
    return n


def _name_bad_value(props: Mapping[str, str]) -> None:
    """Raise the InvalidRequest that names the first property with a bad value."""
    for k, v in props.items():
        if len(v) > limits.PROPERTY_VALUE_MAX_CHARS or _BAD_IN_VALUE.search(v):
            raise _illegal(f"illegal value of property {k[:80]!r}: at most "
                           f"{limits.PROPERTY_VALUE_MAX_CHARS} characters without \\u0001/\\u0002")
    raise AssertionError("a property value was found bad, then not")


def delay_level(props: Mapping[str, str]) -> int:
    """The ``DELAY`` level of a client's message (0: none). A level above the broker's highest is
    kept and later clamped to it, as RocketMQ clamps to ``maxDelayLevel``. Raises InvalidRequest:
    INVALID_PARAMETER when it does not parse, MESSAGE_ILLEGAL when negative or above int32."""
    raw = props.get(PROPERTY_DELAY_TIME_LEVEL, "")
    return 0 if raw == "" else parse_int(raw, "delay level (DELAY)", 0, _INT32_MAX)


_NOTHING_SPECIAL_IN = frozenset({
    *BROKER_ONLY_PROPERTIES, *_SINK_PROPERTIES, PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_RECONSUME_TIME,
    PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_PRODUCER_GROUP, PROPERTY_RETRY_TOPIC,
}).isdisjoint
"""Whether a message's properties include none that :func:`check_send_properties` looks into."""


def check_send_properties(props: Mapping[str, str]) -> bool:
    """Check the properties of a message a client sends; return whether it is a half message.

    On top of :func:`check_properties`: no broker-only property (NO_PERMISSION), ``TRAN_MSG`` is
    ``true`` or ``false``, ``DELAY``, ``CHECK_IMMUNITY_TIME_IN_SECONDS`` (``0 ..
    CHECK_IMMUNITY_TIME_MAX_S``), ``RECONSUME_TIME`` and ``MAX_RECONSUME_TIMES`` parse as
    integers in range, ``PGROUP`` is a legal group and ``RETRY_TOPIC`` a legal topic, and the
    Spark sink's batch properties come only on half messages. A half message's real topic and
    queue are the request's own, checked by the caller. Raises InvalidRequest.
    """
    check_properties(props)
    if _NOTHING_SPECIAL_IN(props):  # the common plain send: no property with a rule of its own
        return False
    forbidden = BROKER_ONLY_PROPERTIES.intersection(props)
    if forbidden:
        raise InvalidRequest(ResponseCode.NO_PERMISSION,
                             f"properties {sorted(forbidden)} are set by the broker only")
    half = props.get(PROPERTY_TRANSACTION_PREPARED, "false")
    if half not in ("true", "false"):
        raise InvalidRequest(ResponseCode.INVALID_PARAMETER,
                             f"TRAN_MSG must be true or false, not {half[:40]!r}")
    delay_level(props)
    if PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS in props:
        parse_int(props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS], "CHECK_IMMUNITY_TIME_IN_SECONDS",
                  0, limits.CHECK_IMMUNITY_TIME_MAX_S)
    for name in (PROPERTY_RECONSUME_TIME, PROPERTY_MAX_RECONSUME_TIMES):
        if name in props:
            parse_int(props[name], name, -1, _INT32_MAX)
    if props.get(PROPERTY_PRODUCER_GROUP):
        check_group(props[PROPERTY_PRODUCER_GROUP])
    if props.get(PROPERTY_RETRY_TOPIC):
        check_topic(props[PROPERTY_RETRY_TOPIC])
    if half != "true" and any(p in props for p in _SINK_PROPERTIES):
        raise _illegal("TXMQ_SINK_BATCH / TXMQ_SINK_TASK belong on half messages only")
    return half == "true"
