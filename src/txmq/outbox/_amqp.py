"""The RabbitMQ transport (aio-pika, AMQP 0-9-1).

Names (see docs/outbox.md): a topic is a durable **fanout exchange** of the same name; a consumer
group of a topic is a durable **quorum queue** ``<topic>.<group>`` bound to it, declared with
``x-delivery-limit = max_reconsume_times`` and dead-letter exchange ``txmq.dlx`` (direct), which
routes to the group's DLQ, quorum queue ``<topic>.<group>.dlq``. A rollback topic is just another
topic (``<topic>-rollback``), so another exchange.

* Send: publisher confirms on a dedicated channel, ``mandatory`` publishes (a topic no group has
  subscribed yet returns the message: the send fails and the relay keeps the rows), persistent
  delivery mode, ``message_id`` = the event id.
* Consume: manual ack; a failed delivery waits ``retry_delay_ms`` and is nacked with requeue, which
  raises the queue's ``x-delivery-count``; past the delivery limit RabbitMQ itself dead-letters it
  (reason ``delivery_limit`` in ``x-death``). A message that is not an outbox envelope is published
  to the DLQ with ``TXMQ_DLQ_REASON`` (confirmed), then acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage, AbstractRobustConnection

from txmq import limits
from txmq.outbox._bridge import Stop, handle_delivery
from txmq.outbox._tracing import (
    DEAD_LETTER,
    PUBLISH,
    RABBITMQ,
    batch_attributes,
    delivery_span,
    settle_span,
    text_headers,
)
from txmq.outbox._transport import (
    PROPERTY_DLQ_REASON,
    Listener,
    NotAnEnvelope,
    Verdict,
    check_name,
    from_headers,
    to_headers,
)
from txmq.protocol import Message, MessageExt
from txmq.tracing import Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["DLX", "RabbitCore", "dlq_name", "queue_name"]

DLX = "txmq.dlx"
"""The dead-letter exchange (direct; routing key = the DLQ's name)."""


def queue_name(group: str, topic: str) -> str:
    """The quorum queue of ``group`` on ``topic``: ``<topic>.<group>``."""
    return f"{check_name(topic, 'topic')}.{check_name(group, 'consumer group')}"


def dlq_name(group: str, topic: str) -> str:
    """The group's dead-letter queue: ``<topic>.<group>.dlq``."""
    return queue_name(group, topic) + ".dlq"


def _delivery_count(m: AbstractIncomingMessage) -> int:
    n = (m.headers or {}).get("x-delivery-count", 0)
    return int(n) if isinstance(n, int) else 0


def _dead_letter(topic: str, m: AbstractIncomingMessage) -> MessageExt:
    headers = dict(m.headers or {})
    try:
        msg = from_headers(topic, m.body, dict(headers), _delivery_count(m))
    except NotAnEnvelope:
        msg = MessageExt(topic=topic, body=m.body, properties={k: v for k, v in headers.items()
                                                               if isinstance(v, str)})
    death = headers.get("x-death")
    if PROPERTY_DLQ_REASON not in msg.properties and isinstance(death, list) and death:
        first = death[0]
        msg.properties[PROPERTY_DLQ_REASON] = str(first.get("reason", "")) if isinstance(first, dict) else ""
    return msg


class RabbitCore:
    """:class:`~txmq.outbox._bridge.AsyncCore` for RabbitMQ ≥ 3.10 (quorum queue delivery limits).

    Args:
        url: ``amqp://user:pass@host:port/vhost``.
        retry_delay_ms: pause before a failed delivery is nacked (requeued).
        prefetch: unacknowledged deliveries per consumer.
        tracing: the spans of publishes, deliveries, nacks and dead letters (docs/tracing.md,
            "Outbox and inbox"); the trace context travels in the AMQP headers either way.
    """

    kind = "rabbitmq"

    def __init__(self, url: str, *, retry_delay_ms: int = limits.OUTBOX_TRANSPORT_RETRY_DELAY_MS,
                 prefetch: int = limits.OUTBOX_TRANSPORT_PREFETCH,
                 tracing: Tracing | bool = True) -> None:
        self.url, self.retry_delay_ms, self.prefetch = url, retry_delay_ms, prefetch
        self.tracing = Tracing.of(tracing)
        self._conn: AbstractRobustConnection | None = None
        self._pub: AbstractChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._timeout_s = limits.OUTBOX_TRANSPORT_SEND_TIMEOUT_MS / 1000

    async def connect(self) -> None:
        self._conn = await aio_pika.connect_robust(
            self.url, timeout=limits.OUTBOX_TRANSPORT_CONNECT_TIMEOUT_MS / 1000)
        self._pub = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
        self._exchanges[DLX] = await self._pub.declare_exchange(DLX, aio_pika.ExchangeType.DIRECT,
                                                                durable=True)

    def _channel(self) -> AbstractChannel:
        if self._pub is None:
            raise RuntimeError("the RabbitMQ transport is not connected")
        return self._pub

    async def ensure_topic(self, topic: str) -> None:
        await self._exchange(topic)

    async def _exchange(self, topic: str) -> AbstractExchange:
        ex = self._exchanges.get(topic)
        if ex is None:
            ex = self._exchanges[topic] = await self._channel().declare_exchange(
                check_name(topic, "topic"), aio_pika.ExchangeType.FANOUT, durable=True)
        return ex

    async def send(self, msgs: list[Message]) -> None:
        """Publish all, then wait for every confirm. Raises DeliveryError (nack), PublishError
        (unroutable: no group's queue is bound), TimeoutError, connection errors."""
        if not msgs:
            return
        ex = await self._exchange(msgs[0].topic)
        headers = [to_headers(m) for m in msgs]
        with self.tracing.send_span(PUBLISH, msgs[0].topic, headers, system=RABBITMQ,
                                    attributes=batch_attributes(len(msgs))):
            await asyncio.gather(*(ex.publish(_amqp_message(m, h), "", mandatory=True,
                                              timeout=self._timeout_s)
                                   for m, h in zip(msgs, headers, strict=True)))

    async def _declare(self, ch: AbstractChannel, group: str, topic: str,
                       max_reconsume_times: int) -> aio_pika.abc.AbstractQueue:
        q, dlq = queue_name(group, topic), dlq_name(group, topic)
        ex = await ch.declare_exchange(topic, aio_pika.ExchangeType.FANOUT, durable=True)
        dlx = await ch.declare_exchange(DLX, aio_pika.ExchangeType.DIRECT, durable=True)
        dq = await ch.declare_queue(dlq, durable=True, arguments={"x-queue-type": "quorum"})
        await dq.bind(dlx, dlq)
        queue = await ch.declare_queue(q, durable=True, arguments={
            "x-queue-type": "quorum", "x-delivery-limit": max_reconsume_times,
            "x-dead-letter-exchange": DLX, "x-dead-letter-routing-key": dlq})
        await queue.bind(ex)
        return queue

    async def consume(self, group: str, topic: str, listener: Listener, max_reconsume_times: int) -> Stop:
        """Declare the group's queue and DLQ and consume it; returns the coroutine function that
        cancels the consumer and closes its channel."""
        assert self._conn is not None
        ch = await self._conn.channel()
        await ch.set_qos(prefetch_count=self.prefetch)
        queue = await self._declare(ch, group, topic, max_reconsume_times)
        on_message = functools.partial(self._on_message, group, topic, listener, max_reconsume_times)
        tag = await queue.consume(on_message)

        async def stop() -> None:
            with contextlib.suppress(Exception):
                await queue.cancel(tag)
            await ch.close()

        return stop

    async def _on_message(self, group: str, topic: str, listener: Listener, max_rt: int,
                          m: AbstractIncomingMessage) -> None:
        count = _delivery_count(m)
        queue = queue_name(group, topic)

        def span_of(msg: MessageExt) -> AbstractContextManager[Span | None]:
            return delivery_span(self.tracing, RABBITMQ, topic, group, queue, msg.properties,
                                 count + 1)

        v, reason = await handle_delivery(
            listener, lambda: from_headers(topic, m.body, {**(m.headers or {})}, count), count + 1, max_rt,
            broker_limits=True, span_of=span_of)
        if v is Verdict.ACK:
            await m.ack()
            return
        props = text_headers(m.headers or {})
        if v is Verdict.RETRY:  # past the delivery limit, this nack makes RabbitMQ dead-letter it
            last = count + 1 > max_rt
            with settle_span(self.tracing, RABBITMQ, DEAD_LETTER if last else "nack",
                             dlq_name(group, topic) if last else queue, group, props, count + 1):
                await asyncio.sleep(self.retry_delay_ms / 1000)
                await m.nack(requeue=True)
            return
        # not an envelope: to the DLQ with the reason, confirmed, before the ack
        headers = {k: v for k, v in (m.headers or {}).items() if not k.startswith("x-")}
        headers[PROPERTY_DLQ_REASON] = reason
        out = aio_pika.Message(m.body, headers=headers, message_id=m.message_id,
                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        with settle_span(self.tracing, RABBITMQ, DEAD_LETTER, dlq_name(group, topic), group, props,
                         count + 1):
            try:
                await self._exchanges[DLX].publish(out, dlq_name(group, topic), mandatory=True,
                                                   timeout=self._timeout_s)
            except Exception:  # keep it: retried (and dead-lettered by the delivery limit at worst)
                await m.nack(requeue=True)
                raise
            await m.ack()

    async def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        """Read the DLQ on a scratch channel; closing it requeues what was read."""
        assert self._conn is not None
        ch = await self._conn.channel()
        out: list[MessageExt] = []
        try:
            q = await ch.get_queue(dlq_name(group, topic), ensure=True)
            while len(out) < limits.OUTBOX_TRANSPORT_DLQ_READ_MAX:
                m = await q.get(no_ack=False, fail=False, timeout=self._timeout_s)
                if m is None:
                    break
                out.append(_dead_letter(topic, m))
        except aio_pika.exceptions.ChannelClosed:  # no such queue: nothing dead-lettered
            return out
        finally:
            with contextlib.suppress(Exception):
                await ch.close()
        return out

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        self._conn, self._pub = None, None
        self._exchanges.clear()


def _amqp_message(m: Message, headers: dict[str, str]) -> aio_pika.Message:
    return aio_pika.Message(m.body, headers=dict(headers), message_id=m.msg_id or None,
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
