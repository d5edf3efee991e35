"""The threaded face of the asyncio transports (RabbitMQ, NATS), and the one consume step they share.

A broker client that is asyncio-only (aio-pika, nats-py) implements :class:`AsyncCore`;
:class:`BridgedTransport` runs it on a private event-loop thread and offers the blocking
:class:`~txmq.outbox.Transport` methods the threaded relay and the listeners call.
:func:`handle_delivery` is the per-delivery logic (decode → listener in a worker thread → verdict),
written once for every asyncio transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from txmq import limits
from txmq.client import ConsumeStatus
from txmq.errors import BrokerUnavailable
from txmq.outbox._transport import Listener, NotAnEnvelope, Verdict, verdict
from txmq.protocol import Message, MessageExt
from txmq.tracing import set_error

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["AsyncCore", "BridgedTransport", "LoopThread", "SpanOf", "handle_delivery", "is_async_listener"]

log = logging.getLogger("txmq.outbox.transport")

T = TypeVar("T")

Stop = Callable[[], Coroutine[Any, Any, None]]
_NULL: Final = contextlib.nullcontext(None)


class AsyncCore(Protocol):
    """An asyncio broker client for the outbox: the methods of :class:`~txmq.outbox.Transport`,
    as coroutines, plus ``connect``. ``consume`` returns a coroutine function that stops it."""

    kind: str

    async def connect(self) -> None: ...
    async def send(self, msgs: list[Message]) -> None: ...
    async def ensure_topic(self, topic: str) -> None: ...
    async def consume(self, group: str, topic: str, listener: Listener, max_reconsume_times: int) -> Stop: ...
    async def dead_letters(self, group: str, topic: str) -> list[MessageExt]: ...
    async def close(self) -> None: ...


def is_async_listener(fn: object) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004


class LoopThread:
    """An asyncio event loop in a daemon thread; :meth:`run` executes a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """The coroutine's result. Raises what it raises, or TimeoutError after ``timeout_s``."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            fut.cancel()
            raise

    def stop(self) -> None:
        """Stop the loop and join the thread. Idempotent."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


SpanOf = Callable[[MessageExt], AbstractContextManager["Span | None"]]
"""The process span of a decoded delivery (:func:`txmq.outbox._tracing.delivery_span`)."""


async def handle_delivery(listener: Listener, decode: Callable[[], MessageExt], delivery: int,
                          max_reconsume_times: int, *, broker_limits: bool,
                          span_of: SpanOf | None = None) -> tuple[Verdict, str]:
    """Decode one delivery and run the listener on it: awaited if it is a coroutine function (or
    its ``__call__`` is), else in a worker thread (it does blocking database I/O; the thread
    carries the current context, so the inbox's span nests in the process span).

    Args:
        listener: the inbox listener.
        decode: builds the MessageExt; raises NotAnEnvelope for a message that is not one.
        delivery: this delivery's number, 1-based.
        max_reconsume_times: redeliveries allowed before the DLQ.
        broker_limits: the broker dead-letters after its own delivery limit (RabbitMQ).
        span_of: the span the listener runs in (failed unless it consumed the message).

    Returns:
        ``(verdict, reason)``; the reason is for the DLQ (empty on ACK).
    """
    try:
        msg = decode()
    except NotAnEnvelope as exc:
        return Verdict.DEAD_LETTER, str(exc)
    with span_of(msg) if span_of is not None else _NULL as span:
        try:
            if is_async_listener(listener):  # an asyncio listener: awaited on this loop
                status = await listener([msg])  # type: ignore[misc]
            else:  # a threaded one does blocking database I/O: a worker thread
                status = await asyncio.to_thread(listener, [msg])
        except Exception:  # a listener must not raise; if it does, the delivery is retried
            log.exception("outbox listener raised on a delivery; retrying it")
            status = ConsumeStatus.RECONSUME_LATER
        if status is not ConsumeStatus.CONSUME_SUCCESS:
            set_error(span, getattr(status, "name", str(status)), f"listener returned {status!r}")
    v = verdict(status, delivery, max_reconsume_times, broker_limits=broker_limits)
    reason = "" if v is Verdict.ACK else \
        f"failed {delivery} deliveries (max_reconsume_times {max_reconsume_times})"
    return v, reason


class _Subscription:
    def __init__(self, t: BridgedTransport, group: str, topic: str, listener: Listener, max_rt: int) -> None:
        self._t, self._args = t, (group, topic, listener, max_rt)
        self._stop: Stop | None = None

    def start(self) -> None:
        if self._stop is None:
            self._t.connect()
            self._stop = self._t.loop.run(self._t.core.consume(*self._args), self._t.timeout_s)

    def shutdown(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None and not self._t.loop.loop.is_closed():
            try:
                self._t.loop.run(stop(), self._t.timeout_s)
            except Exception:
                log.exception("stopping the %s consumer failed", self._t.kind)


class BridgedTransport:
    """A blocking :class:`~txmq.outbox.Transport` over an :class:`AsyncCore` (thread-safe).

    Connects on first use; a failed connection raises BrokerUnavailable from that call and is tried
    again on the next one (the relay backs off in between).
    """

    def __init__(self, url: str, core: AsyncCore) -> None:
        self.url, self.core, self.kind = url, core, core.kind
        self.loop = LoopThread(f"txmq-outbox-{core.kind}")
        self.timeout_s = limits.OUTBOX_TRANSPORT_SEND_TIMEOUT_MS / 1000
        self._lock = threading.Lock()
        self._connected = False
        self._subs: list[_Subscription] = []

    def connect(self) -> None:
        """Connect now (else on first use). Raises BrokerUnavailable."""
        with self._lock:
            if self._connected:
                return
            try:
                self.loop.run(self.core.connect(), limits.OUTBOX_TRANSPORT_CONNECT_TIMEOUT_MS / 1000 + 1)
            except Exception as exc:
                raise BrokerUnavailable(f"{self.kind} transport: cannot connect: {exc!r}") from exc
            self._connected = True

    def send_batch(self, msgs: list[Message]) -> object:
        self.connect()
        self.loop.run(self.core.send(msgs), self.timeout_s)
        return None

    def ensure_topic(self, topic: str) -> None:
        self.connect()
        self.loop.run(self.core.ensure_topic(topic), self.timeout_s)

    def subscribe(self, group: str, topic: str, listener: Listener, *,
                  max_reconsume_times: int) -> _Subscription:
        s = _Subscription(self, group, topic, listener, max_reconsume_times)
        self._subs.append(s)
        return s

    def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        self.connect()
        return self.loop.run(self.core.dead_letters(group, topic), self.timeout_s)

    def close(self) -> None:
        for s in self._subs:
            s.shutdown()
        if self._connected:
            try:
                self.loop.run(self.core.close(), self.timeout_s)
            except Exception:
                log.exception("closing the %s transport failed", self.kind)
            self._connected = False
        self.loop.stop()
