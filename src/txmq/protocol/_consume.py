"""Bodies of the client and consumption requests (JSON, as RocketMQ's ``RemotingSerializable``
writes them), and txmq's operator views.

RocketMQ's bodies keep RocketMQ's wire names (``HeartbeatData``, ``LockBatchRequestBody`` ...); the
txmq extension bodies (consumer groups, consume stats, offset reset) use the same camelCase
convention. :func:`encode_body` / :func:`decode_body` are the one JSON codec for every body.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from txmq.errors import MalformedHeader

__all__ = [
    "ConsumeStatsRequestHeader",
    "ConsumerData",
    "ConsumerGroupInfo",
    "GetConsumerListByGroupResponseBody",
    "HeartbeatData",
    "LockBatchRequestBody",
    "LockBatchResponseBody",
    "MessageQueue",
    "ProducerData",
    "QueueConsumeStats",
    "ResetConsumerClientOffsetBody",
    "ResetOffsetEntry",
    "ResetOffsetRequestHeader",
    "SubscriptionData",
    "UnlockBatchRequestBody",
    "decode_body",
    "encode_body",
]

B = TypeVar("B")

_enc = msgspec.json.Encoder()


def encode_body(value: object) -> bytes:
    """JSON-encode a request or response body (structs, lists of structs)."""
    return _enc.encode(value)


def decode_body(data: bytes, cls: type[B], *, strict: bool = False) -> B:
    """Decode a JSON body as ``cls``. Like fastjson, numbers written as strings are read as numbers
    (the C++ client writes ``subVersion`` so) unless ``strict``. Raises MalformedHeader when it
    does not decode or validate."""
    try:
        return msgspec.json.decode(data, type=cls, strict=strict)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise MalformedHeader(f"bad {getattr(cls, '__name__', cls)} body: {exc}") from exc


class _Body(msgspec.Struct, kw_only=True, rename="camel"):
    """Base of the JSON bodies: snake_case attributes, camelCase wire names."""


class MessageQueue(msgspec.Struct, frozen=True, order=True, rename="camel"):
    """One queue of a topic (RocketMQ ``MessageQueue``); ``broker_name`` is "" inside txmq, which
    is one broker, and whatever a client sent on the wire."""

    topic: str
    queue_id: int
    broker_name: str = ""


class ProducerData(_Body, kw_only=True):
    """RocketMQ ``ProducerData``: a producer group the client belongs to."""

    group_name: str


class SubscriptionData(_Body, kw_only=True):
    """RocketMQ ``SubscriptionData``: one topic a consumer group subscribes to, with its tag
    expression (``sub_string``, ``*`` for every tag) and ``sub_version`` (ms)."""

    class_filter_mode: bool = False
    topic: str
    sub_string: str = "*"
    tags_set: list[str] = msgspec.field(default_factory=list)
    code_set: list[int] = msgspec.field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"


_CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
_MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
_CONSUME_FROM = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                 "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                 "CONSUME_FROM_TIMESTAMP")


def _enum_name(value: str | int, names: tuple[str, ...]) -> str:
    if isinstance(value, str):
        return value
    return names[value] if 0 <= value < len(names) else str(value)


class ConsumerData(_Body, kw_only=True):
    """RocketMQ ``ConsumerData``: a consumer group the client belongs to.

    The enums are names (Java's fastjson), or ordinals as the C++ client writes them; they are
    read as names (``ConsumeType``, ``MessageModel``, ``ConsumeFromWhere`` in declaration order).
    """

    group_name: str
    consume_type: str | int = "CONSUME_PASSIVELY"
    message_model: str | int = "CLUSTERING"
    consume_from_where: str | int = "CONSUME_FROM_LAST_OFFSET"
    subscription_data_set: list[SubscriptionData] = msgspec.field(default_factory=list)
    unit_mode: bool = False

    def __post_init__(self) -> None:
        self.consume_type = _enum_name(self.consume_type, _CONSUME_TYPES)
        self.message_model = _enum_name(self.message_model, _MESSAGE_MODELS)
        self.consume_from_where = _enum_name(self.consume_from_where, _CONSUME_FROM)

    @property
    def subscriptions(self) -> dict[str, str]:
        """topic → tag expression."""
        return {s.topic: s.sub_string for s in self.subscription_data_set}


class HeartbeatData(_Body, kw_only=True):
    """HEART_BEAT (34) body, RocketMQ ``HeartbeatData``: who the client is and its groups."""

    client_id: str = msgspec.field(name="clientID")
    producer_data_set: list[ProducerData] = msgspec.field(default_factory=list)
    consumer_data_set: list[ConsumerData] = msgspec.field(default_factory=list)

    @property
    def producer_groups(self) -> list[str]:
        return [p.group_name for p in self.producer_data_set]


class GetConsumerListByGroupResponseBody(_Body, kw_only=True):
    """The answer of GET_CONSUMER_LIST_BY_GROUP (38)."""

    consumer_id_list: list[str]


class LockBatchRequestBody(_Body, kw_only=True):
    """LOCK_BATCH_MQ (41) body: lock queues for ``client_id`` (RocketMQ ``LockBatchRequestBody``)."""

    consumer_group: str
    client_id: str
    only_this_broker: bool = False
    mq_set: list[MessageQueue]


class UnlockBatchRequestBody(_Body, kw_only=True):
    """UNLOCK_BATCH_MQ (42) body (RocketMQ ``UnlockBatchRequestBody``)."""

    consumer_group: str
    client_id: str
    only_this_broker: bool = False
    mq_set: list[MessageQueue]


class LockBatchResponseBody(_Body, kw_only=True):
    """LOCK_BATCH_MQ answer: the queues now locked by the requester (renewed or newly taken)."""

    lock_ok_mq_set: list[MessageQueue] = msgspec.field(name="lockOKMQSet")


class ConsumerGroupInfo(_Body, kw_only=True):
    """One row of GET_CONSUMER_GROUPS.

    Attributes:
        group: consumer group name.
        message_model: ``CLUSTERING`` or ``BROADCASTING``; "" when no member is online.
        client_ids: online members.
        subscriptions: topic → tag expression, as the members declared them.
        offset_topics: topics for which the broker stores offsets of the group.
    """

    group: str
    message_model: str = ""
    client_ids: list[str] = msgspec.field(default_factory=list)
    subscriptions: dict[str, str] = msgspec.field(default_factory=dict)
    offset_topics: list[str] = msgspec.field(default_factory=list)


class ConsumeStatsRequestHeader(_Body, kw_only=True):
    """GET_CONSUME_STATS: per-queue progress of a group (all its topics when ``topic`` is "")."""

    consumer_group: str
    topic: str = ""


class QueueConsumeStats(_Body, kw_only=True):
    """Progress of one group on one queue; offsets are queue offsets.

    Attributes:
        broker_offset: next offset to be written (the queue's max offset).
        consumer_offset: the group's committed offset; -1 when none is stored.
        lag: messages from the committed offset (or the queue's min offset) to ``broker_offset``.
        locked_by: client id holding the orderly lock of this queue, or "".
    """

    topic: str
    queue_id: int
    min_offset: int
    broker_offset: int
    consumer_offset: int
    lag: int
    locked_by: str = ""


class ResetOffsetRequestHeader(_Body, kw_only=True):
    """RESET_OFFSET: move a group's offsets of ``topic``.

    Exactly one of ``timestamp_ms`` (first message stored at or after it) and ``offset`` (clamped
    to each queue's bounds) is set (the other is -1). ``queue_id`` -1 means every queue.
    """

    consumer_group: str
    topic: str
    timestamp_ms: int = -1
    offset: int = -1
    queue_id: int = -1


class ResetOffsetEntry(_Body, kw_only=True):
    """One queue of a reset: the offset before (-1 if none) and after."""

    queue_id: int
    old_offset: int
    new_offset: int


class ResetConsumerClientOffsetBody(_Body, kw_only=True):
    """RESET_CONSUMER_OFFSETS (broker to consumer): restart these queues at these offsets."""

    consumer_group: str
    topic: str
    offsets: dict[int, int]
