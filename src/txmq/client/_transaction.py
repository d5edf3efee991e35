"""The sans-IO transaction flow of a producer group: half message → local outcome → end, and
check-back → answer, plus the batching of end requests. The asyncio and sync shells compose it.

RocketMQ ``TransactionMQProducer`` / ``DefaultMQProducerImpl.sendMessageInTransaction``,
``endTransaction`` and ``checkTransactionState``.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from enum import Enum
from typing import TYPE_CHECKING, Any

import msgspec

from txmq import limits
from txmq.client._core import (
    LocalTransactionState,
    MessageIdGenerator,
    SendResult,
    SendStatus,
    TransactionSendResult,
)
from txmq.client._tracing import (
    SEND_MESSAGE_IN_TRANSACTION,
    local_transaction_span,
    local_transaction_state,
    send_span,
    sent,
)
from txmq.errors import ProtocolError, ResponseCode
from txmq.protocol import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    CheckTransactionStateRequestHeader,
    Command,
    EndTransactionRequestHeader,
    Message,
    MessageExt,
    decode_body,
    decode_message_ext,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.tracing import ROCKETMQ_MESSAGE_TYPE_TRANSACTION, Tracing, error_type

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "UNCONFIRMED_END",
    "CheckBack",
    "EndAnswer",
    "EndBatcher",
    "EndMode",
    "EndStep",
    "LocalRaised",
    "LocalStep",
    "SendHalfStep",
    "TransactionCore",
    "TransactionFlow",
]

UNCONFIRMED_END = "UNKNOWN_END"
"""The outcome of a transaction whose end request failed after the local outcome was known: the
broker's check-back settles it from the local transaction log."""

log = logging.getLogger("txmq.client")

_END_TYPE = {
    LocalTransactionState.COMMIT_MESSAGE: TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOWN: TRANSACTION_NOT_TYPE,
}


class CheckBack(msgspec.Struct, frozen=True):
    """A broker's CHECK_TRANSACTION_STATE, decoded: its header and the half message."""

    header: CheckTransactionStateRequestHeader
    message: MessageExt


class EndAnswer(msgspec.Struct, frozen=True):
    """The broker's answer to one end request of a batch (txmq END_TRANSACTION_BATCH)."""

    code: int
    remark: str = ""
    outcome: str = ""
    duplicate: bool = False


class SendHalfStep(msgspec.Struct, frozen=True):
    """Shell: store ``msg`` as a half message; send back its :class:`SendResult` (an exception
    propagates to the caller: nothing ran locally)."""

    msg: Message


class LocalStep(msgspec.Struct, frozen=True):
    """Shell: run the application's ``execute_local_transaction(msg, arg)`` (in the caller's thread
    for the sync shell; awaited, or in a worker thread when it is a plain function, for the async
    one); send back its return value, or a :class:`LocalRaised` when it raised (logged)."""

    msg: Message
    arg: Any
    half: SendResult


class EndStep(msgspec.Struct, frozen=True):
    """Shell: end the transaction (:meth:`AsyncTransactionProducer.end_transaction`, which never
    raises); send back the outcome string."""

    half: SendResult
    state: LocalTransactionState


class LocalRaised:
    """What a shell sends back for a local transaction that raised (counts as UNKNOWN, as in
    RocketMQ; the exception is logged by the shell, and recorded on the local transaction's
    span)."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

TransactionFlow = Generator[SendHalfStep | LocalStep | EndStep, Any, "TransactionSendResult"]
"""``send_message_in_transaction`` as steps a shell performs (:meth:`TransactionCore.flow`)."""


class EndMode(Enum):
    """How ends go out: batched and answered (txmq), or one-way END_TRANSACTION each (what an
    Apache RocketMQ broker takes: it answers the batch code REQUEST_CODE_NOT_SUPPORTED)."""

    BATCH = "BATCH"
    ONEWAY = "ONEWAY"


class TransactionCore:
    """The transaction decisions of one producer group; no I/O.

    Args:
        group: the producer group (check-backs go to its live members).
        ids: the ``UNIQ_KEY`` source; every half gets a fresh one.
        tracing: the spans of :meth:`flow` (off by default).
        client_id: the producer's client id, for those spans.
    """

    def __init__(self, group: str, ids: MessageIdGenerator, *, tracing: Tracing | None = None,
                 client_id: str = "") -> None:
        self.group = group
        self._ids = ids
        self._tracing = tracing or Tracing(enabled=False)
        self._client_id = client_id

    def flow(self, msg: Message, arg: Any) -> TransactionFlow:
        """Half message → local transaction → end, as steps (RocketMQ
        ``sendMessageInTransaction``): the sync and asyncio shells drive the same generator, so the
        flow is written once. A half stored with a weaker status than SEND_OK
        (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) is rolled back without
        running the local transaction, as RocketMQ does. Once the local outcome is known nothing
        raises but a listener's wrong return type (TypeError, after the end request, the
        transaction left UNKNOWN); a failed end is the outcome :data:`UNCONFIRMED_END`.

        Traced (docs/tracing.md) as a ``send_message_in_transaction`` span, current while the
        steps run (a shell throws a step's exception into the generator, which ends the spans and
        re-raises it): its context is the message's creation context, and the half's send, the
        ``execute_local_transaction`` span and the end are its children."""
        with send_span(self._tracing, [msg], SEND_MESSAGE_IN_TRANSACTION, self._client_id,
                       message_type=ROCKETMQ_MESSAGE_TYPE_TRANSACTION) as tx_span:
            half: SendResult = yield SendHalfStep(self.half(msg))
            sent(tx_span, half, msg_id=True)
            if half.status != SendStatus.SEND_OK:
                log.warning("half %s stored with %s; rolled back without the local transaction",
                            half.msg_id, half.status.name)
                state, complaint = LocalTransactionState.ROLLBACK_MESSAGE, ""
            else:
                with local_transaction_span(self._tracing, msg, self._client_id) as span:
                    result = yield LocalStep(msg, arg, half)
                    state, complaint = self.local_state(
                        LocalTransactionState.UNKNOWN if isinstance(result, LocalRaised)
                        else result)
                    _record_local(span, state, result, complaint)
            outcome: str = yield EndStep(half, state)
            if complaint:
                raise TypeError(complaint)
        return TransactionSendResult(half.msg_id, msg.topic, half.queue_id, half.queue_offset,
                                     state, outcome, broker_name=half.broker_name)

    def half(self, msg: Message) -> Message:
        """Mark ``msg`` as a half message of this group, with a fresh id (``UNIQ_KEY``, also the
        transaction id): a retry of the same ``Message`` after a failed send must not share its id
        with a half the broker may have stored anyway, or a check-back that finds the id in the
        local transaction log would commit both. Returns ``msg``."""
        msg.properties = {**msg.properties, PROPERTY_TRANSACTION_PREPARED: "true",
                          PROPERTY_PRODUCER_GROUP: self.group, PROPERTY_UNIQ_KEY: self._ids.next()}
        return msg

    @staticmethod
    def local_state(result: object) -> tuple[LocalTransactionState, str]:
        """The state a local transaction's return value means, and a complaint ("" if none).

        ``None`` means UNKNOWN, as RocketMQ reads a null state. Anything that is not a
        :class:`LocalTransactionState` also ends as UNKNOWN (the half is stored already, so
        check-back settles it) and comes with a complaint the shell raises as TypeError after
        the end request, so the caller sees its mistake.
        """
        if isinstance(result, LocalTransactionState):
            return result, ""
        if result is None:
            return LocalTransactionState.UNKNOWN, ""
        return LocalTransactionState.UNKNOWN, (
            f"execute_local_transaction returned {type(result).__name__}, not a "
            "LocalTransactionState; the transaction was left UNKNOWN for check-back")

    def end_request(self, half: SendResult, state: LocalTransactionState
                    ) -> EndTransactionRequestHeader:
        """END_TRANSACTION for a half this producer sent (RocketMQ
        ``DefaultMQProducerImpl.endTransaction``: the queue offset as ``tranStateTableOffset``,
        the commit log offset from the offset message id, ``bname`` the half's broker group; the
        shell sends it to that group's current master). It carries the half's ``masterEpoch``
        (txmq, controller mode) when its send answer had one."""
        return EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=half.queue_offset,
            commit_log_offset=half.commit_log_offset, commit_or_rollback=_END_TYPE[state],
            msg_id=half.msg_id, transaction_id=half.msg_id, topic=half.topic,
            master_epoch=half.master_epoch)

    @staticmethod
    def check_back(cmd: Command) -> CheckBack | None:
        """Decode a CHECK_TRANSACTION_STATE request; None (logged) when it does not decode."""
        try:
            return CheckBack(from_ext(cmd.ext, CheckTransactionStateRequestHeader),
                             decode_message_ext(cmd.body))
        except ProtocolError as exc:
            log.error("malformed check-back request: %s", exc)
            return None

    def check_answer(self, check: CheckBack, state: LocalTransactionState
                     ) -> EndTransactionRequestHeader | None:
        """The end request answering a check-back, or None for UNKNOWN (the broker asks again).
        RocketMQ ``DefaultMQProducerImpl.checkTransactionState``: the commit log offset is the
        half message's, the message id its ``UNIQ_KEY``."""
        if state is LocalTransactionState.UNKNOWN:
            return None
        h, m = check.header, check.message
        return EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=h.tran_state_table_offset,
            commit_log_offset=m.commit_log_offset or h.commit_log_offset,
            commit_or_rollback=_END_TYPE[state], from_transaction_check=True,
            msg_id=m.properties.get(PROPERTY_UNIQ_KEY) or h.msg_id or "",
            transaction_id=h.transaction_id, topic=h.topic)


def _record_local(span: Span | None, state: LocalTransactionState, result: object,
                  complaint: str) -> None:
    if isinstance(result, LocalRaised):
        local_transaction_state(span, state, error_type(result.exc), str(result.exc))
    else:
        local_transaction_state(span, state, "TypeError" if complaint else "", complaint)


class EndBatcher:
    """End requests queued in one turn of the shell's loop, sent together (sans-IO).

    The shell calls :meth:`add` per end request (it schedules a flush when it returns True),
    :meth:`take` at the flush, :meth:`body` for the request and :meth:`answers` for the
    response. With ``mode`` ONEWAY (after :meth:`unsupported`), ends go one by one as one-way
    END_TRANSACTION instead.
    """

    def __init__(self) -> None:
        self._queued: list[EndTransactionRequestHeader] = []
        self.mode = EndMode.BATCH

    def add(self, h: EndTransactionRequestHeader) -> bool:
        """Queue ``h``; True when it is the first of the turn (schedule a flush)."""
        self._queued.append(h)
        return len(self._queued) == 1

    def take(self) -> tuple[list[EndTransactionRequestHeader], bool]:
        """The next batch (at most ``limits.BATCH_MESSAGES_MAX``) and whether more remain."""
        batch = self._queued[: limits.BATCH_MESSAGES_MAX]
        self._queued = self._queued[limits.BATCH_MESSAGES_MAX :]
        return batch, bool(self._queued)

    @staticmethod
    def body(batch: list[EndTransactionRequestHeader]) -> bytes:
        """END_TRANSACTION_BATCH body: a JSON list of the headers' ext fields."""
        return encode_body([to_ext(h) for h in batch])

    @staticmethod
    def answers(cmd: Command, n: int) -> list[EndAnswer]:
        """Per-request answers of a batch response. Raises ProtocolError on a count mismatch
        or a body that does not decode."""
        items = decode_body(cmd.body, list[EndAnswer])
        if len(items) != n:
            raise ProtocolError(f"{len(items)} answers to {n} end requests")
        return items

    def unsupported(self, cmd: Command) -> bool:
        """Whether ``cmd`` says the broker has no batch end (an Apache RocketMQ broker); the
        batcher then switches to one-way END_TRANSACTION for good."""
        if cmd.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            self.mode = EndMode.ONEWAY
            return True
        return False
