"""The sync shell: each client runs its asyncio twin on a private event-loop thread.

The logic is written once, in the asyncio classes; these wrappers only hand coroutines to the loop
thread and wait. A transactional send runs the local transaction in the *caller's* thread, so it may
use the caller's database connection.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Self, TypeVar

from txmq import limits
from txmq.client._admin import AsyncAdmin, ResendResult
from txmq.client._async import (
    AsyncProducer,
    AsyncTransactionProducer,
    MessageQueueSelector,
    QueueChoice,
    TransactionListener,
)
from txmq.client._client import ClientBase
from txmq.client._consumer import AsyncPushConsumer, MessageListener
from txmq.client._core import (
    ConsumeFromWhere,
    LocalTransactionState,
    MessageModel,
    PullResult,
    RawPullResult,
    SendResult,
    TransactionSendResult,
)
from txmq.client._pull import AsyncPullConsumer, PullMixin
from txmq.client._route import TopicRoute
from txmq.client._transaction import EndStep, LocalRaised, LocalStep, SendHalfStep
from txmq.protocol import (
    MASTER_ID,
    BrokerRuntimeInfo,
    Command,
    ConsumerGroupInfo,
    EndTransactionResponseHeader,
    HaRuntimeInfo,
    Message,
    MessageExt,
    MessageQueue,
    QueueConsumeStats,
    ResetOffsetEntry,
    TopicConfigSerializeWrapper,
    TopicRouteData,
    TopicStatsTable,
    TransactionLife,
)
from txmq.serving import new_event_loop
from txmq.tracing import Tracing

__all__ = ["Admin", "Producer", "PullConsumer", "PushConsumer", "TransactionProducer"]

log = logging.getLogger("txmq.client")
T = TypeVar("T")
A = TypeVar("A")


class _LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def alive(self) -> bool:
        """Whether the loop runs (and so can run a coroutine)."""
        return not self.loop.is_closed() and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the loop and join its thread; then close the loop. Idempotent."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class _SyncClient:
    _a: ClientBase

    def __init__(self) -> None:
        self._lt = _LoopThread(f"txmq-{type(self).__name__}")

    def _build(self, cls: type[A], *args: Any, **kw: Any) -> A:
        """Construct the async twin on the loop thread; on failure stop the thread and close its
        loop (nothing leaks from a failed constructor) and re-raise."""
        try:
            return self._lt.run(_make(cls, *args, **kw))
        except BaseException:
            self._lt.stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._lt.run(coro)

    def start(self) -> None:
        """Connect and start background work. On failure the connections, the loop and its thread
        are released (the client cannot be started again).

        Raises:
            BrokerUnavailable, ConnectTimeout, RequestTimeout, RemoteError: as the async
                ``start()``.
        """
        try:
            self._run(self._a.start())
        except BaseException:
            self._lt.stop()
            raise

    def shutdown(self) -> None:
        """Stop and disconnect (also a client used without :meth:`start`: its first request
        started the heartbeats). Idempotent."""
        try:
            if self._lt.alive():
                self._run(self._a.shutdown())
        finally:
            self._lt.stop()

    @property
    def client_id(self) -> str:
        return str(self._a.client_id)

    def request(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> Command:
        """See :meth:`ClientBase.request`."""
        return self._run(self._a.request(code, ext, body))

    def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
             timeout_s: float | None = None) -> Command:
        """See :meth:`ClientBase.call`."""
        return self._run(self._a.call(code, ext, body, timeout_s))

    def call_broker(self, broker_name: str, code: int, ext: dict[str, str] | None = None,
                    body: bytes = b"", timeout_s: float | None = None, *, topic: str = "",
                    broker_id: int = MASTER_ID) -> Command:
        """See :meth:`ClientBase.call_broker`."""
        return self._run(self._a.call_broker(broker_name, code, ext, body, timeout_s, topic=topic,
                                             broker_id=broker_id))

    def cluster_masters(self) -> dict[str, str]:
        """See :meth:`ClientBase.cluster_masters`."""
        return self._run(self._a.cluster_masters())

    def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """See :meth:`ClientBase.route`."""
        return self._run(self._a.route(topic, refresh))

    def queue_nums(self, topic: str, refresh: bool = False) -> int:
        """See :meth:`ClientBase.queue_nums`."""
        return self._run(self._a.queue_nums(topic, refresh))

    def master_address(self, broker_name: str, topic: str = "") -> str:
        """See :meth:`ClientBase.master_address`."""
        return self._run(self._a.master_address(broker_name, topic))

    def known_master_address(self, broker_name: str) -> str | None:
        """See :meth:`ClientBase.known_master_address`."""
        return self._a.known_master_address(broker_name)

    def broker_addresses(self, broker_name: str) -> dict[int, str]:
        """See :meth:`ClientBase.broker_addresses`."""
        return self._run(_on_loop(lambda: self._a.broker_addresses(broker_name)))

    def broker_address(self) -> str:
        """See :meth:`ClientBase.broker_address`."""
        return self._run(self._a.broker_address())

    def create_topic(self, topic: str, queue_nums: int = limits.DEFAULT_QUEUE_NUMS) -> int:
        """See :meth:`ClientBase.create_topic`."""
        return self._run(self._a.create_topic(topic, queue_nums))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class _SyncQueues(_SyncClient):
    """Sync wrappers of the queue-addressed requests every consumer and the admin share
    (``PullMixin``)."""

    _a: PullMixin

    def queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`AsyncPullConsumer.queues`."""
        return self._run(self._a.queues(topic))

    def min_offset(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.min_offset`."""
        return self._run(self._a.min_offset(topic, queue_id, broker_name=broker_name))

    def max_offset(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.max_offset`."""
        return self._run(self._a.max_offset(topic, queue_id, broker_name=broker_name))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, *,
                      broker_name: str = "") -> int:
        """See :meth:`AsyncPullConsumer.search_offset`."""
        return self._run(self._a.search_offset(topic, queue_id, timestamp_ms,
                                               broker_name=broker_name))

    def fetch_consumer_offset(self, topic: str, queue_id: int, *,
                              broker_name: str = "") -> int | None:
        """See :meth:`AsyncPullConsumer.fetch_consumer_offset`."""
        return self._run(self._a.fetch_consumer_offset(topic, queue_id, broker_name=broker_name))

    def commit_offset(self, topic: str, queue_id: int, offset: int, *,
                      broker_name: str = "") -> None:
        """See :meth:`AsyncPullConsumer.commit_offset`."""
        self._run(self._a.commit_offset(topic, queue_id, offset, broker_name=broker_name))

    def consumer_ids(self, topic: str = "") -> list[str]:
        """See :meth:`AsyncPullConsumer.consumer_ids`."""
        return self._run(self._a.consumer_ids(topic))


class Producer(_SyncClient):
    """Sync :class:`~txmq.client.AsyncProducer` (same arguments)."""

    _a: AsyncProducer

    def __init__(self, group: str, endpoints: str = "", *,
                 max_message_size: int = limits.MESSAGE_SIZE_MAX_BYTES,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 retry_times_when_send_failed: int = limits.SEND_RETRY_TIMES,
                 send_latency_fault_enable: bool = True,
                 access_key: str = "", secret_key: str = "", tls: bool = False,
                 tls_ca_file: str = "", tls_verify_hostname: bool = True,
                 connect_timeout_ms: int = limits.CONNECT_TIMEOUT_MS,
                 poll_name_server_interval_ms: int = limits.POLL_NAME_SERVER_INTERVAL_MS,
                 enable_msg_trace: bool = False, custom_trace_topic: str = "",
                 tracing: Tracing | bool = True) -> None:
        super().__init__()
        self._a = self._build(AsyncProducer, **_args(locals()))

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """See :meth:`AsyncProducer.publish_queues`."""
        return self._run(self._a.publish_queues(topic))

    def send(self, msg: Message, queue_id: QueueChoice = None, *, delay_level: int = 0,
             selector: MessageQueueSelector | None = None, arg: Any = None) -> SendResult:
        """See :meth:`AsyncProducer.send` (``selector`` runs on the client's loop thread)."""
        return self._run(self._a.send(msg, queue_id, delay_level=delay_level, selector=selector,
                                      arg=arg))

    def send_batch(self, msgs: list[Message], queue_id: QueueChoice = None) -> SendResult:
        """See :meth:`AsyncProducer.send_batch`."""
        return self._run(self._a.send_batch(msgs, queue_id))


class TransactionProducer(Producer):
    """Sync :class:`~txmq.client.AsyncTransactionProducer` (same arguments).

    ``execute_local_transaction`` runs in the thread that calls :meth:`send_message_in_transaction`;
    ``check_local_transaction`` runs in a worker thread when the broker checks back.
    """

    _a: AsyncTransactionProducer

    def __init__(self, group: str, endpoints: str = "",
                 listener: TransactionListener | None = None, *, check_threads: int = 4,
                 oneway_end: bool = False,
                 max_message_size: int = limits.MESSAGE_SIZE_MAX_BYTES,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 retry_times_when_send_failed: int = limits.SEND_RETRY_TIMES,
                 send_latency_fault_enable: bool = True,
                 access_key: str = "", secret_key: str = "", tls: bool = False,
                 tls_ca_file: str = "", tls_verify_hostname: bool = True,
                 connect_timeout_ms: int = limits.CONNECT_TIMEOUT_MS,
                 poll_name_server_interval_ms: int = limits.POLL_NAME_SERVER_INTERVAL_MS,
                 enable_msg_trace: bool = False, custom_trace_topic: str = "",
                 tracing: Tracing | bool = True) -> None:
        _SyncClient.__init__(self)
        self._a = self._build(AsyncTransactionProducer, **_args(locals()))
        self.listener = self._a.listener

    def send_half(self, msg: Message, queue_id: QueueChoice = None) -> SendResult:
        """See :meth:`AsyncTransactionProducer.send_half`."""
        return self._run(self._a.send_half(msg, queue_id))

    def send_half_batch(self, msgs: list[Message], queue_id: QueueChoice = None) -> SendResult:
        """See :meth:`AsyncTransactionProducer.send_half_batch`."""
        return self._run(self._a.send_half_batch(msgs, queue_id))

    def end_transaction(self, half: SendResult, state: LocalTransactionState) -> str:
        """See :meth:`AsyncTransactionProducer.end_transaction` (never raises)."""
        return self._run(self._a.end_transaction(half, state))

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
        error: BaseException | None = None
        try:
            while True:
                step = flow.send(value) if error is None else flow.throw(error)
                error = None
                try:
                    if isinstance(step, SendHalfStep):
                        value = self._run(self._a.send(step.msg))
                    elif isinstance(step, LocalStep):
                        value = self._run_local(step)
                    else:
                        assert isinstance(step, EndStep)
                        value = self._run(self._a.end_transaction(step.half, step.state))
                except BaseException as exc:  # thrown into the flow, which re-raises it
                    error = exc
        except StopIteration as stop:
            result: TransactionSendResult = stop.value
            return result

    def _run_local(self, step: LocalStep) -> Any:
        try:
            result = self.listener.execute_local_transaction(step.msg, step.arg)
            if inspect.isawaitable(result):
                result = self._run(_awaited(result))
        except Exception as exc:
            log.exception("local transaction of %s raised; state UNKNOWN", step.half.msg_id)
            return LocalRaised(exc)
        return result


class PushConsumer(_SyncQueues):
    """Sync :class:`~txmq.client.AsyncPushConsumer` (same arguments); the listener runs in the
    consumer's thread pool."""

    _a: AsyncPushConsumer

    def __init__(self, group: str, endpoints: str, listener: MessageListener, *,
                 message_model: MessageModel = "CLUSTERING",
                 consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 consume_timestamp_ms: int | None = None,
                 orderly: bool = False,
                 consume_threads: int = limits.CONSUME_THREADS,
                 pull_batch_size: int = limits.PULL_BATCH_SIZE,
                 consume_message_batch_max_size: int = limits.CONSUME_BATCH_MAX_SIZE,
                 pull_threshold_for_queue: int = limits.PULL_THRESHOLD_FOR_QUEUE,
                 pull_threshold_size_for_queue: int = limits.PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES,
                 consume_concurrently_max_span: int = limits.CONSUME_CONCURRENTLY_MAX_SPAN,
                 max_reconsume_times: int = limits.MAX_RECONSUME_TIMES,
                 consume_timeout_ms: int = limits.CONSUME_TIMEOUT_MS,
                 suspend_current_queue_time_ms: int = limits.SUSPEND_CURRENT_QUEUE_TIME_MS,
                 suspend_ms: int = limits.PULL_SUSPEND_MS,
                 offset_store_dir: str | os.PathLike[str] | None = None,
                 instance_name: str = "DEFAULT",
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 access_key: str = "", secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True,
                 enable_msg_trace: bool = False, custom_trace_topic: str = "",
                 tracing: Tracing | bool = True) -> None:
        super().__init__()
        self._a = self._build(AsyncPushConsumer, **_args(locals()))

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


class PullConsumer(_SyncQueues):
    """Sync :class:`~txmq.client.AsyncPullConsumer`: explicit offsets, or assign/subscribe with
    poll, seek and commit."""

    _a: AsyncPullConsumer

    def __init__(self, endpoints: str = "", consumer_group: str = "txmq-pull", *,
                 consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 consume_timestamp_ms: int | None = None,
                 pull_batch_size: int = limits.PULL_BATCH_SIZE,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 access_key: str = "", secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True, tracing: Tracing | bool = True) -> None:
        super().__init__()
        self._a = self._build(AsyncPullConsumer, **_args(locals()))

    def queue_ids(self, topic: str) -> list[int]:
        """See :meth:`AsyncPullConsumer.queue_ids`."""
        return list(self._run(self._a.queue_ids(topic)))

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
        return self._run(self._a.transaction_stats())


class Admin(_SyncQueues):
    """Sync :class:`~txmq.client.AsyncAdmin`: consumer groups, lag, offset reset, DLQ, messages by
    key or id."""

    _a: AsyncAdmin

    def __init__(self, endpoints: str = "", *, timeout_ms: int = limits.REQUEST_TIMEOUT_MS,
                 namesrv_addr: str = "", access_key: str = "",
                 secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True) -> None:
        super().__init__()
        self._a = self._build(AsyncAdmin, **_args(locals()))

    def transaction_stats(self) -> dict[str, int]:
        """See :meth:`TransactionAdmin.transaction_stats`."""
        return self._run(self._a.transaction_stats())

    def pending_transactions(self, limit: int = 100) -> tuple[int, list[dict[str, Any]]]:
        """See :meth:`TransactionAdmin.pending_transactions`."""
        return self._run(self._a.pending_transactions(limit))

    def query_transaction(self, ident: str) -> dict[str, Any]:
        """See :meth:`TransactionAdmin.query_transaction`."""
        return self._run(self._a.query_transaction(ident))

    def transaction_lives(self, ident: str = "", *, trace_id: str = "",
                          limit: int = 16) -> list[TransactionLife]:
        """See :meth:`TransactionAdmin.transaction_lives`."""
        return self._run(self._a.transaction_lives(ident, trace_id=trace_id, limit=limit))

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

    def ha_status(self) -> HaRuntimeInfo:
        """See :meth:`AsyncAdmin.ha_status`."""
        return self._run(self._a.ha_status())

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


def _args(local: dict[str, Any]) -> dict[str, Any]:
    """A sync constructor's arguments (its ``locals()``), to pass on to its async twin."""
    return {k: v for k, v in local.items() if k not in ("self", "__class__")}


async def _make(cls: type[T], *args: Any, **kw: Any) -> T:
    """Construct an async client on the loop thread (it creates loop-bound primitives)."""
    return cls(*args, **kw)
