"""Request codes (RocketMQ ``RequestCode`` numbers where the operation exists there)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["RequestCode"]


class RequestCode(IntEnum):
    """Operation codes of requests. Numbers below 2000 are RocketMQ's ``RequestCode`` values."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_MIN_OFFSET = 29
    GET_MAX_OFFSET = 30
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    GET_ROUTEINFO_BY_TOPIC = 105
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_BATCH_MESSAGE = 320
    # txmq-specific
    GET_TRANSACTION_STATS = 2001
    """Counts of the transaction state index (pending, committed, rolled back, discarded, checks)."""
