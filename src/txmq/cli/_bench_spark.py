"""``txmq bench spark``: the Spark connectors against their yardsticks, in one run.

- source: rows/s a streaming query (``Trigger.AvailableNow``, noop sink) reads from txmq, vs the same
  query reading the same rows from Parquet;
- sink: rows/s written through the transactional sink (half messages + batch commit), vs the broker's
  plain send rate of the same rows from one client with the same number of requests in flight.

Spark start-up is excluded: warm-up queries first start Spark's Python workers and streaming
machinery on each timed path (see ``_warm_up``). JSON keys:
``source_rows_per_s``, ``parquet_rows_per_s``, ``sink_rows_per_s``, ``plain_send_msgs_per_s`` (+ ratios).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq.client import AsyncProducer, Message
from txmq.client._sync import new_event_loop
from txmq.testing import BrokerProcess

__all__ = ["spark"]

_IN_FLIGHT = 64


async def _fill(endpoints: str, rows: int, body_bytes: int) -> float:
    """Load the source topic with batch sends; then time plain sends of the same rows."""
    p = AsyncProducer("bench-fill", endpoints)
    await p.start()
    try:
        body = b"x" * body_bytes
        for i in range(0, rows, 512):
            await p.send_batch([Message(topic="src", body=body, keys=str(i + j))
                                for j in range(min(512, rows - i))])
        sem = asyncio.Semaphore(_IN_FLIGHT)

        async def one(i: int) -> None:
            async with sem:
                await p.send(Message(topic="plain", body=body, keys=str(i)))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(rows)))
        return rows / (time.perf_counter() - t0)
    finally:
        await p.shutdown()


def _timed_available_now(writer: Any) -> float:
    t0 = time.perf_counter()
    writer.trigger(availableNow=True).start().awaitTermination()
    return time.perf_counter() - t0


def _warm_up(spark_: Any, endpoints: str, work: Path, schema: Any) -> None:
    """Start Spark's Python workers and streaming machinery on every timed path, so no timing pays
    for them: full reads of both inputs (``limit(n).collect()`` would stop reading a worker's output
    part-way and Spark would kill that worker), then a 100-row streaming run of each timed query
    shape: sink into topic ``warm``, txmq source from it, Parquet source."""
    spark_.read.format("txmq").option("endpoints", endpoints).option("topic", "src").load().count()
    spark_.read.parquet(str(work / "parquet")).count()
    spark_.read.parquet(str(work / "parquet")).limit(100).write.parquet(str(work / "warm"))
    _timed_available_now(
        spark_.readStream.schema(schema).parquet(str(work / "warm")).select("key", "body")
        .writeStream.format("txmq").option("endpoints", endpoints).option("topic", "warm")
        .option("checkpointLocation", str(work / "w0")))
    _timed_available_now(
        spark_.readStream.format("txmq").option("endpoints", endpoints).option("topic", "warm").load()
        .writeStream.format("noop").option("checkpointLocation", str(work / "w1")))
    _timed_available_now(spark_.readStream.schema(schema).parquet(str(work / "warm"))
                         .writeStream.format("noop").option("checkpointLocation", str(work / "w2")))


def _measure(spark_: Any, endpoints: str, work: Path, rows: int) -> dict[str, float]:
    import txmq.spark

    txmq.spark.register(spark_)
    src = spark_.readStream.format("txmq").option("endpoints", endpoints).option("topic", "src")
    spark_.read.format("txmq").option("endpoints", endpoints).option("topic", "src").load() \
        .write.parquet(str(work / "parquet"))
    schema = spark_.read.parquet(str(work / "parquet")).schema
    _warm_up(spark_, endpoints, work, schema)
    t_src = _timed_available_now(src.load().writeStream.format("noop")
                                 .option("checkpointLocation", str(work / "c1")))
    t_pq = _timed_available_now(spark_.readStream.schema(schema).parquet(str(work / "parquet"))
                                .writeStream.format("noop").option("checkpointLocation", str(work / "c2")))
    t_sink = _timed_available_now(
        spark_.readStream.schema(schema).parquet(str(work / "parquet")).select("key", "body")
        .writeStream.format("txmq").option("endpoints", endpoints).option("topic", "out")
        .option("checkpointLocation", str(work / "c3")))
    return {"source_rows_per_s": rows / t_src, "parquet_rows_per_s": rows / t_pq,
            "sink_rows_per_s": rows / t_sink}


def spark(json_path: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
          rows: Annotated[int, typer.Option(help="Rows (messages) per measurement.")] = 50_000,
          body_bytes: Annotated[int, typer.Option(help="Body size in bytes.")] = 256) -> None:
    """Source vs Parquet, and transactional sink vs plain send (rows/s)."""
    from txmq.spark import spark_session

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="txmq-bench-spark-") as d:
        bp = BrokerProcess(Path(d) / "broker", {"topics": {"src": 4, "plain": 4, "out": 4, "warm": 1}})
        bp.start()
        loop = new_event_loop()
        try:
            plain = loop.run_until_complete(_fill(bp.endpoints, rows, body_bytes))
            session = spark_session("txmq-bench-spark")
            try:
                figures = _measure(session, bp.endpoints, Path(d), rows)
            finally:
                session.stop()
        finally:
            loop.close()
            bp.stop()
    figures["plain_send_msgs_per_s"] = plain
    figures = {k: round(v, 1) for k, v in figures.items()}
    f = figures
    f["source_to_parquet_ratio"] = round(f["source_rows_per_s"] / f["parquet_rows_per_s"], 3)
    f["sink_to_plain_ratio"] = round(f["sink_rows_per_s"] / f["plain_send_msgs_per_s"], 3)
    table = Table("measure", "value", title=f"txmq bench spark ({rows:,} rows of {body_bytes} B, local[2])")
    for k, v in figures.items():
        table.add_row(k, str(v))
    Console().print(table)
    print(json.dumps(figures))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")

