"""The local message table's spans (docs/tracing.md, "Outbox and inbox"), built on
:mod:`txmq.tracing`: the event's trace context captured at ``put_message``, the relay's send of each
row, the RabbitMQ and NATS transports' publish, delivery, retry and dead-letter spans (txmq's own
are the SDK's), and the inbox's apply and compensation spans.

One trace per business transaction: ``put_message`` writes the current trace context
(``traceparent``, ``tracestate``) into the event's properties, which the row keeps and every
transport carries (txmq/RocketMQ message properties, AMQP headers, NATS headers); the relay's span
of a row, the consumer's process span and the inbox's span all join that trace. A ROLLBACK event
carries the context of the inbox span that gave up, so the compensation upstream joins it too.

Every helper returns at once (a shared null context) when its :class:`~txmq.tracing.Tracing`
makes no spans.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Final, TypeVar

from txmq.outbox._envelope import OutboxRow
from txmq.protocol import Message, MessageExt
from txmq.tracing import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_MESSAGE_ID,
    ROCKETMQ,
    TRACEPARENT,
    TRACESTATE,
    Tracing,
    error_type,
    set_error,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "APPLY",
    "COMPENSATE",
    "DEAD_LETTER",
    "MESSAGING_DESTINATION_SUBSCRIPTION_NAME",
    "NATS",
    "PUBLISH",
    "PUT_MESSAGE",
    "RABBITMQ",
    "RELAY",
    "SYSTEMS",
    "TXMQ_INBOX_OUTCOME",
    "TXMQ_OUTBOX_ATTEMPT",
    "TXMQ_OUTBOX_BIZ_KEY",
    "TXMQ_OUTBOX_DELIVERY",
    "TXMQ_OUTBOX_EVENT_TYPE",
    "TXMQ_OUTBOX_ORIGIN_EVENT_ID",
    "TXMQ_OUTBOX_PARKED_MS",
    "TXMQ_OUTBOX_TABLE",
    "TXMQ_OUTBOX_TX_TYPE",
    "apply_span",
    "batch_attributes",
    "delivery_span",
    "failed",
    "outcome",
    "outside_trace",
    "put_span",
    "relay_spans",
    "settle_span",
    "split_context",
    "system_of",
    "text_headers",
]

# -- names ------------------------------------------------------------------------------------------
RABBITMQ: Final = "rabbitmq"
"""``messaging.system`` of RabbitMQ (the registry's value)."""
NATS: Final = "nats"
"""``messaging.system`` of NATS JetStream (not in the registry; the conventions allow a custom
value)."""
SYSTEMS: Final = {"txmq": ROCKETMQ, "rabbitmq": RABBITMQ, "nats": NATS}
"""A transport's ``kind`` → its ``messaging.system`` (txmq speaks RocketMQ's protocol)."""

PUT_MESSAGE: Final = "put_message"
"""Name of the INTERNAL span of writing an event row (``put_message <topic>``)."""
RELAY: Final = "relay"
"""``messaging.operation.name`` of the relay's send of one row (``relay <topic>``)."""
PUBLISH: Final = "publish"
"""... of a RabbitMQ or NATS transport's publish of a batch (``publish <exchange | subject>``)."""
APPLY: Final = "apply"
"""... of a :class:`~txmq.outbox.CommitListener` handling an event (``apply <topic>``)."""
COMPENSATE: Final = "compensate"
"""... of a :class:`~txmq.outbox.RollbackListener` running a compensation."""
DEAD_LETTER: Final = "dead_letter"
"""... of a RabbitMQ or NATS delivery leaving for its dead-letter queue (as the SDK's)."""

MESSAGING_DESTINATION_SUBSCRIPTION_NAME: Final = "messaging.destination.subscription.name"
"""The RabbitMQ queue or the JetStream durable consumer a delivery came from (registry)."""
TXMQ_OUTBOX_TABLE: Final = "txmq.outbox.table"
"""The outbox (or inbox) table of the span."""
TXMQ_OUTBOX_BIZ_KEY: Final = "txmq.outbox.biz_key"
TXMQ_OUTBOX_EVENT_TYPE: Final = "txmq.outbox.event_type"
TXMQ_OUTBOX_TX_TYPE: Final = "txmq.outbox.tx_type"
"""``COMMIT`` or ``ROLLBACK``."""
TXMQ_OUTBOX_ORIGIN_EVENT_ID: Final = "txmq.outbox.origin_event_id"
"""A ROLLBACK event's: the COMMIT event it undoes."""
TXMQ_OUTBOX_PARKED_MS: Final = "txmq.outbox.parked_ms"
"""How long the row waited in the outbox: from ``put_message`` to the relay's send, in ms."""
TXMQ_OUTBOX_ATTEMPT: Final = "txmq.outbox.attempt"
"""Which claim of the row this send is (1 for the first; the row's ``attempts``)."""
TXMQ_OUTBOX_DELIVERY: Final = "txmq.outbox.delivery"
"""Which delivery of the message this is, 1 for the first (RocketMQ: reconsume times + 1)."""
TXMQ_INBOX_OUTCOME: Final = "txmq.inbox.outcome"
"""What the inbox did: ``applied``, ``duplicate``, ``retry`` (failed: redelivered later) or
``rollback`` (gave up: the ROLLBACK event was written)."""

_NULL: Final = contextlib.nullcontext(None)
_NO_SPANS: Final[contextlib.nullcontext[list[Span | None]]] = contextlib.nullcontext([])
T = TypeVar("T")


def system_of(sender: object) -> str:
    """The ``messaging.system`` a relay's sender sends with: a transport's by its ``kind``,
    else ``rocketmq`` (a :class:`txmq.client.Producer`)."""
    kind = getattr(sender, "kind", "txmq")
    return SYSTEMS.get(kind, ROCKETMQ) if isinstance(kind, str) else ROCKETMQ


# -- put_message ------------------------------------------------------------------------------------
def put_span(tracing: Tracing, table: str, message: Message, event_id: str, event_type: str,
             biz_key: str, tx_type: str,
             origin_event_id: str | None) -> AbstractContextManager[Span | None]:
    """INTERNAL span of writing one event row, a child of the current span (the business
    transaction's); its context becomes the event's creation context."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {
        MESSAGING_DESTINATION_NAME: message.topic, MESSAGING_MESSAGE_ID: event_id,
        TXMQ_OUTBOX_TABLE: table, TXMQ_OUTBOX_EVENT_TYPE: event_type,
        TXMQ_OUTBOX_BIZ_KEY: biz_key, TXMQ_OUTBOX_TX_TYPE: tx_type}
    if origin_event_id:
        attrs[TXMQ_OUTBOX_ORIGIN_EVENT_ID] = origin_event_id
    return tracing.internal_span(f"{PUT_MESSAGE} {message.topic}", attrs)


def split_context(props: MutableMapping[str, str]) -> dict[str, str]:
    """Remove and return the trace context fields of ``props`` (a ROLLBACK event takes the
    current context instead of its COMMIT event's; these are the fallback)."""
    return {k: props.pop(k) for k in (TRACEPARENT, TRACESTATE) if k in props}


# -- the relay --------------------------------------------------------------------------------------
@contextlib.contextmanager
def _relay_spans(tracing: Tracing, system: str, table: str, rows: Sequence[OutboxRow],
                 msgs: Sequence[Message], now_ms: int) -> Iterator[list[Span | None]]:
    with contextlib.ExitStack() as stack:
        spans: list[Span | None] = []
        for row, msg in zip(rows, msgs, strict=True):
            attrs: dict[str, AttributeValue] = {
                MESSAGING_MESSAGE_ID: row.event_id, TXMQ_OUTBOX_TABLE: table,
                TXMQ_OUTBOX_BIZ_KEY: row.biz_key, TXMQ_OUTBOX_TX_TYPE: row.tx_type,
                TXMQ_OUTBOX_PARKED_MS: max(0, now_ms - row.created_at_ms),
                TXMQ_OUTBOX_ATTEMPT: row.attempts}
            # ambient=False: each row's span is a child of the row's creation context (the
            # business trace), whatever the spans entered before it
            spans.append(stack.enter_context(tracing.send_span(
                RELAY, msg.topic, [msg.properties], system=system, attributes=attrs,
                ambient=False)))
        yield spans


def relay_spans(tracing: Tracing, system: str, table: str, rows: Sequence[OutboxRow],
                msgs: Sequence[Message], now_ms: int) -> AbstractContextManager[list[Span | None]]:
    """One CLIENT span per row of a batch the relay sends (``relay <topic>``), each a child of its
    row's creation context (so the send is in the business trace) and linked to it, with the
    time the row was parked (``now_ms`` − its creation) and its claim count. Open from before the
    send to after the broker's acknowledgement; the last one is the current span (for a batch of
    one row, the transport's own send span is its child). A row without a creation context (put
    while not tracing) gets a new trace, whose context its message then carries."""
    if not tracing.active:
        return _NO_SPANS
    return _relay_spans(tracing, system, table, rows, msgs, now_ms)


def failed(spans: Sequence[Span | None], exc: BaseException) -> None:
    """Mark the spans of a batch whose send failed (``error.type`` of ``exc``)."""
    kind = error_type(exc)
    for span in spans:
        set_error(span, kind, str(exc))


def outside_trace(spans: Sequence[Span | None], fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, in no span's scope when ``spans`` are several rows' (their batch's send is
    none of those traces': the transport's span starts a trace of its own, linked to each row's);
    for one row, in its span's scope."""
    if len(spans) <= 1:
        return fn(*args)
    return contextvars.Context().run(fn, *args)


# -- RabbitMQ and NATS ------------------------------------------------------------------------------
def batch_attributes(count: int) -> dict[str, AttributeValue] | None:
    """A publish's attributes: ``messaging.batch.message_count`` for several messages (the
    registry sets it on batch operations only)."""
    return {MESSAGING_BATCH_MESSAGE_COUNT: count} if count > 1 else None


def text_headers(headers: Mapping[str, object]) -> dict[str, str]:
    """The text headers of a delivery (bytes decoded, others dropped): enough to read its trace
    context even when it is not an envelope."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        if isinstance(v, bytes):
            try:
                v = v.decode()
            except UnicodeDecodeError:
                continue
        if isinstance(v, str):
            out[k] = v
    return out


def delivery_span(tracing: Tracing, system: str, topic: str, group: str, subscription: str,
                  props: Mapping[str, str], delivery: int) -> AbstractContextManager[Span | None]:
    """CONSUMER span of one RabbitMQ / NATS delivery (``process <topic>``), as the SDK's push
    consumer's: a child of the message's creation context (no caller's scope), linked to it."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {
        MESSAGING_CONSUMER_GROUP_NAME: group,
        MESSAGING_DESTINATION_SUBSCRIPTION_NAME: subscription, TXMQ_OUTBOX_DELIVERY: delivery}
    if props.get("UNIQ_KEY"):
        attrs[MESSAGING_MESSAGE_ID] = props["UNIQ_KEY"]
    return tracing.process_span("process", topic, [props], system=system, attributes=attrs,
                                ambient=False)


def settle_span(tracing: Tracing, system: str, operation: str, destination: str, group: str,
                props: Mapping[str, str], delivery: int) -> AbstractContextManager[Span | None]:
    """CLIENT settle span of a failed RabbitMQ / NATS delivery: ``operation`` ``nack`` (RabbitMQ),
    ``nak`` (NATS) or ``dead_letter``, to ``destination`` (the queue or subject it goes back to,
    or the dead-letter queue); a child of the message's creation context."""
    if not tracing.active:
        return _NULL
    return tracing.settle_span(operation, destination, [props], system=system, ambient=False,
                               attributes={MESSAGING_CONSUMER_GROUP_NAME: group,
                                           TXMQ_OUTBOX_DELIVERY: delivery})


# -- the inbox --------------------------------------------------------------------------------------
def apply_span(tracing: Tracing, system: str, operation: str, table: str, ev_topic: str,
               msg: MessageExt, event_id: str, biz_key: str) -> AbstractContextManager[Span | None]:
    """CONSUMER span of the inbox handling one event (``apply <topic>`` or ``compensate
    <topic>``): a child of the current span (the consumer's process span) when there is one,
    else of the message's creation context; linked to it. The handler's own spans nest in it."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {
        MESSAGING_MESSAGE_ID: event_id, TXMQ_OUTBOX_TABLE: table, TXMQ_OUTBOX_BIZ_KEY: biz_key,
        TXMQ_OUTBOX_DELIVERY: msg.reconsume_times + 1}
    return tracing.process_span(operation, ev_topic, [msg.properties], system=system,
                                attributes=attrs)


def outcome(span: Span | None, value: str, exc: BaseException | None = None) -> None:
    """Record what the inbox did (:data:`TXMQ_INBOX_OUTCOME`); with ``exc``, the handler's
    failure (status ERROR, its ``error.type``)."""
    if span is None:
        return
    span.set_attribute(TXMQ_INBOX_OUTCOME, value)
    if exc is not None:
        set_error(span, error_type(exc), repr(exc))

