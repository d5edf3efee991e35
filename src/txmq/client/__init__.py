"""Clients: producers, the transaction producer and consumers, sync and asyncio.

Sync classes (``Producer``, ``TransactionProducer``, ``PushConsumer``, ``PullConsumer``) wrap the
asyncio ones (``Async*``), which hold all the logic over the sans-IO core.
"""

from txmq.client._admin import AsyncAdmin, ResendResult
from txmq.client._async import (
    AsyncConnection,
    AsyncProducer,
    AsyncTransactionProducer,
    TransactionListener,
)
from txmq.client._consumer import AsyncPushConsumer, MessageListener
from txmq.client._core import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    LocalTransactionState,
    MessageModel,
    PullResult,
    PullStatus,
    RawPullResult,
    SendResult,
    TransactionSendResult,
    allocate_averagely,
)
from txmq.client._pull import AsyncPullConsumer
from txmq.client._sync import Admin, Producer, PullConsumer, PushConsumer, TransactionProducer
from txmq.client._transaction import TransactionCore
from txmq.protocol import Message, MessageExt, MessageQueue

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConnection",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "AsyncTransactionProducer",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageListener",
    "MessageModel",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "RawPullResult",
    "ResendResult",
    "SendResult",
    "TransactionCore",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
]
