"""Operations on the local message table: status and backlog, retention, a SQLite engine that suits
several processes sharing one file."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from txmq import limits
from txmq.outbox._schema import DEFAULT_TABLES, EventStatus, OutboxTables

__all__ = ["Backlog", "OutboxStatus", "PurgeResult", "backlog", "create_sqlite_engine", "outbox_status",
           "purge"]

_UNSENT = (EventStatus.PRODUCE_INIT.value, EventStatus.PRODUCE_PROCESSING.value)


@dataclass(frozen=True)
class Backlog:
    """Unsent events: counts by status, the oldest one's age (ms, None when there is none), how many
    PROCESSING rows have an expired lease, and the most attempts any unsent event has had."""

    by_status: dict[str, int]
    oldest_age_ms: int | None
    expired_leases: int
    attempts_max: int

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def backlog(conn: sa.Connection, tables: OutboxTables = DEFAULT_TABLES, now_ms: int | None = None) -> Backlog:
    """Measure the unsent part of the outbox (reads only PRODUCE_INIT/PROCESSING rows, via the index)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    t = tables.outbox
    expired = sa.case((sa.and_(t.c.status == EventStatus.PRODUCE_PROCESSING.value,
                               t.c.lease_expires_at_ms <= now), 1), else_=0)
    q = (sa.select(t.c.status, sa.func.count(), sa.func.min(t.c.created_at_ms), sa.func.sum(expired),
                   sa.func.max(t.c.attempts))
         .where(t.c.status.in_(_UNSENT)).group_by(t.c.status))
    by_status = dict.fromkeys(_UNSENT, 0)
    oldest: int | None = None
    expired_n = attempts = 0
    for status, n, first, exp, att in conn.execute(q):
        by_status[status] = int(n)
        oldest = int(first) if oldest is None else min(oldest, int(first))
        expired_n += int(exp or 0)
        attempts = max(attempts, int(att or 0))
    return Backlog(by_status, None if oldest is None else max(0, now - oldest), expired_n, attempts)


@dataclass(frozen=True)
class OutboxStatus:
    """What ``txmq outbox status`` shows.

    Attributes:
        outbox_table, inbox_table: the table names.
        events: ``{tx_type: {status: count}}`` over the whole outbox.
        inbox: ``{tx_type: {status: count}}`` over the whole inbox.
        backlog: the unsent part (see :class:`Backlog`).
    """

    outbox_table: str
    inbox_table: str
    events: dict[str, dict[str, int]]
    inbox: dict[str, dict[str, int]]
    backlog: Backlog = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["backlog"]["total"] = self.backlog.total
        return d


def _grouped(conn: sa.Connection, t: sa.Table) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tx, status, n in conn.execute(sa.select(t.c.tx_type, t.c.status, sa.func.count())
                                      .group_by(t.c.tx_type, t.c.status)):
        out.setdefault(tx, {})[status] = int(n)
    return out


def outbox_status(conn: sa.Connection, tables: OutboxTables = DEFAULT_TABLES,
                  now_ms: int | None = None) -> OutboxStatus:
    """Counts of both tables by tx type and status, and the backlog. Scans both tables (an operator
    command, not something to run every second)."""
    return OutboxStatus(tables.outbox.name, tables.inbox.name, _grouped(conn, tables.outbox),
                        _grouped(conn, tables.inbox), backlog(conn, tables, now_ms))


@dataclass(frozen=True)
class PurgeResult:
    """Rows deleted by :func:`purge`."""

    events: int
    inbox: int


def _purge_table(engine: sa.Engine, t: sa.Table, where: sa.ColumnElement[bool], batch_rows: int) -> int:
    deleted = 0
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(sa.select(t.c.id).where(where).order_by(t.c.id).limit(batch_rows))
                       .scalars())
            if not ids:
                return deleted
            deleted += int(conn.execute(sa.delete(t).where(t.c.id.in_(ids))).rowcount)


def purge(engine: sa.Engine, tables: OutboxTables = DEFAULT_TABLES, *,
          older_than_ms: int = limits.OUTBOX_RETENTION_MS, now_ms: int | None = None,
          batch_rows: int = limits.OUTBOX_PURGE_BATCH_ROWS) -> PurgeResult:
    """Delete PRODUCE_PROCESSED events sent, and inbox rows written, more than ``older_than_ms`` ago.

    Unsent events are never deleted. Deletes ``batch_rows`` rows per transaction. Keep
    ``older_than_ms`` above the longest redelivery window (see ``limits.OUTBOX_RETENTION_MS``): a
    duplicate arriving after its inbox row was purged would run the handler again.
    """
    if older_than_ms <= 0 or batch_rows <= 0:
        raise ValueError("older_than_ms and batch_rows must be positive")
    cutoff = (int(time.time() * 1000) if now_ms is None else now_ms) - older_than_ms
    o, i = tables.outbox, tables.inbox
    events = _purge_table(engine, o, sa.and_(o.c.status == EventStatus.PRODUCE_PROCESSED.value,
                                             o.c.sent_at_ms < cutoff), batch_rows)
    inbox = _purge_table(engine, i, i.c.consumed_at_ms < cutoff, batch_rows)
    return PurgeResult(events, inbox)


def create_sqlite_engine(path: Path | str, *, busy_timeout_s: float = 60.0, **kw: Any) -> sa.Engine:
    """An engine for a SQLite file shared by several processes (the embedded default).

    Every connection uses WAL journaling (readers do not block the writer), ``synchronous=FULL`` (a
    committed transaction survives power loss) and waits up to ``busy_timeout_s`` for another
    process's write lock instead of failing with ``database is locked``. ``kw`` goes to
    ``create_engine``.
    """
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": busy_timeout_s}, **kw)

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = FULL")
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cur.close()

    return engine
