"""The console's transactions: pending and parked ones, one transaction's state, resume, an
operator's commit or rollback, and the audit log of those decisions, over every broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from txmq import limits
from txmq.console._backend_common import NOT_FOUND, BrokerClients, bad, check_ident, check_page, or_empty
from txmq.console._models import (
    AuditEntry,
    AuditPage,
    EndTransactionResult,
    ParkedPage,
    ParkedTransaction,
    PendingPage,
    PendingTransaction,
    ResumeResult,
)
from txmq.console._trace import read_topic
from txmq.console._user import acting_user
from txmq.errors import RemoteError, ResponseCode
from txmq.protocol import (
    HALF_TOPIC,
    OP_TOPIC,
    OPERATOR_DECISION_KEY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TXMQ_HALF_OFFSET,
    PROPERTY_TXMQ_OPERATOR,
    PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_PARK_REASON,
    PROPERTY_TXMQ_REASON,
    PROPERTY_TXMQ_TX_ID,
    PROPERTY_TXMQ_TX_TOPIC,
    PROPERTY_UNIQ_KEY,
    TRANS_CHECK_MAX_TIME_TOPIC,
    MessageExt,
)

__all__ = ["BrokerSet", "TransactionDesk"]

T = TypeVar("T")


class BrokerSet(Protocol):
    """The brokers the console talks to (its :class:`~txmq.console.Backend`)."""

    async def brokers(self) -> list[BrokerClients]: ...

    async def each(self, fn: Callable[[BrokerClients], Awaitable[T]]) -> list[T]: ...


class TransactionDesk:
    """Transactions across ``brokers``; every method validates its input first and raises
    InvalidRequest (bad input, 400/404/409) or RemoteError (a broker's refusal)."""

    def __init__(self, brokers: BrokerSet) -> None:
        self._set = brokers

    async def transactions(self, limit: int = 100, offset: int = 0) -> PendingPage:
        """Pending transactions, oldest first: rows ``offset .. offset + limit``."""
        check_page(limit)
        if offset < 0 or offset + limit > limits.CONSOLE_PENDING_WINDOW_MAX:
            raise bad(f"offset + limit must be in 0..{limits.CONSOLE_PENDING_WINDOW_MAX}")
        answers = await self._set.each(lambda b: b.admin.pending_transactions(offset + limit))
        rows = sorted((r for _, rs in answers for r in rs), key=lambda r: -int(r.get("age_ms", 0)))
        items = [PendingTransaction(
            id=str(r.get("msg_id") or f"half:{r['half_offset']}"), half_offset=int(r["half_offset"]),
            topic=str(r.get("topic", "")), producer_group=str(r.get("producer_group", "")),
            keys=str(r.get("keys", "")), age_ms=int(r.get("age_ms", 0)),
            check_count=int(r.get("check_count", 0)), born_host=str(r.get("sender", "")))
            for r in rows[offset: offset + limit]]
        return PendingPage(pending_total=sum(n for n, _ in answers), items=items)

    async def parked(self, limit: int = 100) -> ParkedPage:
        """Half messages discarded (after ``transactionCheckMax`` check-backs, or because they
        could never be committed) and not resumed yet, oldest first."""
        check_page(limit)
        found = [p for ps in await self._set.each(self._parked_one) for p in ps]
        found.sort(key=lambda p: p.parked_at_ms)
        return ParkedPage(total=len(found), items=found[:limit])

    async def _parked_one(self, b: BrokerClients) -> list[ParkedTransaction]:
        msgs = await read_topic(b.reader, TRANS_CHECK_MAX_TIME_TOPIC, 0, limits.CONSOLE_PARKED_READ_MAX)
        offs = [m.properties.get(PROPERTY_TXMQ_HALF_OFFSET, "") for m in msgs]
        states = await asyncio.gather(*(or_empty_dict(b.admin.query_transaction(f"half:{o}"))
                                        for o in offs))
        out = []
        for m, off, st in zip(msgs, offs, states, strict=True):
            if st.get("resumed") or st.get("state") not in ("DISCARD", None):
                continue
            p = m.properties
            checks = int(p.get(PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0)
            out.append(ParkedTransaction(
                id=p.get(PROPERTY_UNIQ_KEY) or f"half:{off}", topic=p.get(PROPERTY_REAL_TOPIC, ""),
                producer_group=p.get(PROPERTY_PRODUCER_GROUP, ""), keys=m.keys, check_count=checks,
                parked_at_ms=m.store_timestamp_ms,
                reason=p.get(PROPERTY_TXMQ_PARK_REASON) or f"no decision after {checks} check-backs"))
        return out

    async def _on_first(self, fn: Callable[[BrokerClients], Awaitable[T]]) -> T:
        """``fn`` on each broker until one does not answer not-found; raises the last not-found."""
        last: RemoteError | None = None
        for b in await self._set.brokers():
            try:
                return await fn(b)
            except RemoteError as exc:
                if exc.response_code not in NOT_FOUND:
                    raise
                last = exc
        assert last is not None
        raise last

    async def transaction(self, ident: str) -> dict[str, Any]:
        """One transaction's state (``query_transaction``): by message id or ``half:<offset>``."""
        check_ident(ident)
        st = await self._on_first(lambda b: self._state(b, ident))
        return {"id": ident, **st}

    async def _state(self, b: BrokerClients, ident: str) -> dict[str, Any]:
        """The broker knows pending and discarded transactions by id; a decided one is found by
        its half message's offset (the newest half copy of the id)."""
        try:
            return await known(b.admin.query_transaction(ident), ident)
        except RemoteError as exc:
            if exc.response_code != ResponseCode.TRANSACTION_NOT_FOUND or ident.startswith("half:"):
                raise
            halves = [m for m in await or_empty(b.admin.view_message(ident)) if m.topic == HALF_TOPIC]
            if not halves:
                raise
            half = max(halves, key=lambda m: m.queue_offset)
            return {"msg_id": ident, **await known(b.admin.query_transaction(f"half:{half.queue_offset}"),
                                                    ident)}

    async def resume(self, ident: str) -> ResumeResult:
        """Put a discarded half message back to be checked again; its new half offset."""
        check_ident(ident)
        off = await self._on_first(lambda b: b.admin.resume_transaction(ident))
        return ResumeResult(id=ident, half_offset=off)

    async def end_transaction(self, ident: str, outcome: str, operator: str,
                              reason: str = "") -> EndTransactionResult:
        """Commit or roll back (``outcome`` COMMIT / ROLLBACK) a pending transaction as
        ``operator`` (required) for ``reason``; with a logged-in user (ACL on) the operator is that
        user, whatever ``operator`` says. Raises InvalidRequest: no operator, an unknown outcome,
        TRANSACTION_NOT_FOUND, ILLEGAL_OPERATION (already decided: nothing changed)."""
        check_ident(ident)
        operator = acting_user() or operator
        if outcome not in ("COMMIT", "ROLLBACK"):
            raise bad(f"outcome {outcome!r} is not COMMIT or ROLLBACK")
        if not operator.strip():
            raise bad("an operator name is required")
        st = await self.transaction(ident)
        if st.get("state") != "PENDING":
            raise bad(f"transaction {ident} is not pending (state {st.get('state')})",
                      ResponseCode.ILLEGAL_OPERATION)
        r = await self._on_first(lambda b: b.admin.operator_end(ident, outcome, operator.strip(), reason))
        if r.duplicate:
            raise bad(f"transaction {ident} was already decided: {r.outcome}", ResponseCode.ILLEGAL_OPERATION)
        return EndTransactionResult(id=ident, outcome="COMMIT" if r.outcome == "COMMIT" else "ROLLBACK",
                                    operator=operator.strip(), reason=reason)

    async def audit(self, limit: int = 100) -> AuditPage:
        """Operators' decisions, newest first, through the key index of the op topic."""
        check_page(limit)
        found = [e for es in await self._set.each(lambda b: self._audit_one(b, limit)) for e in es]
        found.sort(key=lambda e: -e.time_ms)
        return AuditPage(items=found[:limit])

    async def _audit_one(self, b: BrokerClients, limit: int) -> list[AuditEntry]:
        seen: dict[int, MessageExt] = {}
        end_ms = 2**63 - 1
        while len(seen) < limit:
            page = await or_empty(b.admin.query_messages(OP_TOPIC, OPERATOR_DECISION_KEY, end_ms=end_ms,
                                                          max_num=limits.QUERY_MESSAGE_MAX_NUM))
            fresh = [m for m in page if m.commit_log_offset not in seen]
            if not fresh:
                break
            seen.update((m.commit_log_offset, m) for m in fresh)
            end_ms = min(m.store_timestamp_ms for m in fresh)
        out = []
        for m in sorted(seen.values(), key=lambda m: -m.commit_log_offset)[:limit]:
            p = m.properties
            out.append(AuditEntry(time_ms=m.store_timestamp_ms, id=p.get(PROPERTY_TXMQ_TX_ID, ""),
                                  topic=p.get(PROPERTY_TXMQ_TX_TOPIC, ""),
                                  outcome=p.get(PROPERTY_TXMQ_OUTCOME, ""),
                                  operator=p.get(PROPERTY_TXMQ_OPERATOR, ""),
                                  reason=p.get(PROPERTY_TXMQ_REASON, "")))
        return out


async def known(call: Awaitable[dict[str, Any]], ident: str) -> dict[str, Any]:
    """``call``'s transaction state; TRANSACTION_NOT_FOUND when the broker knows no such offset."""
    st = await call
    if st.get("state") == "UNKNOWN_OFFSET":
        raise RemoteError.of(ResponseCode.TRANSACTION_NOT_FOUND, f"no transaction {ident}")
    return st


async def or_empty_dict(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """``call``'s answer, or {} when the broker says not found."""
    try:
        return await call
    except RemoteError as exc:
        if exc.response_code in NOT_FOUND:
            return {}
        raise
