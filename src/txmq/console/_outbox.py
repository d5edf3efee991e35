"""The outbox page's numbers, read from the outbox database (sync SQLAlchemy, run in a thread)."""

from __future__ import annotations

import sqlalchemy as sa

from txmq import outbox
from txmq.console._models import OutboxInbox, OutboxLease, OutboxStatus, OutboxSummary
from txmq.errors import ConfigError

__all__ = ["OutboxReader"]


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite:///") and "?" not in url:
        return outbox.create_sqlite_engine(url[len("sqlite:///"):])
    try:
        return sa.create_engine(url)
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise ConfigError(f"cannot use database URL {url!r}: {exc}") from exc


class OutboxReader:
    """Counts of one outbox's tables (``<prefix>outbox``, ``<prefix>inbox``).

    Raises:
        ConfigError: a URL SQLAlchemy cannot use.
    """

    def __init__(self, url: str, prefix: str) -> None:
        self.engine = _engine(url)
        self.tables = outbox.make_tables(prefix)

    def close(self) -> None:
        self.engine.dispose()

    def summary(self, now_ms: int) -> OutboxSummary:
        """Rows per status with the oldest row's age (ms), the relays' leases on
        PRODUCE_PROCESSING rows, and the inbox: rows, and rows of events delivered more than once
        (``duplicates``: redeliveries the inbox absorbed).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
        """
        t, i = self.tables.outbox, self.tables.inbox
        with self.engine.connect() as conn:
            statuses = [OutboxStatus(status=s, rows=int(n),
                                     oldest_age_ms=max(0, now_ms - int(first or now_ms)))
                        for s, n, first in conn.execute(
                            sa.select(t.c.status, sa.func.count(), sa.func.min(t.c.created_at_ms))
                            .group_by(t.c.status).order_by(t.c.status))]
            leases = [OutboxLease(relay=str(owner), until_ms=int(until or 0), rows=int(n))
                      for owner, until, n in conn.execute(
                          sa.select(t.c.lease_owner, sa.func.max(t.c.lease_expires_at_ms), sa.func.count())
                          .where(t.c.status == outbox.EventStatus.PRODUCE_PROCESSING.value,
                                 t.c.lease_owner.is_not(None))
                          .group_by(t.c.lease_owner).order_by(t.c.lease_owner))]
            rows, dups = conn.execute(sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(sa.case((i.c.reconsume_times > 0, 1),
                                                                      else_=0)), 0)).select_from(i)).one()
        return OutboxSummary(statuses=statuses, leases=leases,
                             inbox=OutboxInbox(rows=int(rows), duplicates=int(dups)))
