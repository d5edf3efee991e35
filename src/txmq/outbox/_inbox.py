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

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from txmq import limits
from txmq.client import ConsumeStatus, MessageExt, PushConsumer
from txmq.errors import ConfigError, OutboxError
from txmq.outbox._envelope import InboxEvent, default_rollback_topic
from txmq.outbox._inbox_core import Duplicate, InboxCore, RejectEvent
from txmq.outbox._metrics import OutboxMetrics, default_metrics
from txmq.outbox._schema import DEFAULT_TABLES, EventStatus, OutboxTables
from txmq.outbox._tracing import SYSTEMS
from txmq.outbox._transport import Subscription, Transport
from txmq.tracing import ROCKETMQ, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["CommitListener", "Handler", "RejectEvent", "RollbackListener"]

Handler = Callable[[sa.Connection, InboxEvent], object]
"""``handler(conn, event)``: apply the event's side effect on ``conn`` (inside the inbox transaction;
do not commit). Raise to fail. The return value is ignored."""


class _InboxListener:
    """The threaded shell over :class:`~txmq.outbox._inbox_core.InboxCore` (the asyncio shell is
    ``_aio._AsyncInboxListener``): opens the transactions and calls the handler."""

    def __init__(self, engine: sa.Engine, handler: Handler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES, max_reconsume_times: int | None,
                 metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 clock: Callable[[], float] = time.time,
                 rollback_topic: Callable[[str], str] | None = None,
                 on_rollback: Callable[[], object] | None = None,
                 tracing: Tracing | bool = True) -> None:
        self.engine = engine
        self.handler = handler
        self.app_id = app_id
        self.tables = tables
        self.max_reconsume_times = max_reconsume_times
        self.metrics = metrics or default_metrics()
        self.core = InboxCore(tables, app_id=app_id, max_reconsume_times=max_reconsume_times,
                              rollback_topic=rollback_topic, metrics=self.metrics, clock=clock,
                              on_duplicate=on_duplicate, on_rollback=on_rollback, tracing=tracing)

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        """The PushConsumer listener: CONSUME_SUCCESS when every message is handled (or was before)."""
        status = ConsumeStatus.CONSUME_SUCCESS
        for m in msgs:
            if self.consume(m) is ConsumeStatus.RECONSUME_LATER:
                status = ConsumeStatus.RECONSUME_LATER
        return status

    def consume(self, msg: MessageExt) -> ConsumeStatus:
        """Handle one delivered message; see the module docstring."""
        core = self.core
        ev, give_up = core.decode(msg)
        with core.span(ev) as span:
            if give_up is not None:
                return self._give_up(ev, give_up, span)
            try:
                with self.engine.begin() as conn:
                    core.insert_inbox(conn, ev, EventStatus.CONSUME_PROCESSED)
                    self.handler(conn, ev)
            except Duplicate:
                return self._duplicate(ev, span)
            except Exception as exc:  # the handler (or the database) failed: nothing was committed
                give_up = core.failed(ev, exc, span)
                return ConsumeStatus.RECONSUME_LATER if give_up is None else \
                    self._give_up(ev, give_up, span)
            return core.consumed(span)

    def inbox_status(self, ev: InboxEvent) -> str | None:
        """The committed inbox status of ``ev``, or None if it has no inbox row."""
        with self.engine.connect() as conn:
            return self.core.status_of(conn, ev)

    def _duplicate(self, ev: InboxEvent, span: Span | None) -> ConsumeStatus:
        return self.core.duplicate(ev, self.inbox_status(ev), span)

    def _give_up(self, ev: InboxEvent, reason: str, span: Span | None) -> ConsumeStatus:
        try:
            with self.engine.begin() as conn:
                self.core.write_give_up(conn, ev)
        except Duplicate:
            return self._duplicate(ev, span)
        except (sa.exc.SQLAlchemyError, OutboxError) as exc:  # retry: nothing was acknowledged
            return self.core.give_up_failed(ev, exc, span)
        return self.core.gave_up(ev, reason, span)

    def _subscribe(self, transport: Transport, group: str, topic: str,
                   max_reconsume_times: int) -> Subscription:
        self.core.system = SYSTEMS.get(transport.kind, ROCKETMQ)
        return transport.subscribe(group, topic, self, max_reconsume_times=max_reconsume_times)

    def _consumer(self, group: str, endpoints: str, topic: str, max_reconsume_times: int,
                  kw: dict[str, Any]) -> PushConsumer:
        kw.setdefault("tracing", self.core.tracing)
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
        tracing: True (the global tracer provider), False, or a :class:`~txmq.tracing.Tracing`:
            each event is handled in an ``apply <topic>`` span (a child of the consumer's process
            span, else of the event's creation context), and a ROLLBACK event carries its
            context (docs/tracing.md, "Outbox and inbox"). :meth:`consumer` passes it on.

    The consumer's own ``max_reconsume_times`` (DLQ) must exceed this one, or the broker would move
    the event to the DLQ before the rollback is emitted; :meth:`consumer` checks it.
    """


    def __init__(self, engine: sa.Engine, handler: Handler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES,
                 max_reconsume_times: int = limits.OUTBOX_MAX_COMMIT_RECONSUME_TIMES,
                 rollback_topic: Callable[[str], str] = default_rollback_topic,
                 metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 on_rollback: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.time, tracing: Tracing | bool = True) -> None:
        if max_reconsume_times < 1:
            raise ConfigError(f"max_reconsume_times must be at least 1, got {max_reconsume_times}")
        super().__init__(engine, handler, app_id=app_id, tables=tables,
                         max_reconsume_times=max_reconsume_times, metrics=metrics,
                         on_duplicate=on_duplicate, clock=clock, rollback_topic=rollback_topic,
                         on_rollback=on_rollback, tracing=tracing)
        self.rollback_topic = rollback_topic
        self.on_rollback = on_rollback

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

    def subscribe(self, transport: Transport, group: str, topic: str, *,
                  max_reconsume_times: int = limits.MAX_RECONSUME_TIMES) -> Subscription:
        """A (not yet started) consumer of ``topic`` with this listener on any transport (txmq,
        RabbitMQ, NATS); past ``max_reconsume_times`` retries a message goes to the group's DLQ.

        Raises:
            ConfigError: ``max_reconsume_times`` does not exceed the rollback threshold, or a name
                the broker cannot carry.
        """
        assert self.max_reconsume_times is not None
        if max_reconsume_times <= self.max_reconsume_times:
            raise ConfigError(f"consumer max_reconsume_times {max_reconsume_times} must exceed the "
                              f"rollback threshold {self.max_reconsume_times}")
        return self._subscribe(transport, group, topic, max_reconsume_times)


class RollbackListener(_InboxListener):
    """Upstream: run the compensation for ROLLBACK events once each.

    Same arguments as :class:`CommitListener` without the rollback ones. A compensation that raises
    is retried by the broker; after the consumer's ``max_reconsume_times`` (16) the event goes to
    ``%DLQ%<group>`` for a person to handle. Each event is handled in a ``compensate <topic>``
    span.
    """

    def __init__(self, engine: sa.Engine, handler: Handler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES, metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 clock: Callable[[], float] = time.time, tracing: Tracing | bool = True) -> None:
        super().__init__(engine, handler, app_id=app_id, tables=tables, max_reconsume_times=None,
                         metrics=metrics, on_duplicate=on_duplicate, clock=clock, tracing=tracing)

    def consumer(self, group: str, endpoints: str, topic: str, *,
                 max_reconsume_times: int = limits.OUTBOX_COMPENSATION_MAX_RECONSUME_TIMES,
                 **kw: Any) -> PushConsumer:
        """A (not yet started) :class:`~txmq.client.PushConsumer` of the rollback ``topic``."""
        return self._consumer(group, endpoints, topic, max_reconsume_times, kw)

    def subscribe(self, transport: Transport, group: str, topic: str, *,
                  max_reconsume_times: int = limits.OUTBOX_COMPENSATION_MAX_RECONSUME_TIMES) -> Subscription:
        """A (not yet started) consumer of the rollback ``topic`` on any transport; a compensation
        failing ``max_reconsume_times + 1`` times lands in the group's DLQ."""
        return self._subscribe(transport, group, topic, max_reconsume_times)
