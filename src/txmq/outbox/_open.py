"""Opening a transport by URL, and the txmq transport (the default: today's Producer and
PushConsumer, unchanged).

txmq names are RocketMQ's: topic = topic, a group's retry topic ``%RETRY%<group>`` with the broker's
delay levels, its DLQ topic ``%DLQ%<group>`` after ``max_reconsume_times`` retries, the rollback
topic ``<topic>-rollback``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from txmq import limits
from txmq.client import Producer, PullConsumer, PushConsumer
from txmq.errors import ConfigError, RemoteError, ResponseCode, TxmqError
from txmq.extras import require_extra
from txmq.outbox._transport import Listener, Transport, parse_transport_url, txmq_addresses
from txmq.protocol import Message, MessageExt
from txmq.tracing import Tracing

__all__ = ["TxmqTransport", "not_routed_yet", "open_transport"]

DLQ_PREFIX = "%DLQ%"


class TxmqTransport:
    """:class:`~txmq.outbox.Transport` on a txmq (or RocketMQ remoting) broker.

    Args:
        url: the URL (``txmq://host:port``, or ``txmq://ns:port[;ns:port]?namesrv=1`` for name
            servers: :func:`~txmq.outbox._transport.txmq_addresses`).
        endpoints: ``host:port`` of the broker ("" with ``namesrv_addr``).
        namesrv_addr: name servers ``host:port[;host:port]``: the relay sends to, and the inbox
            consumes from, every broker group of a topic's route (a cluster).
        producer_group: the relay's producer group.
        consumer_kw: extra :class:`~txmq.client.PushConsumer` arguments for :meth:`subscribe`
            (e.g. ``consume_from_where``).
        tracing: the producer's and the consumers' ``tracing=`` (the SDK's spans).

    The producer starts on first use; if the broker is down, that send raises BrokerUnavailable and
    the next one tries again.
    """

    kind = "txmq"

    def __init__(self, url: str, endpoints: str, *, namesrv_addr: str = "",
                 producer_group: str = "txmq-outbox-relay",
                 consumer_kw: dict[str, Any] | None = None, tracing: Tracing | bool = True) -> None:
        self.url, self.endpoints, self.producer_group = url, endpoints, producer_group
        self.namesrv_addr = namesrv_addr
        self.consumer_kw = dict(consumer_kw or {})
        self.tracing = Tracing.of(tracing)
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def producer(self) -> Producer:
        """The started producer. Raises BrokerUnavailable."""
        with self._lock:
            if self._producer is None:
                p = Producer(self.producer_group, self.endpoints, namesrv_addr=self.namesrv_addr,
                             tracing=self.tracing)
                try:
                    p.start()
                except BaseException:
                    p.shutdown()
                    raise
                self._producer = p
            return self._producer

    def connect(self) -> None:
        self.producer()

    def send_batch(self, msgs: list[Message]) -> object:
        return self.producer().send_batch(msgs)

    def ensure_topic(self, topic: str) -> None:
        """Create ``topic`` (on every master the name servers know, with ``namesrv_addr``) and,
        over name servers, wait up to ``limits.OUTBOX_TXMQ_TOPIC_ROUTE_WAIT_MS`` for its route.
        Raises RemoteError (TOPIC_NOT_EXIST: still not routed), BrokerUnavailable."""
        deadline = time.monotonic() + limits.OUTBOX_TXMQ_TOPIC_ROUTE_WAIT_MS / 1000
        while True:
            try:
                self.producer().create_topic(topic, limits.DEFAULT_QUEUE_NUMS)
                return
            except RemoteError as exc:
                if not not_routed_yet(exc, self.namesrv_addr, deadline):
                    raise
            time.sleep(limits.OUTBOX_TXMQ_TOPIC_ROUTE_POLL_MS / 1000)

    def subscribe(self, group: str, topic: str, listener: Listener, *,
                  max_reconsume_times: int) -> PushConsumer:
        kw = {"tracing": self.tracing, **self.consumer_kw}
        c = PushConsumer(group, self.endpoints, listener, max_reconsume_times=max_reconsume_times,
                         namesrv_addr=self.namesrv_addr, **kw)
        c.subscribe(topic)
        return c

    def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        """Messages of ``%DLQ%<group>`` whose original topic is ``topic``: its queue on every broker
        group that has one (a message is dead-lettered on the broker it was consumed from), at most
        ``limits.OUTBOX_TRANSPORT_DLQ_READ_MAX`` in all."""
        out: list[MessageExt] = []
        with PullConsumer(self.endpoints, namesrv_addr=self.namesrv_addr) as pc:
            try:
                queues = pc.queues(DLQ_PREFIX + group)
            except TxmqError:  # no DLQ topic yet: nothing dead-lettered
                return []
            for mq in queues:
                offset = 0
                while len(out) < limits.OUTBOX_TRANSPORT_DLQ_READ_MAX:
                    try:
                        got = pc.pull(mq.topic, mq.queue_id, offset,
                                      broker_name=mq.broker_name).messages
                    except TxmqError:  # that broker has no DLQ queue (yet)
                        break
                    if not got:
                        break
                    offset += len(got)
                    out.extend(m for m in got if m.properties.get("RETRY_TOPIC", topic) == topic)
        return out

    def close(self) -> None:
        with self._lock:
            p, self._producer = self._producer, None
        if p is not None:
            with contextlib.suppress(Exception):
                p.shutdown()


def not_routed_yet(exc: RemoteError, namesrv_addr: str, deadline: float) -> bool:
    """Whether a create_topic that raised ``exc`` failed only because the name servers do not
    route the new topic yet (the brokers register it within a second) and there is time left."""
    return (bool(namesrv_addr) and exc.response_code == ResponseCode.TOPIC_NOT_EXIST
            and time.monotonic() < deadline)


def open_transport(url: str, **kw: Any) -> Transport:
    """The transport for ``url``; checks the URL now and connects on first use.

    ``txmq://host:port`` (a broker) or ``txmq://host:port[;host:port]?namesrv=1`` (name servers: a
    cluster) → :class:`TxmqTransport`; ``amqp://user:pass@host:port/vhost`` → RabbitMQ;
    ``nats://host:port`` → NATS JetStream. ``kw`` go to the transport (every one: ``tracing``;
    RabbitMQ / NATS: ``retry_delay_ms``, ``prefetch``; NATS also ``ack_wait_ms``; txmq:
    ``producer_group``, ``consumer_kw``).

    Raises:
        ConfigError: an unknown scheme, a URL without host, a bad port, or an unknown keyword.
    """
    kind, address = parse_transport_url(url)
    try:
        if kind == "txmq":
            endpoints, namesrv_addr = txmq_addresses(url)
            return TxmqTransport(url, endpoints, namesrv_addr=namesrv_addr, **kw)
        from txmq.outbox._bridge import BridgedTransport
        if kind == "rabbitmq":
            require_extra("rabbitmq", "the outbox's RabbitMQ transport", "aio_pika")
            from txmq.outbox._amqp import RabbitCore
            return BridgedTransport(url, RabbitCore(address, **kw))
        require_extra("nats", "the outbox's NATS transport", "nats")
        from txmq.outbox._nats import NatsCore
        return BridgedTransport(url, NatsCore(address, **kw))
    except TypeError as exc:
        raise ConfigError(f"{kind} transport: {exc}") from None
