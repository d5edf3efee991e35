"""Request codes (RocketMQ ``RequestCode`` numbers where the operation exists there)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["RequestCode"]


class RequestCode(IntEnum):
    """Operation codes of requests. Numbers below 2000 are RocketMQ's ``RequestCode`` values."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    """Messages of a topic by key within a store-time range, through the index (``queryMessage``)."""
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_BROKER_RUNTIME_INFO = 28
    """The broker's health: each timer's last tick, parked messages, pending transactions (a
    ``KVTable`` JSON body, :class:`~txmq.protocol.BrokerRuntimeInfo`)."""
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    """The first queue offset stored at or after a timestamp (binary search by store time)."""
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    """One message by its id (``UNIQ_KEY``) or commit log offset (``viewMessage``)."""
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
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    """Every consumer group the broker knows: online members, subscriptions, stored offsets."""
    GET_CONSUME_STATS = 208
    """Per queue of a group: broker offset, consumer offset, lag."""
    RESET_CONSUMER_CLIENT_OFFSET = 220
    """Broker to consumer: the group's offsets of a topic were reset; restart from them."""
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    """Operator: reset a group's offsets of a topic to a timestamp or an offset."""
    GET_ROUTEINFO_BY_TOPIC = 105
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_BATCH_MESSAGE = 320
    # txmq-specific
    GET_TRANSACTION_STATS = 2001
    """Counts of the transaction state index (pending, committed, rolled back, discarded, checks)."""
    GET_PENDING_TRANSACTIONS = 2002
    """Oldest pending half messages (JSON body), for ``txmq tx list``."""
    QUERY_TRANSACTION = 2003
    """One transaction's state by message id or ``half:<offset>`` (JSON body)."""
    ADMIN_END_TRANSACTION = 2004
    """An operator's commit or rollback, recorded with operator name and reason."""
    END_TRANSACTION_BATCH = 2005
    """Several END_TRANSACTION headers in one request (msgpack list body); the answer's body is a
    list of ``{code, remark, outcome, duplicate}`` in the same order."""
    COMMIT_SINK_BATCH = 2010
    """Commit a Spark sink micro-batch: header ``batch``, ``producer_group``; body msgpack
    ``{task attempt: rows}``. Idempotent per batch."""
    ABORT_SINK_BATCH = 2011
    """Roll back an uncommitted Spark sink micro-batch (no-op after its commit)."""
