"""The sync shell: each client runs its asyncio twin on a private event-loop thread.

The logic is written once, in the asyncio classes; these wrappers only hand coroutines to the loop
thread and wait. A transactional send runs the local transaction in the *caller's* thread, so it may
use the caller's database connection.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any, Literal, Self, TypeVar

from txmq import limits
from txmq.client._async import AsyncProducer, AsyncTransactionProducer, TransactionListener
from txmq.client._consumer import AsyncPullConsumer, AsyncPushConsumer, MessageListener
from txmq.client._core import LocalTransactionState, PullResult, SendResult, TransactionSendResult
from txmq.protocol import Message

__all__ = ["Producer", "PullConsumer", "PushConsumer", "TransactionProducer"]

log = logging.getLogger("txmq.client")
T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop where uvloop is installed, else the default one."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()


class _LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class _SyncClient:
    _a: Any

    def __init__(self) -> None:
        self._lt = _LoopThread(f"txmq-{type(self).__name__}")
        self._started = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._lt.run(coro)

    def start(self) -> None:
        """Connect and start background work. Raises BrokerUnavailable."""
        self._run(self._a.start())
        self._started = True

    def shutdown(self) -> None:
        """Stop and disconnect. Idempotent."""
        if self._started:
            try:
                self._run(self._a.shutdown())
            finally:
                self._started = False
        self._lt.stop()

    @property
    def client_id(self) -> str:
        return str(self._a.client_id)

    def create_topic(self, topic: str, queue_nums: int = limits.DEFAULT_QUEUE_NUMS) -> int:
        """Create a topic on the broker (admin). Returns its queue count."""
        return int(self._run(self._a.create_topic(topic, queue_nums)))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class Producer(_SyncClient):
    """Sync :class:`~txmq.client.AsyncProducer` (same arguments)."""

    _a: AsyncProducer

    def __init__(self, group: str, endpoints: str, **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncProducer, group, endpoints, **kw))

    def send(self, msg: Message, queue_id: int | None = None) -> SendResult:
        """See :meth:`AsyncProducer.send`."""
        return self._run(self._a.send(msg, queue_id))

    def send_batch(self, msgs: list[Message], queue_id: int | None = None) -> SendResult:
        """See :meth:`AsyncProducer.send_batch`."""
        return self._run(self._a.send_batch(msgs, queue_id))


class TransactionProducer(Producer):
    """Sync :class:`~txmq.client.AsyncTransactionProducer`.

    ``execute_local_transaction`` runs in the thread that calls :meth:`send_message_in_transaction`;
    ``check_local_transaction`` runs in a worker thread when the broker checks back.
    """

    _a: AsyncTransactionProducer

    def __init__(self, group: str, endpoints: str, listener: TransactionListener, **kw: Any) -> None:
        _SyncClient.__init__(self)
        self.listener = listener
        self._a = self._lt.run(_make(AsyncTransactionProducer, group, endpoints, listener, **kw))

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Half message → local transaction (in this thread) → commit or rollback.

        Raises (before the local transaction runs): MessageTooLarge, RemoteError,
        BrokerUnavailable, RequestTimeout. An exception in the local transaction counts as UNKNOWN.
        """
        half = self._run(self._a.send_half(msg))
        try:
            state = self.listener.execute_local_transaction(msg, arg)
        except Exception:
            log.exception("local transaction of %s raised; state UNKNOWN", half.msg_id)
            state = LocalTransactionState.UNKNOWN
        outcome = self._run(self._a.end_transaction(half, state))
        return TransactionSendResult(half.msg_id, msg.topic, half.queue_id, half.queue_offset,
                                     state, outcome)


class PushConsumer(_SyncClient):
    """Sync :class:`~txmq.client.AsyncPushConsumer`; the listener runs in worker threads."""

    def __init__(self, group: str, endpoints: str, listener: MessageListener, *,
                 message_model: Literal["CLUSTERING", "BROADCASTING"] = "CLUSTERING",
                 **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncPushConsumer, group, endpoints, listener,
                                     message_model=message_model, **kw))

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._a.subscribe(topic, expression)


class PullConsumer(_SyncClient):
    """Sync :class:`~txmq.client.AsyncPullConsumer`: read queues by explicit offsets."""

    _a: AsyncPullConsumer

    def __init__(self, endpoints: str, consumer_group: str = "txmq-pull", **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncPullConsumer, endpoints, consumer_group, **kw))

    def queue_ids(self, topic: str) -> list[int]:
        return list(self._run(self._a.queue_ids(topic)))

    def min_offset(self, topic: str, queue_id: int) -> int:
        return int(self._run(self._a.min_offset(topic, queue_id)))

    def max_offset(self, topic: str, queue_id: int) -> int:
        return int(self._run(self._a.max_offset(topic, queue_id)))

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> PullResult:
        return self._run(self._a.pull(topic, queue_id, offset, max_nums))

    def commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        self._run(self._a.commit_offset(topic, queue_id, offset))

    def fetch_consumer_offset(self, topic: str, queue_id: int) -> int | None:
        return self._run(self._a.fetch_consumer_offset(topic, queue_id))

    def transaction_stats(self) -> dict[str, int]:
        """Counts of the broker's transaction index (pending, COMMIT, ROLLBACK, checks …)."""
        from txmq.client._core import check_response
        from txmq.protocol import RequestCode

        r = self._run(self._a.call(RequestCode.GET_TRANSACTION_STATS))
        return {k: int(v) for k, v in check_response(r).ext.items()}


async def _make(cls: type[T], *args: Any, **kw: Any) -> T:
    """Construct an async client on the loop thread (it creates loop-bound primitives)."""
    return cls(*args, **kw)
