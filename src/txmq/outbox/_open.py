"""Opening a transport by URL, and the txmq transport (the default: today's Producer and
PushConsumer, unchanged).

txmq names are RocketMQ's: topic = topic, a group's retry topic ``%RETRY%<group>`` with the broker's
delay levels, its DLQ topic ``%DLQ%<group>`` after ``max_reconsume_times`` retries, the rollback
topic ``<topic>-rollback``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from txmq import limits
from txmq.client import Producer, PullConsumer, PushConsumer
from txmq.errors import ConfigError
from txmq.outbox._transport import Listener, Transport, parse_transport_url
from txmq.protocol import Message, MessageExt

__all__ = ["TxmqTransport", "open_transport"]

DLQ_PREFIX = "%DLQ%"


class TxmqTransport:
    """:class:`~txmq.outbox.Transport` on a txmq (or RocketMQ remoting) broker.

    Args:
        url: the URL (``txmq://host:port``).
        endpoints: ``host:port`` of the broker (or name server).
        producer_group: the relay's producer group.
        consumer_kw: extra :class:`~txmq.client.PushConsumer` arguments for :meth:`subscribe`
            (e.g. ``consume_from_where``).

    The producer starts on first use; if the broker is down, that send raises BrokerUnavailable and
    the next one tries again.
    """

    kind = "txmq"

    def __init__(self, url: str, endpoints: str, *, producer_group: str = "txmq-outbox-relay",
                 consumer_kw: dict[str, Any] | None = None) -> None:
        self.url, self.endpoints, self.producer_group = url, endpoints, producer_group
        self.consumer_kw = dict(consumer_kw or {})
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def producer(self) -> Producer:
        """The started producer. Raises BrokerUnavailable."""
        with self._lock:
            if self._producer is None:
                p = Producer(self.producer_group, self.endpoints)
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
        self.producer().create_topic(topic, limits.DEFAULT_QUEUE_NUMS)

    def subscribe(self, group: str, topic: str, listener: Listener, *,
                  max_reconsume_times: int) -> PushConsumer:
        c = PushConsumer(group, self.endpoints, listener, max_reconsume_times=max_reconsume_times,
                         **self.consumer_kw)
        c.subscribe(topic)
        return c

    def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        """Messages of ``%DLQ%<group>`` whose original topic is ``topic`` (the DLQ has one queue)."""
        out: list[MessageExt] = []
        with PullConsumer(self.endpoints) as pc:
            offset = 0
            while len(out) < limits.OUTBOX_TRANSPORT_DLQ_READ_MAX:
                try:
                    got = pc.pull(DLQ_PREFIX + group, 0, offset).messages
                except Exception:  # no DLQ topic yet: nothing dead-lettered
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


def open_transport(url: str, **kw: Any) -> Transport:
    """The transport for ``url``; checks the URL now and connects on first use.

    ``txmq://host:port`` → :class:`TxmqTransport`; ``amqp://user:pass@host:port/vhost`` → RabbitMQ;
    ``nats://host:port`` → NATS JetStream. ``kw`` go to the transport (RabbitMQ / NATS:
    ``retry_delay_ms``, ``prefetch``; NATS also ``ack_wait_ms``; txmq: ``producer_group``,
    ``consumer_kw``).

    Raises:
        ConfigError: an unknown scheme, a URL without host, a bad port, or an unknown keyword.
    """
    kind, address = parse_transport_url(url)
    try:
        if kind == "txmq":
            return TxmqTransport(url, address, **kw)
        from txmq.outbox._bridge import BridgedTransport
        if kind == "rabbitmq":
            from txmq.outbox._amqp import RabbitCore
            return BridgedTransport(url, RabbitCore(address, **kw))
        from txmq.outbox._nats import NatsCore
        return BridgedTransport(url, NatsCore(address, **kw))
    except TypeError as exc:
        raise ConfigError(f"{kind} transport: {exc}") from None
