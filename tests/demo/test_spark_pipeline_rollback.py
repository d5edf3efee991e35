"""The Spark pipeline over a stream that also carries ROLLBACK events of the local message table:
Q1 over committed-minus-compensated orders equals the oracle over non-cancelled orders."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txmq.demo import orderdb, tpch
from txmq.demo import spark_pipeline as pipeline
from txmq.demo.tpch import Order

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _write(rows: list[tuple[Order, str | None]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    bodies = pa.array([tpch.encode_order(o) for o, _ in rows], pa.binary())
    props = pa.array([[] if tx is None else [("TXMQ_OUTBOX_TX_TYPE", tx)] for _, tx in rows],
                     pa.map_(pa.string(), pa.string()))
    pq.write_table(pa.table({"body": bodies, "properties": props}), path)


@pytest.mark.spark
def test_q1_subtracts_compensated_orders(spark: SparkSession, spark_orders: list[Order],
                                         tmp_path: Path) -> None:
    orders = spark_orders[:400]
    undone = orders[::40]  # 10 orders the ledger rejected; the first one's rollback arrives twice
    _write([(o, None) for o in orders[:200]], tmp_path / "in" / "part-0.parquet")
    _write([(o, "COMMIT") for o in orders[200:]] + [(o, "ROLLBACK") for o in [*undone, undone[0]]],
           tmp_path / "in" / "part-1.parquet")
    schema = "body BINARY, properties MAP<STRING,STRING>"
    stream = spark.readStream.schema(schema).parquet(str(tmp_path / "in"))
    q = pipeline.start_lineitem_stream(stream, tmp_path / "lineitems", tmp_path / "checkpoint")
    q.awaitTermination(timeout=240)
    assert q.exception() is None
    db = tmp_path / "orders.db"
    orderdb.init_db(db)
    conn = orderdb.connect(db)
    with conn:
        for o in orders:
            orderdb.insert_order(conn, o)
        conn.executemany("UPDATE orders SET cancelled = 1 WHERE o_orderkey = ?",
                         [(o.o_orderkey,) for o in undone])
    conn.close()
    rows = pipeline.collect_rows(pipeline.q1(spark, tmp_path / "lineitems"))
    assert pipeline.compare_q1(rows, orderdb.q1_oracle(db, exclude_cancelled=True)) == []
    assert pipeline.compare_q1(rows, orderdb.q1_oracle(db, exclude_cancelled=False)) != []
    rev = pipeline.collect_rows(pipeline.revenue_by_orderdate(spark, tmp_path / "lineitems"))
    assert pipeline.compare_revenue(rev, orderdb.revenue_oracle(db)) == []
    keys = {r[0] for r in pipeline.committed_lineitems(spark, tmp_path / "lineitems")
            .select("o_orderkey").distinct().collect()}
    assert keys == {o.o_orderkey for o in orders} - {o.o_orderkey for o in undone}
