"""The NATS JetStream transport (nats-py; nats-server ≥ 2.9).

Names (see docs/outbox.md): every topic is subject ``txmq.outbox.<topic>`` of one file-backed
stream ``TXMQ_OUTBOX`` (subjects ``txmq.outbox.>``); a consumer group of a topic is a durable pull
consumer ``<topic>__<group>`` filtered on that subject, with ``max_deliver = max_reconsume_times + 1``
and ``ack_wait``; the group's DLQ is subject ``txmq.dlq.<topic>.<group>`` of stream ``TXMQ_DLQ``.

* Send: JetStream publish, waiting for each publish ack; ``Nats-Msg-Id`` = the event id, so a
  resend within the stream's duplicate window (2 min) is stored once.
* Consume: a fetch loop; ack on success, ``nak`` with a delay on failure; on the last allowed
  delivery a failure publishes the message to the DLQ with ``TXMQ_DLQ_REASON`` (publish-acked,
  deduplicated by ``dlq-<stream sequence>``) and then terminates it. The same for a message that is
  not an outbox envelope, at once. When the last delivery is never acknowledged (the consumer died
  during it), JetStream gives the message up when a consumer of the group next pulls and publishes
  the max-deliveries advisory; every running consumer of the group follows it and copies the
  message from the stream to the DLQ (both paths use the same ``Nats-Msg-Id``, so it is stored
  once). An advisory published while no consumer of the group runs is lost (advisories are not
  stored); the message then stays only in ``TXMQ_OUTBOX``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from txmq import limits
from txmq.outbox._bridge import Stop, handle_delivery
from txmq.outbox._tracing import (
    DEAD_LETTER,
    NATS,
    PUBLISH,
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

__all__ = ["DLQ_STREAM", "STREAM", "NatsCore", "consumer_name", "dlq_subject", "subject"]

log = logging.getLogger("txmq.outbox.transport")

STREAM = "TXMQ_OUTBOX"
"""The stream holding every topic."""
DLQ_STREAM = "TXMQ_DLQ"
"""The stream holding every group's dead letters."""
_PREFIX, _DLQ_PREFIX = "txmq.outbox.", "txmq.dlq."
_FETCH_WAIT_S = 1.0
_MAX_DELIVERIES = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"


def subject(topic: str) -> str:
    """The subject of ``topic``: ``txmq.outbox.<topic>``."""
    return _PREFIX + check_name(topic, "topic")


def dlq_subject(group: str, topic: str) -> str:
    """The DLQ subject of ``group`` on ``topic``: ``txmq.dlq.<topic>.<group>``."""
    return f"{_DLQ_PREFIX}{check_name(topic, 'topic')}.{check_name(group, 'consumer group')}"


def consumer_name(group: str, topic: str) -> str:
    """The durable consumer of ``group`` on ``topic``: ``<topic>__<group>``."""
    return f"{check_name(topic, 'topic')}__{check_name(group, 'consumer group')}"


def _lenient(topic: str, m: Msg) -> MessageExt:
    try:
        return from_headers(topic, m.data, dict(m.headers or {}), 0)
    except NotAnEnvelope:
        return MessageExt(topic=topic, body=m.data, properties=dict(m.headers or {}))


class NatsCore:
    """:class:`~txmq.outbox._bridge.AsyncCore` for NATS JetStream.

    Args:
        url: ``nats://host:port`` (``tls://`` for TLS).
        retry_delay_ms: ``nak`` delay of a failed delivery.
        prefetch: messages per fetch.
        ack_wait_ms: redelivery of an unacknowledged delivery after this.
        tracing: the spans of publishes, deliveries, naks and dead letters (docs/tracing.md,
            "Outbox and inbox"); the trace context travels in the NATS headers either way.
    """

    kind = "nats"

    def __init__(self, url: str, *, retry_delay_ms: int = limits.OUTBOX_TRANSPORT_RETRY_DELAY_MS,
                 prefetch: int = limits.OUTBOX_TRANSPORT_PREFETCH,
                 ack_wait_ms: int = limits.OUTBOX_TRANSPORT_ACK_WAIT_MS,
                 tracing: Tracing | bool = True) -> None:
        self.url, self.retry_delay_ms = url, retry_delay_ms
        self.tracing = Tracing.of(tracing)
        self.prefetch, self.ack_wait_ms = prefetch, ack_wait_ms
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None

    async def connect(self) -> None:
        """Connect (nats-py then reconnects on its own, forever) and create both streams.

        Raises OSError or TimeoutError when the server refuses or does not answer: the first
        connection is probed with a plain TCP connect, because nats-py would retry it forever."""
        t = limits.OUTBOX_TRANSPORT_CONNECT_TIMEOUT_MS / 1000
        u = urlsplit(self.url)
        _, w = await asyncio.wait_for(asyncio.open_connection(u.hostname, u.port or 4222), t)
        w.close()
        self._nc = await nats.connect(self.url, connect_timeout=t, max_reconnect_attempts=-1,
                                      allow_reconnect=True)
        try:
            self._js = self._nc.jetstream(timeout=limits.OUTBOX_TRANSPORT_SEND_TIMEOUT_MS / 1000)
            await self._stream(STREAM, _PREFIX + ">", limits.OUTBOX_NATS_DUPLICATE_WINDOW_MS)
            await self._stream(DLQ_STREAM, _DLQ_PREFIX + ">", limits.OUTBOX_NATS_DUPLICATE_WINDOW_MS)
        except BaseException:
            await self._nc.close()
            raise

    async def _stream(self, name: str, subjects: str, dup_window_ms: int) -> None:
        js = self.js
        try:
            await js.stream_info(name)
        except NotFoundError:
            with contextlib.suppress(BadRequestError):  # created meanwhile by another process
                await js.add_stream(name=name, subjects=[subjects], storage=api.StorageType.FILE,
                                    duplicate_window=dup_window_ms / 1000)

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("the NATS transport is not connected")
        return self._js

    async def ensure_topic(self, topic: str) -> None:
        subject(topic)  # one stream holds every topic: only the name is checked

    async def send(self, msgs: list[Message]) -> None:
        """Publish all, then wait for every publish ack. Raises nats errors (no responders, timeout)
        or RuntimeError when an ack names another stream."""
        if not msgs:
            return
        subj = subject(msgs[0].topic)

        async def one(m: Message, headers: dict[str, str]) -> None:
            if m.msg_id:
                headers["Nats-Msg-Id"] = m.msg_id
            ack = await self.js.publish(subj, m.body, headers=headers)
            if ack.stream != STREAM:
                raise RuntimeError(f"subject {subj} is stored by stream {ack.stream}, not {STREAM}")

        headers = [to_headers(m) for m in msgs]
        with self.tracing.send_span(PUBLISH, subj, headers, system=NATS,
                                    attributes=batch_attributes(len(msgs))):
            await asyncio.gather(*(one(m, h) for m, h in zip(msgs, headers, strict=True)))

    async def consume(self, group: str, topic: str, listener: Listener, max_reconsume_times: int) -> Stop:
        """Create (or bind) the durable pull consumer and run its fetch loop in a task; returns the
        coroutine function that stops the loop and unsubscribes (the durable consumer stays)."""
        cfg = api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, max_deliver=max_reconsume_times + 1,
                                 ack_wait=self.ack_wait_ms / 1000, filter_subject=subject(topic),
                                 deliver_policy=api.DeliverPolicy.ALL)
        psub = await self.js.pull_subscribe(subject(topic), durable=consumer_name(group, topic),
                                            stream=STREAM, config=cfg)
        task = asyncio.create_task(self._loop(psub, group, topic, listener, max_reconsume_times))
        assert self._nc is not None
        advisories = await self._nc.subscribe(
            f"{_MAX_DELIVERIES}.{STREAM}.{consumer_name(group, topic)}",
            cb=functools.partial(self._on_max_deliveries, group, topic))

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            for sub in (advisories, psub):
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

        return stop

    async def _loop(self, psub: Any, group: str, topic: str, listener: Listener, max_rt: int) -> None:
        while True:
            try:
                msgs = await psub.fetch(self.prefetch, timeout=_FETCH_WAIT_S)
            except TimeoutError:
                continue
            except Exception as exc:  # connection lost: nats-py reconnects; try again shortly
                log.warning("NATS fetch of %s for %s failed: %r", topic, group, exc)
                await asyncio.sleep(_FETCH_WAIT_S)
                continue
            await asyncio.gather(*(self._one(m, group, topic, listener, max_rt) for m in msgs),
                                 return_exceptions=True)

    async def _one(self, m: Msg, group: str, topic: str, listener: Listener, max_rt: int) -> None:
        n = m.metadata.num_delivered or 1

        def span_of(msg: MessageExt) -> AbstractContextManager[Span | None]:
            return delivery_span(self.tracing, NATS, topic, group, consumer_name(group, topic),
                                 msg.properties, n)

        v, reason = await handle_delivery(
            listener, lambda: from_headers(topic, m.data, dict(m.headers or {}), n - 1), n, max_rt,
            broker_limits=False, span_of=span_of)
        if v is Verdict.ACK:
            await m.ack()
            return
        props = text_headers(m.headers or {})
        if v is Verdict.RETRY:
            with settle_span(self.tracing, NATS, "nak", subject(topic), group, props, n):
                await m.nak(delay=self.retry_delay_ms / 1000)
            return
        headers = dict(m.headers or {})
        headers.pop("Nats-Msg-Id", None)
        headers[PROPERTY_DLQ_REASON] = reason
        headers["Nats-Msg-Id"] = f"dlq-{group}-{m.metadata.sequence.stream}"
        with settle_span(self.tracing, NATS, DEAD_LETTER, dlq_subject(group, topic), group, props,
                         n):
            try:
                await self.js.publish(dlq_subject(group, topic), m.data, headers=headers)
            except Exception:
                log.exception("NATS: moving a message of %s to the DLQ of %s failed; retrying it",
                              topic, group)
                await m.nak(delay=self.retry_delay_ms / 1000)
                return
            await m.term()

    async def _on_max_deliveries(self, group: str, topic: str, adv: Msg) -> None:
        """JetStream gave up on a message (its last delivery was never acknowledged, e.g. the
        consumer died): copy it from the stream to the DLQ. The DLQ's ``Nats-Msg-Id`` is the one the
        consumer would use, so a message both paths move is stored once."""
        try:
            info = json.loads(adv.data)
            seq = int(info["stream_seq"])
            raw = await self.js.get_msg(STREAM, seq)
            headers = {str(k): str(v) for k, v in (raw.headers or {}).items() if k != "Nats-Msg-Id"}
            delivered = int(info.get("deliveries", 0) or 0)
            headers[PROPERTY_DLQ_REASON] = (f"{info.get('deliveries', '?')} deliveries without an "
                                            "acknowledgement (max-deliveries advisory)")
            headers["Nats-Msg-Id"] = f"dlq-{group}-{seq}"
            with settle_span(self.tracing, NATS, DEAD_LETTER, dlq_subject(group, topic), group,
                             headers, delivered):
                await self.js.publish(dlq_subject(group, topic), raw.data or b"", headers=headers)
        except Exception:  # the message stays in the stream; an operator can still find it
            log.exception("NATS: following a max-deliveries advisory of %s for %s failed", topic, group)

    async def dead_letters(self, group: str, topic: str) -> list[MessageExt]:
        """Read the group's DLQ subject with an ephemeral consumer (deleted afterwards)."""
        cfg = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL,
                                 filter_subject=dlq_subject(group, topic))
        psub = await self.js.pull_subscribe(dlq_subject(group, topic), stream=DLQ_STREAM, config=cfg)
        out: list[MessageExt] = []
        try:
            while len(out) < limits.OUTBOX_TRANSPORT_DLQ_READ_MAX:
                try:
                    got = await psub.fetch(self.prefetch, timeout=0.3)
                except TimeoutError:
                    break
                out.extend(_lenient(topic, m) for m in got)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()
        return out

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()
        self._nc, self._js = None, None
