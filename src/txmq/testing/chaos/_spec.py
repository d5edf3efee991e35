"""The workload's names (topics, groups) and databases, shared by the workers and the run."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy as sa

from txmq import outbox

__all__ = ["EFFECTS", "GROUPS", "TOPICS", "TX_GROUP", "prepare_databases"]

TOPICS = {"plain": "chaos-plain", "tx": "chaos-tx", "outbox": "chaos-outbox"}
GROUPS = ("chaos-g1", "chaos-g2")
TX_GROUP = "chaos-tx-producers"

EFFECTS = sa.Table("effects", sa.MetaData(), sa.Column("key", sa.String, index=True),
                   sa.Column("topic", sa.String), sa.Column("event_id", sa.String))


def prepare_databases(run: Path) -> None:
    """Create every workload database before the processes start (no races on the schema)."""
    with sqlite3.connect(run / "tx.db") as c:
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("CREATE TABLE IF NOT EXISTS tx (key TEXT PRIMARY KEY, state TEXT NOT NULL, t REAL)")
    c.close()
    outbox.init_db(outbox.create_sqlite_engine(str(run / "outbox.db")))
    for g in GROUPS:
        engine = outbox.create_sqlite_engine(str(run / f"{g}.db"))
        outbox.init_db(engine)
        EFFECTS.metadata.create_all(engine)
        engine.dispose()
