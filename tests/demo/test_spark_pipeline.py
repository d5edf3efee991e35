"""The demo's Spark pipeline: order bodies → exactly-once line items → Q1, checked against SQLite."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txmq.demo import orderdb, tpch
from txmq.demo import spark_pipeline as pipeline
from txmq.demo.tpch import Order

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# --- compare_q1 / compare_rows (no Spark) ---------------------------------------------------------


def _q1_row(flag: str, status: str, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "l_returnflag": flag, "l_linestatus": status, "sum_qty_c": 3_804_560_0,
        "sum_base_price_c": 53_234_821_165, "sum_disc_price_e4": 5_058_224_414_861,
        "sum_charge_e6": 526_165_934_000_839, "count_order": 14_876,
        "avg_qty": 25.575154611454693, "avg_price": 35785.70930693735, "avg_disc": 0.0500813390696,
    }  # fmt: skip
    row.update(over)
    return row


ORACLE = [_q1_row("A", "F"), _q1_row("N", "F"), _q1_row("N", "O"), _q1_row("R", "F")]


def test_compare_q1_equal_rows_match() -> None:
    assert pipeline.compare_q1(copy.deepcopy(ORACLE), ORACLE) == []
    assert pipeline.compare_q1(list(reversed(ORACLE)), ORACLE) == []  # order does not matter


def test_compare_q1_averages_within_relative_tolerance() -> None:
    close = [dict(r, avg_price=r["avg_price"] * (1 + 1e-12)) for r in ORACLE]
    assert pipeline.compare_q1(close, ORACLE) == []
    far = [dict(r, avg_price=r["avg_price"] * (1 + 1e-7)) for r in ORACLE]
    diffs = pipeline.compare_q1(far, ORACLE)
    assert len(diffs) == 4
    assert all("avg_price" in d for d in diffs)


def test_compare_q1_integer_sums_are_exact() -> None:
    off_by_one = copy.deepcopy(ORACLE)
    off_by_one[2]["sum_charge_e6"] += 1
    assert pipeline.compare_q1(off_by_one, ORACLE) == [
        "('N', 'O') sum_charge_e6: spark 526165934000840 != oracle 526165934000839"
    ]


def test_compare_q1_reports_missing_extra_and_duplicate_groups() -> None:
    spark_rows = [*ORACLE[1:], _q1_row("X", "Y"), ORACLE[1]]
    diffs = pipeline.compare_q1(spark_rows, ORACLE)
    assert any(d.startswith("('A', 'F'): missing from spark") for d in diffs)
    assert any(d.startswith("('X', 'Y'): only in spark") for d in diffs)
    assert any(d.startswith("spark: duplicate row for ('N', 'F')") for d in diffs)
    assert pipeline.compare_q1([], ORACLE) != []
    assert pipeline.compare_q1(ORACLE, []) != []


# --- Spark ---------------------------------------------------------------------------------------


def _write_bodies(orders: list[Order], path: Path) -> None:
    """One Parquet file with a binary ``body`` column, as txmq's source would deliver it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    bodies = pa.array([tpch.encode_order(o) for o in orders], pa.binary())
    pq.write_table(pa.table({"body": bodies}), path)


def _oracle_db(orders: list[Order], path: Path) -> Path:
    orderdb.init_db(path)
    conn = orderdb.connect(path)
    with conn:
        for order in orders:
            orderdb.insert_order(conn, order)
    conn.close()
    return path


@pytest.fixture(scope="module")
def streamed(
    spark: SparkSession, spark_orders: list[Order], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """Run the lineitem stream twice on one checkpoint: first half of the bodies, then the rest.

    Returns the run dir, holding ``lineitems/`` (the sink), ``checkpoint/`` and ``orders.db``.
    """
    run = tmp_path_factory.mktemp("pipeline")
    bodies_dir = run / "bodies"
    half = len(spark_orders) // 2
    _oracle_db(spark_orders, run / "orders.db")
    for part, chunk in enumerate((spark_orders[:half], spark_orders[half:])):
        _write_bodies(chunk, bodies_dir / f"part-{part}.parquet")
        stream = spark.readStream.schema("body BINARY").parquet(str(bodies_dir))
        query = pipeline.start_lineitem_stream(stream, run / "lineitems", run / "checkpoint")
        query.awaitTermination(timeout=240)
        assert not query.isActive
        assert query.exception() is None
    return run


@pytest.mark.spark
def test_explode_orders_one_row_per_lineitem(
    spark: SparkSession, spark_orders: list[Order], tmp_path: Path
) -> None:
    order = next(o for o in spark_orders if len(o.lineitems) >= 3)
    _write_bodies([order], tmp_path / "b.parquet")
    df = pipeline.explode_orders(spark.read.parquet(str(tmp_path / "b.parquet")))
    rows = sorted(pipeline.collect_rows(df), key=lambda r: r["l_linenumber"])
    expected_cols = [c.split(" ")[0] for c in tpch.LINEITEM_ROW_SPARK_SCHEMA.split(", ")]
    assert df.columns == expected_cols
    assert len(rows) == len(order.lineitems)
    for row, li in zip(rows, order.lineitems, strict=True):
        assert row == {
            "o_orderkey": order.o_orderkey,
            "o_orderdate": order.o_orderdate,
            **{f: getattr(li, f) for f in tpch.LineItem.__struct_fields__},
        }


@pytest.mark.spark
def test_explode_orders_fails_loudly_on_malformed_body(spark: SparkSession) -> None:
    df = spark.createDataFrame([(b'{"o_orderkey": "oops", "lineitems": 7}',)], "body BINARY")
    with pytest.raises(Exception, match=r"(?i)malformed|FAILFAST|parse"):
        pipeline.explode_orders(df).collect()


@pytest.mark.spark
def test_stream_writes_each_lineitem_exactly_once(
    spark: SparkSession, spark_orders: list[Order], streamed: Path
) -> None:
    lineitems = spark.read.parquet(str(streamed / "lineitems"))
    total = sum(len(o.lineitems) for o in spark_orders)
    assert lineitems.count() == total
    assert lineitems.select("l_orderkey", "l_linenumber").distinct().count() == total
    commits = sorted(p.name for p in (streamed / "checkpoint" / "commits").iterdir() if p.name[0] != ".")
    assert commits == ["0", "1"]  # one micro-batch per run; the count shows no file twice


@pytest.mark.spark
def test_q1_matches_sqlite_oracle(spark: SparkSession, streamed: Path) -> None:
    spark_rows = pipeline.collect_rows(pipeline.q1(spark, streamed / "lineitems"))
    oracle_rows = orderdb.q1_oracle(streamed / "orders.db")
    assert len(oracle_rows) == 4
    assert pipeline.compare_q1(spark_rows, oracle_rows) == []
    assert [list(r) for r in spark_rows] == [list(r) for r in oracle_rows]  # same columns, order
    assert [type(v) for v in spark_rows[0].values()] == [type(v) for v in oracle_rows[0].values()]


@pytest.mark.spark
def test_q1_detects_a_dropped_order(
    spark: SparkSession, spark_orders: list[Order], streamed: Path, tmp_path: Path
) -> None:
    victim = next(o for o in spark_orders if any(li.l_shipdate <= tpch.Q1_SHIPDATE_MAX for li in o.lineitems))
    short_db = _oracle_db([o for o in spark_orders if o is not victim], tmp_path / "short.db")
    spark_rows = pipeline.collect_rows(pipeline.q1(spark, streamed / "lineitems"))
    diffs = pipeline.compare_q1(spark_rows, orderdb.q1_oracle(short_db))
    assert diffs
    assert any("count_order" in d for d in diffs)
    assert any("sum_charge_e6" in d for d in diffs)


@pytest.mark.spark
def test_revenue_by_orderdate_matches_oracle(spark: SparkSession, streamed: Path) -> None:
    spark_rows = pipeline.collect_rows(pipeline.revenue_by_orderdate(spark, streamed / "lineitems"))
    oracle_rows = orderdb.revenue_oracle(streamed / "orders.db")
    assert len(spark_rows) > 100
    assert pipeline.compare_revenue(spark_rows, oracle_rows) == []
    assert [r["o_orderdate"] for r in spark_rows] == sorted(r["o_orderdate"] for r in spark_rows)


@pytest.mark.spark
def test_write_results_round_trips(spark: SparkSession, streamed: Path, tmp_path: Path) -> None:
    q1_df = pipeline.q1(spark, streamed / "lineitems")
    rev_df = pipeline.revenue_by_orderdate(spark, streamed / "lineitems")
    paths = pipeline.write_results(q1_df, rev_df, tmp_path / "run")
    assert paths == {
        "q1": tmp_path / "run" / "q1",
        "revenue_by_orderdate": tmp_path / "run" / "revenue_by_orderdate",
    }
    q1_back = pq.read_table(paths["q1"]).to_pylist()
    assert pipeline.compare_q1(q1_back, orderdb.q1_oracle(streamed / "orders.db")) == []
    assert pq.read_table(paths["revenue_by_orderdate"]).num_rows == rev_df.count()
    pipeline.write_results(q1_df, rev_df, tmp_path / "run")  # overwrite is allowed
    assert len(pq.read_table(paths["q1"]).to_pylist()) == 4
