"""``txmq bench spark``: the Spark connectors against their yardsticks, in one run.

- source: rows/s a streaming query (``Trigger.AvailableNow``, noop sink) reads from txmq, vs the same
  query reading the same rows from the reference source (the same batches already in memory, see
  :mod:`txmq.spark._bench_reference`: the ceiling of PySpark's Python data source API) and from
  Parquet;
- sink: rows/s written through the transactional sink (half messages + batch commit), vs the broker's
  plain send rate of the same rows from one client with the same number of requests in flight.

Every size (``--rows``, default 50,000 and 200,000) is measured in the same Spark session and
against the same broker, one after the other. Spark start-up is excluded: warm-up queries first
start Spark's Python workers and streaming machinery on each timed path (see ``_warm_up``). During
each timed run the CPU time of the broker, of Spark's JVM and of the Python processes under it is
read from ``/proc`` (µs per row). JSON: ``{"master": ..., "sizes": {"<rows>": {"source_rows_per_s",
"reference_rows_per_s", "parquet_rows_per_s", "sink_rows_per_s", "plain_send_msgs_per_s", +
ratios}}, "cpu_us_per_row": {"<rows>": {"<run>": {"broker", "jvm", "python"}}}}``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq.client import AsyncProducer, Message, PullConsumer
from txmq.errors import RequestTimeout
from txmq.serving import new_event_loop
from txmq.testing import BrokerProcess, process_cpu_s

__all__ = ["spark"]

_log = logging.getLogger(__name__)

_IN_FLIGHT = 64
_QUEUES = 4
_DEFAULT_ROWS = (50_000, 200_000)
_SHM = Path("/dev/shm")


async def _fill(endpoints: str, rows: int, body_bytes: int) -> float | None:
    """Load topic ``src<rows>`` with batch sends; then time plain sends of the same rows (None,
    logged, when one of them times out: the machine is too loaded; the source runs go on)."""
    p = AsyncProducer("bench-fill", endpoints)
    await p.start()
    try:
        body = b"x" * body_bytes
        for i in range(0, rows, 512):
            await p.send_batch([Message(topic=f"src{rows}", body=body, keys=str(i + j))
                                for j in range(min(512, rows - i))])
        await p.route(f"plain{rows}")  # once, not by 64 sends at a time (timed out under load)
        sem = asyncio.Semaphore(_IN_FLIGHT)

        async def one(i: int) -> None:
            async with sem:
                await p.send(Message(topic=f"plain{rows}", body=body, keys=str(i)))

        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(one(i) for i in range(rows)))
        except RequestTimeout as exc:
            _log.error("plain sends of %d rows failed: %s", rows, exc)
            return None
        return rows / (time.perf_counter() - t0)
    finally:
        await p.shutdown()


def _write_reference(endpoints: str, topic: str, directory: Path, limit: int | None = None) -> int:
    """Read every queue of ``topic`` (its first ``limit`` rows) with the txmq source's own executor
    code and keep its batches as the reference source's files (so both yield the very same rows)."""
    from txmq.spark._bench_reference import write_reference
    from txmq.spark._source import QueueRange, read_queue_range

    consumer = PullConsumer(endpoints=endpoints, consumer_group="bench-reference")
    consumer.start()
    try:
        ends = {q: min(consumer.max_offset(topic, q), limit or 2**62) for q in consumer.queue_ids(topic)}
    finally:
        consumer.shutdown()

    def queues() -> Iterator[tuple[int, Iterator[Any]]]:
        for q, end in ends.items():
            yield q, read_queue_range(QueueRange(endpoints, "bench-reference", topic, q, 0, end))

    return write_reference(directory, queues())


_START_ATTEMPTS = 3
"""Runs of a query that Spark failed to start (its Python process did not connect back in time,
which happens on a saturated machine) before the benchmark gives up."""


def _timed_available_now(writer: Any) -> float:
    """Seconds of one ``Trigger.AvailableNow`` run of ``writer``'s query, from its start to its end.
    A run whose Python process did not connect back to Spark in time is run again (at most
    :data:`_START_ATTEMPTS` in all; same checkpoint, so the same rows) and only the last is timed."""
    from pyspark.errors import StreamingQueryException

    for attempt in range(1, _START_ATTEMPTS + 1):
        t0 = time.perf_counter()
        try:
            writer.trigger(availableNow=True).start().awaitTermination()
        except StreamingQueryException as exc:
            if "failed to connect back" not in str(exc) or attempt == _START_ATTEMPTS:
                raise
            _log.warning("a Python worker of Spark did not connect back in time; running the query again")
            continue
        return time.perf_counter() - t0
    raise AssertionError("unreachable")


def _cpu_by_role(broker_pid: int) -> dict[str, float]:
    """CPU seconds so far of the broker, of Spark's JVM and of the other processes under this one
    (Spark's Python workers and its streaming source runner), from ``/proc`` (Linux)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            head, tail = stat.rsplit(")", 1)
            parents[int(entry.name)] = int(tail.split()[1])
            names[int(entry.name)] = head.split("(", 1)[1]
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        mine.update(kids)
        todo += kids
    out = {"broker": process_cpu_s(broker_pid, children=True), "jvm": 0.0, "python": 0.0}
    for pid in mine - {broker_pid}:
        out["jvm" if names[pid] == "java" else "python"] += process_cpu_s(pid, children=True)
    return out


class _Timer:
    """Times streaming runs and the CPU each process role spends in them (µs per row)."""

    def __init__(self, broker_pid: int, rows: int) -> None:
        self.broker_pid, self.rows = broker_pid, rows
        self.cpu: dict[str, dict[str, float]] = {}
        self.all_rates: dict[str, list[int]] = {}

    def run(self, name: str, writer: Any) -> float:
        before = _cpu_by_role(self.broker_pid)
        seconds = _timed_available_now(writer)
        after = _cpu_by_role(self.broker_pid)
        self.cpu[name] = {k: round((after[k] - before[k]) / self.rows * 1e6, 2) for k in after}
        return seconds


def _warm_up(spark_: Any, endpoints: str, work: Path, shm: Path, schema: Any, rows: int) -> None:
    """Start Spark's Python workers and streaming machinery on every timed path, so no timing pays
    for them: full reads of both inputs (``limit(n).collect()`` would stop reading a worker's output
    part-way and Spark would kill that worker), then a 100-row streaming run of each timed query
    shape: sink into topic ``warm``, txmq source from it, reference source (25 rows of each queue:
    its 4 partitions start a Python worker on each core), Parquet source."""
    src = f"src{rows}"
    spark_.read.format("txmq").option("endpoints", endpoints).option("topic", src).load().count()
    spark_.read.parquet(str(work / f"parquet{rows}")).count()
    spark_.read.parquet(str(work / f"parquet{rows}")).limit(100).write.parquet(str(work / "warm"))
    _timed_available_now(
        spark_.readStream.schema(schema).parquet(str(work / "warm")).select("key", "body")
        .writeStream.format("txmq").option("endpoints", endpoints).option("topic", "warm")
        .option("checkpointLocation", str(work / "w0")))
    _timed_available_now(
        spark_.readStream.format("txmq").option("endpoints", endpoints).option("topic", "warm").load()
        .writeStream.format("noop").option("checkpointLocation", str(work / "w1")))
    _write_reference(endpoints, src, shm / "warm", limit=25)
    _timed_available_now(
        spark_.readStream.format("txmq-reference").option("path", str(shm / "warm")).load()
        .writeStream.format("noop").option("checkpointLocation", str(work / "w3")))
    _timed_available_now(spark_.readStream.schema(schema).parquet(str(work / "warm"))
                         .writeStream.format("noop").option("checkpointLocation", str(work / "w2")))


def _measure(spark_: Any, bp: BrokerProcess, work: Path, shm: Path, rows: int, warm: bool,
             repeat: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Rows/s of the best of ``repeat`` runs of each source query (runs round-robin) and of one
    sink run, the CPU µs per row each process role spent in each run (``"<run>#<i>"``; the best
    run's also under ``"<run>"``) and every run's rows/s (``"rates"``)."""
    from pyspark.errors import StreamingQueryException

    endpoints = bp.endpoints
    src, pq = f"src{rows}", str(work / f"parquet{rows}")
    spark_.read.format("txmq").option("endpoints", endpoints).option("topic", src).load() \
        .write.parquet(pq)
    schema = spark_.read.parquet(pq).schema
    ref = shm / f"ref{rows}"
    if _write_reference(endpoints, src, ref) != rows:
        raise RuntimeError(f"the reference files do not hold {rows} rows")
    if not warm:
        _warm_up(spark_, endpoints, work, shm, schema, rows)
    assert bp.proc is not None
    timer = _Timer(bp.proc.pid, rows)
    queries: dict[str, Callable[[], Any]] = {
        "source": lambda: spark_.readStream.format("txmq").option("endpoints", endpoints)
        .option("topic", src).load(),
        "reference": lambda: spark_.readStream.format("txmq-reference").option("path", str(ref))
        .load(),
        "parquet": lambda: spark_.readStream.schema(schema).parquet(pq),
    }
    seconds: dict[str, float] = {}
    for i in range(repeat):  # round-robin, so a burst of other load hits every run alike
        for name, query in queries.items():
            t = timer.run(f"{name}#{i}", query().writeStream.format("noop")
                          .option("checkpointLocation", str(work / f"c{rows}-{name}-{i}")))
            if t < seconds.get(name, float("inf")):
                seconds[name] = t
                timer.cpu[name] = timer.cpu[f"{name}#{i}"]
            timer.all_rates.setdefault(name, []).append(round(rows / t))
    t_src, t_ref, t_pq = seconds["source"], seconds["reference"], seconds["parquet"]
    figures = {"source_rows_per_s": rows / t_src, "reference_rows_per_s": rows / t_ref,
               "parquet_rows_per_s": rows / t_pq}
    try:
        figures["sink_rows_per_s"] = rows / timer.run(
            "sink", spark_.readStream.schema(schema).parquet(pq).select("key", "body")
            .writeStream.format("txmq").option("endpoints", endpoints).option("topic", f"out{rows}")
            .option("checkpointLocation", str(work / f"c{rows}-3")))
    except StreamingQueryException as exc:  # reported; the source figures are kept
        _log.error("sink run of %d rows failed: %s", rows, str(exc).splitlines()[0])
    return figures, {**timer.cpu, "rates": timer.all_rates}


def _start_cluster(work: Path) -> Any:
    """``txmq.testing.SparkCluster`` (2 workers of 1 core), started. Raises typer.BadParameter
    when this txmq has none."""
    cls = getattr(importlib.import_module("txmq.testing"), "SparkCluster", None)
    if cls is None:
        raise typer.BadParameter("this txmq has no txmq.testing.SparkCluster; use --spark-master",
                                 param_hint="--cluster")
    cluster = cls(work, workers=2, cores_per_worker=1)
    cluster.start()
    return cluster


def _ratios(f: dict[str, float]) -> dict[str, float]:
    out = {k: round(v, 1) for k, v in f.items()}
    out["source_to_reference_ratio"] = round(f["source_rows_per_s"] / f["reference_rows_per_s"], 3)
    out["source_to_parquet_ratio"] = round(f["source_rows_per_s"] / f["parquet_rows_per_s"], 3)
    if "sink_rows_per_s" in f and "plain_send_msgs_per_s" in f:  # absent when failed (logged)
        out["sink_to_plain_ratio"] = round(f["sink_rows_per_s"] / f["plain_send_msgs_per_s"], 3)
    return out


def _run(work: Path, shm: Path, sizes: list[int], body_bytes: int, master: str | None,
         cluster: bool, repeat: int) -> tuple[str, dict[int, dict[str, float]], dict[int, Any]]:
    import txmq.spark
    from txmq.spark import spark_session
    from txmq.spark._bench_reference import ReferenceDataSource

    topics = {"warm": 1} | {f"{t}{n}": _QUEUES for n in sizes for t in ("src", "plain", "out")}
    bp = BrokerProcess(work / "broker", {"topics": topics})
    bp.start()
    loop = new_event_loop()
    spark_cluster = None
    try:
        plain = {n: loop.run_until_complete(_fill(bp.endpoints, n, body_bytes)) for n in sizes}
        if cluster:
            spark_cluster = _start_cluster(work / "cluster")
            master = spark_cluster.master_url
        master = master or "local[2]"
        session = spark_session("txmq-bench-spark", master=master)
        try:
            txmq.spark.register(session)
            session.dataSource.register(ReferenceDataSource)
            figures, cpu = {}, {}
            for i, n in enumerate(sizes):
                figures[n], cpu[n] = _measure(session, bp, work, shm, n, i > 0, repeat)
                if (rate := plain[n]) is not None:
                    figures[n]["plain_send_msgs_per_s"] = rate
        finally:
            session.stop()
    finally:
        if spark_cluster is not None:
            spark_cluster.stop()
        loop.close()
        bp.stop()
    return master, {n: _ratios(f) for n, f in figures.items()}, cpu


def spark(json_path: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
          rows: Annotated[list[int] | None, typer.Option(
              help="Rows (messages) per measurement; repeat for several sizes "
                   "(default 50000 and 200000).")] = None,
          body_bytes: Annotated[int, typer.Option(help="Body size in bytes.")] = 256,
          spark_master: Annotated[str | None, typer.Option(
              help="Spark master URL, e.g. spark://host:7077 (default local[2]). The reference "
                   "source's files are in /dev/shm: the workers must share this host.")] = None,
          repeat: Annotated[int, typer.Option(
              help="Runs of each source query per size (round-robin); the best counts.")] = 3,
          cluster: Annotated[bool, typer.Option(
              help="Start a standalone cluster (txmq.testing.SparkCluster: a master and 2 workers "
                   "of 1 core) and run on it.")] = False) -> None:
    """Source vs reference source vs Parquet, and transactional sink vs plain send (rows/s)."""
    if cluster and spark_master:
        raise typer.BadParameter("give --cluster or --spark-master, not both")
    sizes = list(dict.fromkeys(rows or _DEFAULT_ROWS))
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="txmq-bench-spark-") as d:
        shm = Path(tempfile.mkdtemp(prefix="txmq-bench-spark-", dir=_SHM if _SHM.is_dir() else d))
        try:
            master, figures, cpu = _run(Path(d), shm, sizes, body_bytes, spark_master, cluster,
                                        max(1, repeat))
        finally:
            shutil.rmtree(shm, ignore_errors=True)
    table = Table("measure", *(f"{n:,} rows" for n in sizes),
                  title=f"txmq bench spark (rows of {body_bytes} B, {master})")
    for k in dict.fromkeys(k for n in sizes for k in figures[n]):
        table.add_row(k, *(str(figures[n].get(k, "failed")) for n in sizes))
    Console().print(table)
    cpu_table = Table("run", "process", *(f"{n:,} rows" for n in sizes),
                      title="CPU µs per row during each timed run (/proc)")
    for run in dict.fromkeys(r for n in sizes for r in cpu[n] if "#" not in r and r != "rates"):
        for role in ("broker", "jvm", "python"):
            cpu_table.add_row(run, role, *(str(cpu[n].get(run, {}).get(role, "-")) for n in sizes))
    Console().print(cpu_table)
    out = {"master": master, "body_bytes": body_bytes, "sizes": {str(n): f for n, f in figures.items()},
           "cpu_us_per_row": {str(n): c for n, c in cpu.items()}}
    print(json.dumps(out))
    if json_path is not None:
        json_path.write_text(json.dumps(out, indent=2) + "\n")
