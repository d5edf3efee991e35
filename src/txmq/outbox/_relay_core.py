"""The relay's one core, shared by the threaded :class:`~txmq.outbox.Relay` and the asyncio
:class:`~txmq.outbox.AsyncRelay`: the two database steps of a round (claim; finish) as plain
functions of a ``sa.Connection`` (an ``AsyncConnection`` runs them through ``run_sync``), the batch
plan and the bookkeeping of a round. The shells only add how they wait: threads and
``sender.send_batch(...)`` or tasks and ``await sender.send_batch(...)``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import sqlalchemy as sa

from txmq import limits
from txmq.outbox._claims import claim, mark_failed, mark_sent
from txmq.outbox._envelope import OutboxRow, to_message
from txmq.outbox._metrics import OutboxMetrics
from txmq.outbox._policy import RelayConfig, RoundResult, backoff_ms, plan_batches
from txmq.outbox._schema import OutboxTables
from txmq.protocol import Message

__all__ = ["FINISH_TRIES", "RelayCore", "Round", "relay_isolation"]

log = logging.getLogger("txmq.outbox.relay")

FINISH_TRIES = 3
"""Attempts of the finishing transaction on a deadlock or a lost connection."""


def relay_isolation(dialect_name: str) -> str | None:
    """The isolation level of relay transactions: READ COMMITTED on MariaDB/MySQL (no gap locks that
    would block ``put_message``), else the engine's default (None)."""
    return "READ COMMITTED" if dialect_name in ("mysql", "mariadb") else None


@dataclass
class Round:
    """One round's claimed rows and what their sends did."""

    rows: list[OutboxRow]
    ok: list[OutboxRow] = field(default_factory=list)
    failed: list[tuple[OutboxRow, str]] = field(default_factory=list)
    due: list[tuple[OutboxRow, int, str]] = field(default_factory=list)

    def batches(self, config: RelayConfig) -> Iterator[tuple[list[OutboxRow], list[Message]]]:
        """The broker batch requests: ``(rows, messages)`` per batch (one topic each)."""
        for batch in plan_batches(self.rows, limits.BATCH_MESSAGES_MAX, config.send_batch_bytes_max):
            yield batch, [to_message(r) for r in batch]

    def sent(self, batch: list[OutboxRow]) -> None:
        """The broker acknowledged ``batch``."""
        self.ok.extend(batch)

    def send_failed(self, batch: list[OutboxRow], exc: BaseException, relay_id: str) -> None:
        """``batch`` was not acknowledged: its rows go back with a backoff."""
        log.warning("relay %s: send of %d events to %s failed: %s", relay_id, len(batch), batch[0].topic, exc)
        self.failed.extend((r, f"{type(exc).__name__}: {exc}") for r in batch)


class RelayCore:
    """Claim, finish and account for rounds of one relay (thread-safe; no I/O of its own).

    Args:
        tables, config, relay_id, metrics: as the relay's.
        clock: wall clock in seconds; rng: backoff jitter.
    """

    def __init__(self, tables: OutboxTables, config: RelayConfig, relay_id: str, metrics: OutboxMetrics,
                 clock: Callable[[], float], rng: random.Random) -> None:
        self.tables, self.config, self.relay_id, self.metrics = tables, config, relay_id, metrics
        self.clock, self._rng = clock, rng
        self._rng_lock = threading.Lock()
        self.label = tables.outbox.name

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def claim(self, conn: sa.Connection, worker: int) -> Round:
        """Claim up to ``batch_size`` events for ``<relay_id>/<worker>`` in the caller's transaction."""
        rows = claim(conn, self.tables, f"{self.relay_id}/{worker}", self.now_ms(), self.config.batch_size,
                     self.config.lease_ms)
        if rows:
            self.metrics.claimed.labels(self.label).inc(len(rows))
        return Round(rows)

    def plan_backoff(self, rnd: Round) -> None:
        """Pick each failed row's retry delay (once per round, before the finishing transaction)."""
        with self._rng_lock:
            rnd.due = [(r, backoff_ms(r.attempts, self.config, self._rng), err) for r, err in rnd.failed]

    def finish(self, conn: sa.Connection, rnd: Round) -> tuple[int, int, int]:
        """Mark the acknowledged rows PROCESSED and the failed ones back to PRODUCE_INIT, in the
        caller's transaction, each only if its claim's fencing token still holds. Returns
        ``(marked, unsent, now_ms)`` for :meth:`account` once the transaction committed."""
        now = self.now_ms()
        marked = mark_sent(conn, self.tables, rnd.ok, now)
        unsent = sum(mark_failed(conn, self.tables, [(r, now + d)], err, now) for r, d, err in rnd.due)
        return marked, unsent, now

    def account(self, rnd: Round, finished: tuple[int, int, int]) -> RoundResult:
        """Count and log a finished round (after its transaction committed)."""
        marked, unsent, now = finished
        stale = len(rnd.ok) - marked + len(rnd.failed) - unsent
        lbl = self.label
        if stale:
            log.warning("relay %s: %d of %d events had lost their lease before they were finished "
                        "(another relay re-claimed them)", self.relay_id, stale, len(rnd.rows))
            self.metrics.stale_finishes.labels(lbl).inc(stale)
        self.metrics.sent.labels(lbl).inc(marked)
        self.metrics.send_failures.labels(lbl).inc(len(rnd.failed))
        for r in rnd.ok:
            self.metrics.relay_lag.labels(lbl).observe(max(0, now - r.created_at_ms) / 1000)
        return RoundResult(claimed=len(rnd.rows), sent=marked, failed=unsent, stale=stale)
