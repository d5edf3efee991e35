"""The sync shell: each client runs its asyncio twin on a private event-loop thread.

The logic is written once, in the asyncio classes; these wrappers only hand coroutines to the loop
thread and wait. A transactional send runs the local transaction in the *caller's* thread, so it may
use the caller's database connection.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, Self, TypeVar

from txmq import limits
from txmq.client._admin import AsyncAdmin, ResendResult
from txmq.client._async import AsyncProducer, AsyncTransactionProducer, TransactionListener
from txmq.client._consumer import AsyncPushConsumer, MessageListener
from txmq.client._core import (
    PullResult,
    RawPullResult,
    SendResult,
    TransactionSendResult,
    check_response,
)
from txmq.client._pull import AsyncPullConsumer
from txmq.client._transaction import LOCAL_RAISED, EndStep, LocalStep, SendHalfStep
from txmq.protocol import (
    BrokerRuntimeInfo,
    Command,
    ConsumerGroupInfo,
    EndTransactionResponseHeader,
    Message,
    MessageExt,
    MessageQueue,
    QueueConsumeStats,
    RequestCode,
    ResetOffsetEntry,
    TopicConfigSerializeWrapper,
    TopicRouteData,
    TopicStatsTable,
    decode_body,
)

__all__ = ["Admin", "Producer", "PullConsumer", "PushConsumer", "TransactionProducer"]

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

    def request(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> Command:
        """One raw request (admin tools); returns the response, raising RemoteError on an error code.

        Raises:
            RemoteError, BrokerUnavailable, RequestTimeout.
        """
        return check_response(self._run(self._a.call(code, ext or {}, body)))

    def broker_address(self) -> str:
        """See :meth:`AsyncProducer.broker_address`."""
        return str(self._run(self._a.broker_address()))

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

    def __init__(self, group: str, endpoints: str = "", **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncProducer, group, endpoints, **kw))

    def send(self, msg: Message, queue_id: int | None = None, *, delay_level: int = 0) -> SendResult:
        """See :meth:`AsyncProducer.send`."""
        return self._run(self._a.send(msg, queue_id, delay_level=delay_level))

    def send_batch(self, msgs: list[Message], queue_id: int | None = None) -> SendResult:
        """See :meth:`AsyncProducer.send_batch`."""
        return self._run(self._a.send_batch(msgs, queue_id))


class TransactionProducer(Producer):
    """Sync :class:`~txmq.client.AsyncTransactionProducer`.

    ``execute_local_transaction`` runs in the thread that calls :meth:`send_message_in_transaction`;
    ``check_local_transaction`` runs in a worker thread when the broker checks back.
    """

    _a: AsyncTransactionProducer

    def __init__(self, group: str, endpoints: str = "", listener: TransactionListener | None = None,
                 **kw: Any) -> None:
        _SyncClient.__init__(self)
        self._a = self._lt.run(_make(AsyncTransactionProducer, group, endpoints, listener, **kw))
        self.listener = self._a.listener

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Half message → local transaction (in this thread) → commit or rollback: the steps of
        :meth:`TransactionCore.flow`, the same generator the async producer drives; a coroutine
        listener is awaited on the client's loop.

        Raises (only before the local transaction runs): MessageTooLarge, ConfigError,
        RemoteError, TransportError. An exception in the local transaction counts as UNKNOWN.
        TypeError (after the end request, the transaction left UNKNOWN): the listener returned
        something that is not a LocalTransactionState.
        """
        flow = self._a._tx.flow(msg, arg)
        value: Any = None
        try:
            while True:
                step = flow.send(value)
                if isinstance(step, SendHalfStep):
                    value = self._run(self._a.send(step.msg))
                elif isinstance(step, LocalStep):
                    value = self._run_local(step)
                else:
                    assert isinstance(step, EndStep)
                    value = self._run(self._a.end_transaction(step.half, step.state))
        except StopIteration as stop:
            result: TransactionSendResult = stop.value
            return result

    def _run_local(self, step: LocalStep) -> Any:
        try:
            result = self.listener.execute_local_transaction(step.msg, step.arg)
            if inspect.isawaitable(result):
                result = self._run(_awaited(result))
        except Exception:
            log.exception("local transaction of %s raised; state UNKNOWN", step.half.msg_id)
            return LOCAL_RAISED
        return result


class PushConsumer(_SyncClient):
    """Sync :class:`~txmq.client.AsyncPushConsumer` (same arguments); the listener runs in the
    consumer's thread pool."""

    _a: AsyncPushConsumer

    def __init__(self, group: str, endpoints: str, listener: MessageListener, *,
                 message_model: Literal["CLUSTERING", "BROADCASTING"] = "CLUSTERING",
                 **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncPushConsumer, group, endpoints, listener,
                                     message_model=message_model, **kw))

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` filtered by a tag expression (``*`` or ``TagA || TagB``)."""
        self._a.subscribe(topic, expression)

    def assignment(self) -> list[MessageQueue]:
        """The queues this member consumes now."""
        return self._run(_on_loop(self._a.assignment))

    def loop_errors(self) -> dict[str, int]:
        """Failures of each background loop so far (pull, rebalance, persist, lock, heartbeat,
        route refresh): each was logged and its loop went on."""
        return self._run(_on_loop(lambda: dict(self._a.loop_errors)))


class PullConsumer(_SyncClient):
    """Sync :class:`~txmq.client.AsyncPullConsumer`: explicit offsets, or assign/subscribe with
    poll, seek and commit."""

    _a: AsyncPullConsumer

    def __init__(self, endpoints: str = "", consumer_group: str = "txmq-pull", **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncPullConsumer, endpoints, consumer_group, **kw))

    def queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`AsyncPullConsumer.queues`."""
        return self._run(self._a.queues(topic))

    def queue_ids(self, topic: str) -> list[int]:
        """See :meth:`AsyncPullConsumer.queue_ids`."""
        return list(self._run(self._a.queue_ids(topic)))

    def min_offset(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.min_offset`."""
        return int(self._run(self._a.min_offset(topic, queue_id, broker_name=broker_name)))

    def max_offset(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.max_offset`."""
        return int(self._run(self._a.max_offset(topic, queue_id, broker_name=broker_name)))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, *,
                      broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.search_offset`."""
        return int(self._run(self._a.search_offset(topic, queue_id, timestamp_ms,
                                                   broker_name=broker_name)))

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int, *,
                             broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.offset_for_timestamp`."""
        return int(self._run(self._a.offset_for_timestamp(topic, queue_id, timestamp_ms,
                                                          broker_name=broker_name)))

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32, *,
             broker_name: str = "") -> PullResult:
        """See :meth:`AsyncPullConsumer.pull`."""
        return self._run(self._a.pull(topic, queue_id, offset, max_nums, broker_name=broker_name))

    def pull_raw(self, topic: str, queue_id: int, offset: int, max_nums: int = 32, *,
                 broker_name: str = "") -> RawPullResult:
        """See :meth:`AsyncPullConsumer.pull_raw`."""
        return self._run(self._a.pull_raw(topic, queue_id, offset, max_nums,
                                          broker_name=broker_name))

    def commit_offset(self, topic: str, queue_id: int, offset: int, *,
                      broker_name: str = "") -> None:
        """See :meth:`AsyncPullConsumer.commit_offset`."""
        self._run(self._a.commit_offset(topic, queue_id, offset, broker_name=broker_name))

    def fetch_consumer_offset(self, topic: str, queue_id: int, *,
                              broker_name: str = "") -> int | None:
        """See :meth:`AsyncPullConsumer.fetch_consumer_offset`."""
        return self._run(self._a.fetch_consumer_offset(topic, queue_id, broker_name=broker_name))

    def assign(self, queues: list[MessageQueue] | list[tuple[str, int]]) -> None:
        """See :meth:`AsyncPullConsumer.assign`."""
        self._a.assign(queues)

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """See :meth:`AsyncPullConsumer.subscribe` (call before :meth:`start`)."""
        self._a.subscribe(topic, expression)

    def assignment(self) -> list[MessageQueue]:
        """See :meth:`AsyncPullConsumer.assignment`."""
        return self._run(_on_loop(self._a.assignment))

    def loop_errors(self) -> dict[str, int]:
        """Failures of each background loop so far (rebalance, heartbeat, route refresh)."""
        return self._run(_on_loop(lambda: dict(self._a.loop_errors)))

    def poll(self, timeout_ms: int = 5_000) -> list[MessageExt]:
        """See :meth:`AsyncPullConsumer.poll`."""
        return self._run(self._a.poll(timeout_ms))

    def seek(self, topic: str, queue_id: int, offset: int, *, broker_name: str = "") -> None:
        """See :meth:`AsyncPullConsumer.seek`."""
        self._a.seek(topic, queue_id, offset, broker_name=broker_name)

    def seek_to_begin(self, topic: str, queue_id: int, *, broker_name: str = "") -> None:
        """See :meth:`AsyncPullConsumer.seek_to_begin`."""
        self._run(self._a.seek_to_begin(topic, queue_id, broker_name=broker_name))

    def seek_to_end(self, topic: str, queue_id: int, *, broker_name: str = "") -> None:
        """See :meth:`AsyncPullConsumer.seek_to_end`."""
        self._run(self._a.seek_to_end(topic, queue_id, broker_name=broker_name))

    def position(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.position`."""
        return self._run(self._a.position(topic, queue_id, broker_name=broker_name))

    def committed(self, topic: str, queue_id: int, *, broker_name: str = "") -> int | None:
        """See :meth:`AsyncPullConsumer.committed`."""
        return self._run(self._a.committed(topic, queue_id, broker_name=broker_name))

    def commit(self) -> None:
        """Commit the current position of every assigned queue."""
        self._run(self._a.commit())

    def transaction_stats(self) -> dict[str, int]:
        """Counts of the broker's transaction index (pending, COMMIT, ROLLBACK, checks …)."""
        r = self.request(RequestCode.GET_TRANSACTION_STATS)
        return decode_body(r.body, dict[str, int])


class Admin(_SyncClient):
    """Sync :class:`~txmq.client.AsyncAdmin`: consumer groups, lag, offset reset, DLQ, messages by
    key or id."""

    _a: AsyncAdmin

    def __init__(self, endpoints: str = "", **kw: Any) -> None:
        super().__init__()
        self._a = self._lt.run(_make(AsyncAdmin, endpoints, **kw))

    def transaction_stats(self) -> dict[str, int]:
        """See :meth:`TransactionAdmin.transaction_stats`."""
        return self._run(self._a.transaction_stats())

    def pending_transactions(self, limit: int = 100) -> tuple[int, list[dict[str, Any]]]:
        """See :meth:`TransactionAdmin.pending_transactions`."""
        return self._run(self._a.pending_transactions(limit))

    def query_transaction(self, ident: str) -> dict[str, Any]:
        """See :meth:`TransactionAdmin.query_transaction`."""
        return self._run(self._a.query_transaction(ident))

    def operator_end(self, ident: str, outcome: str, operator: str,
                     reason: str = "") -> EndTransactionResponseHeader:
        """See :meth:`TransactionAdmin.operator_end`."""
        return self._run(self._a.operator_end(ident, outcome, operator, reason))

    def resume_transaction(self, ident: str) -> int:
        """See :meth:`TransactionAdmin.resume_transaction`."""
        return self._run(self._a.resume_transaction(ident))

    def commit_sink_batch(self, batch: str, producer_group: str,
                          tasks: dict[str, int]) -> EndTransactionResponseHeader:
        """See :meth:`TransactionAdmin.commit_sink_batch`."""
        return self._run(self._a.commit_sink_batch(batch, producer_group, tasks))

    def abort_sink_batch(self, batch: str) -> EndTransactionResponseHeader:
        """See :meth:`TransactionAdmin.abort_sink_batch`."""
        return self._run(self._a.abort_sink_batch(batch))

    def groups(self) -> list[ConsumerGroupInfo]:
        return self._run(self._a.groups())

    def query_messages(self, topic: str, key: str, *, begin_ms: int = 0, end_ms: int = 2**63 - 1,
                       max_num: int = 32) -> list[MessageExt]:
        """See :meth:`AsyncAdmin.query_messages`."""
        return self._run(self._a.query_messages(topic, key, begin_ms=begin_ms, end_ms=end_ms,
                                                max_num=max_num))

    def view_message(self, msg_id: str = "", *, offset: int = -1) -> list[MessageExt]:
        """See :meth:`AsyncAdmin.view_message`."""
        return self._run(self._a.view_message(msg_id, offset=offset))

    def consume_stats(self, group: str, topic: str = "") -> list[QueueConsumeStats]:
        return self._run(self._a.consume_stats(group, topic))

    def reset_offset(self, group: str, topic: str, *, timestamp_ms: int | None = None,
                     offset: int | None = None, queue_id: int | None = None) -> list[ResetOffsetEntry]:
        """See :meth:`AsyncAdmin.reset_offset`."""
        return self._run(self._a.reset_offset(group, topic, timestamp_ms=timestamp_ms, offset=offset,
                                              queue_id=queue_id))

    def dlq_messages(self, group: str, limit: int = 100_000) -> list[MessageExt]:
        return self._run(self._a.dlq_messages(group, limit))

    def resend_dlq(self, group: str, msg_ids: list[str] | None = None) -> list[ResendResult]:
        """See :meth:`AsyncAdmin.resend_dlq`."""
        return self._run(self._a.resend_dlq(group, msg_ids))

    def runtime_info(self) -> BrokerRuntimeInfo:
        """See :meth:`AsyncAdmin.runtime_info`."""
        return self._run(self._a.runtime_info())

    def parked_messages(self, limit: int = 100_000) -> list[MessageExt]:
        """See :meth:`AsyncAdmin.parked_messages`."""
        return self._run(self._a.parked_messages(limit))

    def resend_parked(self, m: MessageExt, topic: str, queue_id: int = -1) -> int:
        """See :meth:`AsyncAdmin.resend_parked`."""
        return self._run(self._a.resend_parked(m, topic, queue_id))

    def topic_configs(self) -> TopicConfigSerializeWrapper:
        """See :meth:`AsyncAdmin.topic_configs`."""
        return self._run(self._a.topic_configs())

    def update_topic(self, topic: str, queue_nums: int) -> int:
        """See :meth:`AsyncAdmin.update_topic`."""
        return self._run(self._a.update_topic(topic, queue_nums))

    def topic_route(self, topic: str) -> TopicRouteData:
        """See :meth:`AsyncAdmin.topic_route`."""
        return self._run(self._a.topic_route(topic))

    def topic_stats(self, topic: str) -> TopicStatsTable:
        """See :meth:`AsyncAdmin.topic_stats`."""
        return self._run(self._a.topic_stats(topic))

    def topic_names(self) -> list[str]:
        """See :meth:`AsyncAdmin.topic_names`."""
        return self._run(self._a.topic_names())

    def delete_topic(self, topic: str) -> str:
        """See :meth:`AsyncAdmin.delete_topic`."""
        return self._run(self._a.delete_topic(topic))


async def _awaited(result: Awaitable[T]) -> T:
    return await result


async def _on_loop(fn: Callable[[], T]) -> T:
    """Run a plain method of an async client on its loop thread (it reads loop-owned state)."""
    return fn()


async def _make(cls: type[T], *args: Any, **kw: Any) -> T:
    """Construct an async client on the loop thread (it creates loop-bound primitives)."""
    return cls(*args, **kw)
