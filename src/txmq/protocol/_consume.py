"""Headers and bodies of the consumption requests: offset search, orderly queue locks, group admin.

Request headers travel in ``Command.ext`` (see :func:`~txmq.protocol.to_ext`); list-shaped payloads
travel as msgpack bodies (:func:`encode_body` / :func:`decode_body`). Names follow RocketMQ's
``*RequestHeader`` / ``*Body`` classes in snake_case.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from txmq.errors import MalformedFrame

__all__ = [
    "ConsumeStatsRequestHeader",
    "ConsumerGroupInfo",
    "LockBatchRequestBody",
    "LockBatchResponseBody",
    "MessageQueue",
    "QueueConsumeStats",
    "ResetConsumerClientOffsetBody",
    "ResetOffsetEntry",
    "ResetOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "decode_body",
    "encode_body",
]

B = TypeVar("B")

_enc = msgspec.msgpack.Encoder()


def encode_body(value: object) -> bytes:
    """msgpack-encode a request or response body (structs, lists of structs)."""
    return _enc.encode(value)


def decode_body(data: bytes, cls: type[B]) -> B:
    """Decode a body as ``cls``. Raises MalformedFrame when it does not decode or validate."""
    try:
        return msgspec.msgpack.decode(data, type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        # msgspec raises UnicodeDecodeError for a str that is not UTF-8 (found by txmq fuzz)
        raise MalformedFrame(f"bad {getattr(cls, '__name__', cls)} body: {exc}") from exc


class MessageQueue(msgspec.Struct, frozen=True, array_like=True, order=True):
    """One queue of a topic (RocketMQ ``MessageQueue`` without the broker name: one broker)."""

    topic: str
    queue_id: int


class SearchOffsetRequestHeader(msgspec.Struct, kw_only=True):
    """SEARCH_OFFSET_BY_TIMESTAMP: the first offset of a queue stored at or after ``timestamp_ms``.

    The answer (``ext["offset"]``) is the queue's max offset when every message is older, and its
    min offset when every message is newer.
    """

    topic: str
    queue_id: int
    timestamp_ms: int


class LockBatchRequestBody(msgspec.Struct, kw_only=True):
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body: lock (or unlock) queues for ``client_id``."""

    consumer_group: str
    client_id: str
    mqs: list[MessageQueue]


class LockBatchResponseBody(msgspec.Struct, kw_only=True):
    """LOCK_BATCH_MQ response: the queues now locked by the requester (renewed or newly taken)."""

    locked: list[MessageQueue]


class ConsumerGroupInfo(msgspec.Struct, kw_only=True):
    """One row of GET_ALL_SUBSCRIPTIONGROUP_CONFIG.

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


class ConsumeStatsRequestHeader(msgspec.Struct, kw_only=True):
    """GET_CONSUME_STATS: per-queue progress of a group (all its topics when ``topic`` is "")."""

    consumer_group: str
    topic: str = ""


class QueueConsumeStats(msgspec.Struct, kw_only=True):
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


class ResetOffsetRequestHeader(msgspec.Struct, kw_only=True):
    """INVOKE_BROKER_TO_RESET_OFFSET: move a group's offsets of ``topic``.

    Exactly one of ``timestamp_ms`` (first message stored at or after it) and ``offset`` (clamped
    to each queue's bounds) is set (the other is -1). ``queue_id`` -1 means every queue.
    """

    consumer_group: str
    topic: str
    timestamp_ms: int = -1
    offset: int = -1
    queue_id: int = -1


class ResetOffsetEntry(msgspec.Struct, kw_only=True):
    """One queue of a reset: the offset before (-1 if none) and after."""

    queue_id: int
    old_offset: int
    new_offset: int


class ResetConsumerClientOffsetBody(msgspec.Struct, kw_only=True):
    """RESET_CONSUMER_CLIENT_OFFSET (broker to consumer): restart these queues at these offsets."""

    consumer_group: str
    topic: str
    offsets: dict[int, int]
