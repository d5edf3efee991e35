"""The relay: claims outbox events, sends them to the broker, and marks them PRODUCE_PROCESSED only
after the broker acknowledged them (invariant I8).

One round (:meth:`Relay.run_once`) is three steps with the decisions in :mod:`._policy`:

1. claim up to ``batch_size`` events in a short transaction (lease + fencing token, see ``_claims``);
2. send them, grouped into broker batch requests, outside any transaction;
3. in a second short transaction, mark the acknowledged ones PROCESSED and the failed ones back to
   PRODUCE_INIT with a backoff, each only if the claim's fencing token still matches.

A crash between 2 and 3 leaves the events PROCESSING until the lease expires; another relay then
sends them again (at-least-once: the consumer's inbox absorbs the duplicate). :meth:`Relay.start`
runs ``pool_size`` worker threads doing rounds, like shieldTXC's ``SendTxcMessageScheduler``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol, Self

import sqlalchemy as sa

from txmq import limits
from txmq.outbox._envelope import OutboxRow
from txmq.outbox._metrics import OutboxMetrics, default_metrics
from txmq.outbox._open import open_transport
from txmq.outbox._ops import backlog, purge
from txmq.outbox._policy import RelayConfig, RoundResult, idle_wait_ms
from txmq.outbox._relay_core import FINISH_TRIES, RelayCore, Round, relay_isolation
from txmq.outbox._schema import DEFAULT_TABLES, OutboxTables
from txmq.outbox._tracing import failed, outside_trace, relay_spans, system_of
from txmq.outbox._transport import Transport
from txmq.protocol import Message
from txmq.tracing import Tracing

__all__ = ["Relay", "Sender", "default_relay_id"]

log = logging.getLogger("txmq.outbox.relay")


class Sender(Protocol):
    """What a relay sends with: a :class:`txmq.client.Producer` fits.

    ``send_batch`` returns once the broker stored every message of the batch, and raises
    (``TxmqError`` or anything else) if it cannot say so.
    """

    def send_batch(self, msgs: list[Message]) -> object: ...


def default_relay_id() -> str:
    """``host-pid-random``: a relay's default name in ``lease_owner``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Relay:
    """Ships outbox events of one database to the broker.

    Args:
        engine: the database holding the outbox (any SQLAlchemy engine).
        sender: a :class:`~txmq.outbox.Transport`, a started :class:`txmq.client.Producer`, or a
            transport URL (``txmq://host:port``, ``amqp://user:pass@host:port/``,
            ``nats://host:port``), opened now and closed by :meth:`stop`.
        tables: which outbox (default ``txmq_outbox``).
        config: period, batch size, initial delay, pool size, lease, backoff (:class:`RelayConfig`).
        relay_id: this relay's name in ``lease_owner`` (default host-pid-random).
        metrics: where to count (default: the process-wide :func:`default_metrics`).
        clock: wall clock in seconds (tests pass a fake).
        rng: randomness for backoff jitter (seed it for reproducible tests).
        tracing: True (the global tracer provider), False, or a :class:`~txmq.tracing.Tracing`:
            each row's send is a ``relay <topic>`` span in the row's trace (docs/tracing.md,
            "Outbox and inbox"). A sender it opens from a URL traces with it too.
    """

    def __init__(self, engine: sa.Engine, sender: Sender | str, *, tables: OutboxTables = DEFAULT_TABLES,
                 config: RelayConfig | None = None, relay_id: str | None = None,
                 metrics: OutboxMetrics | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, tracing: Tracing | bool = True) -> None:
        self.engine = engine
        self._owned: Transport | None = None
        self.tracing = Tracing.of(tracing)
        if isinstance(sender, str):  # a transport URL: checked now (ConfigError), closed by stop()
            sender = self._owned = open_transport(sender, tracing=self.tracing)
        self.sender: Sender = sender
        self._system = system_of(sender)
        self.tables = tables
        self.config = config or RelayConfig()
        self.relay_id = relay_id or default_relay_id()
        self.metrics = metrics or default_metrics()
        self._clock = clock
        self._core = RelayCore(tables, self.config, self.relay_id, self.metrics, clock,
                               rng or random.Random())
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next_stats_ms = 0
        self._next_purge_ms = 0
        self._label = tables.outbox.name

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    @contextlib.contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as conn:
            level = relay_isolation(conn.dialect.name)
            if level:  # no gap locks that would block put_message
                conn.execution_options(isolation_level=level)
            with conn.begin():
                yield conn

    # -- one round --------------------------------------------------------------------------------
    def run_once(self, worker: int = 0) -> RoundResult:
        """Claim, send and finish one batch. Returns what happened.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (claimed events, if any, are
                retried by whoever claims them after the lease expires).
        """
        with self._begin() as conn:
            rnd = self._core.claim(conn, worker)
        if not rnd.rows:
            return RoundResult()
        for batch, msgs in rnd.batches(self.config):
            with relay_spans(self.tracing, self._system, self._label, batch, msgs,
                             self._now_ms()) as spans:
                try:
                    outside_trace(spans, self.sender.send_batch, msgs)
                except Exception as exc:  # any failure leaves these events unsent: retry them later
                    failed(spans, exc)
                    rnd.send_failed(batch, exc, self.relay_id)
                else:
                    rnd.sent(batch)
        return self._finish_round(rnd)

    def _finish(self, rows: list[OutboxRow], ok: list[OutboxRow],
                failed: list[tuple[OutboxRow, str]]) -> RoundResult:
        return self._finish_round(Round(rows, list(ok), list(failed)))

    def _finish_round(self, rnd: Round) -> RoundResult:
        self._core.plan_backoff(rnd)
        for attempt in range(FINISH_TRIES):
            try:
                with self._begin() as conn:
                    finished = self._core.finish(conn, rnd)
                break
            except sa.exc.OperationalError:  # deadlock, lost connection: try again, then give up
                if attempt == FINISH_TRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        return self._core.account(rnd, finished)

    # -- background workers -----------------------------------------------------------------------
    def start(self) -> None:
        """Start ``pool_size`` worker threads (daemon). Each polls after ``initial_delay_ms``, then
        again at once after a full batch, else after ``period_ms`` or :meth:`wake`."""
        if self._threads:
            raise RuntimeError("relay already started")
        self._stop.clear()
        for i in range(self.config.pool_size):
            t = threading.Thread(target=self._worker, args=(i,), name=f"txmq-relay-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def wake(self) -> None:
        """Poll now (e.g. right after committing a transaction that called ``put_message``)."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the workers after their current round; waits up to ``timeout_s``. Idempotent."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout_s)
        self._threads.clear()
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _worker(self, i: int) -> None:
        if self._stop.wait(self.config.initial_delay_ms / 1000):
            return
        while not self._stop.is_set():
            claimed = 0
            try:
                claimed = self.run_once(i).claimed
                if i == 0:
                    self._housekeeping()
            except Exception:  # the database is down or refused: count, wait, try again
                log.exception("relay %s worker %d: round failed", self.relay_id, i)
                self.metrics.relay_errors.labels(self._label).inc()
            wait = idle_wait_ms(claimed, self.config)
            if wait and not self._stop.is_set():
                self._wake.wait(wait / 1000)
                self._wake.clear()

    def _housekeeping(self) -> None:
        now = self._now_ms()
        if now >= self._next_stats_ms:
            self._next_stats_ms = now + self.config.stats_interval_ms
            self.refresh_gauges(now)
        if self.config.retention_ms is not None and now >= self._next_purge_ms:
            self._next_purge_ms = now + limits.OUTBOX_PURGE_INTERVAL_MS
            r = purge(self.engine, self.tables, older_than_ms=self.config.retention_ms, now_ms=now)
            if r.events or r.inbox:
                log.info("relay %s: purged %d events and %d inbox rows", self.relay_id, r.events, r.inbox)

    def refresh_gauges(self, now_ms: int | None = None) -> None:
        """Update the backlog and oldest-age gauges from the database (one aggregate query)."""
        with self.engine.connect() as conn:
            b = backlog(conn, self.tables, now_ms)
        for status, n in b.by_status.items():
            self.metrics.backlog.labels(self._label, status).set(n)
        self.metrics.oldest_age.labels(self._label).set((b.oldest_age_ms or 0) / 1000)
