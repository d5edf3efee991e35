"""The inbox: listener wrappers that make a consumer's side effect happen once per event (I8).

For every delivered message the wrapper opens ONE database transaction, inserts the inbox row
``(app_id, biz_key, event_id)`` and runs the user's handler on the same connection, then commits.

* A redelivery (relay resend, broker retry, rebalance) hits the inbox's unique key: the database
  raises ``IntegrityError`` on the insert, the transaction is rolled back before the handler runs, and
  the message is acknowledged. Duplicates are recognised by the constraint violation of that one
  statement, confirmed by reading the row back, never by matching error text (shieldTXC defect 5).
* A handler that raises rolls back the inbox row with its own writes and asks for redelivery
  (``RECONSUME_LATER``); nothing is marked consumed that was not (shieldTXC defects 4 and 8).
* :class:`CommitListener` (downstream): when an event has failed ``max_reconsume_times`` times, the
  inbox row ``CONSUME_MAX_RECONSUMETIMES`` and a ``ROLLBACK`` event (``PRODUCE_INIT``, for this
  database's relay to ship to the rollback topic) are written in one transaction, and only then is
  the message acknowledged (shieldTXC defect 7; protean #1266).
* :class:`RollbackListener` (upstream): runs the compensation with the same idempotency; a
  compensation that keeps failing is retried by the broker and lands in ``%DLQ%<group>`` after 16
  attempts, where ``txmq dlq`` shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from txmq import limits
from txmq.client import ConsumeStatus, MessageExt, PushConsumer
from txmq.errors import ConfigError, OutboxError
from txmq.outbox._envelope import InboxEvent, decode_event, default_rollback_topic, user_properties
from txmq.outbox._metrics import OutboxMetrics, default_metrics
from txmq.outbox._policy import ConsumeVerdict, after_handler_failure, before_handler
from txmq.outbox._put import insert_event
from txmq.outbox._schema import DEFAULT_TABLES, EventStatus, OutboxTables, TxType
from txmq.protocol import Message

__all__ = ["CommitListener", "Handler", "RejectEvent", "RollbackListener"]

log = logging.getLogger("txmq.outbox.inbox")

Handler = Callable[[sa.Connection, InboxEvent], object]
"""``handler(conn, event)``: apply the event's side effect on ``conn`` (inside the inbox transaction;
do not commit). Raise to fail. The return value is ignored."""


class RejectEvent(Exception):
    """Raise in a :class:`CommitListener` handler when the event can never succeed (a business
    refusal): the rollback is emitted at once instead of after ``max_reconsume_times`` attempts."""


class _Duplicate(Exception):
    pass


class _InboxListener:
    _emits_rollback = False

    def __init__(self, engine: sa.Engine, handler: Handler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES, max_reconsume_times: int | None,
                 metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.handler = handler
        self.app_id = app_id
        self.tables = tables
        self.max_reconsume_times = max_reconsume_times
        self.metrics = metrics or default_metrics()
        self.on_duplicate = on_duplicate
        self._clock = clock
        self._label = tables.inbox.name
        self._insert = tables.inbox.insert()  # values as parameters: compiled once, cached

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        """The PushConsumer listener: CONSUME_SUCCESS when every message is handled (or was before)."""
        status = ConsumeStatus.CONSUME_SUCCESS
        for m in msgs:
            if self.consume(m) is ConsumeStatus.RECONSUME_LATER:
                status = ConsumeStatus.RECONSUME_LATER
        return status

    def consume(self, msg: MessageExt) -> ConsumeStatus:
        """Handle one delivered message; see the module docstring."""
        ev = decode_event(msg, self.app_id)
        if self._emits_rollback and before_handler(ev.reconsume_times, self.max_reconsume_times) \
                is ConsumeVerdict.EMIT_ROLLBACK:
            return self._give_up(ev, f"{ev.reconsume_times} deliveries failed before")
        try:
            with self.engine.begin() as conn:
                self._insert_inbox(conn, ev, EventStatus.CONSUME_PROCESSED)
                self.handler(conn, ev)
        except _Duplicate:
            return self._duplicate(ev)
        except Exception as exc:  # the handler (or the database) failed: nothing was committed
            self.metrics.handler_failures.labels(self._label).inc()
            log.warning("%s: handler failed on event %s (biz key %s, delivery %d): %r", self._label,
                        ev.event_id, ev.biz_key, ev.reconsume_times + 1, exc)
            if self._emits_rollback and (isinstance(exc, RejectEvent) or after_handler_failure(
                    ev.reconsume_times, self.max_reconsume_times) is ConsumeVerdict.EMIT_ROLLBACK):
                return self._give_up(ev, repr(exc))
            return ConsumeStatus.RECONSUME_LATER
        self.metrics.consumed.labels(self._label).inc()
        return ConsumeStatus.CONSUME_SUCCESS

    def _insert_inbox(self, conn: sa.Connection, ev: InboxEvent, status: EventStatus) -> None:
        try:
            conn.execute(self._insert, {
                "app_id": ev.app_id, "biz_key": ev.biz_key, "event_id": ev.event_id,
                "event_type": ev.event_type, "tx_type": ev.tx_type.value, "status": status.value,
                "topic": ev.topic, "msg_id": ev.message.msg_id or ev.event_id,
                "reconsume_times": ev.reconsume_times, "consumed_at_ms": int(self._clock() * 1000)})
        except sa.exc.IntegrityError as exc:  # the unique key (app_id, biz_key, event_id), or not
            raise _Duplicate from exc

    def inbox_status(self, ev: InboxEvent) -> str | None:
        """The committed inbox status of ``ev``, or None if it has no inbox row."""
        i = self.tables.inbox
        with self.engine.connect() as conn:
            return conn.execute(sa.select(i.c.status).where(
                i.c.app_id == ev.app_id, i.c.biz_key == ev.biz_key, i.c.event_id == ev.event_id)).scalar()

    def _duplicate(self, ev: InboxEvent) -> ConsumeStatus:
        if self.inbox_status(ev) is None:  # an IntegrityError that was not our unique key
            self.metrics.handler_failures.labels(self._label).inc()
            log.error("%s: inbox insert of event %s violated a constraint, but no inbox row exists",
                      self._label, ev.event_id)
            return ConsumeStatus.RECONSUME_LATER
        self.metrics.duplicates_skipped.labels(self._label).inc()
        log.debug("%s: event %s already consumed; acknowledged without handling", self._label, ev.event_id)
        if self.on_duplicate is not None:
            try:
                self.on_duplicate(ev)
            except Exception:
                log.exception("%s: on_duplicate hook failed", self._label)
        return ConsumeStatus.CONSUME_SUCCESS

    def _give_up(self, ev: InboxEvent, reason: str) -> ConsumeStatus:
        return ConsumeStatus.RECONSUME_LATER

    def _consumer(self, group: str, endpoints: str, topic: str, max_reconsume_times: int,
                  kw: dict[str, Any]) -> PushConsumer:
        c = PushConsumer(group, endpoints, self, max_reconsume_times=max_reconsume_times, **kw)
        c.subscribe(topic)
        return c


class CommitListener(_InboxListener):
    """Downstream: consume COMMIT events once, or give up and emit a ROLLBACK event.

    Args:
        engine: the downstream service's database (holds its inbox and its own outbox).
        handler: ``handler(conn, event)``, the side effect, run in the inbox transaction.
        app_id: app id for messages that carry none (not sent by a relay).
        tables: the inbox and outbox tables (default ``txmq_inbox`` / ``txmq_outbox``).
        max_reconsume_times: attempts before giving up (default 10, the shieldTXC blog's value).
        rollback_topic: maps the commit topic to the rollback topic (default ``<topic>-rollback``).
        metrics: where to count (default :func:`default_metrics`).
        on_duplicate: called (outside any transaction) for each duplicate acknowledged.
        on_rollback: called after a ROLLBACK event committed (e.g. ``relay.wake``).
        clock: wall clock in seconds.

    The consumer's own ``max_reconsume_times`` (DLQ) must exceed this one, or the broker would move
    the event to the DLQ before the rollback is emitted; :meth:`consumer` checks it.
    """

    _emits_rollback = True

    def __init__(self, engine: sa.Engine, handler: Handler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES,
                 max_reconsume_times: int = limits.OUTBOX_MAX_COMMIT_RECONSUME_TIMES,
                 rollback_topic: Callable[[str], str] = default_rollback_topic,
                 metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 on_rollback: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if max_reconsume_times < 1:
            raise ConfigError(f"max_reconsume_times must be at least 1, got {max_reconsume_times}")
        super().__init__(engine, handler, app_id=app_id, tables=tables,
                         max_reconsume_times=max_reconsume_times, metrics=metrics,
                         on_duplicate=on_duplicate, clock=clock)
        self.rollback_topic = rollback_topic
        self.on_rollback = on_rollback

    def _give_up(self, ev: InboxEvent, reason: str) -> ConsumeStatus:
        m = ev.message
        rollback = Message(topic=self.rollback_topic(ev.topic), body=ev.payload, tags=m.tags, keys=m.keys,
                           properties=user_properties(m.properties))
        try:
            with self.engine.begin() as conn:
                self._insert_inbox(conn, ev, EventStatus.CONSUME_MAX_RECONSUMETIMES)
                insert_event(conn, self.tables, rollback, event_type=ev.event_type or TxType.ROLLBACK.value,
                             biz_key=ev.biz_key, app_id=ev.app_id, tx_type=TxType.ROLLBACK,
                             now_ms=int(self._clock() * 1000), origin_event_id=ev.event_id)
        except _Duplicate:
            return self._duplicate(ev)
        except (sa.exc.SQLAlchemyError, OutboxError) as exc:  # retry: nothing was acknowledged
            log.error("%s: could not record the rollback of event %s: %r", self._label, ev.event_id, exc)
            return ConsumeStatus.RECONSUME_LATER
        self.metrics.rollbacks_emitted.labels(self._label).inc()
        log.warning("%s: gave up on event %s (biz key %s): %s; ROLLBACK event written", self._label,
                    ev.event_id, ev.biz_key, reason)
        if self.on_rollback is not None:
            try:
                self.on_rollback()
            except Exception:  # the rollback is committed; a failing hook must not undo the ack
                log.exception("%s: on_rollback hook failed", self._label)
        return ConsumeStatus.CONSUME_SUCCESS

    def consumer(self, group: str, endpoints: str, topic: str, *,
                 max_reconsume_times: int = limits.MAX_RECONSUME_TIMES, **kw: Any) -> PushConsumer:
        """A (not yet started) :class:`~txmq.client.PushConsumer` of ``topic`` with this listener.

        Raises:
            ConfigError: ``max_reconsume_times`` (the DLQ threshold) does not exceed the rollback
                threshold.
        """
        assert self.max_reconsume_times is not None
        if max_reconsume_times <= self.max_reconsume_times:
            raise ConfigError(f"consumer max_reconsume_times {max_reconsume_times} must exceed the "
                              f"rollback threshold {self.max_reconsume_times}")
        return self._consumer(group, endpoints, topic, max_reconsume_times, kw)


class RollbackListener(_InboxListener):
    """Upstream: run the compensation for ROLLBACK events once each.

    Same arguments as :class:`CommitListener` without the rollback ones. A compensation that raises
    is retried by the broker; after the consumer's ``max_reconsume_times`` (16) the event goes to
    ``%DLQ%<group>`` for a person to handle.
    """

    def __init__(self, engine: sa.Engine, handler: Handler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES, metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(engine, handler, app_id=app_id, tables=tables, max_reconsume_times=None,
                         metrics=metrics, on_duplicate=on_duplicate, clock=clock)

    def consumer(self, group: str, endpoints: str, topic: str, *,
                 max_reconsume_times: int = limits.OUTBOX_COMPENSATION_MAX_RECONSUME_TIMES,
                 **kw: Any) -> PushConsumer:
        """A (not yet started) :class:`~txmq.client.PushConsumer` of the rollback ``topic``."""
        return self._consumer(group, endpoints, topic, max_reconsume_times, kw)
