"""TPC-H generation, loading and the order message body codec."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txmq.demo import tpch
from txmq.errors import ConfigError

TINY_ORDERS = 1500  # 150,000 x SF 0.001


def test_generate_writes_both_tables(tpch_dir: Path) -> None:
    assert pq.ParquetFile(tpch_dir / "orders.parquet").metadata.num_rows == TINY_ORDERS
    assert pq.ParquetFile(tpch_dir / "lineitem.parquet").metadata.num_rows > 4 * TINY_ORDERS


@pytest.mark.parametrize("sf", [0.0, -1.0, float("nan")])
def test_generate_rejects_bad_scale_factor(sf: float, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="scale factor"):
        tpch.generate(sf, tmp_path)


def test_generate_without_binary_is_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="tpchgen-cli not found"):
        tpch.generate(0.001, tmp_path / "out")


def test_generate_failure_is_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "tpchgen-cli"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'boom: disk on fire' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake.parent / "python"))
    with pytest.raises(ConfigError, match="exited with 3: boom: disk on fire"):
        tpch.generate(0.001, tmp_path / "out")


def test_load_orders_matches_parquet_exactly(tpch_dir: Path, tiny_orders: list[tpch.Order]) -> None:
    raw_orders = sorted(pq.read_table(tpch_dir / "orders.parquet").to_pylist(), key=lambda r: r["o_orderkey"])
    raw_items = pq.read_table(tpch_dir / "lineitem.parquet").to_pylist()
    assert [o.o_orderkey for o in tiny_orders] == [r["o_orderkey"] for r in raw_orders]
    for order, raw in zip(tiny_orders, raw_orders, strict=True):
        assert order.o_totalprice_c == int(raw["o_totalprice"] * 100)
        assert order.o_orderdate == raw["o_orderdate"].isoformat()
        assert (order.o_custkey, order.o_clerk, order.o_shippriority, order.o_comment) == (
            raw["o_custkey"], raw["o_clerk"], raw["o_shippriority"], raw["o_comment"]
        )  # fmt: skip
    items = {(li.l_orderkey, li.l_linenumber): li for o in tiny_orders for li in o.lineitems}
    assert len(items) == len(raw_items)
    for raw in raw_items:
        li = items[raw["l_orderkey"], raw["l_linenumber"]]
        for name in ("l_quantity", "l_extendedprice", "l_discount", "l_tax"):
            assert Decimal(getattr(li, f"{name}_c")) / 100 == raw[name]
        for name in ("l_shipdate", "l_commitdate", "l_receiptdate"):
            assert getattr(li, name) == raw[name].isoformat()
        assert (li.l_partkey, li.l_returnflag, li.l_shipmode, li.l_comment) == (
            raw["l_partkey"], raw["l_returnflag"], raw["l_shipmode"], raw["l_comment"]
        )  # fmt: skip


def test_load_orders_groups_lineitems_in_order(tiny_orders: list[tpch.Order]) -> None:
    for order in tiny_orders:
        assert 1 <= len(order.lineitems) <= 7
        assert {li.l_orderkey for li in order.lineitems} == {order.o_orderkey}
        assert [li.l_linenumber for li in order.lineitems] == list(range(1, len(order.lineitems) + 1))


def test_load_orders_rejects_orphan_lineitem(tpch_dir: Path, tmp_path: Path) -> None:
    orders = pq.read_table(tpch_dir / "orders.parquet")
    pq.write_table(orders.slice(1), tmp_path / "orders.parquet")  # drop order 1, keep its items
    pq.write_table(pq.read_table(tpch_dir / "lineitem.parquet"), tmp_path / "lineitem.parquet")
    with pytest.raises(ConfigError, match="reference no order"):
        tpch.load_orders(tmp_path)


def test_load_orders_missing_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"orders\.parquet"):
        tpch.load_orders(tmp_path)


def test_body_round_trips_every_order(tiny_orders: list[tpch.Order]) -> None:
    for order in tiny_orders:
        assert tpch.decode_order(tpch.encode_order(order)) == order


def test_body_is_json_with_tpch_names(tiny_orders: list[tpch.Order]) -> None:
    body = json.loads(tpch.encode_order(tiny_orders[0]))
    assert list(body) == [*tpch.Order.__struct_fields__]
    assert list(body["lineitems"][0]) == [*tpch.LineItem.__struct_fields__]
    assert isinstance(body["o_totalprice_c"], int)
    assert isinstance(body["lineitems"][0]["l_extendedprice_c"], int)


def test_decode_rejects_wrong_shape(tiny_orders: list[tpch.Order]) -> None:
    body = json.loads(tpch.encode_order(tiny_orders[0]))
    body["o_totalprice_c"] = "12.34"
    with pytest.raises(msgspec.ValidationError, match="o_totalprice_c"):
        tpch.decode_order(json.dumps(body).encode())
    with pytest.raises(msgspec.DecodeError):
        tpch.decode_order(b"{not json")


def test_spark_schema_names_every_field() -> None:
    ddl = tpch.ORDER_SPARK_SCHEMA
    for name in tpch.Order.__struct_fields__ + tpch.LineItem.__struct_fields__:
        assert f"{name} " in ddl
    assert "o_orderdate DATE" in ddl
    assert "l_extendedprice_c BIGINT" in ddl
    assert "lineitems ARRAY<STRUCT<" in ddl
    row = tpch.LINEITEM_ROW_SPARK_SCHEMA
    assert row.startswith("o_orderkey BIGINT, o_orderdate DATE, l_orderkey BIGINT")


@pytest.mark.parametrize(
    ("value", "scale", "text"),
    [(-12345, 2, "-123.45"), (5, 4, "0.0005"), (1_000_000, 6, "1.000000"), (42, 0, "42")],
)
def test_scaled_to_str(value: int, scale: int, text: str) -> None:
    assert tpch.scaled_to_str(value, scale) == text


def test_modules_import_without_pyspark_or_pandas() -> None:
    code = (
        "import sys, txmq.demo.tpch, txmq.demo.orderdb, txmq.demo.spark_pipeline, txmq.spark;"
        "print(sorted(m for m in ('pyspark', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_decimal_conversion_handles_negative_and_sliced_arrays(tmp_path: Path) -> None:
    values = [Decimal("-1.25"), Decimal("0.00"), Decimal("99999999999.99"), Decimal("-0.01")]
    col = pa.chunked_array([pa.array(values, pa.decimal128(15, 2)).slice(1), []])
    assert tpch._decimal_hundredths("x_c", col) == [0, 9_999_999_999_999, -1]
    col = pa.chunked_array([pa.array(values, pa.decimal128(15, 2))])
    assert tpch._decimal_hundredths("x_c", col) == [-125, 0, 9_999_999_999_999, -1]
    with pytest.raises(ConfigError, match="decimal128"):
        tpch._decimal_hundredths("x_c", pa.chunked_array([pa.array([1], pa.decimal128(5, 1))]))
