"""The inbox's one core, shared by the threaded listeners (:class:`~txmq.outbox.CommitListener`,
:class:`~txmq.outbox.RollbackListener`) and the asyncio ones (:class:`~txmq.outbox.AsyncCommitListener`,
:class:`~txmq.outbox.AsyncRollbackListener`).

It holds every decision (give up before or after the handler, duplicate or constraint violation,
what the ROLLBACK event looks like), the counting and logging, and the SQL steps as plain functions
of a ``sa.Connection`` (an ``AsyncConnection`` runs them through ``run_sync``). A shell only opens
the transaction and calls the handler, with or without ``await``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import sqlalchemy as sa

from txmq.client import ConsumeStatus
from txmq.errors import OutboxError
from txmq.outbox._envelope import InboxEvent, decode_event, user_properties
from txmq.outbox._metrics import OutboxMetrics
from txmq.outbox._policy import ConsumeVerdict, after_handler_failure, before_handler
from txmq.outbox._put import insert_event
from txmq.outbox._schema import EventStatus, OutboxTables, TxType
from txmq.outbox._tracing import APPLY, COMPENSATE, apply_span, outcome, split_context
from txmq.protocol import Message, MessageExt
from txmq.tracing import ROCKETMQ, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Duplicate", "InboxCore", "RejectEvent"]

log = logging.getLogger("txmq.outbox.inbox")


class RejectEvent(Exception):
    """Raise in a :class:`CommitListener` handler when the event can never succeed (a business
    refusal): the rollback is emitted at once instead of after ``max_reconsume_times`` attempts."""


class Duplicate(Exception):
    """The inbox insert hit a unique constraint (a duplicate, or something else: see
    :meth:`InboxCore.duplicate`)."""


class InboxCore:
    """Decisions and SQL of one inbox listener.

    Args:
        tables: inbox (and, for rollbacks, outbox) tables.
        app_id: app id for messages that carry none.
        max_reconsume_times: give up after this many failed deliveries (None: never, the
            compensation side).
        rollback_topic: maps the commit topic to the rollback topic (None: never gives up).
        metrics: where to count; clock: wall clock in seconds.
        on_duplicate, on_rollback: hooks (called outside any transaction; their errors are logged).
        tracing: where the inbox's spans go (``apply <topic>``, or ``compensate <topic>`` on the
            compensation side), and whether a ROLLBACK event carries the current trace context.

    Attributes:
        system: the ``messaging.system`` of the inbox's spans: ``rocketmq``, or the transport's
            (set by ``subscribe``).
    """

    def __init__(self, tables: OutboxTables, *, app_id: str, max_reconsume_times: int | None,
                 rollback_topic: Callable[[str], str] | None, metrics: OutboxMetrics,
                 clock: Callable[[], float], on_duplicate: Callable[[InboxEvent], object] | None,
                 on_rollback: Callable[[], object] | None, tracing: Tracing | bool = True) -> None:
        self.tables, self.app_id, self.max_reconsume_times = tables, app_id, max_reconsume_times
        self.rollback_topic, self.metrics, self.clock = rollback_topic, metrics, clock
        self.on_duplicate, self.on_rollback = on_duplicate, on_rollback
        self.emits_rollback = rollback_topic is not None
        self.label = tables.inbox.name
        self._insert = tables.inbox.insert()  # values as parameters: compiled once, cached
        self.tracing = Tracing.of(tracing)
        self.system = ROCKETMQ
        self._operation = APPLY if self.emits_rollback else COMPENSATE

    def decode(self, msg: MessageExt) -> tuple[InboxEvent, str | None]:
        """The event, and the reason to give up before running the handler (or None)."""
        ev = decode_event(msg, self.app_id)
        if self.emits_rollback and before_handler(ev.reconsume_times, self.max_reconsume_times) \
                is ConsumeVerdict.EMIT_ROLLBACK:
            return ev, f"{ev.reconsume_times} deliveries failed before"
        return ev, None

    def span(self, ev: InboxEvent) -> AbstractContextManager[Span | None]:
        """The span of handling ``ev`` (``apply <topic>`` / ``compensate <topic>``; see
        :func:`txmq.outbox._tracing.apply_span`); the shells run every step of it inside."""
        return apply_span(self.tracing, self.system, self._operation, self.label, ev.topic,
                          ev.message, ev.event_id, ev.biz_key)

    def insert_inbox(self, conn: sa.Connection, ev: InboxEvent, status: EventStatus) -> None:
        """INSERT the inbox row. Raises Duplicate on any integrity error."""
        try:
            conn.execute(self._insert, {
                "app_id": ev.app_id, "biz_key": ev.biz_key, "event_id": ev.event_id,
                "event_type": ev.event_type, "tx_type": ev.tx_type.value, "status": status.value,
                "topic": ev.topic, "msg_id": ev.message.msg_id or ev.event_id,
                "reconsume_times": ev.reconsume_times, "consumed_at_ms": int(self.clock() * 1000)})
        except sa.exc.IntegrityError as exc:  # the unique key (app_id, biz_key, event_id), or not
            raise Duplicate from exc

    def consumed(self, span: Span | None = None) -> ConsumeStatus:
        """The handler's transaction committed."""
        self.metrics.consumed.labels(self.label).inc()
        outcome(span, "applied")
        return ConsumeStatus.CONSUME_SUCCESS

    def failed(self, ev: InboxEvent, exc: Exception, span: Span | None = None) -> str | None:
        """The handler (or the database) failed: count it; the reason to give up now, or None to
        ask for a redelivery."""
        self.metrics.handler_failures.labels(self.label).inc()
        outcome(span, "retry", exc)
        log.warning("%s: handler failed on event %s (biz key %s, delivery %d): %r", self.label,
                    ev.event_id, ev.biz_key, ev.reconsume_times + 1, exc)
        if self.emits_rollback and (isinstance(exc, RejectEvent) or after_handler_failure(
                ev.reconsume_times, self.max_reconsume_times) is ConsumeVerdict.EMIT_ROLLBACK):
            return repr(exc)
        return None

    def status_of(self, conn: sa.Connection, ev: InboxEvent) -> str | None:
        """The committed inbox status of ``ev``, or None if it has no inbox row."""
        i = self.tables.inbox
        return conn.execute(sa.select(i.c.status).where(
            i.c.app_id == ev.app_id, i.c.biz_key == ev.biz_key, i.c.event_id == ev.event_id)).scalar()

    def duplicate(self, ev: InboxEvent, status: str | None,
                  span: Span | None = None) -> ConsumeStatus:
        """After Duplicate, given the inbox row's status read back: a real duplicate is acknowledged;
        a constraint violation without our row is a failure (shieldTXC defect 5)."""
        if status is None:
            self.metrics.handler_failures.labels(self.label).inc()
            log.error("%s: inbox insert of event %s violated a constraint, but no inbox row exists",
                      self.label, ev.event_id)
            outcome(span, "retry", OutboxError("inbox constraint violated without an inbox row"))
            return ConsumeStatus.RECONSUME_LATER
        outcome(span, "duplicate")
        self.metrics.duplicates_skipped.labels(self.label).inc()
        log.debug("%s: event %s already consumed; acknowledged without handling", self.label, ev.event_id)
        _hook(self.on_duplicate, ev, f"{self.label}: on_duplicate hook failed")
        return ConsumeStatus.CONSUME_SUCCESS

    def write_give_up(self, conn: sa.Connection, ev: InboxEvent) -> None:
        """In the caller's transaction: the inbox row CONSUME_MAX_RECONSUMETIMES and the ROLLBACK
        event (PRODUCE_INIT, for this database's relay). The ROLLBACK event carries the current
        trace context (the inbox span's, in the COMMIT event's trace), else the COMMIT event's.
        Raises Duplicate, OutboxError."""
        assert self.rollback_topic is not None
        m = ev.message
        props = user_properties(m.properties)
        fallback = split_context(props) if self.tracing.propagates else None
        rollback = Message(topic=self.rollback_topic(ev.topic), body=ev.payload, tags=m.tags, keys=m.keys,
                           properties=props)
        self.insert_inbox(conn, ev, EventStatus.CONSUME_MAX_RECONSUMETIMES)
        insert_event(conn, self.tables, rollback, event_type=ev.event_type or TxType.ROLLBACK.value,
                     biz_key=ev.biz_key, app_id=ev.app_id, tx_type=TxType.ROLLBACK,
                     now_ms=int(self.clock() * 1000), origin_event_id=ev.event_id,
                     tracing=self.tracing, fallback_context=fallback)

    def give_up_failed(self, ev: InboxEvent, exc: Exception,
                       span: Span | None = None) -> ConsumeStatus:
        """The give-up transaction failed: nothing was acknowledged, retry."""
        log.error("%s: could not record the rollback of event %s: %r", self.label, ev.event_id, exc)
        outcome(span, "retry", exc)
        return ConsumeStatus.RECONSUME_LATER

    def gave_up(self, ev: InboxEvent, reason: str, span: Span | None = None) -> ConsumeStatus:
        """The give-up transaction committed: count, log, tell ``on_rollback``, acknowledge."""
        outcome(span, "rollback")
        self.metrics.rollbacks_emitted.labels(self.label).inc()
        log.warning("%s: gave up on event %s (biz key %s): %s; ROLLBACK event written", self.label,
                    ev.event_id, ev.biz_key, reason)
        _hook(self.on_rollback, None, f"{self.label}: on_rollback hook failed")
        return ConsumeStatus.CONSUME_SUCCESS


def _hook(fn: Callable[..., object] | None, arg: InboxEvent | None, what: str) -> None:
    if fn is None:
        return
    try:
        fn() if arg is None else fn(arg)
    except Exception:  # the transaction is committed; a failing hook must not undo the ack
        log.exception(what)
