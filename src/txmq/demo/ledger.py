"""The demo's downstream ledger service: a push consumer of group ``ledger`` (clustering).

Run as ``python -m txmq.demo.ledger --endpoints E --db ledger.db``. Each received order key is
inserted into ``received``; a redelivered key hits the primary key and is counted in
``duplicates`` instead of being applied twice. Stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sqlite3
import threading
from pathlib import Path

from txmq.client import ConsumeStatus, MessageExt, PushConsumer

__all__ = ["LEDGER_GROUP", "init_db", "ledger_counts", "main"]

LEDGER_GROUP = "ledger"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS received (orderkey INTEGER PRIMARY KEY, msg_id TEXT NOT NULL,
                                     queue_id INTEGER NOT NULL, queue_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS duplicates (orderkey INTEGER NOT NULL, msg_id TEXT NOT NULL);
"""


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, isolation_level="IMMEDIATE", check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def init_db(path: Path) -> None:
    conn = _connect(path)
    conn.executescript(_SCHEMA)
    conn.close()


def ledger_counts(path: Path) -> tuple[set[int], int]:
    """``(distinct order keys received, duplicate deliveries)``."""
    conn = _connect(path)
    try:
        keys = {r[0] for r in conn.execute("SELECT orderkey FROM received")}
        dups = conn.execute("SELECT count(*) FROM duplicates").fetchone()[0]
        return keys, int(dups)
    finally:
        conn.close()


class _Ledger:
    def __init__(self, db: Path) -> None:
        self.db = db
        self._local = threading.local()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect(self.db)
        with conn:
            for m in msgs:
                key = int(m.keys.split()[0])
                try:
                    conn.execute(
                        "INSERT INTO received VALUES (?, ?, ?, ?)",
                        (key, m.msg_id, m.queue_id, m.queue_offset),
                    )
                except sqlite3.IntegrityError:
                    conn.execute("INSERT INTO duplicates VALUES (?, ?)", (key, m.msg_id))
        return ConsumeStatus.CONSUME_SUCCESS


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoints", required=True)
    p.add_argument("--db", type=Path, required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s: %(message)s")
    init_db(a.db)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = PushConsumer(
        LEDGER_GROUP,
        a.endpoints,
        _Ledger(a.db),
        consume_from_where="CONSUME_FROM_FIRST_OFFSET",
        consume_threads=2,
    )
    consumer.subscribe("orders")
    consumer.start()
    try:
        stop.wait()
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    main()
