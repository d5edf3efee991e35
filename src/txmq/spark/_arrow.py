"""Messages → Arrow record batches for the ``txmq`` Spark source, built directly from buffers.

Every column is assembled from Python ``array``/``bytes`` buffers with ``pyarrow.Array.from_buffers``
instead of ``pyarrow.array(list)``, for two reasons:

* ``pyarrow.array`` imports pandas the first time it is called (pyarrow probes its argument for
  pandas objects). Spark starts fresh Python workers for the tasks, and the pandas import costs
  such a worker 0.3-1 s of CPU, more than converting 50,000 rows. Nothing else on the source's read
  path imports pandas.
* Joining bytes and accumulating lengths runs in C; the remaining per-row Python work is one list
  comprehension per column (about 1 µs per row for all ten columns).

The source reads pull replies with :func:`pull_body_to_record_batch`, column by column: the reply's
records are indexed by :func:`txmq.protocol.index_message_exts` (one pass over the record
boundaries, then numpy gathers of the heads), fixed-width columns are numpy arrays handed to Arrow,
bodies, topics and properties strings are taken by Arrow from offsets arrays over the reply's bytes,
and properties are split at their separator bytes by numpy and sorted by an Arrow sort: no Python
object per record. About 1.3 µs of CPU per record of a 1,024-record reply against 2.6-3.8 µs for
the row-by-row decoder it replaces and 3.5-4.4 µs for decoding messages then converting them
(``benchmarks/decode_pull.py``); the per-message path (:func:`messages_to_record_batch` of
``decode_message_exts``) stays the specification and the fallback for uncommon replies.

``pyarrow.compute`` is imported by the functions that use it, not with the module, and
``txmq.spark._source`` imports this module only where ``read`` runs: Spark starts Python processes
for every streaming query (its source runner, the worker planning the read) that import
``txmq.spark._source`` only to plan (issue #24; ``pyarrow.compute`` alone was 0.05-0.1 s of CPU).

None of it may call ``pa.array``, ``pa.scalar`` or ``Array.to_numpy`` (all import pandas, see
above): scalars are sliced from arrays built from buffers, masks read from Arrow's bitmaps.

Columns with variable-width values (``string``, ``binary``, ``map``) use 32-bit offsets, so one
batch holds at most 2 GiB per column; the reader caps batches far below that
(``_source.ARROW_BATCH_BYTES_MAX``).

**The compiled decoder.** Where the package was built with its C extension
(``txmq.spark._ccolumns``, from ``_columns.c``: two passes over the reply in C, no GIL held, the
body CRC32 by zlib) it takes every reply first and the numpy path above is not used: it checks
every record as ``decode_message_exts`` does and writes the Arrow buffers of every column, and
Python assembles them with a fixed number of ``from_buffers`` calls per reply. Replies it does not
take (compressed bodies, timestamps beyond 64-bit microseconds, anything malformed) go to the
per-message path, which raises its own errors. ``TXMQ_PURE_PYTHON=1`` in the environment (read at
import) leaves the extension unused; tests run both paths against the per-message one.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa

from txmq.native import load_extension
from txmq.protocol import (
    COMPRESSED_FLAG,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    MessageExt,
    MessageIndex,
    decode_message_exts,
    index_message_exts,
)

__all__ = ["ARROW_SCHEMA", "COLUMNAR_MIN_RECORDS", "PullBatch", "messages_to_record_batch",
           "pull_body_to_record_batch"]

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


def _fixed(type_: pa.DataType, values: array[int] | np.ndarray[Any, Any]) -> pa.Array:
    """A non-null fixed-width array of ``type_`` whose values are ``values`` (a Python ``array``
    or a contiguous numpy array of the same width)."""
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


# --- a pull reply's bytes → one batch, column by column ----------------------------------------

COLUMNAR_MIN_RECORDS = 128
"""Replies of fewer records take the per-message path: the columnar path costs about 0.35 ms per
reply whatever its size (some 60 numpy and Arrow calls) and saves about 2.5 µs per record
(``benchmarks/decode_pull.py --records 32``: 11-12 µs per record columnar against 4 per message)."""

_TS_MS_MIN, _TS_MS_MAX = -(2**63) // 1000 + 1, (2**63 - 1) // 1000
"""Milliseconds whose microseconds fit ``timestamp[us]`` (int64); others raise OverflowError in
the per-message path, so the columnar path leaves them to it."""
_PLAIN_KEYS = "[^!-~]"
"""RE2: a character outside printable ASCII without space. A ``KEYS`` value without one is its own
first key; others are split by Python's ``str.split`` (its whitespace is Unicode's)."""


class PullBatch:
    """One pull reply's records as an Arrow batch of :data:`ARROW_SCHEMA`, plus what a reader
    checks before it keeps them.

    Attributes:
        batch: one row per record, in reply order.
        queue_offsets: the records' queue offsets (same order).
        queues: the distinct ``(topic, queue_id)`` of the records.
    """

    __slots__ = ("batch", "queue_offsets", "queues")

    def __init__(self, batch: pa.RecordBatch, queue_offsets: Sequence[int],
                 queues: set[tuple[str, int]]) -> None:
        self.batch = batch
        self.queue_offsets = queue_offsets
        self.queues = queues

    def consecutive(self) -> bool:
        """Whether the queue offsets are ``first, first + 1, ...`` (numpy: no Python int per row;
        the compiled decoder's offsets are a buffer numpy reads in place)."""
        offsets = np.asarray(self.queue_offsets, dtype=np.int64)
        return len(offsets) < 2 or bool(np.all(np.diff(offsets) == 1))


_compiled = load_extension("txmq.spark._ccolumns")


def pull_body_to_record_batch(data: bytes) -> PullBatch:
    """A PULL_MESSAGE reply body (MessageExt records back to back) → one :class:`PullBatch`.

    Gives the same rows as ``messages_to_record_batch(decode_message_exts(data))`` (that is the
    specification, and what runs when the columnar path does not take the reply: fewer than
    :data:`COLUMNAR_MIN_RECORDS` records, a compressed body, a timestamp beyond 64-bit
    microseconds, or anything malformed). The columnar path
    indexes the records with :func:`txmq.protocol.index_message_exts` (numpy, no Python object
    per record) and builds every column with Arrow kernels from the buffer: bodies, topics and
    properties strings are taken from offsets arrays over the reply's bytes, properties are split
    at their separator bytes by numpy, and the map entries sorted by an Arrow sort.

    With the C extension (module docstring) it decodes every non-empty reply, whatever its
    record count, and the numpy path is not used.

    Raises:
        txmq.errors.MalformedMessage: as :func:`txmq.protocol.decode_message_exts`.
        OverflowError: a timestamp beyond 64-bit microseconds.
    """
    if _compiled is not None:
        out = _compiled.decode_reply(data) if data else None
        if out is not None:
            return _compiled_batch(out)
        ix = None
    else:
        ix = index_message_exts(data, min_records=COLUMNAR_MIN_RECORDS) if data else None
    if ix is not None:
        try:
            batch = _columnar_batch(data, ix)
        except (pa.ArrowInvalid, _NotColumnar):  # invalid UTF-8 (the per-message path raises)
            batch = None
        if batch is not None:
            return batch
    messages = decode_message_exts(data)
    return PullBatch(messages_to_record_batch(messages), [m.queue_offset for m in messages],
                     {(m.topic, m.queue_id) for m in messages})


def _compiled_batch(out: Any) -> PullBatch:
    """The batch of what ``_ccolumns.decode_reply`` returned (its docstring gives the shape)."""
    n, key, tags, body, topic, qids, offsets, ids, born, store, props, queues, keys_unicode = out
    map_offsets, name_offsets, names, value_offsets, values = props
    entries = len(name_offsets) // 4 - 1
    keys = _var(pa.string(), n, key)
    columns = [
        _split_first_keys(keys) if keys_unicode else keys,
        _var(pa.string(), n, tags),
        _var(pa.binary(), n, body),
        _var(pa.string(), n, topic),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(qids)]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        _var(pa.string(), n, ids),
        pa.Array.from_buffers(_TIMESTAMP, n, [None, pa.py_buffer(born)]),
        pa.Array.from_buffers(_TIMESTAMP, n, [None, pa.py_buffer(store)]),
        pa.Array.from_buffers(_PROPERTIES, n, [None, pa.py_buffer(map_offsets)], children=[
            pa.StructArray.from_arrays([_var(pa.string(), entries, (None, 0, name_offsets, names)),
                                        _var(pa.string(), entries, (None, 0, value_offsets, values))],
                                       fields=_ENTRY_FIELDS)]),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    return PullBatch(batch, memoryview(offsets).cast("q"), queues)


def _var(type_: pa.DataType, n: int, parts: tuple[bytes | None, int, bytes, bytes]) -> pa.Array:
    """A string or binary array of ``n`` values from (validity bitmap or None, null count, int32
    offsets, data)."""
    validity, nulls, offsets, data = parts
    buffers = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
               pa.py_buffer(data)]
    return pa.Array.from_buffers(type_, n, buffers, null_count=nulls)


class _NotColumnar(Exception):
    """A reply the columnar path leaves to the per-message path."""


def _columnar_batch(data: bytes, ix: MessageIndex) -> PullBatch:
    import pyarrow.compute as pc  # see the module docstring (lazy)
    if np.any((ix.sys_flag & COMPRESSED_FLAG) & (ix.body_end > ix.body_start)):
        raise _NotColumnar
    stamps = np.concatenate([ix.born_timestamp_ms, ix.store_timestamp_ms])
    if np.any((stamps < _TS_MS_MIN) | (stamps > _TS_MS_MAX)):
        raise _NotColumnar
    buf = pa.py_buffer(data)
    topics = _taken(buf, ix.topic_start, ix.topic_end, pa.binary()).cast(pa.string())
    props = _taken(buf, ix.props_start, ix.props_end, pa.binary())
    props.cast(pa.string())  # validates UTF-8 (raises ArrowInvalid)
    tags, keys, ids, maps = _property_columns(props, ix.count)
    qids = ix.queue_id.astype(np.int32)
    columns = [
        keys,
        tags,
        _taken(buf, ix.body_start, ix.body_end, pa.binary()),
        topics,
        _fixed(pa.int32(), qids),
        _fixed(pa.int64(), ix.queue_offset),
        ids,
        _fixed(_TIMESTAMP, ix.born_timestamp_ms * 1000),
        _fixed(_TIMESTAMP, ix.store_timestamp_ms * 1000),
        maps,
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    distinct_topics = pc.unique(topics).to_pylist()
    distinct_qids = np.unique(qids).tolist()
    if len(distinct_topics) == 1 and len(distinct_qids) == 1:
        queues = {(distinct_topics[0], distinct_qids[0])}
    else:
        queues = set(zip(topics.to_pylist(), qids.tolist(), strict=True))
    return PullBatch(batch, ix.queue_offset.tolist(), queues)


def _taken(buf: pa.Buffer, starts: Any, ends: Any, type_: pa.DataType) -> pa.Array:
    """The byte ranges ``[starts[i], ends[i])`` of ``buf`` as one contiguous array of ``type_``
    (binary or string; not validated): an array over ``buf`` whose values are the ranges and the
    gaps between them (its offsets ``s0, e0, s1, e1, ...``), of which Arrow's ``take`` copies the
    ranges. ``buf`` must be under 2 GiB and the ranges in order."""
    n = len(starts)
    if n == 0:
        return pa.Array.from_buffers(type_, 0, [None, pa.py_buffer(np.zeros(1, np.int32)), buf])
    offsets = np.empty(2 * n, dtype=np.int32)
    offsets[0::2] = starts
    offsets[1::2] = ends
    spread = pa.Array.from_buffers(type_, 2 * n - 1, [None, pa.py_buffer(offsets), buf])
    return spread.take(_indices(np.arange(0, 2 * n - 1, 2, dtype=np.int32)))


def _indices(values: Any, valid: Any = None) -> pa.Array:
    """An int32 Arrow array of ``values`` (numpy int32), NULL where ``valid`` is False."""
    validity, nulls = None, 0
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        nulls = int(len(valid) - np.count_nonzero(valid))
    return pa.Array.from_buffers(pa.int32(), len(values), [validity, pa.py_buffer(values)],
                                 null_count=nulls)


def _property_columns(props: pa.Array, n: int) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """The ``tags``, ``key``, ``message_id`` and ``properties`` columns of ``n`` records from
    their properties strings (``props``: binary, offset 0, valid UTF-8), as
    :func:`~txmq.protocol.decode_message_exts` and :func:`messages_to_record_batch` read them:
    entries are the text between ``\u0002`` bytes, name and value split at the first
    ``\u0001`` (both non-empty, else skipped), a repeated name keeps its last value, ``TAGS``,
    ``KEYS`` and ``__CRC32#`` leave the map, entries sorted by name (UTF-8 byte order is code
    point order). The separators are ASCII, so splitting bytes splits characters.

    Usual properties (no repeated name, the map's entries already in order, as a producer's
    ``UNIQ_KEY`` alone is) take one Arrow ``take`` per column from the byte ranges; any other
    reply is sorted first (:func:`_sorted_columns`)."""
    import pyarrow.compute as pc  # see the module docstring (lazy)
    buf, bounds, starts, cut, ends, parents = _entries(props, n)
    names = _taken(buf, starts, cut, pa.string())
    is_tags, is_keys, is_crc, is_id = (_bools(pc.equal(names, name)) for name in _NAMES)
    in_map = ~(is_tags | is_keys | is_crc)
    map_names = _taken(buf, starts[in_map], cut[in_map], pa.string())
    if not _in_order(map_names, parents[in_map]) or any(
            np.bincount(parents[mask], minlength=n).max(initial=0) > 1
            for mask in (is_tags, is_keys, is_crc)):
        return _sorted_columns(buf, starts, cut, ends, parents, n)
    entries = pa.StructArray.from_arrays(
        [map_names, _taken(buf, cut[in_map] + 1, ends[in_map], pa.string())], fields=_ENTRY_FIELDS)
    maps = _map_column(entries, parents[in_map], n)
    tags, keys, ids = (_row_values(buf, bounds, cut[mask] + 1, ends[mask], parents[mask])
                       for mask in (is_tags, is_keys, is_id))
    return tags, _first_keys(keys), ids, maps


def _entries(props: pa.Array, n: int) -> tuple[pa.Buffer, Any, Any, Any, Any, Any]:
    """The properties' data buffer, each record's ``[bounds[i], bounds[i + 1])`` in it, and each
    kept entry's start, name-value separator, end and record (numpy; entries in buffer order)."""
    _, offsets_buf, data_buf = props.buffers()
    bounds = np.frombuffer(offsets_buf, np.int32)[: n + 1].astype(np.int64)
    if data_buf is None:
        data_buf = pa.py_buffer(b"")
    data = np.frombuffer(data_buf, np.uint8)[: bounds[-1]]
    entry_seps = np.flatnonzero(data == PROPERTY_SEPARATOR.encode()[0])
    name_seps = np.flatnonzero(data == NAME_VALUE_SEPARATOR.encode()[0])
    starts = np.sort(np.concatenate([bounds[:-1], entry_seps + 1]))
    ends = np.sort(np.concatenate([entry_seps, bounds[1:]]))
    found = np.searchsorted(name_seps, starts)
    cut = name_seps[np.minimum(found, len(name_seps) - 1)] if len(name_seps) else starts
    keep = (found < len(name_seps)) & (cut > starts) & (ends > cut + 1)
    starts, ends, cut = starts[keep], ends[keep], cut[keep]
    parents = (np.searchsorted(bounds, starts, side="right") - 1).astype(np.int32)
    return data_buf, bounds, starts, cut, ends, parents


def _in_order(names: pa.Array, parents: Any) -> bool:
    """Whether each record's names are strictly increasing (so sorted, none repeated)."""
    import pyarrow.compute as pc  # see the module docstring (lazy)
    same = parents[1:] == parents[:-1]
    if not same.any():
        return True
    return bool(_bools(pc.less(names[:-1], names[1:]))[same].all())


def _map_column(entries: pa.StructArray, parents: Any, n: int) -> pa.Array:
    """A ``map`` column of ``n`` rows whose row ``r`` holds the entries whose parent is ``r``
    (entries grouped by parent, in row order)."""
    counts = np.bincount(parents, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.Array.from_buffers(_PROPERTIES, n, [None, pa.py_buffer(offsets)], children=[entries])


def _row_values(buf: pa.Buffer, bounds: Any, starts: Any, ends: Any, parents: Any) -> pa.Array:
    """A string column of ``len(bounds) - 1`` rows: row ``parents[i]`` holds ``buf[starts[i]:
    ends[i]]`` (one value per row at most, inside the row's ``[bounds[r], bounds[r + 1])``), the
    other rows NULL. Every row is a (possibly empty) range in buffer order, so one ``take``."""
    n = len(bounds) - 1
    row_starts = bounds[:-1].copy()
    row_ends = bounds[:-1].copy()
    row_starts[parents] = starts
    row_ends[parents] = ends
    valid = np.zeros(n, dtype=bool)
    valid[parents] = True
    taken = _taken(buf, row_starts, row_ends, pa.string())
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [validity, *taken.buffers()[1:]],
                                 null_count=n - len(parents))


def _sorted_columns(buf: pa.Buffer, starts: Any, cut: Any, ends: Any, parents: Any,
                    n: int) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """:func:`_property_columns` for any entries: sorted by (record, name), last of a repeated
    name kept."""
    import pyarrow.compute as pc  # see the module docstring (lazy)
    names = _taken(buf, starts, cut, pa.string())
    values = _taken(buf, cut + 1, ends, pa.string())
    names, values, parents = _sorted_last_wins(names, values, parents)
    is_tags, is_keys, is_crc, is_id = (_bools(pc.equal(names, name)) for name in _NAMES)
    in_map = ~(is_tags | is_keys | is_crc)
    entries = pa.StructArray.from_arrays(
        [_where(names, in_map), _where(values, in_map)], fields=_ENTRY_FIELDS)
    return (_by_record(_where(values, is_tags), parents[is_tags], n),
            _first_keys(_by_record(_where(values, is_keys), parents[is_keys], n)),
            _by_record(_where(values, is_id), parents[is_id], n),
            _map_column(entries, parents[in_map], n))


def _bools(values: pa.Array) -> Any:
    """A non-null Arrow boolean array as a numpy bool array (``to_numpy`` imports pandas)."""
    if len(values) == 0:
        return np.zeros(0, dtype=bool)
    bits = np.unpackbits(np.frombuffer(values.buffers()[1], np.uint8), bitorder="little")
    return bits[values.offset : values.offset + len(values)].astype(bool)


def _utf8_scalar(text: str) -> pa.Scalar:
    """A string scalar made from buffers (``pa.scalar`` imports pandas: see the module docstring)."""
    data = text.encode()
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int32))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]


_NAMES = tuple(map(_utf8_scalar, (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_CRC32, PROPERTY_UNIQ_KEY)))
"""The properties the columns take out of the map (all but UNIQ_KEY, which stays in it too)."""


def _where(values: pa.Array, mask: Any) -> pa.Array:
    """The values where the numpy boolean ``mask`` is True (``take``: ``filter`` would need an
    Arrow mask, and ``pa.array`` imports pandas)."""
    return values.take(_indices(np.flatnonzero(mask).astype(np.int32)))


def _sorted_last_wins(names: pa.Array, values: pa.Array,
                      parents: Any) -> tuple[pa.Array, pa.Array, Any]:
    """Entries sorted by (record, name), stably, and of a repeated name only the last kept."""
    import pyarrow.compute as pc  # see the module docstring (lazy)
    if len(names) == 0:
        return names, values, parents
    order = pc.sort_indices(pa.record_batch([_fixed(pa.int32(), parents), names], ["p", "n"]),
                            sort_keys=[("p", "ascending"), ("n", "ascending")])
    names, values = names.take(order), values.take(order)
    parents = parents[np.frombuffer(order.buffers()[1], np.uint64)[order.offset :][: len(order)]]
    repeated = (parents[1:] == parents[:-1]) & _bools(pc.equal(names[1:], names[:-1]))
    if repeated.any():
        last = np.append(~repeated, True)
        names, values, parents = _where(names, last), _where(values, last), parents[last]
    return names, values, parents


def _first_keys(keys: pa.Array) -> pa.Array:
    """Each ``KEYS`` value's first space-separated key (``str.split`` semantics), NULL if none
    (NULL stays NULL)."""
    import pyarrow.compute as pc  # see the module docstring (lazy)
    if not pc.any(pc.match_substring_regex(keys, _PLAIN_KEYS)).as_py():
        return keys
    return _split_first_keys(keys)


def _split_first_keys(keys: pa.Array) -> pa.Array:
    """Each value's first key by Python's ``str.split`` (Unicode whitespace), NULL if none."""
    return _strings([(v.split(None, 1) or ("",))[0] if v else "" for v in keys.to_pylist()],
                    empty_is_null=True)


def _by_record(values: pa.Array, parents: Any, n: int) -> pa.Array:
    """A column of ``n`` rows: ``values[i]`` at row ``parents[i]`` (one value per row at most),
    NULL in the other rows and where the value is NULL."""
    index = np.zeros(n, dtype=np.int32)
    valid = np.zeros(n, dtype=bool)
    index[parents] = np.arange(len(parents), dtype=np.int32)
    valid[parents] = True
    return values.take(_indices(index, valid))
