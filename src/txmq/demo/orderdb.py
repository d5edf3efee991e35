"""The demo order service's SQLite database, and the exact TPC-H Query 1 oracle over it.

Several processes (order producers, check-back handlers, the verifier) open the same file at once,
so every connection uses WAL journaling, ``synchronous=FULL`` (a committed local transaction
survives a crash) and a 60 s busy timeout.

Transaction semantics of :func:`connect` (Python 3.11 ``sqlite3`` legacy mode,
``isolation_level="IMMEDIATE"``): a ``SELECT`` outside a transaction runs on its own snapshot and
holds nothing; the first ``INSERT``/``UPDATE``/``DELETE`` implicitly issues ``BEGIN IMMEDIATE``,
taking the database's single write lock (waiting up to the busy timeout) before anything is read
inside the transaction, so concurrent writers queue instead of failing with ``SQLITE_BUSY`` on a
read-to-write upgrade. The caller ends it with ``conn.commit()`` / ``conn.rollback()`` (or
``with conn:``). Functions that take a ``conn`` never commit; functions that take a ``path`` open,
use and close their own connection.

Schema: ``orders`` and ``lineitem`` with the columns of :class:`txmq.demo.tpch.Order` /
:class:`~txmq.demo.tpch.LineItem` (hundredths as ``INTEGER``, dates as ISO ``TEXT``), plus
``orders.cancelled INTEGER NOT NULL DEFAULT 0`` (1 = cancelled by a later compensation).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Final

import msgspec

from txmq.demo.tpch import (
    Q1_AVG_COLUMNS,
    Q1_EXACT_COLUMNS,
    Q1_KEY_COLUMNS,
    Q1_SHIPDATE_MAX,
    LineItem,
    Order,
)

__all__ = [
    "BUSY_TIMEOUT_S",
    "committed_orderkeys",
    "connect",
    "init_db",
    "insert_order",
    "order_exists",
    "q1_oracle",
    "revenue_oracle",
]

BUSY_TIMEOUT_S: Final = 60.0
"""How long a statement waits for another process's write lock before ``database is locked``."""

_ORDER_COLS: Final = tuple(f for f in Order.__struct_fields__ if f != "lineitems")
_LINEITEM_COLS: Final = LineItem.__struct_fields__
_SQL_TYPES: Final = {int: "INTEGER", str: "TEXT"}


def _columns_ddl(struct: type[msgspec.Struct], names: tuple[str, ...]) -> str:
    hints = {f.name: f.type for f in msgspec.structs.fields(struct)}
    return ", ".join(f"{n} {_SQL_TYPES[hints[n]]} NOT NULL" for n in names)


_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS orders (
    {_columns_ddl(Order, _ORDER_COLS)},
    cancelled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (o_orderkey)
);
CREATE TABLE IF NOT EXISTS lineitem (
    {_columns_ddl(LineItem, _LINEITEM_COLS)},
    PRIMARY KEY (l_orderkey, l_linenumber),
    FOREIGN KEY (l_orderkey) REFERENCES orders (o_orderkey)
) WITHOUT ROWID;
"""

_INSERT_ORDER: Final = (
    f"INSERT INTO orders ({', '.join(_ORDER_COLS)}) VALUES ({', '.join('?' * len(_ORDER_COLS))})"
)
_INSERT_LINEITEM: Final = (
    f"INSERT INTO lineitem ({', '.join(_LINEITEM_COLS)}) VALUES ({', '.join('?' * len(_LINEITEM_COLS))})"
)


def connect(path: Path | str) -> sqlite3.Connection:
    """Open the order database with the semantics in the module docstring.

    WAL journal, ``synchronous=FULL``, busy timeout :data:`BUSY_TIMEOUT_S`, foreign keys on,
    implicit ``BEGIN IMMEDIATE`` before the first write. The file is created if missing (empty;
    call :func:`init_db` for the tables).
    """
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level="IMMEDIATE")
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def init_db(path: Path | str) -> None:
    """Create the ``orders`` and ``lineitem`` tables if they do not exist (safe to race)."""
    conn = connect(path)
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
    finally:
        conn.close()


def insert_order(conn: sqlite3.Connection, order: Order) -> None:
    """Insert ``order`` and its line items in the caller's transaction; does not commit.

    Raises:
        sqlite3.IntegrityError: the order key (or a line item key) already exists.
    """
    conn.execute(_INSERT_ORDER, [getattr(order, c) for c in _ORDER_COLS])
    conn.executemany(_INSERT_LINEITEM, [[getattr(li, c) for c in _LINEITEM_COLS] for li in order.lineitems])


def order_exists(conn: sqlite3.Connection, orderkey: int) -> bool:
    """Whether an order with this key is visible to ``conn`` (committed, or in its own transaction).

    Cancelled orders exist too: the row stays, with ``cancelled = 1``.
    """
    row = conn.execute("SELECT 1 FROM orders WHERE o_orderkey = ?", (orderkey,)).fetchone()
    return row is not None


def committed_orderkeys(path: Path | str, *, include_cancelled: bool = True) -> set[int]:
    """The keys of all committed orders in the database at ``path``."""
    where = "" if include_cancelled else " WHERE cancelled = 0"
    conn = connect(path)
    try:
        return {key for (key,) in conn.execute(f"SELECT o_orderkey FROM orders{where}")}
    finally:
        conn.close()


_DISC_PRICE_E4: Final = "l_extendedprice_c * (100 - l_discount_c)"
_Q1_SQL: Final = f"""
SELECT l_returnflag, l_linestatus,
       SUM(l_quantity_c) AS sum_qty_c,
       SUM(l_extendedprice_c) AS sum_base_price_c,
       SUM({_DISC_PRICE_E4}) AS sum_disc_price_e4,
       SUM({_DISC_PRICE_E4} * (100 + l_tax_c)) AS sum_charge_e6,
       COUNT(*) AS count_order,
       SUM(l_discount_c) AS sum_disc_c
FROM lineitem JOIN orders ON o_orderkey = l_orderkey
WHERE l_shipdate <= ? {{cancelled}}
GROUP BY l_returnflag, l_linestatus
ORDER BY l_returnflag, l_linestatus
"""


def q1_oracle(path: Path | str, *, exclude_cancelled: bool = True) -> list[dict[str, Any]]:
    """TPC-H Query 1 (pricing summary report) over the committed orders, exactly.

    Returns one dict per (``l_returnflag``, ``l_linestatus``), sorted by them, with the keys of
    :data:`~txmq.demo.tpch.Q1_KEY_COLUMNS` (str), :data:`~txmq.demo.tpch.Q1_EXACT_COLUMNS` (int at
    the scale given by :data:`~txmq.demo.tpch.Q1_SCALES`) and
    :data:`~txmq.demo.tpch.Q1_AVG_COLUMNS` (float, natural units:
    ``avg_qty = sum_qty_c / count_order / 100``). Line items of cancelled orders are left out
    unless ``exclude_cancelled`` is false.

    Raises:
        sqlite3.OperationalError: ``integer overflow`` in ``sum_charge_e6`` beyond about SF 10.
    """
    cancelled = "AND orders.cancelled = 0" if exclude_cancelled else ""
    conn = connect(path)
    try:
        cursor = conn.execute(_Q1_SQL.format(cancelled=cancelled), (Q1_SHIPDATE_MAX,))
        names = [d[0] for d in cursor.description]
        raw = [dict(zip(names, row, strict=True)) for row in cursor]
    finally:
        conn.close()
    rows: list[dict[str, Any]] = []
    for r in raw:
        n = r["count_order"]
        row = {k: r[k] for k in (*Q1_KEY_COLUMNS, *Q1_EXACT_COLUMNS)}
        averaged = (r["sum_qty_c"], r["sum_base_price_c"], r["sum_disc_c"])
        row.update({col: float(total) / n / 100 for col, total in zip(Q1_AVG_COLUMNS, averaged, strict=True)})
        rows.append(row)
    return rows


def revenue_oracle(path: Path | str, *, exclude_cancelled: bool = True) -> list[dict[str, Any]]:
    """Revenue per order date: ``[{"o_orderdate": "YYYY-MM-DD", "revenue_e4": int,
    "lineitem_count": int}, ...]`` sorted by date, where
    ``revenue_e4 = Σ l_extendedprice_c·(100 − l_discount_c)`` (units of 10⁻⁴) over every line item
    (no ship date filter). Matches :func:`txmq.demo.spark_pipeline.revenue_by_orderdate`.
    """
    cancelled = "WHERE orders.cancelled = 0" if exclude_cancelled else ""
    sql = (
        f"SELECT o_orderdate, SUM({_DISC_PRICE_E4}) AS revenue_e4, COUNT(*) AS lineitem_count "
        f"FROM lineitem JOIN orders ON o_orderkey = l_orderkey {cancelled} "
        "GROUP BY o_orderdate ORDER BY o_orderdate"
    )
    conn = connect(path)
    try:
        cursor = conn.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]
    finally:
        conn.close()
