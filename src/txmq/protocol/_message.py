"""Messages as they travel: what a producer sends and what a consumer receives.

Property names are RocketMQ's ``MessageConst`` values, so a RocketMQ user recognises them. On the
wire (RocketMQ ``MessageDecoder``, see :mod:`txmq.protocol._message_codec`) tags and keys are the
properties ``TAGS`` and ``KEYS``; here they are fields of their own.
"""

from __future__ import annotations

import msgspec

from txmq.protocol._message_id import offset_msg_id

__all__ = [
    "OPERATOR_DECISION_KEY",
    "PROPERTY_BORN_HOST",
    "PROPERTY_BORN_TIMESTAMP",
    "PROPERTY_BUYER_ID",
    "PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS",
    "PROPERTY_CONSUME_START_TIMESTAMP",
    "PROPERTY_CORRECTION_FLAG",
    "PROPERTY_CORRELATION_ID",
    "PROPERTY_CRC32",
    "PROPERTY_DELAY_TIME_LEVEL",
    "PROPERTY_DLQ_ORIGIN_MESSAGE_ID",
    "PROPERTY_DLQ_ORIGIN_TOPIC",
    "PROPERTY_EXTEND_UNIQ_INFO",
    "PROPERTY_INNER_BASE",
    "PROPERTY_INNER_NUM",
    "PROPERTY_INSTANCE_ID",
    "PROPERTY_KEYS",
    "PROPERTY_MAX_OFFSET",
    "PROPERTY_MAX_RECONSUME_TIMES",
    "PROPERTY_MIN_OFFSET",
    "PROPERTY_MQ2_FLAG",
    "PROPERTY_MSG_REGION",
    "PROPERTY_ORIGIN_MESSAGE_ID",
    "PROPERTY_PRODUCER_GROUP",
    "PROPERTY_REAL_QUEUE_ID",
    "PROPERTY_REAL_TOPIC",
    "PROPERTY_RECONSUME_TIME",
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_SHARDING_KEY",
    "PROPERTY_START_DELIVER_TIME",
    "PROPERTY_TAGS",
    "PROPERTY_TIMER_DELAY_LEVEL",
    "PROPERTY_TIMER_DELAY_MS",
    "PROPERTY_TIMER_DELAY_SEC",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TIMER_DEL_UNIQKEY",
    "PROPERTY_TIMER_DEQUEUE_MS",
    "PROPERTY_TIMER_ENQUEUE_MS",
    "PROPERTY_TIMER_OUT_MS",
    "PROPERTY_TIMER_ROLL_TIMES",
    "PROPERTY_TRACE_SWITCH",
    "PROPERTY_TRANSACTION_CHECK_TIMES",
    "PROPERTY_TRANSACTION_ID",
    "PROPERTY_TRANSACTION_PREPARED",
    "PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET",
    "PROPERTY_TRANSFER_FLAG",
    "PROPERTY_TXMQ_DECIDED_BY",
    "PROPERTY_TXMQ_HALF_OFFSET",
    "PROPERTY_TXMQ_OPERATOR",
    "PROPERTY_TXMQ_OUTCOME",
    "PROPERTY_TXMQ_REASON",
    "PROPERTY_TXMQ_RESUMED_FROM",
    "PROPERTY_TXMQ_SENDER_CLIENT_ID",
    "PROPERTY_TXMQ_TX_ID",
    "PROPERTY_TXMQ_TX_TOPIC",
    "PROPERTY_UNIQ_KEY",
    "PROPERTY_WAIT_STORE_MSG_OK",
    "SYSTEM_PROPERTIES",
    "Message",
    "MessageExt",
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
PROPERTY_TXMQ_DECIDED_BY = "TXMQ_DECIDED_BY"
"""txmq: on an op message, who decided: ``producer``, ``check-back`` or ``operator``."""
PROPERTY_TXMQ_OPERATOR = "TXMQ_OPERATOR"
"""txmq: on an operator's op message, the operator's name."""
PROPERTY_TXMQ_REASON = "TXMQ_REASON"
"""txmq: on an operator's op message, the reason given."""
PROPERTY_TXMQ_TX_ID = "TXMQ_TX_ID"
"""txmq: on an operator's op message, the decided transaction's message id (UNIQ_KEY)."""
PROPERTY_TXMQ_TX_TOPIC = "TXMQ_TX_TOPIC"
"""txmq: on an operator's op message, the decided transaction's real topic."""
PROPERTY_TXMQ_HALF_OFFSET = "TXMQ_HALF_OFFSET"
"""txmq: on a discarded half message's copy, its half queue offset."""
OPERATOR_DECISION_KEY = "TXMQ_OPERATOR_DECISION"
"""txmq: a KEYS value of every operator decision's op message (the audit log's index key)."""

# RocketMQ MessageConst names txmq meets on the wire (the values are RocketMQ's).
PROPERTY_KEYS = "KEYS"
"""Lookup keys, separated by spaces (``MessageConst.KEY_SEPARATOR``); :attr:`Message.keys`."""
PROPERTY_TAGS = "TAGS"
"""The filter tag; :attr:`Message.tags`."""
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
"""``"true"``/``"false"``: whether the producer waits for the store (RocketMQ clients send "true")."""
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_BUYER_ID = "BUYER_ID"
PROPERTY_TRANSFER_FLAG = "TRANSFER_FLAG"
PROPERTY_CORRECTION_FLAG = "CORRECTION_FLAG"
PROPERTY_MQ2_FLAG = "MQ2_FLAG"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
PROPERTY_EXTEND_UNIQ_INFO = "EXTEND_UNIQ_INFO"
PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
PROPERTY_INNER_NUM = "INNER_NUM"
PROPERTY_INNER_BASE = "INNER_BASE"
PROPERTY_INSTANCE_ID = "INSTANCE_ID"
PROPERTY_CORRELATION_ID = "CORRELATION_ID"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
"""The sharding key of an orderly message (``MessageConst.PROPERTY_SHARDING_KEY``)."""
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"
"""Delivery time of a scheduled message, ms since the epoch. Not in ``MessageConst``: RocketMQ
``DefaultMQProducerImpl`` and the OpenMessaging ``RocketMQConstants.START_DELIVER_TIME`` name it."""
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TIMER_DELAY_LEVEL = "TIMER_DELAY_LEVEL"
PROPERTY_BORN_HOST = "__BORNHOST"
PROPERTY_BORN_TIMESTAMP = "BORN_TIMESTAMP"
PROPERTY_CRC32 = "__CRC32#"
"""A RocketMQ 5 broker with ``enabledAppendPropCRC`` appends it to stored properties."""
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"

SYSTEM_PROPERTIES = frozenset(
    {
        PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP, PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID, PROPERTY_UNIQ_KEY, PROPERTY_TRANSACTION_ID,
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_TRANSACTION_CHECK_TIMES,
        PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, PROPERTY_DELAY_TIME_LEVEL,
        PROPERTY_RETRY_TOPIC, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES, PROPERTY_TXMQ_SENDER_CLIENT_ID, PROPERTY_TXMQ_OUTCOME,
        PROPERTY_TXMQ_RESUMED_FROM,
        # RocketMQ MessageConst.STRING_HASH_SET (names Message.putUserProperty refuses)
        PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_MIN_OFFSET,
        PROPERTY_MAX_OFFSET, PROPERTY_BUYER_ID, PROPERTY_TRANSFER_FLAG, PROPERTY_CORRECTION_FLAG,
        PROPERTY_MQ2_FLAG, PROPERTY_MSG_REGION, PROPERTY_TRACE_SWITCH, PROPERTY_EXTEND_UNIQ_INFO,
        PROPERTY_CONSUME_START_TIMESTAMP, PROPERTY_INSTANCE_ID, PROPERTY_CORRELATION_ID,
        PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_MS,
        PROPERTY_TIMER_ENQUEUE_MS, PROPERTY_TIMER_DEQUEUE_MS, PROPERTY_TIMER_ROLL_TIMES,
        PROPERTY_TIMER_OUT_MS, PROPERTY_TIMER_DEL_UNIQKEY, PROPERTY_TIMER_DELAY_LEVEL,
        PROPERTY_BORN_HOST, PROPERTY_BORN_TIMESTAMP, PROPERTY_CRC32, PROPERTY_DLQ_ORIGIN_TOPIC,
        PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    }
)
"""Properties the client and broker set; user code may read but should not set them (txmq's own
and RocketMQ ``MessageConst.STRING_HASH_SET``)."""


class Message(msgspec.Struct, kw_only=True):
    """A message to send (RocketMQ ``Message``).

    Attributes:
        topic: destination topic.
        body: payload bytes (at most the broker's ``max_message_size``, default 4 MiB).
        tags: one filter tag (RocketMQ ``TAGS``), may be empty.
        keys: lookup keys separated by spaces (RocketMQ ``KEYS``), may be empty.
        properties: user and system string properties (without ``TAGS`` and ``KEYS``, which are
            the fields above).
        flag: the producer's free 32-bit integer (RocketMQ ``Message.flag``), stored and
            delivered unchanged.
    """

    topic: str
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    flag: int = 0

    @property
    def msg_id(self) -> str:
        """The client message id (``UNIQ_KEY``), or "" before it is sent."""
        return self.properties.get(PROPERTY_UNIQ_KEY, "")


class MessageExt(Message, kw_only=True):
    """A stored message as a consumer (or a check-back) receives it (RocketMQ ``MessageExt``).

    Hosts are ``"a.b.c.d:port"`` or ``"[v6 address]:port"``, ``""`` when unknown (see
    :mod:`txmq.protocol._message_id`).

    Attributes:
        queue_id: the message queue within the topic.
        queue_offset: logical position in the consume queue (0-based, dense).
        commit_log_offset: byte position of the record in the commit log.
        born_timestamp_ms: producer's wall clock at send, ms since the epoch.
        store_timestamp_ms: broker's wall clock at store, ms since the epoch.
        reconsume_times: how many times the message has been retried.
        born_host: ``ip:port`` of the connection the message was sent over ("" if unknown).
        store_host: ``ip:port`` of the broker that stored it.
        sys_flag: RocketMQ ``MessageSysFlag`` bits (transaction type, compression, IPv6 hosts);
            see :mod:`txmq.protocol._message_codec`.
        body_crc: CRC32 of the stored body, ``& 0x7FFFFFFF`` (``UtilAll.crc32``); filled in by
            the binary codec.
        prepared_transaction_offset: on a commit or rollback record, the commit log offset of its
            half message (RocketMQ ``preparedTransactionOffset``); 0 otherwise.
        store_size: bytes of the binary record (RocketMQ ``storeSize``); set on decode.
    """

    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    reconsume_times: int = 0
    born_host: str = ""
    store_host: str = ""
    sys_flag: int = 0
    body_crc: int = 0
    prepared_transaction_offset: int = 0
    store_size: int = 0

    @property
    def offset_msg_id(self) -> str:
        """The offset message id (store host + commit log offset, 32 or 56 upper hex; RocketMQ
        ``MessageDecoder.createMessageId``), or "" when the store host is unknown.

        Raises:
            MalformedMessage: ``store_host`` is not an IP literal with a port.
        """
        return offset_msg_id(self.store_host, self.commit_log_offset) if self.store_host else ""
