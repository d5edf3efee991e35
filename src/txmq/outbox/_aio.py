"""The asyncio relay and listeners, for FastAPI and other asyncio services (SQLAlchemy
``AsyncEngine``; aiosqlite, psycopg async, asyncmy).

They are shells over the same cores as the threaded ones: :class:`~txmq.outbox._relay_core.RelayCore`
(claim, batch plan, finish, accounting) and :class:`~txmq.outbox._inbox_core.InboxCore` (every inbox
decision and its SQL). The SQL steps run through ``AsyncConnection.run_sync``; the sends are awaited
on an :class:`~txmq.outbox.AsyncTransport` (or anything with ``async send_batch(msgs)``); the
handlers are coroutine functions ``await handler(conn, event)`` on the inbox transaction's
``AsyncConnection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, Self

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from txmq import limits
from txmq.client import ConsumeStatus, MessageExt
from txmq.errors import ConfigError, OutboxError
from txmq.outbox._aio_transport import AsyncSubscription, AsyncTransport, open_async_transport
from txmq.outbox._envelope import InboxEvent, default_rollback_topic
from txmq.outbox._inbox_core import Duplicate, InboxCore
from txmq.outbox._metrics import OutboxMetrics, default_metrics
from txmq.outbox._ops import backlog
from txmq.outbox._policy import RelayConfig, RoundResult, idle_wait_ms
from txmq.outbox._relay import default_relay_id
from txmq.outbox._relay_core import FINISH_TRIES, RelayCore, Round, relay_isolation
from txmq.outbox._schema import DEFAULT_TABLES, EventStatus, OutboxTables
from txmq.outbox._tracing import SYSTEMS, failed, outside_trace, relay_spans, system_of
from txmq.protocol import Message
from txmq.tracing import ROCKETMQ, Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["AsyncCommitListener", "AsyncHandler", "AsyncRelay", "AsyncRollbackListener", "AsyncSender"]

log = logging.getLogger("txmq.outbox.relay")

AsyncHandler = Callable[[AsyncConnection, InboxEvent], Awaitable[object]]
"""``await handler(conn, event)``: the side effect on ``conn``, inside the inbox transaction (do not
commit). Raise to fail."""


class AsyncSender(Protocol):
    """What an :class:`AsyncRelay` sends with: an :class:`~txmq.outbox.AsyncTransport` or a started
    :class:`~txmq.client.AsyncProducer`. Returns once the broker stored every message; raises if not."""

    async def send_batch(self, msgs: list[Message]) -> object: ...


class AsyncRelay:
    """:class:`~txmq.outbox.Relay` for asyncio: the same rounds, claims, fencing and backoff.

    Args:
        engine: an ``AsyncEngine`` on the outbox's database.
        sender: an :class:`AsyncSender`, or a transport URL (opened now, closed by :meth:`stop`).
        tables, config, relay_id, metrics, clock, rng, tracing: as :class:`~txmq.outbox.Relay`'s.

    Raises:
        ConfigError: a bad URL, or ``config.retention_ms`` (purge with :func:`txmq.outbox.purge`
            on a sync engine, or ``txmq outbox purge``).
    """

    def __init__(self, engine: AsyncEngine, sender: AsyncSender | str, *,
                 tables: OutboxTables = DEFAULT_TABLES, config: RelayConfig | None = None,
                 relay_id: str | None = None, metrics: OutboxMetrics | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 tracing: Tracing | bool = True) -> None:
        self.engine, self.tables = engine, tables
        self.tracing = Tracing.of(tracing)
        self.config = config or RelayConfig()
        if self.config.retention_ms is not None:
            raise ConfigError("AsyncRelay does not purge: leave retention_ms unset and run outbox.purge")
        self._owned: AsyncTransport | None = None
        if isinstance(sender, str):
            sender = self._owned = open_async_transport(sender, tracing=self.tracing)
        self.sender: AsyncSender = sender
        self._system = system_of(sender)
        self.relay_id = relay_id or default_relay_id()
        self.metrics = metrics or default_metrics()
        self._core = RelayCore(tables, self.config, self.relay_id, self.metrics, clock,
                               rng or random.Random())
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._next_stats_ms = 0

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            level = relay_isolation(conn.dialect.name)
            if level:
                await conn.execution_options(isolation_level=level)
            async with conn.begin():
                yield conn

    async def run_once(self, worker: int = 0) -> RoundResult:
        """Claim, send and finish one batch (see :meth:`Relay.run_once`). Raises SQLAlchemyError."""
        async with self._begin() as conn:
            rnd: Round = await conn.run_sync(self._core.claim, worker)
        if not rnd.rows:
            return RoundResult()
        for batch, msgs in rnd.batches(self.config):
            with relay_spans(self.tracing, self._system, self._core.label, batch, msgs,
                             self._core.now_ms()) as spans:
                try:
                    sending = self.sender.send_batch(msgs)
                    await (outside_trace(spans, asyncio.ensure_future, sending) if len(spans) > 1
                           else sending)
                except Exception as exc:  # any failure leaves these events unsent: retry them later
                    failed(spans, exc)
                    rnd.send_failed(batch, exc, self.relay_id)
                else:
                    rnd.sent(batch)
        self._core.plan_backoff(rnd)
        for attempt in range(FINISH_TRIES):
            try:
                async with self._begin() as conn:
                    finished = await conn.run_sync(self._core.finish, rnd)
                break
            except sa.exc.OperationalError:  # deadlock, lost connection: try again, then give up
                if attempt == FINISH_TRIES - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        return self._core.account(rnd, finished)

    def start(self) -> None:
        """Start ``pool_size`` worker tasks on the running loop."""
        if self._tasks:
            raise RuntimeError("relay already started")
        self._stop.clear()
        self._tasks = [asyncio.create_task(self._worker(i), name=f"txmq-relay-{i}")
                       for i in range(self.config.pool_size)]

    def wake(self) -> None:
        """Poll now (e.g. right after committing a transaction that called ``put_message``)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop the workers after their current round, and close an owned transport. Idempotent."""
        self._stop.set()
        self._wake.set()
        tasks, self._tasks = self._tasks, []
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._owned is not None:
            await self._owned.close()

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _worker(self, i: int) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.config.initial_delay_ms / 1000)
        while not self._stop.is_set():
            claimed = 0
            try:
                claimed = (await self.run_once(i)).claimed
                if i == 0:
                    await self._gauges()
            except Exception:  # the database is down or refused: count, wait, try again
                log.exception("relay %s worker %d: round failed", self.relay_id, i)
                self.metrics.relay_errors.labels(self._core.label).inc()
            wait = idle_wait_ms(claimed, self.config)
            if wait and not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait / 1000)
                self._wake.clear()

    async def _gauges(self) -> None:
        now = self._core.now_ms()
        if now < self._next_stats_ms:
            return
        self._next_stats_ms = now + self.config.stats_interval_ms
        async with self.engine.connect() as conn:
            b = await conn.run_sync(backlog, self.tables, now)
        for status, n in b.by_status.items():
            self.metrics.backlog.labels(self._core.label, status).set(n)
        self.metrics.oldest_age.labels(self._core.label).set((b.oldest_age_ms or 0) / 1000)


class _AsyncInboxListener:
    def __init__(self, engine: AsyncEngine, handler: AsyncHandler, *, app_id: str, tables: OutboxTables,
                 max_reconsume_times: int | None, metrics: OutboxMetrics | None,
                 on_duplicate: Callable[[InboxEvent], object] | None, clock: Callable[[], float],
                 rollback_topic: Callable[[str], str] | None = None,
                 on_rollback: Callable[[], object] | None = None,
                 tracing: Tracing | bool = True) -> None:
        self.engine, self.handler, self.tables = engine, handler, tables
        self.max_reconsume_times = max_reconsume_times
        self.metrics = metrics or default_metrics()
        self.core = InboxCore(tables, app_id=app_id, max_reconsume_times=max_reconsume_times,
                              rollback_topic=rollback_topic, metrics=self.metrics, clock=clock,
                              on_duplicate=on_duplicate, on_rollback=on_rollback, tracing=tracing)

    async def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        """The consumer's listener: CONSUME_SUCCESS when every message is handled (or was before)."""
        status = ConsumeStatus.CONSUME_SUCCESS
        for m in msgs:
            if await self.consume(m) is ConsumeStatus.RECONSUME_LATER:
                status = ConsumeStatus.RECONSUME_LATER
        return status

    async def consume(self, msg: MessageExt) -> ConsumeStatus:
        """Handle one delivered message (the threaded listener's flow, awaiting the handler)."""
        core = self.core
        ev, give_up = core.decode(msg)
        with core.span(ev) as span:
            if give_up is not None:
                return await self._give_up(ev, give_up, span)
            try:
                async with self.engine.begin() as conn:
                    await conn.run_sync(core.insert_inbox, ev, EventStatus.CONSUME_PROCESSED)
                    await self.handler(conn, ev)
            except Duplicate:
                return await self._duplicate(ev, span)
            except Exception as exc:  # the handler (or the database) failed: nothing was committed
                give_up = core.failed(ev, exc, span)
                return ConsumeStatus.RECONSUME_LATER if give_up is None else \
                    await self._give_up(ev, give_up, span)
            return core.consumed(span)

    async def inbox_status(self, ev: InboxEvent) -> str | None:
        """The committed inbox status of ``ev``, or None if it has no inbox row."""
        async with self.engine.connect() as conn:
            return await conn.run_sync(self.core.status_of, ev)

    async def _duplicate(self, ev: InboxEvent, span: Span | None) -> ConsumeStatus:
        return self.core.duplicate(ev, await self.inbox_status(ev), span)

    async def _give_up(self, ev: InboxEvent, reason: str, span: Span | None) -> ConsumeStatus:
        try:
            async with self.engine.begin() as conn:
                await conn.run_sync(self.core.write_give_up, ev)
        except Duplicate:
            return await self._duplicate(ev, span)
        except (sa.exc.SQLAlchemyError, OutboxError) as exc:  # retry: nothing was acknowledged
            return self.core.give_up_failed(ev, exc, span)
        return self.core.gave_up(ev, reason, span)

    def _subscribe(self, transport: AsyncTransport, group: str, topic: str,
                   max_reconsume_times: int) -> AsyncSubscription:
        self.core.system = SYSTEMS.get(transport.kind, ROCKETMQ)
        return transport.subscribe(group, topic, self, max_reconsume_times=max_reconsume_times)


class AsyncCommitListener(_AsyncInboxListener):
    """:class:`~txmq.outbox.CommitListener` for asyncio: ``engine`` is an ``AsyncEngine``, the
    handler ``async def handler(conn: AsyncConnection, event)``; the other arguments (``tracing``
    too) are the same. ``on_duplicate`` and ``on_rollback`` are plain callables (e.g.
    ``relay.wake``)."""

    def __init__(self, engine: AsyncEngine, handler: AsyncHandler, *, app_id: str = "",
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
                         max_reconsume_times=max_reconsume_times, metrics=metrics, on_duplicate=on_duplicate,
                         clock=clock, rollback_topic=rollback_topic, on_rollback=on_rollback,
                         tracing=tracing)

    def subscribe(self, transport: AsyncTransport, group: str, topic: str, *,
                  max_reconsume_times: int = limits.MAX_RECONSUME_TIMES) -> AsyncSubscription:
        """A (not started) consumer of ``topic``; see :meth:`CommitListener.subscribe`.

        Raises:
            ConfigError: ``max_reconsume_times`` does not exceed the rollback threshold.
        """
        assert self.max_reconsume_times is not None
        if max_reconsume_times <= self.max_reconsume_times:
            raise ConfigError(f"consumer max_reconsume_times {max_reconsume_times} must exceed the "
                              f"rollback threshold {self.max_reconsume_times}")
        return self._subscribe(transport, group, topic, max_reconsume_times)


class AsyncRollbackListener(_AsyncInboxListener):
    """:class:`~txmq.outbox.RollbackListener` for asyncio (an ``AsyncEngine``, a coroutine
    compensation)."""

    def __init__(self, engine: AsyncEngine, handler: AsyncHandler, *, app_id: str = "",
                 tables: OutboxTables = DEFAULT_TABLES, metrics: OutboxMetrics | None = None,
                 on_duplicate: Callable[[InboxEvent], object] | None = None,
                 clock: Callable[[], float] = time.time, tracing: Tracing | bool = True) -> None:
        super().__init__(engine, handler, app_id=app_id, tables=tables, max_reconsume_times=None,
                         metrics=metrics, on_duplicate=on_duplicate, clock=clock, tracing=tracing)

    def subscribe(self, transport: AsyncTransport, group: str, topic: str, *,
                  max_reconsume_times: int = limits.OUTBOX_COMPENSATION_MAX_RECONSUME_TIMES
                  ) -> AsyncSubscription:
        """A (not started) consumer of the rollback ``topic``; after ``max_reconsume_times + 1``
        failed compensations the event goes to the group's DLQ."""
        return self._subscribe(transport, group, topic, max_reconsume_times)
