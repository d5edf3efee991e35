"""Messages as they travel: what a producer sends and what a consumer receives.

Property names are RocketMQ's ``MessageConst`` values, so a RocketMQ user recognises them.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS",
    "PROPERTY_DELAY_TIME_LEVEL",
    "PROPERTY_MAX_RECONSUME_TIMES",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_TRANSACTION_CHECK_TIMES",
    "PROPERTY_TRANSACTION_ID",
    "PROPERTY_TRANSACTION_PREPARED",
    "PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET",
    "PROPERTY_TXMQ_OUTCOME",
    "PROPERTY_TXMQ_RESUMED_FROM",
    "PROPERTY_TXMQ_SENDER_CLIENT_ID",
    "PROPERTY_UNIQ_KEY",
    "SYSTEM_PROPERTIES",
    "Message",
    "MessageExt",
    "decode_message_ext",
    "decode_messages",
    "encode_message_ext",
    "encode_messages",
]

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_TXMQ_SENDER_CLIENT_ID = "TXMQ_SENDER_CLIENT_ID"
"""txmq: client id of the producer that sent a half message (check-back goes there first)."""
PROPERTY_TXMQ_OUTCOME = "TXMQ_OUTCOME"
"""txmq: on an op message, the decided outcome (COMMIT, ROLLBACK, DISCARD)."""
PROPERTY_TXMQ_RESUMED_FROM = "TXMQ_RESUMED_FROM"
"""txmq: on a half message put back by an operator, the half offset it was discarded at."""

SYSTEM_PROPERTIES = frozenset(
    {
        PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP, PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID, PROPERTY_UNIQ_KEY, PROPERTY_TRANSACTION_ID,
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_TRANSACTION_CHECK_TIMES,
        PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_TXMQ_SENDER_CLIENT_ID, PROPERTY_TXMQ_OUTCOME,
        PROPERTY_TXMQ_RESUMED_FROM,
    }
)
"""Properties the client and broker set; user code may read but should not set them."""


class Message(msgspec.Struct, kw_only=True):
    """A message to send.

    Attributes:
        topic: destination topic.
        body: payload bytes (at most the broker's ``max_message_size``, default 4 MiB).
        tags: one filter tag (RocketMQ ``TAGS``), may be empty.
        keys: lookup keys separated by spaces (RocketMQ ``KEYS``), may be empty.
        properties: user and system string properties.
    """

    topic: str
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def msg_id(self) -> str:
        """The client message id (``UNIQ_KEY``), or "" before it is sent."""
        return self.properties.get(PROPERTY_UNIQ_KEY, "")


class MessageExt(Message, kw_only=True):
    """A stored message as a consumer (or a check-back) receives it.

    Attributes:
        queue_id: the message queue within the topic.
        queue_offset: logical position in the consume queue (0-based, dense).
        commit_log_offset: byte position of the record in the commit log.
        born_timestamp_ms: producer's wall clock at send, ms since the epoch.
        store_timestamp_ms: broker's wall clock at store, ms since the epoch.
        reconsume_times: how many times the message has been retried.
        born_host: ``ip:port`` of the connection the message was sent over ("" if unknown).
        store_host: ``ip:port`` of the broker that stored it.
    """

    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    reconsume_times: int = 0
    born_host: str = ""
    store_host: str = ""


_enc = msgspec.msgpack.Encoder()
_dec_ext = msgspec.msgpack.Decoder(MessageExt)
_dec_ext_list = msgspec.msgpack.Decoder(list[MessageExt])
_dec_list = msgspec.msgpack.Decoder(list[Message])


def encode_message_ext(msg: MessageExt) -> bytes:
    """msgpack-encode one stored message (check-back bodies)."""
    return _enc.encode(msg)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes) -> Any:
    try:
        return decoder.decode(data)
    except UnicodeDecodeError as exc:  # msgspec's error for a str that is not UTF-8 (txmq fuzz)
        raise msgspec.DecodeError(f"invalid UTF-8: {exc}") from exc


def decode_message_ext(data: bytes) -> MessageExt:
    """Decode :func:`encode_message_ext` output. Raises ``msgspec.DecodeError`` on bad input
    (``msgspec.ValidationError``, a subclass, when a field has the wrong type)."""
    return _decode(_dec_ext, data)  # type: ignore[no-any-return]


def encode_messages(msgs: list[MessageExt] | list[Message]) -> bytes:
    """msgpack-encode a list of messages (pull responses, batch sends)."""
    return _enc.encode(msgs)


def decode_messages(data: bytes, *, ext: bool = True) -> list[MessageExt] | list[Message]:
    """Decode a list of messages; ``ext`` selects :class:`MessageExt` or :class:`Message`.
    Raises ``msgspec.DecodeError`` (or its subclass ``msgspec.ValidationError``) on bad input."""
    return _decode(_dec_ext_list if ext else _dec_list, data)  # type: ignore[no-any-return]
