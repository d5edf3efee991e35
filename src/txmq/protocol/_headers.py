"""Typed header fields of each request and response, carried in ``Command.ext``.

Field names follow RocketMQ's ``*RequestHeader`` classes in snake_case. :func:`to_ext` and
:func:`from_ext` convert between a header struct and the ``ext`` map; :func:`from_ext` raises
:class:`~txmq.errors.MalformedFrame` when a field is missing or of the wrong type.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from txmq.errors import MalformedFrame

__all__ = [
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "AdminEndTransactionRequestHeader",
    "CheckTransactionStateRequestHeader",
    "ConsumerData",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "EndTransactionRequestHeader",
    "EndTransactionResponseHeader",
    "GroupRequestHeader",
    "HeartbeatData",
    "OffsetRequestHeader",
    "PendingTransactionsRequestHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "QueueRequestHeader",
    "SendMessageRequestHeader",
    "SendMessageResponseHeader",
    "SinkBatchRequestHeader",
    "TopicRequestHeader",
    "TransactionIdRequestHeader",
    "from_ext",
    "to_ext",
]

# RocketMQ MessageSysFlag transaction bits, used as the END_TRANSACTION outcome.
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC

T = TypeVar("T", bound=msgspec.Struct)


def to_ext(header: msgspec.Struct) -> dict[str, object]:
    """The ``ext`` map of a header struct."""
    out = msgspec.to_builtins(header)
    assert isinstance(out, dict)
    return out


def from_ext(ext: dict[str, object], cls: type[T]) -> T:
    """Validate an ``ext`` map as header ``cls``. Raises MalformedFrame on a bad field."""
    try:
        return msgspec.convert(ext, cls)
    except msgspec.ValidationError as exc:
        raise MalformedFrame(f"bad {cls.__name__}: {exc}") from exc


class SendMessageRequestHeader(msgspec.Struct, kw_only=True):
    """SEND_MESSAGE (body = message body) and SEND_BATCH_MESSAGE (body = msgpack list)."""

    producer_group: str
    topic: str
    queue_id: int = -1
    tags: str = ""
    keys: str = ""
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    born_timestamp_ms: int = 0
    reconsume_times: int = 0


class SendMessageResponseHeader(msgspec.Struct, kw_only=True):
    """Where a sent message was stored (for a batch, the first message)."""

    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    transaction_id: str = ""
    count: int = 1


class PullMessageRequestHeader(msgspec.Struct, kw_only=True):
    """PULL_MESSAGE: read from ``queue_offset``; hold up to ``suspend_timeout_ms`` if empty."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int = 32
    suspend_timeout_ms: int = 0
    commit_offset: int = -1
    subscription: str = "*"


class PullMessageResponseHeader(msgspec.Struct, kw_only=True):
    """Where to pull next, and the queue's bounds."""

    next_begin_offset: int
    min_offset: int
    max_offset: int


class QueryMessageRequestHeader(msgspec.Struct, kw_only=True):
    """QUERY_MESSAGE: at most ``max_num`` durable messages of ``topic`` whose keys include ``key``,
    stored within ``[begin_timestamp_ms, end_timestamp_ms]`` (ms since the epoch), newest first.
    RocketMQ ``QueryMessageRequestHeader`` (topic, key, maxNum, beginTimestamp, endTimestamp)."""

    topic: str
    key: str
    max_num: int = 32
    begin_timestamp_ms: int = 0
    end_timestamp_ms: int = 2**63 - 1


class ViewMessageRequestHeader(msgspec.Struct, kw_only=True):
    """VIEW_MESSAGE_BY_ID: give ``msg_id`` (``UNIQ_KEY``: the message and its half, retry or DLQ
    copies, newest first) or ``offset`` (the commit log offset of one record)."""

    msg_id: str = ""
    offset: int = -1


class TopicRequestHeader(msgspec.Struct, kw_only=True):
    topic: str


class CreateTopicRequestHeader(msgspec.Struct, kw_only=True):
    topic: str
    queue_nums: int


class QueueRequestHeader(msgspec.Struct, kw_only=True):
    """GET_MIN_OFFSET / GET_MAX_OFFSET."""

    topic: str
    queue_id: int


class OffsetRequestHeader(msgspec.Struct, kw_only=True):
    """QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET (``commit_offset`` -1 when querying)."""

    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int = -1


class GroupRequestHeader(msgspec.Struct, kw_only=True):
    consumer_group: str


class ConsumerData(msgspec.Struct, kw_only=True):
    """One consumer group a client belongs to (heartbeat body)."""

    group: str
    message_model: str = "CLUSTERING"
    subscriptions: dict[str, str] = msgspec.field(default_factory=dict)


class HeartbeatData(msgspec.Struct, kw_only=True):
    """HEART_BEAT body: who the client is and which groups it belongs to."""

    client_id: str
    producer_groups: list[str] = msgspec.field(default_factory=list)
    consumer_groups: list[ConsumerData] = msgspec.field(default_factory=list)


class ConsumerSendMsgBackRequestHeader(msgspec.Struct, kw_only=True):
    """CONSUMER_SEND_MSG_BACK: put a message that failed to consume into the retry topic."""

    group: str
    commit_log_offset: int
    delay_level: int = 0
    origin_msg_id: str = ""
    origin_topic: str = ""
    max_reconsume_times: int = 16
    reconsume_times: int = -1
    """The consumer's own count when it retried locally (orderly mode); -1: use the stored one."""


class EndTransactionRequestHeader(msgspec.Struct, kw_only=True):
    """END_TRANSACTION: settle the half message at ``tran_state_table_offset``."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str = ""
    transaction_id: str = ""
    operator: str = ""
    reason: str = ""


class EndTransactionResponseHeader(msgspec.Struct, kw_only=True):
    """The transaction's recorded outcome; ``duplicate`` when it was decided before."""

    outcome: str
    duplicate: bool = False


class CheckTransactionStateRequestHeader(msgspec.Struct, kw_only=True):
    """CHECK_TRANSACTION_STATE (broker to producer); body = the half message, real topic restored."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str
    transaction_id: str
    producer_group: str


class TransactionIdRequestHeader(msgspec.Struct, kw_only=True):
    """Names a transaction by message id (``UNIQ_KEY``) or ``half:<offset>``."""

    id: str


class AdminEndTransactionRequestHeader(msgspec.Struct, kw_only=True):
    """ADMIN_END_TRANSACTION: an operator settles a pending transaction."""

    id: str
    outcome: str
    operator: str
    reason: str = ""


class PendingTransactionsRequestHeader(msgspec.Struct, kw_only=True):
    """GET_PENDING_TRANSACTIONS: list at most ``limit`` of the oldest pending half messages."""

    limit: int = 100


class SinkBatchRequestHeader(msgspec.Struct, kw_only=True):
    """COMMIT_SINK_BATCH / ABORT_SINK_BATCH: the sink's ``<sink id>/<batch id>`` and, to commit,
    the producer group its halves were sent with."""

    batch: str
    producer_group: str = ""
