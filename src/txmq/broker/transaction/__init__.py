"""Transactional messages: half messages, end transaction, the state index and check-back."""

from txmq.broker.transaction._index import HalfEntry, Outcome, TransactionIndex
from txmq.broker.transaction._service import (
    HALF_TOPIC,
    OP_TOPIC,
    REMOVE_TAG,
    TRANS_CHECK_MAX_TIME_TOPIC,
    EndResult,
    TransactionService,
)

__all__ = [
    "HALF_TOPIC",
    "OP_TOPIC",
    "REMOVE_TAG",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "EndResult",
    "HalfEntry",
    "Outcome",
    "TransactionIndex",
    "TransactionService",
]
