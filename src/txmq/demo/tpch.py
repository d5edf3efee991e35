"""TPC-H orders for the demo: generation, loading, the message body codec and the Q1 contract.

Data comes from the ``tpchgen-cli`` binary (installed with the ``tpchgen-cli`` wheel) as two Parquet
files, ``orders.parquet`` and ``lineitem.parquet``. :func:`load_orders` groups the line items under
their order; each :class:`Order` becomes one transactional message whose body is
:func:`encode_order`'s JSON.

Money and quantities are exact: every TPC-H ``DECIMAL(15,2)`` column is carried as an ``int`` in
hundredths and named with a ``_c`` suffix (``l_extendedprice_c = 2438667`` means 24386.67;
``l_discount_c = 4`` means 0.04). Dates are ISO-8601 strings (``"1996-03-13"``). All other columns
keep their TPC-H names and types.

The body of a message, one JSON object (field order as written by :func:`encode_order`)::

    {"o_orderkey": int, "o_custkey": int, "o_orderstatus": str, "o_totalprice_c": int,
     "o_orderdate": "YYYY-MM-DD", "o_orderpriority": str, "o_clerk": str, "o_shippriority": int,
     "o_comment": str,
     "lineitems": [{"l_orderkey": int, "l_partkey": int, "l_suppkey": int, "l_linenumber": int,
                    "l_quantity_c": int, "l_extendedprice_c": int, "l_discount_c": int,
                    "l_tax_c": int, "l_returnflag": str, "l_linestatus": str,
                    "l_shipdate": "YYYY-MM-DD", "l_commitdate": "YYYY-MM-DD",
                    "l_receiptdate": "YYYY-MM-DD", "l_shipinstruct": str, "l_shipmode": str,
                    "l_comment": str}, ...]}

The module also fixes the TPC-H Query 1 result contract shared by the SQLite oracle
(:mod:`txmq.demo.orderdb`) and the Spark pipeline (:mod:`txmq.demo.spark_pipeline`): see
:data:`Q1_SCALES` and friends.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from txmq.errors import ConfigError
from txmq.extras import require_extra

require_extra("demo", "txmq.demo.tpch", "numpy", "pyarrow")

__all__ = [
    "LINEITEM_ROW_SPARK_SCHEMA",
    "ORDER_SPARK_SCHEMA",
    "Q1_AVG_COLUMNS",
    "Q1_EXACT_COLUMNS",
    "Q1_KEY_COLUMNS",
    "Q1_SCALES",
    "Q1_SHIPDATE_MAX",
    "LineItem",
    "Order",
    "decode_order",
    "encode_order",
    "generate",
    "load_orders",
    "scaled_to_str",
]

TPCHGEN_TIMEOUT_S: Final = 3600
"""Longest a ``tpchgen-cli`` run may take before :func:`generate` gives up (SF 1 takes ~20 s)."""


class LineItem(msgspec.Struct, frozen=True, gc=False):
    """One TPC-H ``lineitem`` row. ``*_c`` fields are hundredths; dates are ``YYYY-MM-DD``."""

    l_orderkey: int
    l_partkey: int
    l_suppkey: int
    l_linenumber: int
    l_quantity_c: int
    l_extendedprice_c: int
    l_discount_c: int
    l_tax_c: int
    l_returnflag: str
    l_linestatus: str
    l_shipdate: str
    l_commitdate: str
    l_receiptdate: str
    l_shipinstruct: str
    l_shipmode: str
    l_comment: str


class Order(msgspec.Struct, frozen=True, gc=False):
    """One TPC-H ``orders`` row with its line items (sorted by ``l_linenumber``).

    ``o_totalprice_c`` is in hundredths; ``o_orderdate`` is ``YYYY-MM-DD``.
    """

    o_orderkey: int
    o_custkey: int
    o_orderstatus: str
    o_totalprice_c: int
    o_orderdate: str
    o_orderpriority: str
    o_clerk: str
    o_shippriority: int
    o_comment: str
    lineitems: list[LineItem]


_ORDER_COLUMNS: Final = tuple(f for f in Order.__struct_fields__ if f != "lineitems")
_LINEITEM_COLUMNS: Final = LineItem.__struct_fields__

# Spark SQL types of the body's fields (dates as DATE: from_json parses ISO strings).
_SPARK_TYPES: Final = {int: "BIGINT", str: "STRING"}
_DATE_FIELDS: Final = frozenset({"o_orderdate", "l_shipdate", "l_commitdate", "l_receiptdate"})


def _spark_fields(struct: type[msgspec.Struct], names: tuple[str, ...]) -> str:
    hints = {f.name: f.type for f in msgspec.structs.fields(struct)}
    return ", ".join(f"{n} {'DATE' if n in _DATE_FIELDS else _SPARK_TYPES[hints[n]]}" for n in names)


_LINEITEM_DDL: Final = _spark_fields(LineItem, _LINEITEM_COLUMNS)

ORDER_SPARK_SCHEMA: Final = (
    f"{_spark_fields(Order, _ORDER_COLUMNS)}, lineitems ARRAY<STRUCT<{_LINEITEM_DDL}>>"
)
"""Spark DDL schema of an :func:`encode_order` body, for ``from_json``. Integers are ``BIGINT``,
dates ``DATE`` (parsed from the ISO strings), text ``STRING``."""

LINEITEM_ROW_SPARK_SCHEMA: Final = f"o_orderkey BIGINT, o_orderdate DATE, {_LINEITEM_DDL}"
"""Spark DDL schema of one exploded line item row (order key and date, then every lineitem
column), as written by the Spark pipeline's lineitem stream."""

# --- TPC-H Query 1 result contract ---------------------------------------------------------------
Q1_SHIPDATE_MAX: Final = "1998-09-02"
"""Q1's predicate ``l_shipdate <= date '1998-12-01' - interval '90' day``, resolved."""

Q1_KEY_COLUMNS: Final = ("l_returnflag", "l_linestatus")
"""Group columns of a Q1 row, also its sort order."""

Q1_SCALES: Final = {
    "sum_qty_c": 2,
    "sum_base_price_c": 2,
    "sum_disc_price_e4": 4,
    "sum_charge_e6": 6,
    "count_order": 0,
}
"""Exact (integer) Q1 columns and their decimal scale: the value means ``int / 10**scale``.

``sum_disc_price_e4 = Σ l_extendedprice_c·(100 − l_discount_c)`` and
``sum_charge_e6 = Σ l_extendedprice_c·(100 − l_discount_c)·(100 + l_tax_c)``. Both fit a signed
64-bit integer up to about SF 10 (the per-row charge is below 1.2·10^11)."""

Q1_EXACT_COLUMNS: Final = tuple(Q1_SCALES)
Q1_AVG_COLUMNS: Final = ("avg_qty", "avg_price", "avg_disc")
"""Float Q1 columns in natural units (``avg_disc = 0.05`` means 5 %), each computed as
``float(sum of hundredths) / count / 100``."""


def scaled_to_str(value: int, scale: int) -> str:
    """Render an exact scaled integer as a decimal string: ``scaled_to_str(-12345, 2) == "-123.45"``."""
    if scale == 0:
        return str(value)
    sign = "-" if value < 0 else ""
    whole, frac = divmod(abs(value), 10**scale)
    return f"{sign}{whole}.{frac:0{scale}d}"


def _tpchgen_binary() -> str:
    beside = Path(sys.executable).with_name("tpchgen-cli")
    if beside.is_file():
        return str(beside)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise ConfigError(
            "tpchgen-cli not found next to the Python interpreter or on PATH; "
            "install the 'tpchgen-cli' package into this environment"
        )
    return found


def generate(sf: float, out_dir: Path) -> Path:
    """Generate TPC-H ``orders`` and ``lineitem`` at scale factor ``sf`` as Parquet.

    Runs ``tpchgen-cli parquet -s SF --tables orders,lineitem -o OUT_DIR --overwrite``, so the
    directory ends up with ``orders.parquet`` (150,000·SF rows) and ``lineitem.parquet``
    (about 600,000·SF rows); existing files are replaced. Returns ``out_dir``.

    Raises:
        ConfigError: ``sf`` is not positive, the binary is missing, or it failed (its stderr is
            included in the message).
    """
    if not sf > 0:
        raise ConfigError(f"TPC-H scale factor must be positive, got {sf!r}")
    binary = _tpchgen_binary()
    out_dir.mkdir(parents=True, exist_ok=True)
    sf_text = f"{sf:.12f}".rstrip("0").rstrip(".")
    cmd = [binary, "parquet", "-s", sf_text, "--tables", "orders,lineitem",
           "-o", str(out_dir), "--overwrite", "--no-progress"]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TPCHGEN_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"could not run {' '.join(cmd)}: {exc}") from exc
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
    for table in ("orders", "lineitem"):
        if not (out_dir / f"{table}.parquet").is_file():
            raise ConfigError(f"tpchgen-cli did not write {out_dir / f'{table}.parquet'}")
    return out_dir


def _decimal_hundredths(name: str, column: Any) -> list[int]:
    """A non-null ``decimal128(p, 2)`` column as ints in hundredths (its unscaled values).

    Reads the 16-byte little-endian two's complement words directly: pyarrow's own conversions of
    Python scalars import pandas, which costs 1.5 s.
    """
    import numpy as np
    import pyarrow as pa

    arr = column.combine_chunks()
    if not pa.types.is_decimal128(arr.type) or arr.type.scale != 2 or arr.null_count:
        raise ConfigError(f"column {name}: expected non-null decimal128(p, 2), got {arr.type}")
    words = np.frombuffer(arr.buffers()[1], dtype="<i8", count=2 * len(arr), offset=arr.offset * 16)
    low, high = words[0::2], words[1::2]
    if not np.array_equal(high, low >> 63):
        raise ConfigError(f"column {name}: a value does not fit in 64 bits")
    values: list[int] = low.tolist()
    return values


def _columns(table: Any, names: tuple[str, ...]) -> list[list[Any]]:
    """Each named column as a Python list: decimals as hundredths, dates as ISO strings."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: list[list[Any]] = []
    for name in names:
        col = table.column(name.removesuffix("_c"))
        if pa.types.is_decimal(col.type):
            out.append(_decimal_hundredths(name, col))
            continue
        if pa.types.is_date(col.type):
            col = pc.cast(col, pa.string())
        out.append(col.to_pylist())
    return out


def _read_table(path: Path) -> Any:
    """Read one Parquet file, with ``string_view`` columns cast to ``string`` (sortable)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path).read()  # read_table would import pandas (1.5 s)
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise ConfigError(f"cannot read TPC-H Parquet file {path}: {exc}") from exc
    schema = pa.schema(
        [f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in table.schema]
    )
    return table.cast(schema)


def _int64_numpy(column: Any) -> Any:
    """A non-null int64 column as a numpy array, without pyarrow's ``to_numpy`` (imports pandas)."""
    import numpy as np
    import pyarrow as pa

    arr = column.combine_chunks()
    if arr.type != pa.int64() or arr.null_count:
        raise ConfigError(f"expected a non-null int64 key column, got {arr.type}")
    return np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr), offset=arr.offset * 8)


def load_orders(data_dir: Path) -> list[Order]:
    """Load ``orders.parquet`` and ``lineitem.parquet`` from ``data_dir`` as :class:`Order` values.

    Returns the orders sorted by ``o_orderkey``, each with its line items sorted by
    ``l_linenumber``. Columns are converted vectorised (pyarrow); SF 0.1 (150,000 orders, 600k line
    items) loads in about 2 s.

    Raises:
        ConfigError: a file is missing or unreadable, or a line item has no order.
    """
    import numpy as np

    orders = _read_table(data_dir / "orders.parquet").sort_by("o_orderkey")
    items = _read_table(data_dir / "lineitem.parquet").sort_by(
        [("l_orderkey", "ascending"), ("l_linenumber", "ascending")]
    )
    okeys = _int64_numpy(orders.column("o_orderkey"))
    lkeys = _int64_numpy(items.column("l_orderkey"))
    starts = np.searchsorted(lkeys, okeys, side="left").tolist()
    ends = np.searchsorted(lkeys, okeys, side="right").tolist()
    if sum(e - s for s, e in zip(starts, ends, strict=True)) != len(lkeys):
        raise ConfigError(f"{data_dir}: some line items reference no order in orders.parquet")
    lineitems = [LineItem(*row) for row in zip(*_columns(items, _LINEITEM_COLUMNS), strict=True)]
    order_rows = zip(*_columns(orders, _ORDER_COLUMNS), strict=True)
    return [Order(*(*row, lineitems[s:e])) for row, s, e in zip(order_rows, starts, ends, strict=True)]


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Order)


def encode_order(order: Order) -> bytes:
    """Encode an order as its message body: compact UTF-8 JSON (shape in the module docstring)."""
    return _ENCODER.encode(order)


def decode_order(body: bytes) -> Order:
    """Decode a message body written by :func:`encode_order`.

    Raises:
        msgspec.ValidationError: the JSON does not have the :class:`Order` shape.
        msgspec.DecodeError: the bytes are not JSON (``ValidationError`` is a subclass).
    """
    return _DECODER.decode(body)
