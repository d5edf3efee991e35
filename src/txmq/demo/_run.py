"""``txmq demo``: TPC-H orders as transactional messages into a ledger and a Spark pipeline.

Stages: generate TPC-H data → start a broker (or, ``brokers`` ≥ 2, a name server and that many
brokers, every topic on each; the clients then find them through the name server) → start the
ledger (2 consumer processes behind the local message table's inbox) and the order service's
compensation consumer → run the order service
(3+ producer processes, with deterministic rollbacks, UNKNOWNs and SIGKILLs) → wait until every half
message is settled → wait until the ledger has caught up → wait until every order the ledger
rejected came back as a ROLLBACK event and was cancelled → run the Spark Structured Streaming query
(``Trigger.AvailableNow``) over the order and rollback topics → verify against the order database.

The Spark stage runs on ``local[2]`` by default, on a standalone master (``spark_master``), or on a
two-worker cluster started for it (``spark_cluster``, see docs/spark-cluster.md); the report names
the master (``spark_master``) and the stage's time (``spark_stage_s``).

The ledger's ROLLBACK events (the local message table's part) go through txmq's broker by default,
or through RabbitMQ or NATS JetStream (``DemoOptions.outbox_transport``); the transactional orders
always go through txmq's broker. On another broker the rollback topic gets a per-run name
(``orders-rollback-<run tag>``), so queues and durable consumers left by earlier runs never feed this
one, and the Spark query, which reads txmq only, is checked against the committed orders with the
cancelled ones included (the order database checks the compensation).

The demo's broker retries failed deliveries after 200 ms at every delay level (RocketMQ's levels
would make the ledger's ten attempts at a rejected order take about ten minutes).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from txmq.demo import ledger, order_service, orderdb, tpch, traces
from txmq.demo._brokers import Brokers, start_brokers
from txmq.demo._faults import Fault, fault_of, ledger_rejects
from txmq.demo._processes import ServiceProcess
from txmq.errors import ConfigError, TxmqError
from txmq.outbox import parse_transport_url

__all__ = ["DemoError", "DemoOptions", "run_demo"]

TOPIC = "orders"
TOPIC_QUEUES = 4
ROLLBACK_TOPIC = order_service.ROLLBACK_TOPIC
ROLLBACK_TOPIC_QUEUES = 2
SETTLE_TIMEOUT_S = 180.0
LEDGER_TIMEOUT_S = 120.0
COMPENSATE_TIMEOUT_S = 120.0
OUTBOX_URLS = {"txmq": "", "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/",
               "nats": "nats://127.0.0.1:4222"}
"""``--outbox-transport`` → the default URL of that broker (txmq: the demo's own broker)."""
SPARK_CLUSTER_WORKERS = 2
"""Workers (1 core each) of the cluster ``--spark-cluster`` starts: the issue's two executors."""
DELAY_LEVELS = " ".join(["200ms"] * 18)
"""The demo broker's ``message_delay_level``: every retry after 200 ms."""


class DemoError(TxmqError):
    """The demo could not run to the end (a process failed, a wait timed out)."""

    code = "DEMO_ERROR"


@dataclass
class DemoOptions:
    """What ``txmq demo`` runs with; times in ms."""

    sf: float = 0.01
    broker: str | None = None
    namesrv_addr: str | None = None
    """Name servers to find the broker through (RocketMQ ``namesrvAddr``), instead of ``broker``."""
    brokers: int = 1
    replicas: int = 0
    """1: the broker the demo starts is a SYNC_MASTER with one slave; the report says whether the
    slave's commit log is byte-identical to the master's at the end (``slave_log_identical``)."""
    """Brokers to start (neither ``broker`` nor ``namesrv_addr`` given): 1, or a cluster of a name
    server and this many brokers (``broker-a``, ``broker-b``, …), every topic on each."""
    report: Path | None = None
    run_dir: Path = field(default_factory=lambda: Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"))
    producers: int = 3
    producer_threads: int = 2
    ledgers: int = 2
    transaction_timeout_ms: int = 1000
    transaction_check_interval_ms: int = 1000
    message_delay_level: str = DELAY_LEVELS
    outbox_transport: str = "txmq"
    """Where the ledger's ROLLBACK events go: ``txmq``, ``rabbitmq`` or ``nats``."""
    outbox_url: str | None = None
    """The URL of that broker (default :data:`OUTBOX_URLS`); refused with ``txmq``."""
    spark: bool = True
    """Run the Spark stage (off: the report's Spark checks are skipped, not failed)."""
    spark_master: str = "local[2]"
    """Where the Spark stage runs: ``local[N]`` or a standalone master ``spark://host:port`` (its
    workers must reach the broker and share the run directory's file system)."""
    spark_cluster: bool = False
    """Start a standalone cluster of :data:`SPARK_CLUSTER_WORKERS` workers on loopback
    (:class:`txmq.testing.SparkCluster`, under ``<run_dir>/spark-cluster``) for the Spark stage,
    instead of ``spark_master``."""
    traces: bool = True
    """Export the service processes' spans to ``<run_dir>/traces.jsonl`` (OTLP JSON lines; needs
    the extra ``otlp``, else the run is untraced and the report says so)."""

    @property
    def trace_file(self) -> Path | None:
        """Where the spans go, or None (off, or the extra ``otlp`` missing)."""
        if not self.traces or not traces.tracing_available():
            return None
        return self.run_dir / traces.TRACE_FILE_NAME


@dataclass(frozen=True)
class _Outbox:
    """The resolved outbox side: transport kind, URL ("" = txmq's broker), rollback topic."""

    kind: str
    url: str
    rollback_topic: str

    def args(self) -> list[str]:
        """Command-line arguments of the ledger and the compensator for this outbox side."""
        extra = ["--rollback-topic", self.rollback_topic]
        return extra if not self.url else [*extra, "--outbox-url", self.url]


def _without_password(url: str) -> str:
    """``url`` with its password replaced by ``***`` (the report must not carry it)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def _resolve_outbox(opts: DemoOptions) -> _Outbox:
    """Check ``opts.outbox_transport`` / ``outbox_url``. Raises ConfigError."""
    kind = opts.outbox_transport
    if kind not in OUTBOX_URLS:
        raise ConfigError(f"outbox transport {kind!r}: use one of {', '.join(OUTBOX_URLS)}")
    if kind == "txmq":
        if opts.outbox_url:
            raise ConfigError("--outbox-url needs --outbox-transport rabbitmq or nats (txmq: the "
                              "demo's own broker carries the rollback events)")
        return _Outbox(kind, "", ROLLBACK_TOPIC)
    url = opts.outbox_url or OUTBOX_URLS[kind]
    got, _ = parse_transport_url(url)
    if got != kind:
        raise ConfigError(f"outbox URL is a {got} URL, but --outbox-transport is {kind}")
    return _Outbox(kind, url, f"{ROLLBACK_TOPIC}-{uuid.uuid4().hex[:8]}")


def _check_spark_master(opts: DemoOptions) -> None:
    """Raises ConfigError for a master that is not ``local…`` or ``spark://…``, or one given
    together with ``spark_cluster``."""
    master = opts.spark_master
    if not master.startswith(("local", "spark://")):
        raise ConfigError(f"spark master {master!r}: use local[N] or spark://host:port")
    if opts.spark_cluster and not master.startswith("local"):
        raise ConfigError("--spark-cluster starts its own master: drop --spark-master")


class _Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(time.monotonic() - t0, 3)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _prepare_work(opts: DemoOptions, console: Console) -> tuple[list[tpch.Order], list[Path]]:
    data_dir = tpch.generate(opts.sf, opts.run_dir / "tpch")
    orders = tpch.load_orders(data_dir)
    work_dir = opts.run_dir / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(opts.producers):
        part = [(o.o_orderkey, tpch.encode_order(o)) for o in orders[i :: opts.producers]]
        path = work_dir / f"slot-{i}.bin"
        path.write_bytes(msgspec.msgpack.encode(part))
        files.append(path)
    console.print(
        f"generated TPC-H SF {opts.sf}: {len(orders):,} orders, "
        f"{sum(len(o.lineitems) for o in orders):,} lineitems"
    )
    return orders, files


def _start_broker(opts: DemoOptions) -> Brokers:
    """The brokers to run on: ``opts.broker``, the masters the name servers ``opts.namesrv_addr``
    route to, or ``opts.brokers`` started here (see :func:`txmq.demo._brokers.start_brokers`)."""
    return start_brokers(
        opts.brokers, opts.run_dir, {TOPIC: TOPIC_QUEUES, ROLLBACK_TOPIC: ROLLBACK_TOPIC_QUEUES},
        opts.broker, opts.namesrv_addr, opts.replicas,
        transaction_timeout_ms=opts.transaction_timeout_ms,
        transaction_check_interval_ms=opts.transaction_check_interval_ms,
        message_delay_level=opts.message_delay_level,
    )


class _ProgressFiles:
    """Counts ``D`` (done) lines of the producers' progress files incrementally."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._pos = dict.fromkeys(paths, 0)
        self.done: dict[int, str] = {}
        self.attempted: Counter[int] = Counter()
        self.ended: set[Path] = set()

    def refresh(self) -> None:
        for p in self.paths:
            if not p.exists():
                continue
            with open(p, "rb") as f:
                f.seek(self._pos[p])
                chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            self._pos[p] += cut
            for line in chunk[:cut].decode().splitlines():
                parts = line.split()
                if parts[0] == "A":
                    self.attempted[int(parts[1])] += 1
                elif parts[0] == "D":
                    self.done[int(parts[1])] = parts[2]
                elif parts[0] == "END":
                    self.ended.add(p)


def _run_producers(
    opts: DemoOptions, brokers: Brokers, db: Path, work: list[Path], total: int, progress: Progress
) -> tuple[_ProgressFiles, list[ServiceProcess], int]:
    logs = opts.run_dir / "logs"
    prog = _ProgressFiles([w.with_suffix(".progress") for w in work])
    spawned = Counter[int]()

    def spawn(i: int) -> ServiceProcess:
        spawned[i] += 1
        return ServiceProcess(
            "txmq.demo.order_service",
            [
                *brokers.args(),
                "--db",
                str(db),
                "--work",
                str(work[i]),
                "--progress",
                str(prog.paths[i]),
                "--threads",
                str(opts.producer_threads),
                "--linger",
                *_trace_args(opts),
            ],
            logs / f"producer-{i}-{spawned[i]}.log",
        )

    slots = {i: spawn(i) for i in range(len(work))}
    crashes = 0
    task = progress.add_task("order service: sent", total=total)
    while len(prog.ended) < len(work):
        time.sleep(0.2)
        prog.refresh()
        progress.update(task, completed=len(prog.attempted))
        for i, p in list(slots.items()):
            rc = p.poll()
            if rc is None:
                continue
            if rc == -9:
                crashes += 1
                slots[i] = spawn(i)  # a fresh producer carries on with the orders not yet sent
            else:
                raise DemoError(f"producer {i} exited with {rc}; see {p.log_path}")
    progress.update(task, completed=total)
    return prog, list(slots.values()), crashes


def _wait_settled(brokers: Brokers, progress: Progress) -> dict[str, int]:
    """Wait until no broker holds a pending half; returns the counts summed over the brokers."""
    task = progress.add_task("broker: settle halves", total=None)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        stats = brokers.transaction_stats()
        settled = stats["COMMIT"] + stats["ROLLBACK"] + stats["DISCARD"]
        progress.update(task, total=settled + stats["PENDING"], completed=settled)
        if stats["PENDING"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise DemoError(
                f"{stats['PENDING']} half messages still pending after {SETTLE_TIMEOUT_S:.0f} s"
            )
        time.sleep(0.25)


def _wait_ledger(db: Path, expected: set[int], progress: Progress) -> tuple[set[int], int]:
    task = progress.add_task("ledger: received", total=len(expected))
    deadline = time.monotonic() + LEDGER_TIMEOUT_S
    while True:
        received, _ = ledger.ledger_counts(db)
        progress.update(task, completed=len(received & expected))
        if expected <= received or time.monotonic() > deadline:
            time.sleep(1.0)  # let late redeliveries land before counting
            return ledger.ledger_counts(db)
        time.sleep(0.25)


def _wait_compensated(order_db: Path, expected: set[int], progress: Progress) -> set[int]:
    """Wait until the orders the ledger rejects are cancelled; returns the cancelled order keys."""
    task = progress.add_task("orders: compensated", total=len(expected))
    deadline = time.monotonic() + COMPENSATE_TIMEOUT_S
    while True:
        cancelled = orderdb.committed_orderkeys(order_db) - orderdb.committed_orderkeys(
            order_db, include_cancelled=False)
        progress.update(task, completed=len(cancelled & expected))
        if expected <= cancelled or time.monotonic() > deadline:
            time.sleep(1.0)  # a late duplicate rollback would show now
            return orderdb.committed_orderkeys(order_db) - orderdb.committed_orderkeys(
                order_db, include_cancelled=False)
        time.sleep(0.25)


def _spark_stage(opts: DemoOptions, brokers: Brokers, order_db: Path, progress: Progress,
                 with_rollbacks: bool = True) -> dict[str, Any]:
    """The Spark query over txmq's ``orders`` (and, ``with_rollbacks``, its rollback topic), checked
    against the order database's oracles (cancelled orders excluded only ``with_rollbacks``)."""
    from txmq import spark as txspark
    from txmq.demo import spark_pipeline as pipeline

    task = progress.add_task("spark: streaming query", total=None)
    spark = txspark.spark_session("txmq-demo", master=opts.spark_master)
    run_dir = opts.run_dir.resolve()  # executors of a cluster run in their own directories
    try:
        txspark.register(spark)
        stream = (
            spark.readStream.format("txmq")
            .options(**brokers.spark_options())
            .option("topic", f"{TOPIC},{ROLLBACK_TOPIC}" if with_rollbacks else TOPIC)
            .option("startingOffsets", "earliest")
            .load()
        )
        out = run_dir / "spark" / "lineitems"
        q = pipeline.start_lineitem_stream(
            stream, out, run_dir / "spark" / "checkpoint", query_name="orders_lineitems"
        )
        q.awaitTermination()
        q1_df = pipeline.q1(spark, out)
        rev_df = pipeline.revenue_by_orderdate(spark, out)
        pipeline.write_results(q1_df, rev_df, run_dir / "spark")
        live = pipeline.committed_lineitems(spark, out)  # committed minus compensated
        keys = {r[0] for r in live.select("o_orderkey").distinct().collect()}
        q1_rows, rev_rows = pipeline.collect_rows(q1_df), pipeline.collect_rows(rev_df)
    finally:
        spark.stop()
        progress.update(task, total=1, completed=1)
    return {
        "orderkeys": keys,
        "q1_diffs": pipeline.compare_q1(
            q1_rows, orderdb.q1_oracle(order_db, exclude_cancelled=with_rollbacks)),
        "revenue_diffs": pipeline.compare_revenue(
            rev_rows, orderdb.revenue_oracle(order_db, exclude_cancelled=with_rollbacks)),
        "q1_rows": q1_rows,
    }


def _trace_args(opts: DemoOptions) -> list[str]:
    """A service process's ``--trace-file`` arguments (none when not tracing)."""
    path = opts.trace_file
    return [] if path is None else ["--trace-file", str(path)]


def _start_services(opts: DemoOptions, brokers: Brokers, side: _Outbox, order_db: Path,
                    ledger_db: Path) -> tuple[list[ServiceProcess], ServiceProcess]:
    """Start the ledger processes and the order service's compensation consumer."""
    ledgers = [
        ServiceProcess(
            "txmq.demo.ledger",
            [*brokers.args(), "--db", str(ledger_db), *side.args(), *_trace_args(opts)],
            opts.run_dir / "logs" / f"ledger-{i}.log",
        )
        for i in range(opts.ledgers)
    ]
    compensator = ServiceProcess(
        "txmq.demo.order_service",
        [*brokers.args(), "--db", str(order_db), "--compensate", *side.args(), *_trace_args(opts)],
        opts.run_dir / "logs" / "compensation.log",
    )
    return ledgers, compensator


@contextmanager
def _spark_master(opts: DemoOptions, stage: _Stages, console: Console) -> Iterator[None]:
    """With ``opts.spark_cluster``: a standalone cluster started for the Spark stage (its start
    timed as stage ``spark_cluster_start``), ``opts.spark_master`` pointing at it, stopped after."""
    if not opts.spark_cluster:
        yield
        return
    from txmq.testing import SparkCluster

    with stage("spark_cluster_start"):
        cluster = SparkCluster(opts.run_dir / "spark-cluster", workers=SPARK_CLUSTER_WORKERS).start()
    opts.spark_master = cluster.master_url
    console.print(f"Spark standalone cluster at {cluster.master_url}: {SPARK_CLUSTER_WORKERS} "
                  f"workers of 1 core")
    try:
        yield
    finally:
        cluster.stop()


def _skipped_spark() -> dict[str, Any]:
    return {"orderkeys": set(), "q1_diffs": [], "revenue_diffs": [], "q1_rows": [], "skipped": True}


def run_demo(opts: DemoOptions, console: Console) -> dict[str, Any]:
    """Run the whole demo; returns the report (also written as JSON).

    Raises:
        DemoError: a process failed or a wait timed out.
        ConfigError: a bad ``outbox_transport`` / ``outbox_url``, or both ``spark_cluster`` and
            a ``spark_master`` other than ``local[…]``, or a ``spark_master`` that is neither.
        txmq.testing.SparkClusterError: the cluster of ``spark_cluster`` did not start.
    """
    _check_spark_master(opts)
    t0 = time.monotonic()
    stage = _Stages()
    side = _resolve_outbox(opts)
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    if opts.trace_file is not None:
        opts.trace_file.unlink(missing_ok=True)  # a reused run directory: this run's spans only
    order_db, ledger_db = opts.run_dir / "orders.db", opts.run_dir / "ledger.db"
    with stage("generate"):
        orders, work = _prepare_work(opts, console)
    orderdb.init_db(order_db)
    order_service.init_tx_log(order_db)
    ledger.init_db(ledger_db)
    with stage("broker_start"):
        brokers = _start_broker(opts)
    console.print(f"{brokers.describe()}; ROLLBACK events over {side.kind} to {side.rollback_topic}; "
                  f"run directory {opts.run_dir}")
    ledgers, compensator = _start_services(opts, brokers, side, order_db, ledger_db)
    producers: list[ServiceProcess] = []
    try:
        with _progress(console) as progress:
            with stage("produce"):
                prog, producers, crashes = _run_producers(
                    opts, brokers, order_db, work, len(orders), progress
                )
            with stage("settle"):
                stats = _wait_settled(brokers, progress)
            stored = brokers.stored(TOPIC)
            for p in producers:
                p.terminate()
            committed = orderdb.committed_orderkeys(order_db)
            rejected = {k for k in committed if ledger_rejects(k)}
            with stage("ledger"):
                received, dups = _wait_ledger(ledger_db, committed - rejected, progress)
            with stage("compensate"):
                cancelled = _wait_compensated(order_db, rejected, progress)
            for p in [*ledgers, compensator]:
                p.terminate()
            spark = _skipped_spark()
            if opts.spark:
                with _spark_master(opts, stage, console), stage("spark"):
                    spark = _spark_stage(opts, brokers, order_db, progress,
                                         with_rollbacks=side.kind == "txmq")
        replica = brokers.replica_report()
    finally:
        for p in [*producers, *ledgers, compensator]:
            p.terminate()
        brokers.stop()
    comp = {"rejected": rejected, "cancelled": cancelled, **ledger.ledger_rejected(ledger_db)}
    report = _report(opts, orders, prog, stats, crashes, committed, received, dups, spark, comp,
                     stage.seconds, time.monotonic() - t0, side,
                     {**_cluster_report(brokers, stored), **replica, **_trace_report(opts)})
    return report


def _trace_report(opts: DemoOptions) -> dict[str, Any]:
    """The report's trace part: the file (None: untraced), and an order whose trace shows a
    check-back and a compensation, with the command that shows it (after every service process
    ended, so their spans are in the file)."""
    path = opts.trace_file
    if path is None or not path.exists():
        return {"trace_file": None, "trace_example": None}
    found = traces.example_trace([path])
    if found is None:
        return {"trace_file": str(path), "trace_example": None}
    trace_id, key = found
    return {"trace_file": str(path), "trace_example": {
        "order_key": key, "trace_id": trace_id,
        "command": f"txmq trace show {path} --trace-id {trace_id}"}}


def _cluster_report(brokers: Brokers, stored: dict[str, int]) -> dict[str, Any]:
    """The report's broker part: how many, the name servers ("" with one broker), and the orders
    each broker stored (messages of ``orders``)."""
    return {"brokers": len(brokers.masters), "namesrv_addr": brokers.namesrv_addr,
            "orders_stored_per_broker": stored, "orders_stored": sum(stored.values())}


def _compensation_report(committed: set[int], received: set[int],
                         comp: dict[str, set[int]]) -> dict[str, Any]:
    """The local message table's part: rejected by the ledger → ROLLBACK event → cancelled."""
    rejected, cancelled = comp["rejected"], comp["cancelled"]
    return {
        "ledger_rejected": len(comp["given_up"]),
        "rollback_events_sent": len(comp["rollback_sent"]),
        "compensated": len(cancelled),
        "rejects_planned": len(rejected),
        "uncompensated": len(rejected - cancelled),
        "wrongly_cancelled": len(cancelled - rejected),
        "lost": len(committed - rejected - received),
        "phantom": len(received - (committed - rejected)),
    }


def _consistent(report: dict[str, Any], live: int) -> bool:
    """The verdict: nothing lost or phantom, every planned rejection compensated once, (unless
    skipped) Spark's orders and aggregates equal to the ``live`` orders and the oracles, and with a
    slave its commit log byte-identical to the master's."""
    return bool(
        report["committed"] > 0
        and (not report.get("replicas") or report["slave_log_identical"])
        and report["lost"] == 0
        and report["phantom"] == 0
        and report["ledger_rejected"] == report["compensated"] == report["rejects_planned"]
        and report["uncompensated"] == 0
        and report["wrongly_cancelled"] == 0
        and (report["spark_skipped"] or (
            report["spark_orders"] == live
            and report["spark_missing"] == 0
            and report["q1_matches_oracle"]
            and report["revenue_matches_oracle"]))
    )


def _report(
    opts: DemoOptions,
    orders: list[tpch.Order],
    prog: _ProgressFiles,
    stats: dict[str, int],
    crashes: int,
    committed: set[int],
    received: set[int],
    dups: int,
    spark: dict[str, Any],
    comp: dict[str, set[int]],
    stages: dict[str, float],
    elapsed: float,
    side: _Outbox,
    cluster: dict[str, Any],
) -> dict[str, Any]:
    faults = Counter(fault_of(o.o_orderkey) for o in orders)
    unknown_keys = {k for k, s in prog.done.items() if s == "UNKNOWN"}
    crash_keys = {
        o.o_orderkey
        for o in orders
        if fault_of(o.o_orderkey) in (Fault.CRASH_AFTER_COMMIT, Fault.CRASH_BEFORE_COMMIT)
    }
    delivered = received | comp["cancelled"]  # booked by the ledger, or rejected and compensated
    # what Spark must show: committed minus compensated; all committed when the rollback events
    # travel over another broker (Spark reads txmq only)
    live = committed - comp["cancelled"] if side.kind == "txmq" else committed
    report: dict[str, Any] = {
        "sf": opts.sf,
        "outbox_transport": side.kind,
        "outbox_url": _without_password(side.url),
        "rollback_topic": side.rollback_topic,
        **cluster,
        "orders_total": len(orders),
        "committed": len(committed),
        "rolled_back": stats["ROLLBACK"],
        "discarded": stats["DISCARD"],
        "unknown_returned": len(unknown_keys),
        "unknown_resolved_by_check": len(unknown_keys & committed & delivered),
        "producer_crashes": crashes,
        "crash_orders_committed_by_check": len(crash_keys & committed & delivered),
        "crash_orders_rolled_back_by_check": len(crash_keys - committed),
        "resent_after_crash": sum(1 for n in prog.attempted.values() if n > 1),
        "orders_never_settled": len(set(prog.attempted) - set(prog.done) - crash_keys),
        "orders_not_committed": len(orders) - len(committed),
        "check_backs": stats["checks_sent"],
        "check_backs_answered": stats["checks_answered"],
        "duplicate_end_requests": stats["duplicate_ends"],
        "ledger_received_distinct": len(received),
        "ledger_duplicates": dups,
        **_compensation_report(committed, received, comp),
        "spark_skipped": bool(spark.get("skipped")),
        "spark_master": opts.spark_master,
        "spark_stage_s": stages.get("spark"),
        "spark_orders": len(spark["orderkeys"]),
        "spark_missing": len(live - spark["orderkeys"]),
        "spark_phantom": len(spark["orderkeys"] - live),
        "q1_matches_oracle": not spark["q1_diffs"],
        "revenue_matches_oracle": not spark["revenue_diffs"],
        "q1_diffs": spark["q1_diffs"][:20],
        "revenue_diffs": spark["revenue_diffs"][:20],
        "faults_planned": {f.value: n for f, n in sorted(faults.items(), key=lambda x: x[0].value)},
        "elapsed_s": round(elapsed, 3),
        "stages": stages,
        "run_dir": str(opts.run_dir),
    }
    report["consistent"] = _consistent(report, len(live))
    path = opts.report or opts.run_dir / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report
