"""Request codes: RocketMQ ``RequestCode`` numbers, and txmq's extensions in a range RocketMQ does
not use (9000-9999; RocketMQ's own codes stop at 3010 below the pop range at 200050)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["TXMQ_CODE_MIN", "RequestCode"]

TXMQ_CODE_MIN = 9000
"""txmq's own request codes start here; every number below is RocketMQ's ``RequestCode``."""


class RequestCode(IntEnum):
    """Operation codes of requests.

    Numbers below ``TXMQ_CODE_MIN`` are RocketMQ's ``RequestCode`` values with RocketMQ's headers
    and bodies. Those at and above it are txmq extensions (transaction administration, Spark sink
    batches, operator views): an Apache RocketMQ broker answers them REQUEST_CODE_NOT_SUPPORTED.
    """

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    """Messages of a topic by key within a store-time range, through the index (``queryMessage``);
    body: concatenated MessageExt records."""
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    """Every topic of the broker; body: ``TopicConfigSerializeWrapper``."""
    GET_BROKER_RUNTIME_INFO = 28
    """The broker's health: each timer's last tick, parked messages, pending transactions (a
    ``KVTable`` JSON body, :class:`~txmq.protocol.BrokerRuntimeInfo`)."""
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    """The first queue offset stored at or after a timestamp (binary search by store time)."""
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    """One message by its commit log offset (``viewMessage``; clients decode the offset msgId)."""
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    """Orderly consumption: lock queues for one member of a group (expire after 60 s)."""
    UNLOCK_BATCH_MQ = 42
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_TOPIC_STATS_INFO = 202
    """Per queue min/max offset and last update time of one topic; body: ``TopicStatsTable``."""
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    SEND_MESSAGE_V2 = 310
    """SEND_MESSAGE with the short header field names ``a``...``n`` (what clients send)."""
    SEND_BATCH_MESSAGE = 320
    RESUME_CHECK_HALF_MESSAGE = 323
    BROKER_HEARTBEAT = 904
    EXCHANGE_BROKER_HA_INFO = 906
    """Ask a broker its HA address (empty header; a slave asks its master, RocketMQ
    ``BrokerOuterAPI.retrieveBrokerHaInfo``), or tell a slave its master's (RocketMQ
    ``ExchangeHAInfoRequestHeader`` with ``masterHaAddress``)."""
    GET_BROKER_HA_STATUS = 907
    """A broker's replication state (``mqadmin haStatus``); body: RocketMQ ``HARuntimeInfo`` JSON,
    :class:`~txmq.protocol.HaRuntimeInfo`."""
    # the controller (RocketMQ 5 controller mode; docs/controller.md)
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    """Who leads the controllers (answered by every controller, leader or not)."""
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    """Controller to broker: a new master was elected in its group."""
    CLEAN_BROKER_DATA = 1011
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013
    # txmq extensions
    GET_TRANSACTION_STATS = 9001
    """Counts of the transaction state index (pending, committed, rolled back, discarded, checks)."""
    GET_PENDING_TRANSACTIONS = 9002
    """Oldest pending half messages (JSON body), for ``txmq tx list``."""
    QUERY_TRANSACTION = 9003
    """One transaction's state by message id or ``half:<offset>`` (JSON body)."""
    ADMIN_END_TRANSACTION = 9004
    """An operator's commit or rollback, recorded with operator name and reason."""
    END_TRANSACTION_BATCH = 9005
    """Several END_TRANSACTION headers in one request (JSON list of ext maps); the answer's body is
    a JSON list of ``{code, remark, outcome, duplicate}`` in the same order."""
    VIEW_MESSAGE_BY_UNIQ_KEY = 9006
    """Every stored copy of a message by ``UNIQ_KEY`` (the message and its half, retry or DLQ
    copies, newest first); body: concatenated MessageExt records."""
    GET_CONSUMER_GROUPS = 9007
    """Every consumer group the broker knows: online members, subscriptions, stored offsets."""
    GET_CONSUME_STATS = 9008
    """Per queue of a group: broker offset, consumer offset, lag."""
    RESET_OFFSET = 9009
    """Operator: reset a group's offsets of a topic to a timestamp or an offset."""
    COMMIT_SINK_BATCH = 9010
    """Commit a Spark sink micro-batch: header ``batch``, ``producerGroup``; body JSON
    ``{task attempt: rows}``. Idempotent per batch."""
    ABORT_SINK_BATCH = 9011
    """Roll back an uncommitted Spark sink micro-batch (no-op after its commit)."""
    RESET_CONSUMER_OFFSETS = 9012
    """Broker to consumer: the group's offsets of a topic were reset; restart from them (JSON
    body :class:`~txmq.protocol.ResetConsumerClientOffsetBody`)."""
    GET_TRANSACTION_TRACE = 9013
    """The recorded lives of transactions, by id or by W3C trace id (header
    :class:`~txmq.protocol.TransactionTraceRequestHeader`; body: JSON list of
    :class:`~txmq.protocol.TransactionLife`)."""
