"""The order service's SQLite database and the exact Q1 oracle."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from txmq.demo import orderdb, tpch
from txmq.demo.tpch import Order


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "orders.db"
    orderdb.init_db(path)
    return path


@pytest.fixture(scope="module")
def full_db(tmp_path_factory: pytest.TempPathFactory, tiny_orders: list[Order]) -> Path:
    path = tmp_path_factory.mktemp("orderdb") / "orders.db"
    orderdb.init_db(path)
    conn = orderdb.connect(path)
    with conn:
        for order in tiny_orders:
            orderdb.insert_order(conn, order)
    conn.close()
    return path


def python_q1(orders: list[Order]) -> list[dict[str, Any]]:
    """Q1 straight from the definition, in exact rational arithmetic on the decimal values."""
    groups: dict[tuple[str, str], list[tpch.LineItem]] = defaultdict(list)
    for order in orders:
        for li in order.lineitems:
            if li.l_shipdate <= "1998-09-02":
                groups[li.l_returnflag, li.l_linestatus].append(li)
    rows = []
    for (flag, status), items in sorted(groups.items()):
        qty = sum(Fraction(li.l_quantity_c, 100) for li in items)
        price = sum(Fraction(li.l_extendedprice_c, 100) for li in items)
        disc = [Fraction(li.l_discount_c, 100) for li in items]
        disc_price = sum(
            Fraction(li.l_extendedprice_c, 100) * (1 - d) for li, d in zip(items, disc, strict=True)
        )
        charge = sum(
            Fraction(li.l_extendedprice_c, 100) * (1 - d) * (1 + Fraction(li.l_tax_c, 100))
            for li, d in zip(items, disc, strict=True)
        )
        n = len(items)
        rows.append({
            "l_returnflag": flag, "l_linestatus": status,
            "sum_qty": qty, "sum_base_price": price, "sum_disc_price": disc_price,
            "sum_charge": charge, "count_order": n,
            "avg_qty": qty / n, "avg_price": price / n, "avg_disc": sum(disc) / n,
        })  # fmt: skip
    return rows


def test_connect_settings(db: Path) -> None:
    conn = orderdb.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 30_000
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    finally:
        conn.close()


def test_init_db_is_idempotent_and_has_cancelled_flag(db: Path, tiny_orders: list[Order]) -> None:
    orderdb.init_db(db)
    conn = orderdb.connect(db)
    with conn:
        orderdb.insert_order(conn, tiny_orders[0])
    cols = {r[1]: r for r in conn.execute("PRAGMA table_info(orders)")}
    assert cols["o_totalprice_c"][2] == "INTEGER"
    assert cols["o_orderdate"][2] == "TEXT"
    assert conn.execute("SELECT cancelled FROM orders").fetchall() == [(0,)]
    conn.close()


def test_insert_is_invisible_until_caller_commits(db: Path, tiny_orders: list[Order]) -> None:
    writer, reader = orderdb.connect(db), orderdb.connect(db)
    try:
        order = tiny_orders[0]
        orderdb.insert_order(writer, order)
        assert writer.in_transaction
        assert orderdb.order_exists(writer, order.o_orderkey)
        assert not orderdb.order_exists(reader, order.o_orderkey)
        writer.rollback()
        assert not orderdb.order_exists(writer, order.o_orderkey)
        orderdb.insert_order(writer, order)
        writer.commit()
        assert orderdb.order_exists(reader, order.o_orderkey)
        n_items = reader.execute(
            "SELECT COUNT(*) FROM lineitem WHERE l_orderkey = ?", (order.o_orderkey,)
        ).fetchone()[0]
        assert n_items == len(order.lineitems)
    finally:
        writer.close()
        reader.close()


def test_duplicate_order_is_integrity_error(db: Path, tiny_orders: list[Order]) -> None:
    conn = orderdb.connect(db)
    with conn:
        orderdb.insert_order(conn, tiny_orders[0])
    with pytest.raises(sqlite3.IntegrityError), conn:
        orderdb.insert_order(conn, tiny_orders[0])
    assert orderdb.committed_orderkeys(db) == {tiny_orders[0].o_orderkey}
    conn.close()


def test_committed_orderkeys_and_cancelled(db: Path, tiny_orders: list[Order]) -> None:
    conn = orderdb.connect(db)
    with conn:
        for order in tiny_orders[:5]:
            orderdb.insert_order(conn, order)
    keys = {o.o_orderkey for o in tiny_orders[:5]}
    with conn:
        conn.execute("UPDATE orders SET cancelled = 1 WHERE o_orderkey = ?", (min(keys),))
    conn.close()
    assert orderdb.committed_orderkeys(db) == keys
    assert orderdb.committed_orderkeys(db, include_cancelled=False) == keys - {min(keys)}


def test_q1_oracle_matches_definition(full_db: Path, tiny_orders: list[Order]) -> None:
    got = orderdb.q1_oracle(full_db)
    want = python_q1(tiny_orders)
    assert [(r["l_returnflag"], r["l_linestatus"]) for r in got] == [
        ("A", "F"), ("N", "F"), ("N", "O"), ("R", "F")
    ]  # fmt: skip
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert Fraction(g["sum_qty_c"], 100) == w["sum_qty"]
        assert Fraction(g["sum_base_price_c"], 100) == w["sum_base_price"]
        assert Fraction(g["sum_disc_price_e4"], 10**4) == w["sum_disc_price"]
        assert Fraction(g["sum_charge_e6"], 10**6) == w["sum_charge"]
        assert g["count_order"] == w["count_order"]
        for name in ("avg_qty", "avg_price", "avg_disc"):
            assert g[name] == pytest.approx(float(w[name]), rel=1e-12)
        assert set(g) == {*tpch.Q1_KEY_COLUMNS, *tpch.Q1_EXACT_COLUMNS, *tpch.Q1_AVG_COLUMNS}


def test_q1_oracle_excludes_cancelled_orders(db: Path, tiny_orders: list[Order]) -> None:
    conn = orderdb.connect(db)
    with conn:
        for order in tiny_orders:
            orderdb.insert_order(conn, order)
    victim = next(o for o in tiny_orders if any(li.l_shipdate <= tpch.Q1_SHIPDATE_MAX for li in o.lineitems))
    with conn:
        conn.execute("UPDATE orders SET cancelled = 1 WHERE o_orderkey = ?", (victim.o_orderkey,))
    conn.close()
    rest = [o for o in tiny_orders if o is not victim]
    counts = {(r["l_returnflag"], r["l_linestatus"]): r["count_order"] for r in python_q1(rest)}
    assert {(r["l_returnflag"], r["l_linestatus"]): r["count_order"] for r in orderdb.q1_oracle(db)} == counts
    all_rows = orderdb.q1_oracle(db, exclude_cancelled=False)
    assert sum(r["count_order"] for r in all_rows) > sum(counts.values())


def test_revenue_oracle_matches_definition(full_db: Path, tiny_orders: list[Order]) -> None:
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for order in tiny_orders:
        for li in order.lineitems:
            want[order.o_orderdate][0] += li.l_extendedprice_c * (100 - li.l_discount_c)
            want[order.o_orderdate][1] += 1
    got = orderdb.revenue_oracle(full_db)
    assert [r["o_orderdate"] for r in got] == sorted(want)
    assert {r["o_orderdate"]: [r["revenue_e4"], r["lineitem_count"]] for r in got} == want


_WRITER = """
import sys
from pathlib import Path
from txmq.demo import orderdb, tpch
data, db, start, step = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
orders = tpch.load_orders(data)[start::step]
conn = orderdb.connect(db)
for order in orders:
    orderdb.insert_order(conn, order)
    assert orderdb.order_exists(conn, order.o_orderkey)
    conn.commit()
conn.close()
"""


def test_concurrent_writer_processes(db: Path, tpch_dir: Path, tiny_orders: list[Order]) -> None:
    """Three processes committing one order per transaction never hit 'database is locked'."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tpch_dir), str(db), str(i), "3"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert orderdb.committed_orderkeys(db) == {o.o_orderkey for o in tiny_orders}
