"""Messages → Arrow record batches for the ``txmq`` Spark source, built directly from buffers.

Every column is assembled from Python ``array``/``bytes`` buffers with ``pyarrow.Array.from_buffers``
instead of ``pyarrow.array(list)``, for two reasons:

* ``pyarrow.array`` imports pandas the first time it is called (pyarrow probes its argument for
  pandas objects). Spark starts fresh Python workers for the tasks, and the pandas import costs
  such a worker 0.3-1 s of CPU, more than converting 50,000 rows. Nothing else on the source's read
  path imports pandas.
* Joining bytes and accumulating lengths runs in C; the remaining per-row Python work is one list
  comprehension per column (about 1 µs per row for all ten columns).

Columns with variable-width values (``string``, ``binary``, ``map``) use 32-bit offsets, so one
batch holds at most 2 GiB per column; the reader caps batches far below that
(``_source.ARROW_BATCH_BYTES_MAX``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate

import pyarrow as pa

from txmq.protocol import PROPERTY_UNIQ_KEY, MessageExt

__all__ = ["ARROW_SCHEMA", "messages_to_record_batch"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_PROPERTIES = pa.map_(pa.string(), pa.string())
_ENTRY_FIELDS = [_PROPERTIES.key_field, _PROPERTIES.item_field]

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("tags", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("queue_id", pa.int32()),
        pa.field("queue_offset", pa.int64()),
        pa.field("message_id", pa.string()),
        pa.field("born_timestamp", _TIMESTAMP),
        pa.field("store_timestamp", _TIMESTAMP),
        pa.field("properties", _PROPERTIES),
    ]
)
"""Arrow schema of the batches ``read`` yields. PySpark 4.3.0 compares it with
``to_arrow_schema(SCHEMA, timezone="UTC")`` and fails the task on any difference
(``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``), so every column has an explicit type."""

_BITS = bytes.maketrans(b"\x00\x01", b"01")


def messages_to_record_batch(messages: Sequence[MessageExt]) -> pa.RecordBatch:
    """Convert messages to one Arrow batch of :data:`ARROW_SCHEMA` (explicit types throughout).

    ``key`` is the first of the whitespace-separated ``keys``; empty ``keys``, ``tags`` and message
    id become NULL; millisecond timestamps become ``timestamp[us, UTC]``; ``properties`` entries
    are sorted by name so equal messages give equal rows. One row per message, in order.

    Raises:
        OverflowError: a string or binary column of the batch exceeds 2 GiB, or a timestamp does
            not fit in 64-bit microseconds.
    """
    n = len(messages)
    columns = [
        _strings([(m.keys.split(None, 1) or ("",))[0] for m in messages], empty_is_null=True),
        _strings([m.tags for m in messages], empty_is_null=True),
        _binaries([m.body for m in messages]),
        _strings([m.topic for m in messages], empty_is_null=False),
        _fixed(pa.int32(), array("i", [m.queue_id for m in messages])),
        _fixed(pa.int64(), array("q", [m.queue_offset for m in messages])),
        _strings([m.properties.get(PROPERTY_UNIQ_KEY, "") for m in messages], empty_is_null=True),
        _fixed(_TIMESTAMP, array("q", [m.born_timestamp_ms * 1000 for m in messages])),
        _fixed(_TIMESTAMP, array("q", [m.store_timestamp_ms * 1000 for m in messages])),
        _properties([m.properties for m in messages]),
    ]
    assert all(len(c) == n for c in columns)
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _fixed(type_: pa.DataType, values: array[int]) -> pa.Array:
    """A non-null fixed-width array of ``type_`` whose values are ``values`` (same width)."""
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _offsets(lengths: Sequence[int]) -> pa.Buffer:
    """Arrow int32 offsets ``[0, l0, l0+l1, ...]``. Raises OverflowError beyond 2 GiB."""
    return pa.py_buffer(array("i", list(accumulate(lengths, initial=0))))  # faster than from an iterator


def _validity(lengths: Sequence[int]) -> tuple[pa.Buffer | None, int]:
    """Validity bitmap marking zero-length values NULL, and the NULL count (no bitmap if none).

    Arrow bitmaps are LSB-first: value ``i`` is bit ``i % 8`` of byte ``i // 8``; that is the
    little-endian byte form of the integer whose bit ``i`` is set for a valid value ``i``.
    """
    nulls = lengths.count(0) if isinstance(lengths, list) else sum(1 for x in lengths if not x)
    if nulls == 0:
        return None, 0
    if nulls == len(lengths):
        return pa.py_buffer(bytes((len(lengths) + 7) // 8)), nulls
    digits = bytes(map(bool, reversed(lengths))).translate(_BITS)
    bitmap = int(digits, 2).to_bytes((len(lengths) + 7) // 8, "little")
    return pa.py_buffer(bitmap), nulls


def _strings(values: list[str], *, empty_is_null: bool) -> pa.Array:
    """A ``string`` array of ``values``; with ``empty_is_null`` every ``""`` becomes NULL."""
    text = "".join(values)
    if text.isascii():  # one character per byte: the lengths are the str lengths
        data = text.encode("ascii")
        lengths = list(map(len, values))
    else:
        encoded = [v.encode() for v in values]
        data = b"".join(encoded)
        lengths = list(map(len, encoded))
    validity, nulls = _validity(lengths) if empty_is_null else (None, 0)
    buffers = [validity, _offsets(lengths), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(values), buffers, null_count=nulls)


def _binaries(values: list[bytes]) -> pa.Array:
    """A non-null ``binary`` array of ``values``."""
    buffers = [None, _offsets(list(map(len, values))), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers)


def _properties(maps: list[dict[str, str]]) -> pa.Array:
    """A non-null ``map<string, string>`` array, each map's entries sorted by key."""
    keys: list[str] = []
    values: list[str] = []
    for props in maps:
        if len(props) > 1:
            props = dict(sorted(props.items()))
        keys += props
        values += props.values()
    entries = pa.StructArray.from_arrays(
        [_strings(keys, empty_is_null=False), _strings(values, empty_is_null=False)],
        fields=_ENTRY_FIELDS,
    )
    offsets = _offsets(list(map(len, maps)))
    return pa.Array.from_buffers(_PROPERTIES, len(maps), [None, offsets], children=[entries])
