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
from txmq.outbox._claims import claim, mark_failed, mark_sent
from txmq.outbox._envelope import OutboxRow, to_message
from txmq.outbox._metrics import OutboxMetrics, default_metrics
from txmq.outbox._ops import backlog, purge
from txmq.outbox._policy import RelayConfig, RoundResult, backoff_ms, idle_wait_ms, plan_batches
from txmq.outbox._schema import DEFAULT_TABLES, OutboxTables
from txmq.protocol import Message

__all__ = ["Relay", "Sender"]

log = logging.getLogger("txmq.outbox.relay")

_FINISH_TRIES = 3


class Sender(Protocol):
    """What a relay sends with: a :class:`txmq.client.Producer` fits.

    ``send_batch`` returns once the broker stored every message of the batch, and raises
    (``TxmqError`` or anything else) if it cannot say so.
    """

    def send_batch(self, msgs: list[Message]) -> object: ...


def _default_relay_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Relay:
    """Ships outbox events of one database to the broker.

    Args:
        engine: the database holding the outbox (any SQLAlchemy engine).
        sender: usually a started :class:`txmq.client.Producer`.
        tables: which outbox (default ``txmq_outbox``).
        config: period, batch size, initial delay, pool size, lease, backoff (:class:`RelayConfig`).
        relay_id: this relay's name in ``lease_owner`` (default host-pid-random).
        metrics: where to count (default: the process-wide :func:`default_metrics`).
        clock: wall clock in seconds (tests pass a fake).
        rng: randomness for backoff jitter (seed it for reproducible tests).
    """

    def __init__(self, engine: sa.Engine, sender: Sender, *, tables: OutboxTables = DEFAULT_TABLES,
                 config: RelayConfig | None = None, relay_id: str | None = None,
                 metrics: OutboxMetrics | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.engine = engine
        self.sender = sender
        self.tables = tables
        self.config = config or RelayConfig()
        self.relay_id = relay_id or _default_relay_id()
        self.metrics = metrics or default_metrics()
        self._clock = clock
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
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
            if conn.dialect.name in ("mysql", "mariadb"):  # no gap locks that would block put_message
                conn.execution_options(isolation_level="READ COMMITTED")
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
            rows = claim(conn, self.tables, f"{self.relay_id}/{worker}", self._now_ms(),
                         self.config.batch_size, self.config.lease_ms)
        if not rows:
            return RoundResult()
        self.metrics.claimed.labels(self._label).inc(len(rows))
        ok, failed = self._send(rows)
        return self._finish(rows, ok, failed)

    def _send(self, rows: list[OutboxRow]) -> tuple[list[OutboxRow], list[tuple[OutboxRow, str]]]:
        ok: list[OutboxRow] = []
        failed: list[tuple[OutboxRow, str]] = []
        for batch in plan_batches(rows, limits.BATCH_MESSAGES_MAX, self.config.send_batch_bytes_max):
            try:
                self.sender.send_batch([to_message(r) for r in batch])
            except Exception as exc:  # any failure leaves these events unsent: retry them later
                log.warning("relay %s: send of %d events to %s failed: %s", self.relay_id, len(batch),
                            batch[0].topic, exc)
                failed.extend((r, f"{type(exc).__name__}: {exc}") for r in batch)
            else:
                ok.extend(batch)
        return ok, failed

    def _finish(self, rows: list[OutboxRow], ok: list[OutboxRow],
                failed: list[tuple[OutboxRow, str]]) -> RoundResult:
        with self._rng_lock:
            due = [(r, backoff_ms(r.attempts, self.config, self._rng), err) for r, err in failed]
        for attempt in range(_FINISH_TRIES):
            now = self._now_ms()
            try:
                with self._begin() as conn:
                    marked = mark_sent(conn, self.tables, ok, now)
                    unsent = sum(mark_failed(conn, self.tables, [(r, now + d)], err, now)
                                 for r, d, err in due)
                break
            except sa.exc.OperationalError:  # deadlock, lost connection: try again, then give up
                if attempt == _FINISH_TRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        stale = len(ok) - marked + len(failed) - unsent
        lbl = self._label
        if stale:
            log.warning("relay %s: %d of %d events had lost their lease before they were finished "
                        "(another relay re-claimed them)", self.relay_id, stale, len(rows))
            self.metrics.stale_finishes.labels(lbl).inc(stale)
        self.metrics.sent.labels(lbl).inc(marked)
        self.metrics.send_failures.labels(lbl).inc(len(failed))
        for r in ok:
            self.metrics.relay_lag.labels(lbl).observe(max(0, now - r.created_at_ms) / 1000)
        return RoundResult(claimed=len(rows), sent=marked, failed=unsent, stale=stale)

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
