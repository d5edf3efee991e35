"""The SDK's spans (docs/tracing.md): what each operation of the producers and consumers records,
built on :mod:`txmq.tracing`. The asyncio clients call these, and the sync clients run the asyncio
ones, so each span is made in one place for both.

Every helper returns at once (a shared null context) when the client's :class:`Tracing` makes no
spans; properties are copied before trace context is written into them (a caller's dict may be
shared by several messages).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Final

from txmq.client._core import LocalTransactionState, SendResult
from txmq.protocol import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED,
    Message,
    MessageExt,
)
from txmq.tracing import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_CLIENT_ID,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_PARTITION_ID,
    MESSAGING_MESSAGE_ID,
    MESSAGING_ROCKETMQ_CONSUMPTION_MODEL,
    MESSAGING_ROCKETMQ_MESSAGE_DELAY_TIME_LEVEL,
    MESSAGING_ROCKETMQ_MESSAGE_KEYS,
    MESSAGING_ROCKETMQ_MESSAGE_RECONSUME_TIMES,
    MESSAGING_ROCKETMQ_MESSAGE_TAG,
    MESSAGING_ROCKETMQ_MESSAGE_TYPE,
    MESSAGING_ROCKETMQ_TRANSACTION_CHECK_TIMES,
    MESSAGING_ROCKETMQ_TRANSACTION_OUTCOME,
    MESSAGING_ROCKETMQ_TRANSACTION_STATE,
    MESSAGING_SYSTEM,
    ROCKETMQ,
    ROCKETMQ_MESSAGE_TYPE_DELAY,
    ROCKETMQ_MESSAGE_TYPE_NORMAL,
    ROCKETMQ_MESSAGE_TYPE_TRANSACTION,
    Tracing,
    set_error,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "END_TRANSACTION",
    "SEND",
    "SEND_HALF",
    "SEND_MESSAGE_IN_TRANSACTION",
    "check_span",
    "end_span",
    "ended",
    "local_transaction_span",
    "local_transaction_state",
    "process_span",
    "processed",
    "receive_started",
    "received",
    "send_back_span",
    "send_span",
    "sent",
]

SEND: Final = "send"
"""``messaging.operation.name`` of a plain send (RocketMQ ``DefaultMQProducer.send``)."""
SEND_HALF: Final = "send_half"
"""... of storing a half message (txmq ``send_half``; RocketMQ sends it with ``TRAN_MSG``)."""
SEND_MESSAGE_IN_TRANSACTION: Final = "send_message_in_transaction"
"""... of a whole transactional send (RocketMQ ``sendMessageInTransaction``)."""
END_TRANSACTION: Final = "end_transaction"
"""... of telling the broker the local outcome (RocketMQ ``endTransaction``)."""
EXECUTE_LOCAL_TRANSACTION: Final = "execute_local_transaction"
"""Name of the local transaction's span (RocketMQ ``TransactionListener``)."""
CHECK_TRANSACTION_STATE: Final = "check_transaction_state"
"""... of answering a check-back (RocketMQ request ``CHECK_TRANSACTION_STATE``)."""
PROCESS: Final = "process"
"""... of a push consumer's listener call."""
RETRY: Final = "retry"
"""... of sending a failed message back to ``%RETRY%<group>`` (``CONSUMER_SEND_MSG_BACK``)."""
DEAD_LETTER: Final = "dead_letter"
"""... of a failed message leaving for ``%DLQ%<group>``, out of retries."""

_STATE: Final = {LocalTransactionState.COMMIT_MESSAGE: "commit",
                 LocalTransactionState.ROLLBACK_MESSAGE: "rollback",
                 LocalTransactionState.UNKNOWN: "unknown"}
_NULL: Final = contextlib.nullcontext(None)


def _message_type(msg: Message) -> str:
    if msg.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return ROCKETMQ_MESSAGE_TYPE_TRANSACTION
    if msg.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0") not in ("", "0"):
        return ROCKETMQ_MESSAGE_TYPE_DELAY
    return ROCKETMQ_MESSAGE_TYPE_NORMAL


def _message(msg: Message, out: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
    """Add one message's attributes: id, tag, keys (and queue, reconsume times when stored)."""
    if msg.msg_id:
        out[MESSAGING_MESSAGE_ID] = msg.msg_id
    if msg.tags:
        out[MESSAGING_ROCKETMQ_MESSAGE_TAG] = msg.tags
    if msg.keys:
        out[MESSAGING_ROCKETMQ_MESSAGE_KEYS] = msg.keys.split()
    if isinstance(msg, MessageExt):
        out[MESSAGING_DESTINATION_PARTITION_ID] = str(msg.queue_id)
        out[MESSAGING_ROCKETMQ_MESSAGE_RECONSUME_TIMES] = msg.reconsume_times
    return out


# -- producers --------------------------------------------------------------------------------------
def send_span(tracing: Tracing, msgs: Sequence[Message], operation: str, client_id: str, *,
              batch: bool = False, message_type: str = "") -> AbstractContextManager[Span | None]:
    """The span of a send (``operation``: :data:`SEND`, :data:`SEND_HALF`,
    :data:`SEND_MESSAGE_IN_TRANSACTION`), PRODUCER unless every message carries a creation
    context already; a message without one gets the span's (its properties copied first).
    ``message_type``: the ``messaging.rocketmq.message.type`` ("": read from the first
    message's properties)."""
    if not tracing.active:  # no span; with OpenTelemetry's API alone, a valid context passes on
        if tracing.current_context_valid():
            for m in msgs:
                m.properties = dict(m.properties)
                tracing.inject(m.properties)
        return _NULL
    for m in msgs:
        m.properties = dict(m.properties)
    first = msgs[0]
    attrs: dict[str, AttributeValue] = {MESSAGING_CLIENT_ID: client_id,
                                        MESSAGING_ROCKETMQ_MESSAGE_TYPE:
                                            message_type or _message_type(first)}
    if batch:
        attrs[MESSAGING_BATCH_MESSAGE_COUNT] = len(msgs)
    else:
        _message(first, attrs)
        level = first.properties.get(PROPERTY_DELAY_TIME_LEVEL, "")
        if level.isdigit() and level != "0":
            attrs[MESSAGING_ROCKETMQ_MESSAGE_DELAY_TIME_LEVEL] = int(level)
    return tracing.send_span(operation, first.topic, [m.properties for m in msgs],
                             attributes=attrs)


def sent(span: Span | None, result: SendResult, *, msg_id: bool = False) -> None:
    """Record where a send was stored (the queue id), and with ``msg_id`` the message id (a
    transactional send's, given to the half)."""
    if span is not None:
        span.set_attribute(MESSAGING_DESTINATION_PARTITION_ID, str(result.queue_id))
        if msg_id:
            span.set_attribute(MESSAGING_MESSAGE_ID, result.msg_id)


def local_transaction_span(tracing: Tracing, msg: Message,
                           client_id: str) -> AbstractContextManager[Span | None]:
    """INTERNAL span of ``execute_local_transaction``, current while it runs (the application's
    database spans nest in it)."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {MESSAGING_SYSTEM: ROCKETMQ,
                                        MESSAGING_DESTINATION_NAME: msg.topic,
                                        MESSAGING_CLIENT_ID: client_id}
    return tracing.internal_span(f"{EXECUTE_LOCAL_TRANSACTION} {msg.topic}", _message(msg, attrs))


def local_transaction_state(span: Span | None, state: LocalTransactionState,
                            error: str = "", description: str = "") -> None:
    """Record the local transaction's state; ``error``: it failed (raised, or returned no
    :class:`LocalTransactionState`), with that ``error.type``."""
    if span is not None:
        span.set_attribute(MESSAGING_ROCKETMQ_TRANSACTION_STATE, _STATE[state])
        if error:
            set_error(span, error, description)


def end_span(tracing: Tracing, half: SendResult, state: LocalTransactionState,
             client_id: str) -> AbstractContextManager[Span | None]:
    """CLIENT settle span of an end request, child of the current span (the transactional send's
    when :meth:`send_message_in_transaction` runs it)."""
    if not tracing.active:
        return _NULL
    return tracing.settle_span(END_TRANSACTION, half.topic, attributes={
        MESSAGING_CLIENT_ID: client_id, MESSAGING_MESSAGE_ID: half.msg_id,
        MESSAGING_ROCKETMQ_MESSAGE_TYPE: ROCKETMQ_MESSAGE_TYPE_TRANSACTION,
        MESSAGING_ROCKETMQ_TRANSACTION_STATE: _STATE[state]})


def ended(span: Span | None, outcome: str) -> None:
    """Record the broker's outcome of an end request; ``UNKNOWN_END`` (not confirmed) is an
    error."""
    if span is not None:
        span.set_attribute(MESSAGING_ROCKETMQ_TRANSACTION_OUTCOME, outcome)
        if outcome == "UNKNOWN_END":
            set_error(span, outcome, "end transaction not confirmed; check-back settles it")


def check_span(tracing: Tracing, half: MessageExt,
               client_id: str) -> AbstractContextManager[Span | None]:
    """CONSUMER span of answering a check-back: a child of the half message's creation context
    (the trace of the transactional send, in whichever producer of the group answers) and linked
    to it, with the check count (``TRANSACTION_CHECK_TIMES``)."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {MESSAGING_CLIENT_ID: client_id,
                                        MESSAGING_ROCKETMQ_MESSAGE_TYPE: ROCKETMQ_MESSAGE_TYPE_TRANSACTION}
    checks = half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES, "")
    if checks.isdigit():
        attrs[MESSAGING_ROCKETMQ_TRANSACTION_CHECK_TIMES] = int(checks)
    return tracing.process_span(CHECK_TRANSACTION_STATE, half.topic, [half.properties],
                                attributes=_message(half, attrs), ambient=False)


# -- consumers --------------------------------------------------------------------------------------
def process_span(tracing: Tracing, msgs: list[MessageExt], group: str, client_id: str,
                 model: str) -> AbstractContextManager[Span | None]:
    """CONSUMER span of one listener call: a child of the message's creation context for a single
    message (:class:`Tracing` ``parent_from_message``), else a new trace; linked to each
    message's creation context. The listener call is in no caller's scope (``ambient=False``)."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {MESSAGING_CONSUMER_GROUP_NAME: group,
                                        MESSAGING_CLIENT_ID: client_id,
                                        MESSAGING_ROCKETMQ_CONSUMPTION_MODEL: model.lower()}
    if len(msgs) == 1:
        _message(msgs[0], attrs)
    else:
        attrs[MESSAGING_BATCH_MESSAGE_COUNT] = len(msgs)
    topics = {m.topic for m in msgs}
    return tracing.process_span(PROCESS, topics.pop() if len(topics) == 1 else None,
                                [m.properties for m in msgs], attributes=attrs, ambient=False)


def processed(span: Span | None, status: object, consumed: bool) -> None:
    """Record a listener call that did not consume its messages (status ERROR, ``error.type`` the
    status returned, e.g. ``RECONSUME_LATER``)."""
    if span is not None and not consumed:
        name = getattr(status, "name", None) or type(status).__name__
        set_error(span, str(name), f"listener returned {status!r}")


def send_back_span(tracing: Tracing, msg: MessageExt, destination: str, dead_letter: bool,
                   group: str, client_id: str) -> AbstractContextManager[Span | None]:
    """CLIENT settle span of a failed message leaving for the retry topic (``retry``) or the
    dead-letter queue (``dead_letter``), ``destination`` that topic; a child of the message's
    creation context, with the reconsume count it leaves with."""
    if not tracing.active:
        return _NULL
    attrs: dict[str, AttributeValue] = {MESSAGING_CONSUMER_GROUP_NAME: group,
                                        MESSAGING_CLIENT_ID: client_id}
    _message(msg, attrs)
    attrs[MESSAGING_ROCKETMQ_MESSAGE_RECONSUME_TIMES] = msg.reconsume_times + 1
    return tracing.settle_span(DEAD_LETTER if dead_letter else RETRY, destination,
                               [msg.properties], attributes=attrs, ambient=False)


def receive_started(tracing: Tracing) -> int:
    """The start of a pull consumer's receive (``time.time_ns()``), 0 when not tracing."""
    return time.time_ns() if tracing.active else 0


def received(tracing: Tracing, started_ns: int, operation: str, msgs: Sequence[MessageExt],
             group: str, client_id: str) -> None:
    """Record a CLIENT receive span (``operation``: ``pull`` or ``poll``) for a call that
    returned ``msgs``, linked to each one's creation context; nothing for no message."""
    if not started_ns or not msgs:
        return
    topics = {m.topic for m in msgs}
    attrs: dict[str, AttributeValue] = {MESSAGING_CONSUMER_GROUP_NAME: group,
                                        MESSAGING_CLIENT_ID: client_id,
                                        MESSAGING_BATCH_MESSAGE_COUNT: len(msgs)}
    tracing.receive_span(operation, topics.pop() if len(topics) == 1 else None,
                         [m.properties for m in msgs], started_ns, attributes=attrs)
