"""The asyncio producers: plain sends across every broker of a topic's route, and the transaction
producer (half message → local transaction → end, check-backs answered)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from txmq import limits
from txmq.client._client import ClientBase
from txmq.client._connection import AsyncConnection, parse_endpoint, tls_client_context
from txmq.client._core import (
    SEND_RETRY_CODES,
    SEND_STATUS_OF_CODE,
    LocalTransactionState,
    SendResult,
    TransactionSendResult,
    check_response,
    ensure_msg_id,
    producer_heartbeat,
    send_request_header,
    send_result,
    set_delay_level,
)
from txmq.client._msgtrace import msg_tracer
from txmq.client._route import (
    UNREACHABLE_ROUTE_REFRESH_MS,
    FaultStrategy,
    QueueSelector,
    TopicRoute,
    master_may_have_moved,
)
from txmq.client._tracing import (
    SEND,
    SEND_HALF,
    check_span,
    end_span,
    ended,
    local_transaction_state,
    send_span,
    sent,
)
from txmq.client._transaction import (
    UNCONFIRMED_END,
    CheckBack,
    EndAnswer,
    EndBatcher,
    EndMode,
    EndStep,
    LocalRaised,
    LocalStep,
    SendHalfStep,
    TransactionCore,
    TransactionFlow,
)
from txmq.errors import (
    BrokerUnavailable,
    ConfigError,
    MessageTooLarge,
    RemoteError,
    ResponseCode,
    TransportError,
)
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    Command,
    EndTransactionRequestHeader,
    HeartbeatData,
    Message,
    MessageExt,
    MessageQueue,
    RequestCode,
    UnregisterClientRequestHeader,
    encode_batch,
    to_ext,
)
from txmq.tracing import Tracing, error_type

__all__ = [
    "AsyncConnection",
    "AsyncProducer",
    "AsyncTransactionProducer",
    "MessageQueueSelector",
    "TransactionListener",
    "parse_endpoint",
    "tls_client_context",
]

log = logging.getLogger("txmq.client")


MessageQueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]
"""Chooses the queue of an orderly send from the topic's publish queues, the message and the
caller's ``arg`` (RocketMQ ``MessageQueueSelector.select``), e.g. by hashing a key."""

QueueChoice = MessageQueue | int | None
"""Where a send goes: a :class:`MessageQueue` (RocketMQ ``send(msg, mq)``), an index into the
topic's publish queues (over one broker: its queue id), or None: round robin."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Attempt:
    """What one send attempt learned: the queue tried, and whether it may have been stored."""

    def __init__(self) -> None:
        self.last_broker: str | None = None
        self.ambiguous_mq: MessageQueue | None = None
        self.error: Exception | None = None


class AsyncProducer(ClientBase):
    """Sends messages (RocketMQ ``DefaultMQProducer``), asyncio API, to every broker group of a
    topic's route.

    Each send picks a queue round robin over the publish queues of every broker group with a
    master; a failed attempt is retried ``retry_times_when_send_failed`` times on another broker
    group when there is one, all within ``timeout_ms``. Latency fault tolerance (RocketMQ 5's
    ``MQFaultStrategy`` tables) is on by default, so a broker that failed a send is avoided at once
    (RocketMQ's default is off). A send that timed out or lost its connection may have been stored:
    it is retried like RocketMQ's (at least once; consumers deduplicate by message id); a half
    message is retried only on the same broker, which stores a half with the same ``UNIQ_KEY`` at
    most once (docs/transactions.md).

    Args:
        group: producer group.
        endpoints: broker address ``host:port`` ("" with ``namesrv_addr``).
        max_message_size: refuse bodies larger than this locally (bytes).
        timeout_ms: the time budget of one send, all attempts together (RocketMQ
            ``sendMsgTimeout``).
        namesrv_addr: name server address(es), as RocketMQ clients take them.
        retry_times_when_send_failed: extra attempts of a failed send (RocketMQ 2).
        send_latency_fault_enable: avoid brokers by their recent latency and failures (on).
        access_key, secret_key: ACL credentials; every request is signed (docs/security.md).
        tls, tls_ca_file, tls_verify_hostname: TLS to the brokers (see ``ClientBase``;
            docs/security.md).
        connect_timeout_ms: give up a connect after this (RocketMQ 3 s).
        poll_name_server_interval_ms: route refresh period (RocketMQ 30 s).
        enable_msg_trace: write RocketMQ message trace records (``Pub``, and ``EndTransaction``
            for a transaction producer) to the trace topic, asynchronously, never failing a send
            (RocketMQ ``enableMsgTrace``; docs/tracing.md).
        custom_trace_topic: the trace topic (RocketMQ ``customizedTraceTopic``; default
            ``RMQ_SYS_TRACE_TOPIC``).
        tracing: True (the global tracer provider), False, or a
            :class:`~txmq.tracing.Tracing`: a send span per send, and the message's creation
            context in its ``traceparent`` property (docs/tracing.md).

    Raises:
        ConfigError: a bad argument.
    """

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
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname,
                         connect_timeout_ms=connect_timeout_ms,
                         poll_name_server_interval_ms=poll_name_server_interval_ms,
                         tracing=tracing)
        if not group:
            raise ConfigError("producer group must not be empty")
        if retry_times_when_send_failed < 0:
            raise ConfigError("retry_times_when_send_failed must be >= 0")
        self.group = group
        self.max_message_size = max_message_size
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.faults = FaultStrategy(send_latency_fault_enable)
        self._selector = QueueSelector(self.faults, random.Random())
        self.send_failures: Counter[str] = Counter()
        """Failed send attempts by broker group (each retried or reported)."""
        self.msg_trace = msg_tracer(self, enable_msg_trace, custom_trace_topic, group, "PRODUCE")

    def _heartbeat_data(self) -> HeartbeatData:
        return producer_heartbeat(self.client_id, [self.group])

    def _unregister_header(self) -> UnregisterClientRequestHeader:
        return UnregisterClientRequestHeader(client_id=self.client_id, producer_group=self.group)

    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to ``topic`` chooses from, over every broker group with a master
        (RocketMQ ``fetchPublishMessageQueues``). Raises RemoteError (TOPIC_NOT_EXIST)."""
        return list((await self.route(topic)).publish)

    def _fixed_queue(self, route: TopicRoute, queue: QueueChoice) -> MessageQueue | None:
        if queue is None:
            return None
        if isinstance(queue, MessageQueue):
            if queue not in route.publish:
                raise ConfigError(f"{queue} is not a writable queue of topic {route.topic!r}")
            return queue
        if not 0 <= queue < len(route.publish):
            raise ConfigError(f"queue {queue} not in topic {route.topic!r} "
                              f"({len(route.publish)} queues)")
        return route.publish[queue]

    def _validate(self, msg: Message) -> None:
        if not msg.topic:
            raise ConfigError("message topic must not be empty")
        if len(msg.body) > self.max_message_size:
            raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self.max_message_size}")

    async def send(self, msg: Message, queue_id: QueueChoice = None, *, delay_level: int = 0,
                   selector: MessageQueueSelector | None = None, arg: Any = None) -> SendResult:
        """Send one message; returns after the broker stored it (durably, with SYNC_FLUSH).

        ``queue_id`` pins the queue (see :data:`QueueChoice`); ``selector(queues, msg, arg)`` picks it
        for an orderly send (RocketMQ ``send(msg, selector, arg)``), and then no other queue is
        tried. ``delay_level`` > 0 makes it a delay message (property ``DELAY``): consumers see it
        after that level's delay (``message_delay_level``: 1 = 1 s … 18 = 2 h by default).

        Returns a :class:`SendResult` whose ``status`` is SEND_OK or a weaker guarantee for a
        message that was stored (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE).

        Raises:
            MessageTooLarge, ConfigError: refused locally, nothing sent.
            RemoteError: the broker refused it (unknown topic, no permission, disk full, …).
            TransportError (BrokerUnavailable, ConnectTimeout, RequestTimeout): every attempt failed;
                one that timed out may have been stored.
        """
        if delay_level:
            set_delay_level(msg, delay_level)
        self._validate(msg)
        ensure_msg_id(msg, self._ids)
        half = msg.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true"
        tracer = self.msg_trace
        started_ms = _now_ms() if tracer is not None else 0
        with send_span(self.tracing, [msg], SEND_HALF if half else SEND, self.client_id) as span:
            route = await self._writable(msg.topic)
            fixed = self._fixed_queue(route, queue_id)
            if selector is not None:
                fixed = self._fixed_queue(route, selector(list(route.publish), msg, arg))
            result = await self._send(msg, msg.msg_id, half, RequestCode.SEND_MESSAGE_V2,
                                      msg.body, route, fixed)
            sent(span, result)
        if tracer is not None:
            tracer.sent(msg, result, started_ms)
        return result

    async def send_batch(self, msgs: list[Message], queue_id: QueueChoice = None) -> SendResult:
        """Send plain messages of one topic in one request, stored contiguously in one queue.

        Returns the first message's result (``queue_offset`` of the first; the rest follow).
        Raises as :meth:`send`.
        """
        if not msgs or len(msgs) > limits.BATCH_MESSAGES_MAX:
            raise ConfigError(f"a batch holds 1..{limits.BATCH_MESSAGES_MAX} messages")
        topic = msgs[0].topic
        for m in msgs:
            self._validate(m)
            if m.topic != topic:
                raise ConfigError("all messages of a batch must have the same topic")
            ensure_msg_id(m, self._ids)
        half = msgs[0].properties.get(PROPERTY_TRANSACTION_PREPARED) == "true"
        with send_span(self.tracing, msgs, SEND_HALF if half else SEND, self.client_id,
                       batch=True) as span:
            route = await self._writable(topic)
            result = await self._send(Message(topic=topic, body=b""), msgs[0].msg_id, half,
                                      RequestCode.SEND_BATCH_MESSAGE, encode_batch(msgs), route,
                                      self._fixed_queue(route, queue_id), batch=True)
            sent(span, result)
            return result

    async def _send(self, msg: Message, msg_id: str, half: bool, code: int, body: bytes,
                    route: TopicRoute, fixed: MessageQueue | None, *,
                    batch: bool = False) -> SendResult:
        """Attempts of one send (RocketMQ ``DefaultMQProducerImpl.sendDefaultImpl``); ``msg``
        gives the request header, ``msg_id`` the result's id."""
        deadline = time.monotonic() + self._timeout_ms / 1000
        at = _Attempt()
        for attempt in range(1 + self.retry_times_when_send_failed):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (attempt and fixed is None and not (half and at.ambiguous_mq)
                                  and not route.publish):
                break  # (a plain send whose attempt was lost goes on only where there is a master)
            mq = at.ambiguous_mq if (half and at.ambiguous_mq) else fixed or self._selector.select(
                route.topic, route.publish, at.last_broker, _now_ms())
            result = await self._attempt(msg, msg_id, code, body, mq, remaining, at, batch=batch)
            if result is not None:
                return result
            if half and at.ambiguous_mq is not None and mq is not at.ambiguous_mq:
                break  # a half that may be stored on one broker never goes to another
            if master_may_have_moved(at.error) or (
                    isinstance(at.error, RemoteError)
                    and at.error.response_code == ResponseCode.TOPIC_NOT_EXIST):
                route = await self._refreshed(route)
        assert at.error is not None or time.monotonic() >= deadline
        if at.error is None:
            raise BrokerUnavailable(f"send to {route.topic!r} ran out of its {self._timeout_ms} ms")
        raise at.error

    async def _writable(self, topic: str) -> TopicRoute:
        """``topic``'s route, fetched again when it has no publish queue (every broker group
        without a master, as during a failover, or not writable), as often as
        :meth:`_refresh_route_soon` allows; in the background (:meth:`_refresh_route_later`)
        when only some groups have no master. Raises BrokerUnavailable when it still has none
        (RocketMQ: "No route info of this topic"), RemoteError (TOPIC_NOT_EXIST)."""
        route = await self.route(topic)
        if not route.publish:
            route = await self._refresh_route_soon(topic) or route
        elif route.masterless() or self._avoids_unreachable(route):
            self._refresh_route_later(topic)
        if not route.publish:
            raise BrokerUnavailable(f"topic {topic!r} has no writable queue on a broker group "
                                    f"with a master (groups: {route.broker_names()})")
        return route

    def _avoids_unreachable(self, route: TopicRoute) -> bool:
        """Whether a group of ``route`` is avoided since a send to it failed, and the route was
        last looked up ``UNREACHABLE_ROUTE_REFRESH_MS`` ago or more: its master may have moved."""
        since = self._refresh_gate.since_last(route.topic, time.monotonic_ns() // 1_000_000)
        return (since is None or since >= UNREACHABLE_ROUTE_REFRESH_MS) and any(
            not self.faults.reachable(name) for name in route.broker_names())

    async def _refreshed(self, route: TopicRoute) -> TopicRoute:
        """``route`` fetched again after TOPIC_NOT_EXIST, a broker that could not be reached or
        one that says it is not the master (a route that lost or gained a broker, or whose group
        has a new master), rate-limited by :meth:`_refresh_route_soon`; the old
        route if the lookup fails or was done just now."""
        return await self._refresh_route_soon(route.topic) or route

    async def _attempt(self, msg: Message, msg_id: str, code: int, body: bytes, mq: MessageQueue,
                       timeout_s: float, at: _Attempt, *, batch: bool) -> SendResult | None:
        """One attempt to ``mq``: the result, or None with ``at`` updated (the failure recorded
        for the fault strategy; non-retryable refusals raise)."""
        started = time.monotonic()
        at.last_broker = mq.broker_name
        try:
            conn = await self.connection(await self.master_address(mq.broker_name, mq.topic))
        except TransportError as exc:  # nothing was sent
            self._failed(mq, exc, at)
            return None
        ext = send_request_header(msg, self.group, mq.queue_id, _now_ms(), batch=batch)
        try:
            resp = await conn.request(code, ext, body, timeout_s)
        except TransportError as exc:  # it may have been stored
            self._failed(mq, exc, at)
            at.ambiguous_mq = mq
            return None
        self.faults.update(mq.broker_name, int((time.monotonic() - started) * 1000), _now_ms())
        if resp.code in SEND_STATUS_OF_CODE:
            return send_result(mq.topic, msg_id, resp, mq.broker_name)
        exc_r = RemoteError.of(resp.code, resp.remark or "")
        if resp.code not in SEND_RETRY_CODES and not master_may_have_moved(exc_r):
            raise exc_r
        self._failed(mq, exc_r, at)
        return None

    def _master_moved(self, broker_name: str, old: str, new: str) -> None:
        """The group's failures were the old master's: its new master starts with a clean record
        in the fault strategy (else the group would be avoided for up to 10 s after a failover)."""
        super()._master_moved(broker_name, old, new)
        self.faults.forget(broker_name)

    def _failed(self, mq: MessageQueue, exc: Exception, at: _Attempt) -> None:
        at.error = exc
        self.send_failures[mq.broker_name] += 1
        isolate = isinstance(exc, TransportError)
        self.faults.update(mq.broker_name, 0, _now_ms(), failed=isolate)
        log.warning("send to %s of %s failed: %s", mq.broker_name or self.endpoints, mq.topic, exc)


class TransactionListener(Protocol):
    """The application's side of a transactional send (RocketMQ ``TransactionListener``).

    Either method may be a coroutine function with the async producer. With the sync producer,
    ``execute_local_transaction`` runs in the caller's thread and ``check_local_transaction`` in a
    worker thread, so it must be thread-safe (open its own database connection).
    """

    def execute_local_transaction(
        self, msg: Message, arg: Any
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...

    def check_local_transaction(
        self, msg: MessageExt
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...


class AsyncTransactionProducer(AsyncProducer):
    """Sends half messages, runs the local transaction, ends it; answers check-backs from every
    broker of its routes.

    The half goes wherever a send would go; the end goes to the current master of the half's
    broker group; a check-back is answered to the broker that asked. Once the local outcome is
    known no failure of the end request reaches the caller: the result's ``outcome`` is
    ``"UNKNOWN_END"`` (check-back settles it), the failure is logged and counted in
    ``end_failures``.

    Args:
        group: producer group (check-backs go to live members of it).
        endpoints: broker address.
        listener: the :class:`TransactionListener`. A plain ``execute_local_transaction`` runs in a
            worker thread (the event loop is never blocked); a coroutine function is awaited.
        check_threads: how many check-backs run at once.
        oneway_end: send END_TRANSACTION one-way like RocketMQ's ``endTransactionOneway`` (faster;
            the result's ``outcome`` is then "SENT"). By default the broker's recorded outcome is
            awaited, so a returned COMMIT is durable and visible.
        max_message_size, timeout_ms, namesrv_addr, retry_times_when_send_failed,
        send_latency_fault_enable, access_key, secret_key, tls, tls_ca_file, tls_verify_hostname,
        connect_timeout_ms, poll_name_server_interval_ms, enable_msg_trace, custom_trace_topic:
            as :class:`AsyncProducer`.
        tracing: as :class:`AsyncProducer`; a transactional send is a
            ``send_message_in_transaction`` span (its context the half's creation context) with
            the half's send, the local transaction and the end as children, and a check-back
            answered is a span in the half's trace (docs/tracing.md).
    """

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
        super().__init__(group, endpoints, max_message_size=max_message_size,
                         timeout_ms=timeout_ms, namesrv_addr=namesrv_addr,
                         retry_times_when_send_failed=retry_times_when_send_failed,
                         send_latency_fault_enable=send_latency_fault_enable,
                         access_key=access_key, secret_key=secret_key, tls=tls,
                         tls_ca_file=tls_ca_file, tls_verify_hostname=tls_verify_hostname,
                         connect_timeout_ms=connect_timeout_ms,
                         poll_name_server_interval_ms=poll_name_server_interval_ms,
                         enable_msg_trace=enable_msg_trace, custom_trace_topic=custom_trace_topic,
                         tracing=tracing)
        if listener is None:
            raise ConfigError("a transaction producer needs a TransactionListener")
        if check_threads < 1:
            raise ConfigError("check_threads must be >= 1")
        self.listener = listener
        self.oneway_end = oneway_end
        self._tx = TransactionCore(group, self._ids, tracing=self.tracing,
                                   client_id=self.client_id)
        self._batchers: dict[str, EndBatcher] = {}  # broker address -> its batcher
        self._waiting: dict[int, asyncio.Future[EndAnswer]] = {}  # id(header) -> its answer
        self._check_sem = asyncio.Semaphore(check_threads)
        self._check_tasks: set[asyncio.Task[None]] = set()
        self.checks_answered = 0
        self.end_failures = 0
        """End requests that failed after the local outcome was known (check-back settles them)."""

    async def send_half(self, msg: Message, queue_id: QueueChoice = None) -> SendResult:
        """Store ``msg`` as a half message (invisible until committed); see
        :meth:`TransactionCore.half` for its fresh id. Raises as :meth:`send`."""
        return await self.send(self._tx.half(msg), queue_id)

    async def send_half_batch(self, msgs: list[Message], queue_id: QueueChoice = None) -> SendResult:
        """Store several half messages of one topic in one request, contiguous in the half queue
        (the result names the first; the rest follow). Ending them one by one needs each one's
        offsets, so this is for callers that settle a whole batch at once (the Spark sink)."""
        return await self.send_batch([self._tx.half(m) for m in msgs], queue_id)

    async def end_transaction(self, half: SendResult, state: LocalTransactionState) -> str:
        """Tell the half's broker group (its current master) the local outcome; returns its recorded
        outcome ("COMMIT", "ROLLBACK", "PENDING" for UNKNOWN), "SENT" with ``oneway_end`` or against
        a broker without batch ends (RocketMQ ``endTransactionOneway``: no answer awaited), or
        ``"UNKNOWN_END"`` when the request failed in any way (logged, counted in
        ``end_failures``; check-back will settle it). Never raises.

        The request carries the half's ``masterEpoch`` (txmq, controller mode). When it fails in a
        way that says the group's master may have moved (:func:`master_may_have_moved`: the
        connection failed, or a slave or a fenced or old master refused it), the route is fetched
        again and the same request (the same outcome: an end never goes out with two) is sent
        once more, to the group's current master; if that fails too, check-back settles it.
        Traced as an ``end_transaction`` span with the state and the outcome."""
        with end_span(self.tracing, half, state, self.client_id) as span:
            outcome = await self._end(half, state)
            ended(span, outcome)
            return outcome

    async def _end(self, half: SendResult, state: LocalTransactionState) -> str:
        h = self._tx.end_request(half, state)
        if self.msg_trace is not None:
            self.msg_trace.ended(half, state)
        try:
            return await self._end_once(half, h)
        except Exception as exc:
            failure: Exception = exc
        if master_may_have_moved(failure):
            log.info("end transaction of %s (%s) failed (%s); the master of %s may have moved: "
                     "trying its current master once", half.msg_id, state.name, failure,
                     half.broker_name or self.endpoints)
            await self._refresh_route_soon(half.topic)
            try:
                return await self._end_once(half, h)
            except Exception as exc:
                self.end_failures += 1
                log.info("end transaction of %s (%s) not confirmed by the current master either: "
                         "%s; the broker will ask (check-back)", half.msg_id, state.name, exc)
                return UNCONFIRMED_END
        self.end_failures += 1
        log.warning("end transaction of %s (%s) not confirmed: %s; check-back will settle it",
                    half.msg_id, state.name, failure)
        return UNCONFIRMED_END

    async def _end_once(self, half: SendResult, h: EndTransactionRequestHeader) -> str:
        """One end request to the current master of the half's group; its outcome. Raises
        TransportError, RemoteError (the end refused), ProtocolError."""
        addr = (self.known_master_address(half.broker_name)
                or await self.master_address(half.broker_name, half.topic))
        batcher = self._batchers.get(addr)
        if batcher is None:
            batcher = self._batchers[addr] = EndBatcher()
        if self.oneway_end or batcher.mode is EndMode.ONEWAY:
            (await self.connection(addr)).oneway(RequestCode.END_TRANSACTION, to_ext(h))
            return "SENT"
        fut = self._queue_end(addr, batcher, h)
        try:
            item = await fut
        finally:
            self._waiting.pop(id(h), None)
        if item.code != ResponseCode.SUCCESS:
            raise RemoteError.of(item.code, item.remark)
        return item.outcome

    def _queue_end(self, addr: str, batcher: EndBatcher,
                   h: EndTransactionRequestHeader) -> asyncio.Future[EndAnswer]:
        """Queue an end request; its answer's future (the caller awaits it, then drops it from
        ``_waiting``). All ends to one broker queued in one event-loop turn go in one
        END_TRANSACTION_BATCH request (at most ``limits.BATCH_MESSAGES_MAX``). A function, not a
        coroutine: one coroutine fewer per transaction."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[EndAnswer] = loop.create_future()
        self._waiting[id(h)] = fut
        if batcher.add(h):
            loop.call_soon(self._spawn_end_flush, addr, batcher)
        return fut

    def _spawn_end_flush(self, addr: str, batcher: EndBatcher) -> None:
        task = asyncio.get_running_loop().create_task(self._flush_ends(addr, batcher))
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)

    async def _flush_ends(self, addr: str, batcher: EndBatcher) -> None:
        batch, more = batcher.take()
        if more:
            asyncio.get_running_loop().call_soon(self._spawn_end_flush, addr, batcher)
        futs = [self._waiting.get(id(h)) for h in batch]
        try:
            conn = await self.connection(addr)
            resp = await conn.request(RequestCode.END_TRANSACTION_BATCH, body=batcher.body(batch))
            if batcher.unsupported(resp):  # an Apache RocketMQ broker: one-way ends
                for h in batch:
                    conn.oneway(RequestCode.END_TRANSACTION, to_ext(h))
                answers = [EndAnswer(ResponseCode.SUCCESS, outcome="SENT") for _ in batch]
            else:
                answers = batcher.answers(check_response(resp), len(batch))
        except Exception as exc:
            for fut in futs:
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
            return
        for fut, answer in zip(futs, answers, strict=True):
            if fut is not None and not fut.done():
                fut.set_result(answer)

    async def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Half message → local transaction → commit or rollback (RocketMQ
        ``sendMessageInTransaction``; the steps are :meth:`TransactionCore.flow`'s, shared with
        the sync producer). An exception in the local transaction counts as UNKNOWN (as in
        RocketMQ) and is logged; check-back then decides.

        Raises (only before the local transaction runs): MessageTooLarge, ConfigError,
        RemoteError, TransportError. TypeError (after the end request: the half is left UNKNOWN
        for check-back): the listener returned something that is not a LocalTransactionState.
        """
        return await drive_flow(self._tx.flow(msg, arg), self)

    async def _run_local(self, step: LocalStep) -> Any:
        """Run the listener's ``execute_local_transaction`` for a flow step (awaited when a
        coroutine function, else in a worker thread); :class:`LocalRaised` if it raised."""
        try:
            return await _call_listener(self.listener.execute_local_transaction, step.msg, step.arg)
        except Exception as exc:
            log.exception("local transaction of %s raised; state UNKNOWN", step.half.msg_id)
            return LocalRaised(exc)

    def _on_request(self, conn: AsyncConnection, cmd: Command) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            task = asyncio.get_running_loop().create_task(self._check(conn, cmd))
            self._check_tasks.add(task)
            task.add_done_callback(self._check_tasks.discard)

    async def _check(self, conn: AsyncConnection, cmd: Command) -> None:
        """Answer a check-back to the broker that asked (RocketMQ ``ClientRemotingProcessor
        .checkTransactionState`` answers on the asking channel's address). Traced as a
        ``check_transaction_state`` span in the half message's trace, with the answer."""
        check = self._tx.check_back(cmd)
        if check is None:
            return
        with check_span(self.tracing, check.message, self.client_id) as span:
            async with self._check_sem:
                try:
                    result = await _call_listener(self.listener.check_local_transaction,
                                                  check.message)
                except Exception as exc:
                    log.exception("check_local_transaction of %s raised; answering UNKNOWN",
                                  check.header.msg_id)
                    local_transaction_state(span, LocalTransactionState.UNKNOWN,
                                            error_type(exc), str(exc))
                    return
            state, complaint = self._tx.local_state(result)
            if complaint:
                log.error("check_local_transaction: %s", complaint)
            local_transaction_state(span, state, "TypeError" if complaint else "", complaint)
            if self.msg_trace is not None:
                self.msg_trace.checked(check.message, check.header.transaction_id or "", state,
                                       conn.addr)
            end = self._tx.check_answer(check, state)
            if end is not None:
                await self._answer_check(conn, check, end)

    async def _answer_check(self, conn: AsyncConnection, check: CheckBack,
                            end: EndTransactionRequestHeader) -> None:
        try:
            target = conn if not conn.closed else await self.connection(conn.addr)
            target.oneway(RequestCode.END_TRANSACTION, to_ext(end))
            self.checks_answered += 1
        except TransportError as exc:
            log.warning("check-back answer for %s to %s lost: %s", check.header.msg_id,
                        conn.addr, exc)


async def drive_flow(flow: TransactionFlow, p: AsyncTransactionProducer) -> TransactionSendResult:
    """Perform a :meth:`TransactionCore.flow` on the asyncio producer ``p``. A step that raises
    is thrown into the flow (its spans end, failed) and goes on to the caller."""
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            step = flow.send(value) if error is None else flow.throw(error)
            error = None
            try:
                if isinstance(step, SendHalfStep):
                    value = await p.send(step.msg)
                elif isinstance(step, LocalStep):
                    value = await p._run_local(step)
                else:
                    assert isinstance(step, EndStep)
                    value = await p.end_transaction(step.half, step.state)
            except BaseException as exc:  # thrown into the flow, which re-raises it
                error = exc
    except StopIteration as stop:
        result: TransactionSendResult = stop.value
        return result


def _call_listener(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """What to await for a listener call: a coroutine listener's own coroutine (no coroutine
    around it: one fewer per transaction), a plain one run in a worker thread."""
    method = getattr(fn, "__func__", None)  # a bound method: a new object on every access
    if _coroutine_method(method) if method is not None else inspect.iscoroutinefunction(fn):
        return fn(*args)  # type: ignore[no-any-return]
    return _in_thread(fn, *args)


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a plain listener in a worker thread; await what it returns if that is awaitable."""
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


LISTENER_KIND_CACHE_ENTRIES = 64
"""Listener methods whose kind (coroutine function or not) :func:`_call_listener` remembers: a
process has a few listener classes (txmq)."""


@functools.lru_cache(maxsize=LISTENER_KIND_CACHE_ENTRIES)
def _coroutine_method(func: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction`` of a listener method's function, remembered: it unwraps
    and inspects the function each time (about 1 µs, once per transaction)."""
    return inspect.iscoroutinefunction(func)
