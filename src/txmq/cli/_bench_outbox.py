"""``txmq bench outbox``: how fast relays move outbox events from a committed ``put_message`` to a
broker acknowledgement, beside the broker's plain send rate, measured in one run.

1. Plain send: ``threads`` sync producers each sending 1 KiB messages one at a time (what a service
   does without an outbox), against one real broker process with synchronous flush.
2. Relay: ``events`` committed outbox events (1 KiB payloads) drained by 1 and 4 relays (each its
   own producer and relay id, one worker thread each, default :class:`~txmq.outbox.RelayConfig`),
   timed from the relays' start until the last event is marked PRODUCE_PROCESSED, per database.
3. put_message overhead: median duration of a business transaction (one INSERT + COMMIT) with and
   without a ``put_message`` call, 300 of each, interleaved, per database; the difference is the
   outbox's cost inside the caller's transaction (the commit's fsync dominates both).

Ratios between these numbers are what to compare across machines (DESIGN.md: these machines are
noisy); the absolute values depend on the disk's fsync latency.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import sqlalchemy as sa
import typer
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from txmq import outbox as ob
from txmq.client import Message, Producer
from txmq.testing import BrokerProcess

__all__ = ["bench_outbox", "outbox"]

BODY = b"x" * 1024
TOPIC = "bench-outbox"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _db_label(engine: sa.Engine) -> str:
    name = engine.dialect.name
    return "mariadb" if name == "mysql" and getattr(engine.dialect, "is_mariadb", False) else name


def plain_send_rate(endpoints: str, n: int, threads: int) -> float:
    """Messages per second of ``threads`` producers sending ``n`` messages in all, one per request."""
    producers = [Producer(f"bench-plain-{i}", endpoints) for i in range(threads)]
    for p in producers:
        p.start()
        p.send(Message(topic=TOPIC, body=BODY))  # connect and learn the route before timing
    try:
        def run(p: Producer, k: int) -> None:
            for _ in range(k):
                p.send(Message(topic=TOPIC, body=BODY))

        ts = [threading.Thread(target=run, args=(p, n // threads)) for p in producers]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return (n // threads) * threads / (time.perf_counter() - t0)
    finally:
        for p in producers:
            p.shutdown()


def _prefill(engine: sa.Engine, tables: ob.OutboxTables, n: int) -> None:
    done = 0
    while done < n:
        with engine.begin() as conn:
            for i in range(done, min(n, done + 500)):
                ob.put_message(conn, Message(topic=TOPIC, body=BODY), "BENCH", str(i), "bench",
                                   tables=tables)
        done = min(n, done + 500)


def relay_rate(engine: sa.Engine, endpoints: str, n: int, relays: int) -> float:
    """Events per second that ``relays`` relays move from ``n`` committed events to PROCESSED."""
    tables = ob.make_tables(f"bench{uuid.uuid4().hex[:8]}_")
    ob.init_db(engine, tables)
    metrics = ob.OutboxMetrics(CollectorRegistry())
    producers = [Producer(f"bench-relay-{i}", endpoints) for i in range(relays)]
    try:
        _prefill(engine, tables, n)
        for p in producers:
            p.start()
            p.send(Message(topic=TOPIC, body=b""))  # connect before timing
        workers = [ob.Relay(engine, p, tables=tables, metrics=metrics, relay_id=f"bench-{i}")
                   for i, p in enumerate(producers)]
        t0 = time.perf_counter()
        for r in workers:
            r.start()
        while (metrics.registry.get_sample_value("txmq_outbox_events_sent_total",
                                                 {"table": tables.outbox.name}) or 0) < n:
            time.sleep(0.002)
        elapsed = time.perf_counter() - t0
        for r in workers:
            r.stop()
        with engine.connect() as conn:
            assert ob.backlog(conn, tables).total == 0
        return n / elapsed
    finally:
        for p in producers:
            p.shutdown()
        ob.drop_tables(engine, tables)


def put_message_overhead_ms(engine: sa.Engine, n: int) -> tuple[float, float]:
    """``(median ms of a one-row business transaction, median extra ms a put_message adds to it)``."""
    tables = ob.make_tables(f"bench{uuid.uuid4().hex[:8]}_")
    biz = sa.Table(f"{tables.prefix}orders", tables.metadata, sa.Column("id", sa.Integer, primary_key=True),
                   sa.Column("body", sa.LargeBinary, nullable=False))
    ob.init_db(engine, tables)
    biz.create(engine)
    plain: list[float] = []
    with_outbox: list[float] = []
    try:
        for i in range(2 * n):
            t0 = time.perf_counter()
            with engine.begin() as conn:
                conn.execute(biz.insert(), {"id": i, "body": BODY[:100]})
                if i % 2:
                    ob.put_message(conn, Message(topic=TOPIC, body=BODY), "BENCH", str(i), "bench",
                                       tables=tables)
            (with_outbox if i % 2 else plain).append(time.perf_counter() - t0)
        base = statistics.median(plain)
        return base * 1000, (statistics.median(with_outbox) - base) * 1000
    finally:
        biz.drop(engine)
        ob.drop_tables(engine, tables)


def _engine(url: str | None, tmp: Path) -> sa.Engine:
    if url is None or url == "sqlite":
        return ob.create_sqlite_engine(tmp / "bench.db")
    return sa.create_engine(url, pool_size=8)


def bench_outbox(urls: list[str | None], events: int, relay_counts: list[int], endpoints: str,
                 console: Console | None = None) -> dict[str, Any]:
    """Run the three measurements; ``None`` in ``urls`` is a temporary SQLite file."""
    out: dict[str, Any] = {"events": events, "payload_bytes": len(BODY),
                           "relay_config": {"batch_size": ob.RelayConfig().batch_size, "pool_size": 1},
                           "relay_events_per_s": {}, "put_message_overhead_ms_p50": {},
                           "business_tx_ms_p50": {}}
    out["plain_send_msgs_per_s"] = round(plain_send_rate(endpoints, events, max(relay_counts)), 1)
    with tempfile.TemporaryDirectory(prefix="txmq-bench-outbox-") as tmp:
        for url in urls:
            engine = _engine(url, Path(tmp))
            label = _db_label(engine)
            rates = {str(k): round(relay_rate(engine, endpoints, events, k), 1) for k in relay_counts}
            out["relay_events_per_s"][label] = rates
            base, extra = put_message_overhead_ms(engine, 300)
            out["business_tx_ms_p50"][label] = round(base, 3)
            out["put_message_overhead_ms_p50"][label] = round(extra, 3)
            if console is not None:
                console.print(f"{label}: relays {rates} events/s")
            engine.dispose()
    out["relay_vs_plain_send"] = {db: {k: round(v / out["plain_send_msgs_per_s"], 2) for k, v in r.items()}
                                  for db, r in out["relay_events_per_s"].items()}
    return out


def _table(r: dict[str, Any]) -> Table:
    t = Table("database", "relays", "events/s", "÷ plain send", "business tx ms (p50)",
              "put_message +ms (p50)",
              title=f"txmq bench outbox: {r['events']} events of {r['payload_bytes']} B; "
                    f"plain send {r['plain_send_msgs_per_s']} msgs/s")
    for db, rates in r["relay_events_per_s"].items():
        for k, v in rates.items():
            t.add_row(db, k, f"{v:,.0f}", f"{r['relay_vs_plain_send'][db][k]:.2f}",
                      f"{r['business_tx_ms_p50'][db]:.3f}", f"{r['put_message_overhead_ms_p50'][db]:.3f}")
    return t


def outbox(
    db: Annotated[list[str] | None, typer.Option(
        "--db", help="Database URL (repeatable); 'sqlite' is a temporary file. Default: SQLite and "
                     f"{DEFAULT_POSTGRES_URL}.")] = None,
    events: Annotated[int, typer.Option(min=100, help="Events per relay measurement.")] = 10_000,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures here.")] = None,
    broker: Annotated[str | None, typer.Option(help="Use this broker instead of starting one.")] = None,
) -> None:
    """Relay throughput (events/s from put_message commit to broker ack, 1 and 4 relays) beside
    the plain send rate, and put_message's cost inside the business transaction."""
    console = Console()
    urls: list[str | None] = list(db) if db else [None, DEFAULT_POSTGRES_URL]
    with tempfile.TemporaryDirectory(prefix="txmq-bench-broker-") as tmp:
        bp = None
        if broker is None:
            bp = BrokerProcess(Path(tmp), {"topics": {TOPIC: 4}})
            bp.start()
            broker = bp.endpoints
        try:
            result = bench_outbox(urls, events, [1, 4], broker, console)
        finally:
            if bp is not None:
                bp.stop()
    console.print(_table(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")

