"""The demo's Spark side: committed order messages → line items (exactly once) → TPC-H Q1.

Flow: a streaming DataFrame with a binary ``body`` column (one :func:`txmq.demo.tpch.encode_order`
JSON per row, e.g. from txmq's Spark source) → :func:`explode_orders` (one row per line item) →
:func:`start_lineitem_stream`, a Parquet file sink whose ``_spark_metadata`` log makes every
micro-batch visible exactly once → batch queries :func:`q1` and :func:`revenue_by_orderdate` over
that directory → :func:`compare_q1` against :func:`txmq.demo.orderdb.q1_oracle`.

Compensation: the stream may also carry ROLLBACK events of the local message table (a row whose
``properties`` map has ``TXMQ_OUTBOX_TX_TYPE = ROLLBACK``, its body the order it undoes). Every line
item row records its event's ``tx_type``, and the batch queries read *committed minus compensated*
orders: COMMIT rows of orders that no ROLLBACK row names (:func:`committed_lineitems`). A rollback
delivered twice removes its order once.

Every money column stays an exact integer (see :data:`txmq.demo.tpch.Q1_SCALES`); Spark sums
``BIGINT`` with ANSI mode on (the Spark 4 default), so an overflow fails the query instead of
wrapping. pyspark is imported inside the functions only: importing this module does not load it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from txmq.demo.tpch import (
    LINEITEM_ROW_SPARK_SCHEMA,
    ORDER_SPARK_SCHEMA,
    Q1_AVG_COLUMNS,
    Q1_EXACT_COLUMNS,
    Q1_KEY_COLUMNS,
    Q1_SHIPDATE_MAX,
)
from txmq.extras import require_extra

require_extra("demo", "txmq.demo.spark_pipeline", "pyspark")

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "collect_rows",
    "committed_lineitems",
    "compare_q1",
    "compare_revenue",
    "compare_rows",
    "explode_orders",
    "q1",
    "revenue_by_orderdate",
    "start_lineitem_stream",
    "write_results",
]

"""``spark.sql.shuffle.partitions`` (the value :func:`txmq.spark.spark_session` sets)."""

AVG_REL_TOL: Final = 1e-9
"""Relative tolerance for float columns in :func:`compare_q1`; integer columns must be equal."""

_DISC_PRICE_SQL: Final = "l_extendedprice_c * (100 - l_discount_c)"
_TX_TYPE_PROPERTY: Final = "TXMQ_OUTBOX_TX_TYPE"  # txmq.outbox.PROPERTY_OUTBOX_TX_TYPE
_SINK_SCHEMA: Final = f"tx_type STRING, {LINEITEM_ROW_SPARK_SCHEMA}"


def explode_orders(df: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
    """One row per line item from a DataFrame of order message bodies (streaming or batch).

    ``df`` must have a binary (or string) ``body`` column holding UTF-8 JSON from
    :func:`~txmq.demo.tpch.encode_order`. The result has the columns of
    :data:`~txmq.demo.tpch.LINEITEM_ROW_SPARK_SCHEMA` (``o_orderkey``, ``o_orderdate`` as DATE, then
    every lineitem column; ``*_c`` columns are BIGINT hundredths), preceded by the ``keep`` columns
    of ``df`` (e.g. a queue offset) if any. Bodies are parsed in FAILFAST mode: a malformed body
    fails the query rather than being dropped silently.
    """
    from pyspark.sql import functions as F

    parsed = df.select(
        *keep,
        F.from_json(F.col("body").cast("string"), ORDER_SPARK_SCHEMA, {"mode": "FAILFAST"}).alias("o"),
    )
    exploded = parsed.select(
        *keep,
        F.col("o.o_orderkey").alias("o_orderkey"),
        F.col("o.o_orderdate").alias("o_orderdate"),
        F.explode("o.lineitems").alias("l"),
    )
    return exploded.select(*keep, "o_orderkey", "o_orderdate", "l.*")


def start_lineitem_stream(
    stream_df: DataFrame, out_dir: Path, checkpoint: Path, *, query_name: str | None = None
) -> StreamingQuery:
    """Start writing :func:`explode_orders` of ``stream_df`` to Parquet under ``out_dir``.

    A file sink with checkpoint ``checkpoint`` and ``trigger(availableNow=True)``: the query
    processes what the source has now, in one or more micro-batches, then stops by itself (wait
    with ``query.awaitTermination()``). Restarting with the same checkpoint resumes after the last
    committed batch; readers of ``out_dir`` see only files listed in its ``_spark_metadata`` log,
    so each micro-batch is visible exactly once. Returns the running StreamingQuery.

    Each row also gets ``tx_type``: ``ROLLBACK`` for a ROLLBACK event of the local message table (by
    its ``properties`` column, when ``stream_df`` has one), else ``COMMIT``.
    """
    from pyspark.sql import functions as F

    tx_type = F.lit("COMMIT")
    if "properties" in stream_df.columns:
        tx_type = F.coalesce(F.col("properties").getItem(_TX_TYPE_PROPERTY), tx_type)
    writer = (
        explode_orders(stream_df.withColumn("tx_type", tx_type), keep=("tx_type",))
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(out_dir))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if query_name is not None:
        writer = writer.queryName(query_name)
    return writer.start()


def committed_lineitems(spark: SparkSession, lineitem_parquet_dir: Path) -> DataFrame:
    """Line items written by :func:`start_lineitem_stream`, committed minus compensated.

    COMMIT rows (``tx_type`` COMMIT, or missing in files written before the column existed) of the
    orders that no ROLLBACK row names; columns of :data:`~txmq.demo.tpch.LINEITEM_ROW_SPARK_SCHEMA`.
    """
    from pyspark.sql import functions as F

    rows = spark.read.schema(_SINK_SCHEMA).parquet(str(lineitem_parquet_dir))
    tx = F.coalesce(F.col("tx_type"), F.lit("COMMIT"))
    undone = rows.where(tx == "ROLLBACK").select("o_orderkey").distinct()
    return (rows.where(tx == "COMMIT").join(undone, "o_orderkey", "left_anti")
            .select(*(c.split(" ")[0] for c in LINEITEM_ROW_SPARK_SCHEMA.split(", "))))



def q1(spark: SparkSession, lineitem_parquet_dir: Path) -> DataFrame:
    """TPC-H Query 1 over the line items written by :func:`start_lineitem_stream` (committed minus
    compensated orders, :func:`committed_lineitems`).

    One row per (``l_returnflag``, ``l_linestatus``), sorted by them; columns and scales exactly as
    :func:`txmq.demo.orderdb.q1_oracle`: the key columns (STRING), the exact columns (BIGINT at the
    scales of :data:`~txmq.demo.tpch.Q1_SCALES`), the averages (DOUBLE, natural units, computed as
    ``sum of hundredths / count / 100``).
    """
    from pyspark.sql import functions as F

    disc_price = F.expr(_DISC_PRICE_SQL)
    grouped = (
        committed_lineitems(spark, lineitem_parquet_dir)
        .where(F.col("l_shipdate") <= F.lit(dt.date.fromisoformat(Q1_SHIPDATE_MAX)))
        .groupBy(*Q1_KEY_COLUMNS)
        .agg(
            F.sum("l_quantity_c").alias("sum_qty_c"),
            F.sum("l_extendedprice_c").alias("sum_base_price_c"),
            F.sum(disc_price).alias("sum_disc_price_e4"),
            F.sum(disc_price * (F.lit(100) + F.col("l_tax_c"))).alias("sum_charge_e6"),
            F.count(F.lit(1)).alias("count_order"),
            F.sum("l_discount_c").alias("_sum_disc_c"),
        )
    )

    def avg(total: str) -> Any:
        return F.col(total).cast("double") / F.col("count_order") / F.lit(100.0)

    averaged = (avg("sum_qty_c"), avg("sum_base_price_c"), avg("_sum_disc_c"))
    return grouped.select(
        *Q1_KEY_COLUMNS,
        *Q1_EXACT_COLUMNS,
        *(a.alias(n) for a, n in zip(averaged, Q1_AVG_COLUMNS, strict=True)),
    ).orderBy(*Q1_KEY_COLUMNS)


def revenue_by_orderdate(spark: SparkSession, lineitem_parquet_dir: Path) -> DataFrame:
    """Revenue per order date over all committed line items (no ship date filter), sorted by date.

    Columns: ``o_orderdate`` (DATE), ``revenue_e4`` (BIGINT, ``Σ l_extendedprice_c·(100 −
    l_discount_c)`` in units of 10⁻⁴), ``lineitem_count`` (BIGINT). Same rows as
    :func:`txmq.demo.orderdb.revenue_oracle` once dates are ISO strings (see :func:`collect_rows`).
    """
    from pyspark.sql import functions as F

    return (
        committed_lineitems(spark, lineitem_parquet_dir)
        .groupBy("o_orderdate")
        .agg(
            F.sum(F.expr(_DISC_PRICE_SQL)).alias("revenue_e4"),
            F.count(F.lit(1)).alias("lineitem_count"),
        )
        .orderBy("o_orderdate")
    )


def write_results(q1_df: DataFrame, revenue_df: DataFrame, run_dir: Path) -> dict[str, Path]:
    """Write the Q1 and revenue results as single-file Parquet datasets under ``run_dir``.

    Returns ``{"q1": run_dir / "q1", "revenue_by_orderdate": run_dir / "revenue_by_orderdate"}``;
    existing results there are replaced.
    """
    paths = {"q1": run_dir / "q1", "revenue_by_orderdate": run_dir / "revenue_by_orderdate"}
    for name, df in (("q1", q1_df), ("revenue_by_orderdate", revenue_df)):
        df.coalesce(1).write.mode("overwrite").parquet(str(paths[name]))
    return paths


def collect_rows(df: DataFrame) -> list[dict[str, Any]]:
    """Collect a (small) DataFrame as dicts, with DATE values as ISO strings like the oracle's."""
    return [
        {k: v.isoformat() if isinstance(v, dt.date) else v for k, v in row.asDict().items()}
        for row in df.collect()
    ]


def compare_rows(
    actual: Iterable[dict[str, Any]],
    expected: Iterable[dict[str, Any]],
    *,
    key: Sequence[str],
    exact: Sequence[str],
    approx: Sequence[str] = (),
    label: str = "spark",
) -> list[str]:
    """Differences between two result sets keyed by ``key``; empty means they match.

    ``exact`` columns must be equal; ``approx`` columns within relative :data:`AVG_REL_TOL`.
    Reports duplicate keys, rows only on one side, and every differing value, in key order.
    """
    diffs: list[str] = []
    sides: list[dict[tuple[Any, ...], dict[str, Any]]] = []
    for name, rows in ((label, actual), ("oracle", expected)):
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in rows:
            k = tuple(row[c] for c in key)
            if k in by_key:
                diffs.append(f"{name}: duplicate row for {k}")
            by_key[k] = row
        sides.append(by_key)
    got, want = sides
    for k in sorted(got.keys() | want.keys()):
        if k not in want:
            diffs.append(f"{k}: only in {label}: {got[k]}")
        elif k not in got:
            diffs.append(f"{k}: missing from {label} (oracle has {want[k]})")
        else:
            diffs.extend(_row_diffs(k, got[k], want[k], exact, approx, label))
    return diffs


def _row_diffs(
    k: tuple[Any, ...],
    got: dict[str, Any],
    want: dict[str, Any],
    exact: Sequence[str],
    approx: Sequence[str],
    label: str,
) -> list[str]:
    out = [
        f"{k} {c}: {label} {got.get(c)!r} != oracle {want.get(c)!r}"
        for c in exact
        if got.get(c) != want.get(c)
    ]
    for c in approx:
        a, b = got.get(c), want.get(c)
        if a is None or b is None or not math.isclose(a, b, rel_tol=AVG_REL_TOL, abs_tol=0.0):
            out.append(f"{k} {c}: {label} {a!r} != oracle {b!r} (rel tol {AVG_REL_TOL})")
    return out


def compare_q1(spark_rows: list[dict[str, Any]], oracle_rows: list[dict[str, Any]]) -> list[str]:
    """Human-readable differences between Spark's and the oracle's Q1 rows; ``[]`` = match.

    Keys, counts and integer sums must be equal; averages within relative 1e-9.
    """
    return compare_rows(
        spark_rows, oracle_rows, key=Q1_KEY_COLUMNS, exact=Q1_EXACT_COLUMNS, approx=Q1_AVG_COLUMNS
    )


def compare_revenue(spark_rows: list[dict[str, Any]], oracle_rows: list[dict[str, Any]]) -> list[str]:
    """Differences between :func:`revenue_by_orderdate` (via :func:`collect_rows`) and
    :func:`txmq.demo.orderdb.revenue_oracle` rows; ``[]`` = match (all columns exact)."""
    return compare_rows(spark_rows, oracle_rows, key=("o_orderdate",), exact=("revenue_e4", "lineitem_count"))
