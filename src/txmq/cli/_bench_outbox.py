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

import asyncio
import contextlib
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import sqlalchemy as sa
import typer
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from txmq import outbox as ob
from txmq.client import Message, Producer
from txmq.errors import ConfigError
from txmq.protocol import PROPERTY_UNIQ_KEY
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


def _prefill(engine: sa.Engine, tables: ob.OutboxTables, n: int, topic: str = TOPIC) -> None:
    done = 0
    while done < n:
        with engine.begin() as conn:
            for i in range(done, min(n, done + 500)):
                ob.put_message(conn, Message(topic=topic, body=BODY), "BENCH", str(i), "bench",
                                   tables=tables)
        done = min(n, done + 500)


def _drain(engine: sa.Engine, tables: ob.OutboxTables, metrics: ob.OutboxMetrics,
           senders: Sequence[ob.Sender], n: int) -> float:
    """Events/s of one relay per sender (a Producer or a Transport) moving ``n`` prefilled
    events to PROCESSED; asserts the backlog is empty after."""
    workers = [ob.Relay(engine, s, tables=tables, metrics=metrics, relay_id=f"bench-{i}")
               for i, s in enumerate(senders)]
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
        return _drain(engine, tables, metrics, producers, n)
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


TRANSPORTS = ("txmq", "rabbitmq", "nats")
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
NATS_STREAM, NATS_SUBJECT_PREFIX = "TXMQ_OUTBOX", "txmq.outbox."
"""Where the NATS transport stores a topic (docs/outbox.md, the transport table): purged afterwards."""


def _open_transport(kind: str, url: str, i: int) -> ob.Transport:
    """A fresh transport (its own connection) for publisher or relay ``i``. Raises ConfigError."""
    if kind == "txmq":
        _, endpoints = ob.parse_transport_url(url)
        return ob.TxmqTransport(url, endpoints, producer_group=f"bench-outbox-{i}")
    return ob.open_transport(url)


def _publish_one(t: ob.Transport, topic: str) -> None:
    """One durable publish, waiting for its acknowledgement: txmq ``Producer.send``; RabbitMQ a
    persistent, mandatory publish confirmed by the broker (quorum queue); NATS a JetStream publish
    ack (file storage). The message id is fresh, as a relay's event id would be."""
    m = Message(topic=topic, body=BODY, properties={PROPERTY_UNIQ_KEY: uuid.uuid4().hex})
    if isinstance(t, ob.TxmqTransport):
        t.producer().send(m)
    else:
        t.send_batch([m])


def plain_publish_rate(kind: str, url: str, topic: str, n: int, concurrency: int) -> float:
    """Messages/s of ``concurrency`` publishers (each its own connection, one thread each) sending
    ``n`` 1 KiB messages in all to ``topic``, one at a time, each waiting for its durable ack."""
    ts = [_open_transport(kind, url, i) for i in range(concurrency)]
    try:
        for t in ts:
            _publish_one(t, topic)  # connect (and learn the route) before timing
        k = n // concurrency

        def run(t: ob.Transport) -> None:
            for _ in range(k):
                _publish_one(t, topic)

        threads = [threading.Thread(target=run, args=(t,)) for t in ts]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return k * concurrency / (time.perf_counter() - t0)
    finally:
        for t in ts:
            t.close()


def relay_transport_rate(engine: sa.Engine, kind: str, url: str, topic: str, n: int, relays: int) -> float:
    """Events/s that ``relays`` relays (each its own transport connection, default RelayConfig) move
    from ``n`` committed 1 KiB events to PRODUCE_PROCESSED over that transport."""
    tables = ob.make_tables(f"bench{uuid.uuid4().hex[:8]}_")
    ob.init_db(engine, tables)
    metrics = ob.OutboxMetrics(CollectorRegistry())
    ts = [_open_transport(kind, url, i) for i in range(relays)]
    try:
        _prefill(engine, tables, n, topic)
        for t in ts:
            _publish_one(t, topic)  # connect before timing
        return _drain(engine, tables, metrics, ts, n)
    finally:
        for t in ts:
            t.close()
        ob.drop_tables(engine, tables)


async def _rabbit_sink(url: str, topic: str, delete: bool) -> None:
    """Declare (or delete) the durable quorum queue ``<topic>.bench-sink`` bound to the topic's
    exchange, so that the mandatory publishes are routable; deleting also drops the exchange."""
    import aio_pika

    conn = await aio_pika.connect_robust(url)
    try:
        ch = await conn.channel()
        if delete:
            await ch.queue_delete(f"{topic}.bench-sink")
            await ch.exchange_delete(topic)
            return
        ex = await ch.declare_exchange(topic, aio_pika.ExchangeType.FANOUT, durable=True)
        q = await ch.declare_queue(f"{topic}.bench-sink", durable=True,
                                   arguments={"x-queue-type": "quorum"})
        await q.bind(ex)
    finally:
        await conn.close()


async def _nats_purge(url: str, topic: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().purge_stream(NATS_STREAM, subject=NATS_SUBJECT_PREFIX + topic)
    finally:
        await nc.close()


def _prepare_topic(kind: str, url: str, topic: str, *, cleanup: bool = False) -> None:
    """Make ``topic`` routable on that broker before the runs, or remove what the runs left."""
    if kind == "rabbitmq":
        asyncio.run(_rabbit_sink(url, topic, delete=cleanup))
    elif kind == "nats" and cleanup:
        asyncio.run(_nats_purge(url, topic))
    elif kind == "txmq" and not cleanup:
        t = _open_transport(kind, url, 0)
        try:
            t.ensure_topic(topic)
        finally:
            t.close()


def bench_transports(engine: sa.Engine, urls: dict[str, str], events: int, relays: int, rounds: int,
                     console: Console | None = None) -> dict[str, Any]:
    """Per round, per transport in turn (interleaved): plain durable publish at ``relays``
    concurrent publishers, then ``relays`` relays draining ``events`` events from ``engine``.

    Returns ``{"runs": [{transport: {"plain_msgs_per_s", "relay_events_per_s", "ratio"}}],
    "median": {transport: {...}}, ...}``; rates in 1/s, ratio = relay ÷ plain of the same round.
    Raises ConfigError (bad URL) and the brokers' errors when one is down.
    """
    topic = f"bench-outbox-{uuid.uuid4().hex[:8]}"
    runs: list[dict[str, dict[str, float]]] = []
    for kind, url in urls.items():
        _prepare_topic(kind, url, topic)
    try:
        for rnd in range(rounds):
            runs.append({})
            for kind, url in urls.items():
                plain = plain_publish_rate(kind, url, topic, events, relays)
                relay = relay_transport_rate(engine, kind, url, topic, events, relays)
                runs[-1][kind] = {"plain_msgs_per_s": round(plain, 1), "relay_events_per_s": round(relay, 1),
                                  "ratio": round(relay / plain, 2)}
                if console is not None:
                    console.print(f"round {rnd + 1} {kind}: plain {plain:,.0f} msgs/s, "
                                  f"{relays} relays {relay:,.0f} events/s")
    finally:
        for kind, url in urls.items():
            with contextlib.suppress(Exception):
                _prepare_topic(kind, url, topic, cleanup=True)
    median = {k: {m: round(statistics.median(r[k][m] for r in runs), 2 if m == "ratio" else 1)
                  for m in ("plain_msgs_per_s", "relay_events_per_s", "ratio")} for k in urls}
    return {"events": events, "payload_bytes": len(BODY), "relays": relays, "publishers": relays,
            "database": _db_label(engine), "rounds": rounds,
            "relay_config": {"batch_size": ob.RelayConfig().batch_size, "pool_size": 1},
            "urls": {k: _without_password(u) for k, u in urls.items()}, "runs": runs, "median": median}


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    return url if parts.password is None else url.replace(f":{parts.password}@", ":***@", 1)


def _transport_table(r: dict[str, Any]) -> Table:
    t = Table("transport", "round", "plain publish msgs/s", f"{r['relays']} relays events/s", "relay ÷ plain",
              title=f"txmq bench outbox --transports: {r['events']} events of {r['payload_bytes']} B on "
                    f"{r['database']}, {r['relays']} relays vs {r['publishers']} publishers")
    for kind, med in r["median"].items():
        for i, run in enumerate(r["runs"]):
            x = run[kind]
            t.add_row(kind, str(i + 1), f"{x['plain_msgs_per_s']:,.0f}", f"{x['relay_events_per_s']:,.0f}",
                      f"{x['ratio']:.2f}")
        t.add_row(kind, "median", f"{med['plain_msgs_per_s']:,.0f}", f"{med['relay_events_per_s']:,.0f}",
                  f"{med['ratio']:.2f}")
    return t


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


def _transport_urls(transports: str, broker: str, amqp_url: str, nats_url: str) -> dict[str, str]:
    """``--transports a,b`` → ``{kind: URL}`` in the given order. Raises ConfigError."""
    known = {"txmq": f"txmq://{broker}", "rabbitmq": amqp_url, "nats": nats_url}
    kinds = [k.strip() for k in transports.split(",") if k.strip()]
    bad = [k for k in kinds if k not in known]
    if bad or not kinds:
        raise ConfigError(f"--transports {transports!r}: use a comma-separated subset of "
                          + ",".join(TRANSPORTS))
    urls = {k: known[k] for k in kinds}
    for k, u in urls.items():
        got, _ = ob.parse_transport_url(u)
        if got != k:
            raise ConfigError(f"the {k} URL {_without_password(u)!r} is a {got} URL")
    return urls


def _run_outbox_bench(console: Console, broker: str, urls: list[str | None], events: int, databases: bool,
                      transport_urls: dict[str, str], transport_db: str, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if databases:
        result = bench_outbox(urls, events, [1, 4], broker, console)
        console.print(_table(result))
    if transport_urls:
        with tempfile.TemporaryDirectory(prefix="txmq-bench-outbox-") as tmp:
            engine = _engine(transport_db, Path(tmp))
            try:
                result["transports"] = bench_transports(engine, transport_urls, events, 4, rounds, console)
            finally:
                engine.dispose()
        console.print(_transport_table(result["transports"]))
    return result


def outbox(
    db: Annotated[list[str] | None, typer.Option(
        "--db", help="Database URL (repeatable); 'sqlite' is a temporary file. Default: SQLite and "
                     f"{DEFAULT_POSTGRES_URL}.")] = None,
    events: Annotated[int, typer.Option(min=100, help="Events per relay measurement.")] = 10_000,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the figures here.")] = None,
    broker: Annotated[str | None, typer.Option(help="Use this broker instead of starting one.")] = None,
    transports: Annotated[str, typer.Option(
        help="Transports to compare, comma-separated: txmq,rabbitmq,nats ('' = none).")
    ] = ",".join(TRANSPORTS),
    databases: Annotated[bool, typer.Option(
        help="Also run the per-database part (1 and 4 relays on txmq, put_message cost).")] = True,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds of the transport part.")] = 3,
    transport_db: Annotated[str, typer.Option(
        help="Database of the transport part's relays.")] = DEFAULT_POSTGRES_URL,
    amqp_url: Annotated[str, typer.Option(help="RabbitMQ URL.")] = DEFAULT_AMQP_URL,
    nats_url: Annotated[str, typer.Option(help="NATS (JetStream) URL.")] = DEFAULT_NATS_URL,
) -> None:
    """Relay throughput (events/s from put_message commit to broker ack) beside the plain durable
    publish rate measured in the same run: per database on txmq (1 and 4 relays) and, with 4 relays
    on PostgreSQL, per transport (txmq, RabbitMQ, NATS JetStream), in interleaved rounds."""
    console = Console()
    urls: list[str | None] = list(db) if db else [None, DEFAULT_POSTGRES_URL]
    with tempfile.TemporaryDirectory(prefix="txmq-bench-broker-") as tmp:
        bp = None
        if broker is None:
            bp = BrokerProcess(Path(tmp), {"topics": {TOPIC: 4}})
            bp.start()
            broker = bp.endpoints
        try:
            turls = _transport_urls(transports, broker, amqp_url, nats_url) if transports.strip() else {}
            result = _run_outbox_bench(console, broker, urls, events, databases, turls, transport_db, rounds)
        except ConfigError as exc:
            console.print(f"[red]bench outbox:[/red] {exc}")
            raise typer.Exit(2) from None
        finally:
            if bp is not None:
                bp.stop()
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
