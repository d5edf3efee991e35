"""The asyncio face of the transports, for :class:`~txmq.outbox.AsyncRelay` and the asyncio
listeners: the same three brokers and names as the threaded :class:`~txmq.outbox.Transport`, with
coroutine methods, on the caller's event loop.

RabbitMQ and NATS run their :class:`~txmq.outbox._bridge.AsyncCore` directly (the threaded transport
runs the same core on a private loop); txmq uses :class:`~txmq.client.AsyncProducer` and
:class:`~txmq.client.AsyncPushConsumer`. Listeners may be coroutine functions (awaited on the loop)
or plain ones (run in a worker thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol

from txmq import limits
from txmq.client import AsyncProducer, AsyncPullConsumer, AsyncPushConsumer
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, TxmqError
from txmq.extras import require_extra
from txmq.outbox._bridge import AsyncCore, Stop
from txmq.outbox._open import not_routed_yet
from txmq.outbox._transport import Listener, parse_transport_url, txmq_addresses
from txmq.protocol import Message, MessageExt
from txmq.tracing import Tracing

__all__ = ["AsyncSubscription", "AsyncTransport", "AsyncTxmqTransport", "open_async_transport"]

DLQ_PREFIX = "%DLQ%"


class AsyncSubscription(Protocol):
    """A consumer of one topic for one group, created stopped."""

    async def start(self) -> None: ...
    async def shutdown(self) -> None: ...


class AsyncTransport(Protocol):
    """:class:`~txmq.outbox.Transport` with coroutine methods (same semantics, same errors)."""

    url: str
    kind: str

    async def connect(self) -> None: ...
    async def send_batch(self, msgs: list[Message]) -> object: ...
    async def ensure_topic(self, topic: str) -> None: ...
    def subscribe(self, group: str, topic: str, listener: Any, *,
                  max_reconsume_times: int) -> AsyncSubscription: ...
    async def dead_letters(self, group: str, topic: str) -> list[MessageExt]: ...
    async def close(self) -> None: ...


class _CoreSubscription:
    def __init__(self, t: AsyncCoreTransport, args: tuple[str, str, Listener, int]) -> None:
        self._t, self._args = t, args
        self._stop: Stop | None = None

    async def start(self) -> None:
        if self._stop is None:
            await self._t.connect()
            self._stop = await self._t.core.consume(*self._args)

    async def shutdown(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            await stop()


class AsyncCoreTransport:
    """:class:`AsyncTransport` over a RabbitMQ or NATS :class:`~txmq.outbox._bridge.AsyncCore`;
    connects on first use (a failure raises BrokerUnavailable and is tried again next time)."""

    def __init__(self, url: str, core: AsyncCore) -> None:
        self.url, self.core, self.kind = url, core, core.kind
        self._lock = asyncio.Lock()
        self._connected = False
        self._subs: list[_CoreSubscription] = []

    async def connect(self) -> None:
        async with self._lock:
            if self._connected:
                return
            try:
                await asyncio.wait_for(self.core.connect(),
                                       limits.OUTBOX_TRANSPORT_CONNECT_TIMEOUT_MS / 1000 + 1)
            except Exception as exc:
                raise BrokerUnavailable(f"{self.kind} transport: cannot connect: {exc!r}") from exc
            self._connected = True

    async def send_batch(self, msgs: list[Message]) -> object:
        await self.connect()
        await asyncio.wait_for(self.core.send(msgs), limits.OUTBOX_TRANSPORT_SEND_TIMEOUT_MS / 1000)
        return None

    async def ensure_topic(self, topic: str) -> None:
        await self.connect()
        await self.core.ensure_topic(topic)

    def subscribe(self, group: str, topic: str, listener: Any, *,
                  max_reconsume_times: int) -> _CoreSubscription:
        s = _CoreSubscription(self, (group, topic, listener, max_reconsume_times))
        self._subs.append(s)
        return s

    async def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        await self.connect()
        return await self.core.dead_letters(group, topic)

    async def close(self) -> None:
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.shutdown()
        if self._connected:
            await self.core.close()
            self._connected = False


class _TxmqSubscription:
    def __init__(self, consumer: AsyncPushConsumer) -> None:
        self.consumer, self._started = consumer, False

    async def start(self) -> None:
        if not self._started:
            await self.consumer.start()
            self._started = True

    async def shutdown(self) -> None:
        if self._started:
            self._started = False
            await self.consumer.shutdown()


class AsyncTxmqTransport:
    """:class:`AsyncTransport` on a txmq broker (see :class:`~txmq.outbox.TxmqTransport`)."""

    kind = "txmq"

    def __init__(self, url: str, endpoints: str, *, namesrv_addr: str = "",
                 producer_group: str = "txmq-outbox-relay",
                 consumer_kw: dict[str, Any] | None = None, tracing: Tracing | bool = True) -> None:
        self.url, self.endpoints, self.producer_group = url, endpoints, producer_group
        self.namesrv_addr = namesrv_addr
        self.consumer_kw = dict(consumer_kw or {})
        self.tracing = Tracing.of(tracing)
        self._producer: AsyncProducer | None = None
        self._lock = asyncio.Lock()
        self._subs: list[_TxmqSubscription] = []

    async def producer(self) -> AsyncProducer:
        """The started producer. Raises BrokerUnavailable."""
        async with self._lock:
            if self._producer is None:
                p = AsyncProducer(self.producer_group, self.endpoints, namesrv_addr=self.namesrv_addr,
                                  tracing=self.tracing)
                try:
                    await p.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await p.shutdown()
                    raise
                self._producer = p
            return self._producer

    async def connect(self) -> None:
        await self.producer()

    async def send_batch(self, msgs: list[Message]) -> object:
        return await (await self.producer()).send_batch(msgs)

    async def ensure_topic(self, topic: str) -> None:
        """See :meth:`txmq.outbox.TxmqTransport.ensure_topic`."""
        deadline = time.monotonic() + limits.OUTBOX_TXMQ_TOPIC_ROUTE_WAIT_MS / 1000
        while True:
            try:
                await (await self.producer()).create_topic(topic, limits.DEFAULT_QUEUE_NUMS)
                return
            except RemoteError as exc:
                if not not_routed_yet(exc, self.namesrv_addr, deadline):
                    raise
            await asyncio.sleep(limits.OUTBOX_TXMQ_TOPIC_ROUTE_POLL_MS / 1000)

    def subscribe(self, group: str, topic: str, listener: Any, *,
                  max_reconsume_times: int) -> _TxmqSubscription:
        kw = {"tracing": self.tracing, **self.consumer_kw}
        c = AsyncPushConsumer(group, self.endpoints, listener, max_reconsume_times=max_reconsume_times,
                              namesrv_addr=self.namesrv_addr, **kw)
        c.subscribe(topic)
        s = _TxmqSubscription(c)
        self._subs.append(s)
        return s

    async def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        """See :meth:`txmq.outbox.TxmqTransport.dead_letters` (every broker group's DLQ queue)."""
        out: list[MessageExt] = []
        pc = AsyncPullConsumer(self.endpoints, namesrv_addr=self.namesrv_addr)
        await pc.start()
        try:
            try:
                queues = await pc.queues(DLQ_PREFIX + group)
            except TxmqError:  # no DLQ topic yet: nothing dead-lettered
                queues = []
            for mq in queues:
                offset = 0
                while len(out) < limits.OUTBOX_TRANSPORT_DLQ_READ_MAX:
                    try:
                        got = (await pc.pull(mq.topic, mq.queue_id, offset,
                                             broker_name=mq.broker_name)).messages
                    except TxmqError:  # that broker has no DLQ queue (yet)
                        break
                    if not got:
                        break
                    offset += len(got)
                    out.extend(got)
        finally:
            await pc.shutdown()
        return [m for m in out if m.properties.get("RETRY_TOPIC", topic) == topic]

    async def close(self) -> None:
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.shutdown()
        p, self._producer = self._producer, None
        if p is not None:
            with contextlib.suppress(Exception):
                await p.shutdown()


def open_async_transport(url: str, **kw: Any) -> AsyncTransport:
    """The asyncio transport for ``url`` (same URLs and keywords as
    :func:`~txmq.outbox.open_transport`); connects on first use, on the running loop.

    Raises:
        ConfigError: an unknown scheme, a URL without host, a bad port, or an unknown keyword.
    """
    kind, address = parse_transport_url(url)
    try:
        if kind == "txmq":
            endpoints, namesrv_addr = txmq_addresses(url)
            return AsyncTxmqTransport(url, endpoints, namesrv_addr=namesrv_addr, **kw)
        if kind == "rabbitmq":
            require_extra("rabbitmq", "the outbox's RabbitMQ transport", "aio_pika")
            from txmq.outbox._amqp import RabbitCore
            return AsyncCoreTransport(url, RabbitCore(address, **kw))
        require_extra("nats", "the outbox's NATS transport", "nats")
        from txmq.outbox._nats import NatsCore
        return AsyncCoreTransport(url, NatsCore(address, **kw))
    except TypeError as exc:
        raise ConfigError(f"{kind} transport: {exc}") from None
