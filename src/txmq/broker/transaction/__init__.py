"""Transactional messages: half messages, end transaction, the state index, check-back, and the
transactions' lives (their trace)."""

from txmq.broker.transaction._index import HalfEntry, Outcome, TransactionIndex
from txmq.broker.transaction._result import EndResult
from txmq.broker.transaction._service import (
    HALF_TOPIC,
    OP_TOPIC,
    REMOVE_TAG,
    TRANS_CHECK_MAX_TIME_TOPIC,
    StoredHalf,
    TransactionService,
)
from txmq.broker.transaction._sink import (
    PROPERTY_TXMQ_SINK_BATCH,
    PROPERTY_TXMQ_SINK_TASK,
    SINK_BATCH_TOPIC,
)
from txmq.broker.transaction._trace import (
    TRANSACTION_TRACE_STEPS_MAX,
    TraceListener,
    TransactionTraces,
)

__all__ = [
    "HALF_TOPIC",
    "OP_TOPIC",
    "PROPERTY_TXMQ_SINK_BATCH",
    "PROPERTY_TXMQ_SINK_TASK",
    "REMOVE_TAG",
    "SINK_BATCH_TOPIC",
    "TRANSACTION_TRACE_STEPS_MAX",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "EndResult",
    "HalfEntry",
    "Outcome",
    "StoredHalf",
    "TraceListener",
    "TransactionIndex",
    "TransactionService",
    "TransactionTraces",
]
