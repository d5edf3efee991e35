"""Clients: producers, the transaction producer and consumers, sync and asyncio.

Sync classes (``Producer``, ``TransactionProducer``, ``PushConsumer``, ``PullConsumer``) wrap the
asyncio ones (``Async*``), which hold all the logic over the sans-IO core.
"""

from txmq.client._async import (
    AsyncConnection,
    AsyncProducer,
    AsyncTransactionProducer,
    TransactionListener,
)
from txmq.client._consumer import AsyncPullConsumer, AsyncPushConsumer, MessageListener
from txmq.client._core import (
    ConsumeStatus,
    LocalTransactionState,
    PullResult,
    PullStatus,
    SendResult,
    TransactionSendResult,
    allocate_averagely,
)
from txmq.client._sync import Producer, PullConsumer, PushConsumer, TransactionProducer
from txmq.protocol import Message, MessageExt

__all__ = [
    "AsyncConnection",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "AsyncTransactionProducer",
    "ConsumeStatus",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageListener",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "SendResult",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
]
