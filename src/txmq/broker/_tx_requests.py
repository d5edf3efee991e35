"""The transaction requests of the sans-IO broker: end (one and batched), the operator's view and
actions, and the Spark sink's batch commit. Failures raise InvalidRequest with the response code,
which the broker's dispatch answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from txmq import limits
from txmq.broker._actions import Action, failure, ok_reply
from txmq.broker.transaction import EndResult, Outcome
from txmq.errors import InvalidRequest, MalformedHeader, ResponseCode
from txmq.protocol import (
    AdminEndTransactionRequestHeader,
    Command,
    EndTransactionRequestHeader,
    EndTransactionResponseHeader,
    PendingTransactionsRequestHeader,
    PendingTransactionsResponseHeader,
    RequestCode,
    ResumeCheckHalfMessageRequestHeader,
    ResumeResponseHeader,
    SinkBatchRequestHeader,
    TransactionIdRequestHeader,
    TransactionTraceRequestHeader,
    check_group,
    check_properties,
    decode_body,
    encode_body,
    from_ext,
    from_ext_list_json,
    parse_int,
    to_ext,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from txmq.broker._broker import Broker

__all__ = ["TransactionRequests"]

_ANSWERS: dict[str, dict[str, object]] = {
    o.value: {"code": int(ResponseCode.SUCCESS), "remark": "", "outcome": o.value, "duplicate": False}
    for o in Outcome}
"""An END_TRANSACTION_BATCH answer of a first decision (and of UNKNOWN: PENDING), by outcome:
built once, not per end (only encoded, never changed)."""


class TransactionRequests:
    """END_TRANSACTION and txmq's transaction and sink extensions, over the broker's
    :class:`~txmq.broker.transaction.TransactionService`.

    Args:
        broker: the broker whose config and transaction service it uses.
    """

    def __init__(self, broker: Broker) -> None:
        self.b = broker

    def handlers(self) -> dict[int, Callable[[int, Command, int], list[Action]]]:
        """Request code → handler, for the broker's dispatch table."""
        return {
            RequestCode.END_TRANSACTION: self._end_transaction,
            RequestCode.END_TRANSACTION_BATCH: self._end_transaction_batch,
            RequestCode.GET_TRANSACTION_STATS: self._tx_stats,
            RequestCode.GET_PENDING_TRANSACTIONS: self._tx_pending,
            RequestCode.QUERY_TRANSACTION: self._tx_query,
            RequestCode.ADMIN_END_TRANSACTION: self._tx_admin_end,
            RequestCode.RESUME_CHECK_HALF_MESSAGE: self._tx_resume,
            RequestCode.COMMIT_SINK_BATCH: self._sink_commit,
            RequestCode.ABORT_SINK_BATCH: self._sink_abort,
            RequestCode.GET_TRANSACTION_TRACE: self._tx_trace,
        }

    def _slave_remark(self) -> str:
        """Why a SLAVE refuses END_TRANSACTION (SLAVE_NOT_AVAILABLE; RocketMQ's remark is null),
        naming the master: its remoting address once known (``Broker.master_addr``), else the
        HA address the slave replicates from."""
        c = self.b.config
        where = self.b.master_addr or (f"HA address {c.ha_master_address}"
                                       if c.ha_master_address else "address unknown")
        return (f"broker {c.broker_name} (id {self.b.role.broker_id}) is a SLAVE and does not end "
                f"transactions: send END_TRANSACTION to the master of {c.broker_name} ({where})")

    def _refuse_end(self) -> None:
        """Raise InvalidRequest when this broker may not end transactions now: a SLAVE
        (SLAVE_NOT_AVAILABLE), or a fenced master (docs/replication.md "Fencing")."""
        if (refusal := self.b.role.write_refusal()) is not None:
            raise InvalidRequest(*refusal)
        if self.b.role.slave:
            raise InvalidRequest(ResponseCode.SLAVE_NOT_AVAILABLE, self._slave_remark())

    def _end_transaction(self, conn: int, cmd: Command, now: int) -> list[Action]:
        self._refuse_end()
        h = from_ext(cmd.ext, EndTransactionRequestHeader)
        check_group(h.producer_group)
        if (refusal := self.b.role.end_refusal(h.master_epoch, h.commit_log_offset)) is not None:
            raise InvalidRequest(*refusal)
        return self._end_reply(conn, cmd, self.b.tx.end(h, now, conn))

    def end_run(self, conn: int, cmds: list[Command], now: int) -> list[Action]:
        """END_TRANSACTION requests that arrived together (one-way ones from RocketMQ producers
        and txmq's ``oneway_end``), settled with one :meth:`TransactionService.end_many`: one
        append and one op record per outcome, as an END_TRANSACTION_BATCH is. Answers, stored
        records and errors are those of handling each request in turn (a repeated end of one half
        in the run gets the first one's outcome, a malformed header its own error); a one-way
        request is answered by nothing. Raises nothing but unexpected failures (the broker's
        dispatch answers every request of the run with them)."""
        try:
            self._refuse_end()
        except InvalidRequest as exc:
            return [a for cmd in cmds for a in self.b.error_reply(
                conn, cmd, exc.response_code, str(exc))]
        early: dict[int, list[Action]] = {}
        headers: list[EndTransactionRequestHeader] = []
        for i, cmd in enumerate(cmds):
            try:
                h = from_ext(cmd.ext, EndTransactionRequestHeader)
                check_group(h.producer_group)
                if (refusal := self.b.role.end_refusal(h.master_epoch,
                                                       h.commit_log_offset)) is not None:
                    raise InvalidRequest(*refusal)
                headers.append(h)
            except Exception as exc:  # MalformedHeader, InvalidRequest: that request's own error
                early[i] = self.b.error_reply(conn, cmd, *failure(exc, "decoding an end"))
        results = iter(self.b.tx.end_many(headers, now, conn))
        out: list[Action] = []
        for i, cmd in enumerate(cmds):
            if i in early:
                out += early[i]
                continue
            r = next(results)
            if r.code != ResponseCode.SUCCESS:
                out += self.b.error_reply(conn, cmd, r.code, r.remark)
            elif not cmd.is_oneway:
                out += self._end_reply(conn, cmd, r)
        return out

    def _end_transaction_batch(self, conn: int, cmd: Command, now: int) -> list[Action]:
        self._refuse_end()
        parsed: list[EndTransactionRequestHeader | str | tuple[ResponseCode, str]]
        try:  # every header at once, in one pass (the usual case), else each on its own
            parsed = list(from_ext_list_json(cmd.body, EndTransactionRequestHeader))
        except MalformedHeader:
            parsed = self._end_headers_one_by_one(cmd.body)
        if len(parsed) > limits.BATCH_MESSAGES_MAX:
            raise InvalidRequest(ResponseCode.MESSAGE_ILLEGAL, f"more than {limits.BATCH_MESSAGES_MAX} ends")
        for i, h in enumerate(parsed):  # controller mode: each end's master epoch
            if isinstance(h, EndTransactionRequestHeader) and (
                    refusal := self.b.role.end_refusal(h.master_epoch, h.commit_log_offset)):
                parsed[i] = refusal
        decided = iter(self.b.tx.end_many([h for h in parsed if isinstance(
            h, EndTransactionRequestHeader)], now, conn))
        items, durable = [], 0
        for h in parsed:
            if isinstance(h, str):
                items.append({"code": int(ResponseCode.INVALID_PARAMETER), "remark": h})
                continue
            if isinstance(h, tuple):
                items.append({"code": int(h[0]), "remark": h[1]})
                continue
            r = next(decided)
            durable = max(durable, r.durable_offset)
            answer = _ANSWERS.get(r.outcome) if r.code == ResponseCode.SUCCESS and not (
                r.duplicate or r.remark) else None
            items.append(answer if answer is not None else
                         {"code": int(r.code), "remark": r.remark, "outcome": r.outcome,
                          "duplicate": r.duplicate})
        return ok_reply(conn, cmd, body=encode_body(items), durable_offset=durable)

    @staticmethod
    def _end_headers_one_by_one(body: bytes) -> list[EndTransactionRequestHeader | str | tuple[
            ResponseCode, str]]:
        """An END_TRANSACTION_BATCH body that did not read at once: its ``extFields`` objects
        read one by one, a header or the remark of why it does not read each. Raises
        InvalidRequest (INVALID_PARAMETER) when the body is no list of string fields."""
        try:
            exts = decode_body(body, list[dict[str, str]])
        except MalformedHeader as exc:
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER, f"end batch body: {exc}") from exc
        if len(exts) > limits.BATCH_MESSAGES_MAX:
            raise InvalidRequest(ResponseCode.MESSAGE_ILLEGAL, f"more than {limits.BATCH_MESSAGES_MAX} ends")
        parsed: list[EndTransactionRequestHeader | str | tuple[ResponseCode, str]] = []
        for ext in exts:
            try:
                parsed.append(from_ext(ext, EndTransactionRequestHeader))
            except MalformedHeader as exc:
                parsed.append(str(exc))
        return parsed

    @staticmethod
    def _end_reply(conn: int, cmd: Command, r: EndResult) -> list[Action]:
        if r.code != ResponseCode.SUCCESS:
            raise InvalidRequest(r.code, r.remark)
        ext = to_ext(EndTransactionResponseHeader(outcome=r.outcome, duplicate=r.duplicate))
        return ok_reply(conn, cmd, ext, durable_offset=r.durable_offset)

    def _tx_stats(self, conn: int, cmd: Command, now: int) -> list[Action]:
        index = self.b.tx.index
        return ok_reply(conn, cmd, body=encode_body({**index.counts(), "PARKED": index.parked(),
                                                     **self.b.tx.stats}))

    def _tx_offset(self, cmd: Command) -> int:
        """The half offset a transaction request names: a ``UNIQ_KEY`` or ``half:<offset>``
        (``msgId`` of RESUME_CHECK_HALF_MESSAGE, ``id`` of txmq's requests)."""
        if cmd.code == RequestCode.RESUME_CHECK_HALF_MESSAGE:
            ident = from_ext(cmd.ext, ResumeCheckHalfMessageRequestHeader).msg_id
        else:
            ident = from_ext(cmd.ext, TransactionIdRequestHeader).id
        if ident.startswith("half:"):
            parse_int(ident[5:], "half offset", 0, limits.TIMESTAMP_MAX_MS)
        off = self.b.tx.lookup(ident)
        if off is None:
            raise InvalidRequest(ResponseCode.TRANSACTION_NOT_FOUND,
                                 f"no pending or discarded transaction {ident!r}")
        return off

    def _tx_pending(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, PendingTransactionsRequestHeader)
        limit = max(1, min(h.limit, limits.PENDING_TRANSACTIONS_LIST_MAX))
        body = encode_body(self.b.tx.pending_list(now, limit))
        return ok_reply(conn, cmd, to_ext(PendingTransactionsResponseHeader(
            pending=len(self.b.tx.index.pending))), body)

    def _tx_trace(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """GET_TRANSACTION_TRACE: the lives the broker keeps of the transaction ``id`` names
        (``UNIQ_KEY`` or ``half:<offset>``) or of trace id ``traceId``, newest first ([] when none
        is kept: nothing was recorded, or it was evicted, or the broker restarted since)."""
        h = from_ext(cmd.ext, TransactionTraceRequestHeader)
        if bool(h.id) == bool(h.trace_id):
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER, "give one of id and traceId")
        limit = max(1, min(h.limit, limits.TRANSACTION_TRACE_QUERY_MAX))
        traces = self.b.tx.traces
        if h.trace_id:
            if len(h.trace_id) != 32 or not all(c in "0123456789abcdef" for c in h.trace_id):
                raise InvalidRequest(ResponseCode.INVALID_PARAMETER,
                                     f"traceId {h.trace_id[:40]!r} is not 32 lowercase hex digits")
            return ok_reply(conn, cmd, body=encode_body(traces.by_trace_id(h.trace_id, limit)))
        if h.id.startswith("half:"):
            life = traces.get(parse_int(h.id[5:], "half offset", 0, limits.TIMESTAMP_MAX_MS))
            return ok_reply(conn, cmd, body=encode_body([] if life is None else [life]))
        return ok_reply(conn, cmd, body=encode_body(traces.by_msg_id(h.id, limit)))

    def _tx_query(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return ok_reply(conn, cmd, body=encode_body(self.b.tx.describe(self._tx_offset(cmd), now)))

    def _tx_admin_end(self, conn: int, cmd: Command, now: int) -> list[Action]:
        self._refuse_end()
        h = from_ext(cmd.ext, AdminEndTransactionRequestHeader)
        check_properties({"TXMQ_OPERATOR": h.operator, "TXMQ_REASON": h.reason})  # op message props
        off = self._tx_offset(cmd)
        outcome = {"COMMIT": Outcome.COMMIT, "ROLLBACK": Outcome.ROLLBACK}.get(h.outcome)
        if outcome is None:
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER, "outcome must be COMMIT or ROLLBACK")
        return self._end_reply(conn, cmd, self.b.tx.operator_end(off, outcome, h.operator, h.reason, now))

    def _sink_commit(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, SinkBatchRequestHeader)
        batch, group = h.batch, h.producer_group
        try:
            tasks = decode_body(cmd.body, dict[str, int])
        except MalformedHeader as exc:
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER, f"sink batch body: {exc}") from exc
        if not batch or not group:
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER, "batch and producer_group are required")
        check_group(group)
        for task in (batch, *tasks):  # stored as TXMQ_SINK_BATCH / TXMQ_SINK_TASK values
            check_properties({"TXMQ_SINK_BATCH": task})
        return self._end_reply(conn, cmd, self.b.tx.commit_batch(batch, tasks, group, now))

    def _sink_abort(self, conn: int, cmd: Command, now: int) -> list[Action]:
        batch = from_ext(cmd.ext, SinkBatchRequestHeader).batch
        check_properties({"TXMQ_SINK_BATCH": batch})
        if not batch:
            raise InvalidRequest(ResponseCode.INVALID_PARAMETER, "batch is required")
        return self._end_reply(conn, cmd, self.b.tx.abort_batch(batch, now))

    def _tx_resume(self, conn: int, cmd: Command, now: int) -> list[Action]:
        code, remark, new_offset = self.b.tx.resume(self._tx_offset(cmd), now)
        if code != ResponseCode.SUCCESS:
            raise InvalidRequest(code, remark)
        return ok_reply(conn, cmd, to_ext(ResumeResponseHeader(half_offset=new_offset)))
