"""RocketMQ 4 message trace written by txmq's clients (``enable_msg_trace=True``), as RocketMQ's
``DefaultMQProducer(group, enableMsgTrace, customizedTraceTopic)`` writes it.

A producer records a ``Pub`` per message it sent and (a transaction producer) an ``EndTransaction``
per end request and check-back answer; a push consumer records a ``SubBefore`` per message before
the listener call and a ``SubAfter`` after it (RocketMQ ``SendMessageTraceHookImpl``,
``EndTransactionTraceHookImpl``, ``ConsumeMessageTraceHookImpl``). The records go to the trace
topic (``RMQ_SYS_TRACE_TOPIC``, or ``custom_trace_topic``) in trace messages whose keys are the
traced messages' ids and keys (:mod:`txmq.protocol._msg_trace`).

Nothing here can fail or hold up the user's send or listener (RocketMQ ``AsyncTraceDispatcher``):

- building a record is pure (the ``*_record`` functions, time given as ``now_ms``); a hook that
  fails anyway is logged and counted in ``MsgTracer.hook_failures``;
- :class:`TraceBuffer` holds at most ``TRACE_QUEUE_SIZE`` records; one more is dropped and counted
  (``discarded``);
- a task on the client's event loop sends ``TRACE_MSG_BATCH_NUM`` records at a time, or fewer after
  ``TRACE_FLUSH_INTERVAL_MS``, over the client's own connections (one attempt,
  ``TRACE_SEND_TIMEOUT_MS``); a failed trace message is logged and counted (``send_failures``),
  never raised; shutdown sends what is left, for at most ``TRACE_SHUTDOWN_WAIT_MS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from txmq import limits
from txmq.client._core import (
    LocalTransactionState,
    MessageIdGenerator,
    SendResult,
    SendStatus,
    check_response,
    is_consumed,
    send_request_header,
)
from txmq.errors import BrokerUnavailable, ConfigError, InvalidRequest
from txmq.protocol import (
    DEFAULT_TRACE_REGION_ID,
    FIELD_SPLITOR,
    HALF_TOPIC,
    MASTER_ID,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MSG_REGION,
    PROPERTY_REAL_TOPIC,
    PROPERTY_START_DELIVER_TIME,
    PROPERTY_TRACE_SWITCH,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RMQ_SYS_TRACE_TOPIC,
    TRACE_GROUP_NAME_PREFIX,
    ConsumeReturnType,
    EndTransactionRecord,
    Message,
    MessageExt,
    PubRecord,
    RequestCode,
    SubAfterRecord,
    SubBeforeRecord,
    TraceBatch,
    TraceMessageType,
    TraceRecord,
    check_topic,
    is_trace_topic,
    trace_batches,
)

if TYPE_CHECKING:
    from txmq.client._client import ClientBase

__all__ = [
    "MsgTracer",
    "TraceBuffer",
    "end_record",
    "msg_tracer",
    "pub_record",
    "sub_after_records",
    "sub_before_records",
]

log = logging.getLogger("txmq.client.msgtrace")

TRACE_HALVES_REMEMBERED_MAX = 4_096
"""Half messages a traced transaction producer remembers (tags, keys, broker) until it ends them,
for their EndTransaction records; the oldest is forgotten first (txmq: RocketMQ's end hook is given
the message itself)."""
TRACE_SENDS_IN_FLIGHT_MAX = 4
"""Trace messages a client sends at once. RocketMQ ``AsyncTraceDispatcher.traceExecutor``: at most 4
threads."""
TRACE_FAILURE_LOG_EVERY = 100
"""A failed trace message is logged the first time and then every this many failures (txmq)."""

TraceKind = Literal["PRODUCE", "CONSUME"]
"""RocketMQ ``TraceDispatcher.Type``: what kind of client writes the records."""
_TRACER_IDS = itertools.count(1)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# -- records (pure) -------------------------------------------------------------------------------
def _message_type(msg: Message) -> TraceMessageType:
    """RocketMQ ``DefaultMQProducerImpl.sendKernelImpl``: half, then delay, else normal."""
    p = msg.properties
    if p.get(PROPERTY_START_DELIVER_TIME) is not None or p.get(PROPERTY_DELAY_TIME_LEVEL) is not None:
        return TraceMessageType.Delay_Msg
    if p.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return TraceMessageType.Trans_Msg_Half
    return TraceMessageType.Normal_Msg


def pub_record(msg: Message, result: SendResult, group: str, store_host: str, started_ms: int,
               now_ms: int) -> PubRecord | None:
    """The ``Pub`` record of a sent message (RocketMQ ``SendMessageTraceHookImpl``): started at
    ``started_ms``, answered at ``now_ms``; None when the broker answered ``TRACE_ON`` false."""
    if not result.trace_on:
        return None
    return PubRecord(
        timestamp_ms=started_ms, region_id=result.region_id or DEFAULT_TRACE_REGION_ID,
        group_name=group, topic=msg.topic, msg_id=result.msg_id, tags=msg.tags, keys=msg.keys,
        store_host=store_host, body_length=len(msg.body), cost_time_ms=max(0, now_ms - started_ms),
        msg_type=_message_type(msg), offset_msg_id=result.offset_msg_id,
        success=result.status is SendStatus.SEND_OK)


def end_record(*, topic: str, msg_id: str, transaction_id: str, state: LocalTransactionState,
               group: str, store_host: str, now_ms: int, tags: str = "", keys: str = "",
               region_id: str = "", from_transaction_check: bool = False) -> EndTransactionRecord:
    """The ``EndTransaction`` record of an end request or a check-back answer (RocketMQ
    ``EndTransactionTraceHookImpl``: message type ``Trans_msg_Commit`` whatever the state)."""
    return EndTransactionRecord(
        timestamp_ms=now_ms, region_id=region_id or DEFAULT_TRACE_REGION_ID, group_name=group,
        topic=topic, msg_id=msg_id, tags=tags, keys=keys, store_host=store_host,
        msg_type=TraceMessageType.Trans_msg_Commit, transaction_id=transaction_id,
        transaction_state=state.value, from_transaction_check=from_transaction_check)


def _consumed_id(m: MessageExt) -> str:
    """RocketMQ ``MessageClientExt.getMsgId``: the ``UNIQ_KEY``, else the offset message id."""
    if m.msg_id:
        return m.msg_id
    try:
        return m.offset_msg_id
    except Exception:
        return ""


def sub_before_records(msgs: list[MessageExt], group: str, request_id: str,
                       now_ms: int) -> list[SubBeforeRecord]:
    """The ``SubBefore`` records of one listener call (RocketMQ
    ``ConsumeMessageTraceHookImpl.consumeMessageBefore``): one per message, but none for a message
    whose ``TRACE_ON`` property is ``false``. A message without ``MSG_REGION`` gets
    ``DefaultRegion`` (RocketMQ's Java client drops such records)."""
    out = []
    for m in msgs:
        if m.properties.get(PROPERTY_TRACE_SWITCH) == "false":
            continue
        out.append(SubBeforeRecord(
            timestamp_ms=now_ms, region_id=m.properties.get(PROPERTY_MSG_REGION) or DEFAULT_TRACE_REGION_ID,
            group_name=group, request_id=request_id, msg_id=_consumed_id(m),
            retry_times=m.reconsume_times, keys=m.keys))
    return out


def return_type(status: object, raised: bool, elapsed_ms: int, timeout_ms: int) -> ConsumeReturnType:
    """RocketMQ ``ConsumeMessageConcurrentlyService``'s ``ConsumeReturnType`` of a call: raised →
    EXCEPTION, None → RETURNNULL, past the consume timeout → TIME_OUT, not consumed → FAILED."""
    if raised:
        return ConsumeReturnType.EXCEPTION
    if status is None:
        return ConsumeReturnType.RETURNNULL
    if elapsed_ms >= timeout_ms:
        return ConsumeReturnType.TIME_OUT
    return ConsumeReturnType.SUCCESS if is_consumed(status) else ConsumeReturnType.FAILED


def sub_after_records(befores: list[SubBeforeRecord], calls: int, status: object,
                      code: ConsumeReturnType, now_ms: int) -> list[SubAfterRecord]:
    """The ``SubAfter`` records ending ``befores`` (RocketMQ ``consumeMessageAfter``): the call's
    time divided by its ``calls`` messages, success when the listener said it consumed them."""
    if not befores:
        return []
    cost = max(0, now_ms - befores[0].timestamp_ms) // max(1, calls)
    ok = is_consumed(status)
    return [SubAfterRecord(request_id=b.request_id, msg_id=b.msg_id, cost_time_ms=cost, success=ok,
                           keys=b.keys, context_code=int(code), timestamp_ms=now_ms,
                           group_name=b.group_name) for b in befores]


# -- the buffer (sans-IO, thread-safe) --------------------------------------------------------------
class TraceBuffer:
    """Records waiting to be sent (RocketMQ ``AsyncTraceDispatcher.traceContextQueue`` and
    ``flushTraceContext``). ``append`` may be called from any thread.

    Args:
        batch_num: records per trace message (capped at ``TRACE_MSG_BATCH_NUM_MAX``).
        queue_size: records held at most; one more is dropped and counted in ``discarded``.
        flush_interval_ms: fewer than ``batch_num`` records are due this long after the last take.
        now_ms: the time of creation (the first interval starts there).
    """

    def __init__(self, now_ms: int, *, batch_num: int = limits.TRACE_MSG_BATCH_NUM,
                 queue_size: int = limits.TRACE_QUEUE_SIZE,
                 flush_interval_ms: int = limits.TRACE_FLUSH_INTERVAL_MS) -> None:
        if batch_num < 1 or queue_size < 1 or flush_interval_ms < 0:
            raise ConfigError("batch_num and queue_size must be >= 1, flush_interval_ms >= 0")
        self.batch_num = min(batch_num, limits.TRACE_MSG_BATCH_NUM_MAX)
        self.queue_size = queue_size
        self.flush_interval_ms = flush_interval_ms
        self.discarded = 0
        self._q: deque[TraceRecord] = deque()
        self._lock = threading.Lock()
        self._last_take_ms = now_ms

    def __len__(self) -> int:
        return len(self._q)

    def append(self, records: list[Any]) -> bool:
        """Queue ``records`` (TraceRecords); False (each one dropped and counted) when full."""
        with self._lock:
            room = self.queue_size - len(self._q)
            self._q.extend(records[:max(0, room)])
            dropped = len(records) - max(0, room)
            if dropped > 0:
                self.discarded += dropped
                return False
        return True

    def due(self, now_ms: int) -> bool:
        """Whether records should be sent now: a full batch, or any once more than the flush
        interval passed since the last take (RocketMQ ``flushTraceContext``)."""
        n = len(self._q)
        return n >= self.batch_num or (n > 0 and now_ms - self._last_take_ms > self.flush_interval_ms)

    def take(self, now_ms: int, *, force: bool = False) -> list[TraceRecord]:
        """Up to ``batch_num`` records when :meth:`due` (or any with ``force``), oldest first;
        [] otherwise."""
        with self._lock:
            if not self._q or not (force or self.due(now_ms)):
                return []
            self._last_take_ms = now_ms
            return [self._q.popleft() for _ in range(min(self.batch_num, len(self._q)))]


# -- the shell ---------------------------------------------------------------------------------------
def msg_tracer(host: ClientBase, enable_msg_trace: bool, custom_trace_topic: str, group: str,
               kind: TraceKind) -> MsgTracer | None:
    """The tracer of a client built with ``enable_msg_trace``, or None. Raises ConfigError for an
    illegal ``custom_trace_topic``."""
    if not enable_msg_trace:
        return None
    topic = custom_trace_topic or RMQ_SYS_TRACE_TOPIC
    try:
        check_topic(topic)
    except InvalidRequest as exc:
        raise ConfigError(f"custom_trace_topic: {exc}") from exc
    return MsgTracer(host, group, kind, topic)


class MsgTracer:
    """One client's message trace: builds records in its hooks, sends them from a task on the
    client's event loop (RocketMQ ``AsyncTraceDispatcher``).

    Args:
        host: the client whose connections and routes carry the trace messages.
        group: the client's producer or consumer group (the records' ``groupName``).
        kind: PRODUCE or CONSUME.
        trace_topic: where the records go.
        buffer: the record buffer (default: RocketMQ's batch, queue and interval sizes).

    Counters: ``records_sent``, ``messages_sent``, ``send_failures``, ``hook_failures``, and the
    buffer's ``discarded``.
    """

    def __init__(self, host: ClientBase, group: str, kind: TraceKind, trace_topic: str,
                 buffer: TraceBuffer | None = None) -> None:
        self.host, self.group, self.kind, self.trace_topic = host, group, kind, trace_topic
        self.buffer = buffer or TraceBuffer(_wall_ms())
        name = f"{TRACE_GROUP_NAME_PREFIX}-{group}-{kind}-{next(_TRACER_IDS)}"
        self.producer_group = name[:limits.GROUP_NAME_MAX_CHARS]
        """Group of the trace messages (RocketMQ ``AsyncTraceDispatcher.genGroupNameForTrace``)."""
        self._ids = MessageIdGenerator(os.getpid(), os.urandom(4), _wall_ms)
        self._id_lock = threading.Lock()
        self._halves: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        self._rr = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop_thread = 0
        self._sends: asyncio.Semaphore | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self.records_sent = self.messages_sent = self.send_failures = self.hook_failures = 0

    # -- hooks (one call each from the client) --------------------------------------------------
    def sent(self, msg: Message, result: SendResult, started_ms: int) -> None:
        """After a send that returned ``result`` (on the client's loop). Never raises."""
        try:
            if msg.topic == self.trace_topic or is_trace_topic(msg.topic):
                return
            now = _wall_ms()
            store = self._store_host(result.broker_name)
            if msg.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
                self._remember_half(result.msg_id, (msg.tags, msg.keys, store))
            rec = pub_record(msg, result, self.group, store, started_ms, now)
            if rec is not None:
                self._add([rec])
        except Exception:
            self._hook_failed("send")

    def ended(self, half: SendResult, state: LocalTransactionState) -> None:
        """Before the end request of a half this producer sent (RocketMQ
        ``DefaultMQProducerImpl.endTransaction``). Never raises."""
        try:
            remembered = self._halves.pop(half.msg_id, None)
            tags, keys, store = remembered or ("", "", self._store_host(half.broker_name))
            self._add([end_record(topic=half.topic, msg_id=half.msg_id, transaction_id=half.msg_id,
                                  state=state, group=self.group, store_host=store,
                                  now_ms=_wall_ms(), tags=tags, keys=keys,
                                  region_id=half.region_id)])
        except Exception:
            self._hook_failed("end transaction")

    def checked(self, msg: MessageExt, transaction_id: str, state: LocalTransactionState,
                broker_addr: str) -> None:
        """A check-back from ``broker_addr`` about ``msg`` was answered ``state`` (RocketMQ
        ``checkTransactionState``: ``fromTransactionCheck`` true). Never raises."""
        try:
            topic = msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic) if msg.topic == HALF_TOPIC \
                else msg.topic
            msg_id = msg.properties.get(PROPERTY_UNIQ_KEY) or _consumed_id(msg)
            self._halves.pop(msg_id, ("", "", ""))
            self._add([end_record(
                topic=topic, msg_id=msg_id, transaction_id=transaction_id or msg_id, state=state,
                group=self.group, store_host=broker_addr, now_ms=_wall_ms(), tags=msg.tags,
                keys=msg.keys, region_id=msg.properties.get(PROPERTY_MSG_REGION, ""),
                from_transaction_check=True)])
        except Exception:
            self._hook_failed("check-back")

    def wrap_listener(self, listener: Callable[[list[MessageExt]], Any],
                      consume_timeout_ms: int) -> Callable[[list[MessageExt]], Any]:
        """``listener`` with SubBefore / SubAfter records around each call (on the loop; the
        wrapper keeps a coroutine listener a coroutine function, see ``is_async_listener``)."""
        self._bind()
        if inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
                getattr(listener, "__call__", None)):  # noqa: B004
            async def traced_async(msgs: list[MessageExt]) -> Any:
                before, started = self._before(msgs)
                try:
                    status = await listener(msgs)
                except BaseException:
                    self._after(before, len(msgs), None, started, consume_timeout_ms, raised=True)
                    raise
                self._after(before, len(msgs), status, started, consume_timeout_ms)
                return status
            return traced_async

        def traced(msgs: list[MessageExt]) -> Any:
            before, started = self._before(msgs)
            try:
                status = listener(msgs)
            except BaseException:
                self._after(before, len(msgs), None, started, consume_timeout_ms, raised=True)
                raise
            if inspect.isawaitable(status):  # a plain function that returned a coroutine
                return self._after_awaited(status, before, len(msgs), started, consume_timeout_ms)
            self._after(before, len(msgs), status, started, consume_timeout_ms)
            return status
        return traced

    async def _after_awaited(self, status: Any, before: list[SubBeforeRecord], calls: int,
                             started: int, timeout_ms: int) -> Any:
        try:
            result = await status
        except BaseException:
            self._after(before, calls, None, started, timeout_ms, raised=True)
            raise
        self._after(before, calls, result, started, timeout_ms)
        return result

    def _before(self, msgs: list[MessageExt]) -> tuple[list[SubBeforeRecord], int]:
        try:
            now = _wall_ms()
            before = sub_before_records(msgs, self.group, self._next_id(), now)
            self._add(list(before))
            return before, now
        except Exception:
            self._hook_failed("consume (before)")
            return [], _wall_ms()

    def _after(self, before: list[SubBeforeRecord], calls: int, status: object, started: int,
               timeout_ms: int, *, raised: bool = False) -> None:
        try:
            now = _wall_ms()
            code = return_type(status, raised, now - started, timeout_ms)
            self._add(list(sub_after_records(before, calls, status if not raised else None, code, now)))
        except Exception:
            self._hook_failed("consume (after)")

    # -- dispatch -------------------------------------------------------------------------------
    def _store_host(self, broker_name: str) -> str:
        return self.host.broker_addresses(broker_name).get(MASTER_ID) or self.host.endpoints

    def _remember_half(self, msg_id: str, what: tuple[str, str, str]) -> None:
        self._halves[msg_id] = what
        while len(self._halves) > TRACE_HALVES_REMEMBERED_MAX:
            self._halves.popitem(last=False)

    def _hook_failed(self, where: str) -> None:
        self.hook_failures += 1
        log.exception("message trace hook (%s) of %s failed; the record is lost", where, self.group)

    def _bind(self) -> None:
        """Note the client's loop and start the sending task (called on the loop; RuntimeError
        elsewhere)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._wake is None:
            self._loop, self._wake = loop, asyncio.Event()
            self._loop_thread = threading.get_ident()
            self._sends = asyncio.Semaphore(TRACE_SENDS_IN_FLIGHT_MAX)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=f"txmq-msgtrace-{self.group}")

    def _next_id(self) -> str:
        with self._id_lock:
            return self._ids.next()

    def _add(self, records: list[TraceRecord]) -> None:
        """Queue records (from any thread); wake the task once a batch is full."""
        if not records:
            return
        self.buffer.append(records)
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            with contextlib.suppress(RuntimeError):  # not on a loop: the records wait for one
                self._bind()
            return
        if len(self.buffer) >= self.buffer.batch_num and not wake.is_set():
            if threading.get_ident() == self._loop_thread:
                self._kick()
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(self._kick)

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._bind()
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.buffer.flush_interval_ms / 1000):
                    await wake.wait()
            wake.clear()
            await self._drain(force=False)

    async def _drain(self, *, force: bool) -> None:
        """Send every due batch, at most ``TRACE_SENDS_IN_FLIGHT_MAX`` trace messages at once."""
        assert self._sends is not None
        while records := self.buffer.take(_wall_ms(), force=force):
            try:
                batches = trace_batches(records)
            except Exception:
                self._hook_failed("encode")
                continue
            for b in batches:
                await self._sends.acquire()
                task = asyncio.get_running_loop().create_task(self._send(b))
                self._in_flight.add(task)
                task.add_done_callback(self._sent_one)

    def _sent_one(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        if self._sends is not None:
            self._sends.release()

    async def _send(self, batch: TraceBatch) -> None:
        """One trace message, one attempt; a failure is counted and logged, never raised
        (RocketMQ ``AsyncDataSendTask.sendTraceDataByMQ``)."""
        msg = Message(topic=self.trace_topic, body=batch.body, keys=" ".join(batch.keys))
        msg.properties[PROPERTY_UNIQ_KEY] = self._next_id()
        try:
            route = await self.host.route(self.trace_topic)
            if not route.publish:
                raise BrokerUnavailable(f"trace topic {self.trace_topic!r} has no writable queue")
            mq = route.publish[next(self._rr) % len(route.publish)]
            conn = await self.host.connection(await self.host.master_address(mq.broker_name, mq.topic))
            ext = send_request_header(msg, self.producer_group, mq.queue_id, _wall_ms())
            check_response(await conn.request(RequestCode.SEND_MESSAGE_V2, ext, msg.body,
                                              limits.TRACE_SEND_TIMEOUT_MS / 1000))
        except Exception as exc:
            self.send_failures += 1
            if self.send_failures % TRACE_FAILURE_LOG_EVERY == 1:
                log.warning("message trace of %s not sent to %s (%d failures so far): %s", self.group,
                            self.trace_topic, self.send_failures, exc)
            return
        self.messages_sent += 1
        self.records_sent += batch.body.count(FIELD_SPLITOR.encode())

    async def close(self) -> None:
        """Send what the buffer holds (at most ``TRACE_SHUTDOWN_WAIT_MS``) and stop the task; a
        later record starts it again. Never raises."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._loop is asyncio.get_running_loop():
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(limits.TRACE_SHUTDOWN_WAIT_MS / 1000):
                    await self._drain(force=True)
                    if self._in_flight:
                        await asyncio.wait(set(self._in_flight))
        for t in list(self._in_flight):
            t.cancel()
        self._loop = self._wake = None
