"""Bulk decoding of MessageExt records back to back (a PULL_MESSAGE reply body). Sans-IO.

:func:`txmq.protocol.decode_message_exts` reads a reply record by record with about thirty
interpreter operations per record; this module reads it as a whole:

1. one pass over the record boundaries, reading only each record's total size (4 bytes);
2. the fixed-width fields of every record gathered at once with numpy (one fancy-index gather of
   the 48 bytes before the hosts, one of the rest of the head per host layout) and checked as
   arrays: magic codes, lengths, ports, and the body CRCs;
3. a :class:`MessageIndex`: numpy columns of the fields and of where each record's body, topic and
   properties are in the buffer.

From the index, :func:`decode_message_exts_bulk` builds the same ``MessageExt`` objects as
:func:`~txmq.protocol.decode_message_exts` with a few C-level operations per record (slices,
cached topic and host strings, a C-level split of the properties), and the Spark source builds
Arrow columns without any per-record Python (``txmq.spark``).

:func:`~txmq.protocol.decode_message_exts` stays the specification: whenever the index finds
anything it does not take (a malformed record, a length past its end, a CRC mismatch, a bad port),
the callers run the per-record decoder, which returns the messages or raises its own
``MalformedMessage``; so both give the same messages and the same errors (property tests in
``tests/protocol/test_message_bulk.py``).

RocketMQ 5's ``__CRC32#`` property (``MessageConst.PROPERTY_CRC32``, appended by a broker with
``MessageStoreConfig.enabledAppendPropCRC``) is dropped from the properties both decoders expose:
it describes the stored record, not the message.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np

from txmq.errors import MalformedMessage
from txmq.protocol._message import PROPERTY_CRC32, PROPERTY_KEYS, PROPERTY_TAGS, MessageExt
from txmq.protocol._message_codec import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    STOREHOSTADDRESS_V6_FLAG,
    decode_message_exts,
    decode_properties,
    inflate_body,
)
from txmq.protocol._message_id import unpack_host

__all__ = ["MessageIndex", "decode_message_exts_bulk", "index_message_exts"]

_I64 = np.int64
_PREFIX = np.dtype([("total", ">i4"), ("magic", ">u4"), ("crc", ">i4"), ("queue_id", ">i4"),
                    ("flag", ">i4"), ("queue_offset", ">i8"), ("commit_log_offset", ">i8"),
                    ("sys_flag", ">i4"), ("born_ts", ">i8")])
"""The first 48 bytes of every record (layout drawn in :mod:`txmq.protocol._message_codec`)."""
assert _PREFIX.itemsize == 48
_BORN_HOST_AT = 48


def _tail(born: int, store: int) -> np.dtype[Any]:
    """The head's bytes from the born host to the body length, for hosts of ``born`` and ``store``
    bytes (8: IPv4 + port, 20: IPv6 + port)."""
    return np.dtype({
        "names": ["born_port", "store_ts", "store_port", "reconsume", "prepared", "body_len"],
        "formats": [">i4", ">i8", ">i4", ">i4", ">i8", ">i4"],
        "offsets": [born - 4, born, born + 8 + store - 4, born + 8 + store, born + 12 + store,
                    born + 20 + store],
        "itemsize": born + 24 + store})


_LAYOUTS = {bits: (born, store, _tail(born, store))
            for bits, (born, store) in enumerate([(8, 8), (20, 8), (8, 20), (20, 20)])}
"""sysFlag's two V6 bits (``(sysFlag >> 4) & 3``) → born host bytes, store host bytes, tail."""
assert BORNHOST_V6_FLAG >> 4 == 1 and STOREHOSTADDRESS_V6_FLAG >> 4 == 2
_RECORD_MIN = 88 + 1 + 2
"""The shortest record: an IPv4 head, an empty body, a 1-byte topic length, a properties length."""
_CRC_MASK = 0x7FFFFFFF
_PORT_MAX = 0xFFFF
_SPAN = np.arange(64, dtype=_I64)


class MessageIndex:
    """Where each record of a reply buffer is and its fixed-width fields, as numpy ``int64``
    arrays with one element per record (in reply order).

    Attributes:
        count: number of records.
        start, end: the record's bytes ``[start, end)``.
        queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_timestamp_ms,
            store_timestamp_ms, reconsume_times, prepared_transaction_offset, body_crc: the
            record's fields (``sys_flag`` as stored: ``COMPRESSED_FLAG`` not cleared).
        born_host_start, born_host_end, store_host_start, store_host_end: the hosts' bytes (8 or
            20: address + port).
        body_start, body_end, topic_start, topic_end, props_start, props_end: the body (as stored,
            compressed when ``sys_flag`` says so), the UTF-8 topic and the UTF-8 properties string.
    """

    __slots__ = ("body_crc", "body_end", "body_start", "born_host_end", "born_host_start",
                 "born_timestamp_ms", "commit_log_offset", "count", "end", "flag",
                 "prepared_transaction_offset", "props_end", "props_start", "queue_id",
                 "queue_offset", "reconsume_times", "start", "store_host_end", "store_host_start",
                 "store_timestamp_ms", "sys_flag", "topic_end", "topic_start")

    count: int
    start: np.ndarray[Any, np.dtype[np.int64]]
    end: np.ndarray[Any, np.dtype[np.int64]]
    queue_id: np.ndarray[Any, np.dtype[np.int64]]
    flag: np.ndarray[Any, np.dtype[np.int64]]
    queue_offset: np.ndarray[Any, np.dtype[np.int64]]
    commit_log_offset: np.ndarray[Any, np.dtype[np.int64]]
    sys_flag: np.ndarray[Any, np.dtype[np.int64]]
    born_timestamp_ms: np.ndarray[Any, np.dtype[np.int64]]
    store_timestamp_ms: np.ndarray[Any, np.dtype[np.int64]]
    reconsume_times: np.ndarray[Any, np.dtype[np.int64]]
    prepared_transaction_offset: np.ndarray[Any, np.dtype[np.int64]]
    body_crc: np.ndarray[Any, np.dtype[np.int64]]
    born_host_start: np.ndarray[Any, np.dtype[np.int64]]
    born_host_end: np.ndarray[Any, np.dtype[np.int64]]
    store_host_start: np.ndarray[Any, np.dtype[np.int64]]
    store_host_end: np.ndarray[Any, np.dtype[np.int64]]
    body_start: np.ndarray[Any, np.dtype[np.int64]]
    body_end: np.ndarray[Any, np.dtype[np.int64]]
    topic_start: np.ndarray[Any, np.dtype[np.int64]]
    topic_end: np.ndarray[Any, np.dtype[np.int64]]
    props_start: np.ndarray[Any, np.dtype[np.int64]]
    props_end: np.ndarray[Any, np.dtype[np.int64]]


def _boundaries(data: bytes) -> list[int] | None:
    """Each record's start, reading only total sizes; None when one is too short or overruns."""
    starts: list[int] = []
    append, n, pos = starts.append, len(data), 0
    from_bytes = int.from_bytes
    while pos < n:
        total = from_bytes(data[pos : pos + 4], signed=True)
        if total < _RECORD_MIN or pos + total > n:
            return None
        append(pos)
        pos += total
    return starts


def _gather(u8: np.ndarray[Any, Any], at: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> Any:
    """The records of ``dtype`` at byte positions ``at`` of ``u8`` (one structured array)."""
    rows = u8[at[:, None] + _SPAN[: dtype.itemsize]]
    return rows.view(dtype)[:, 0]


def index_message_exts(data: bytes, *, check_crc: bool = True) -> MessageIndex | None:
    """Index a reply body (MessageExt records back to back) without a Python object per record.

    Returns None when any record is one the index does not take: anything
    :func:`~txmq.protocol.decode_message_exts` would refuse for its layout (a short buffer, a bad
    magic code, a length that is negative or past its record's end, a body CRC mismatch with
    ``check_crc``, a host port outside 0..65535), or a buffer of 2 GiB or more. Then the caller
    runs :func:`~txmq.protocol.decode_message_exts`, which raises its ``MalformedMessage`` or
    returns the messages. UTF-8 of topics and properties and compressed bodies are not checked
    here (their decoders do). Never raises.
    """
    if len(data) >= 2**31:
        return None
    starts = _boundaries(data)
    if starts is None:
        return None
    ix = MessageIndex()
    ix.count = len(starts)
    u8 = np.frombuffer(data, np.uint8)
    start = np.array(starts, dtype=_I64)
    prefix = _gather(u8, start, _PREFIX)
    total = prefix["total"].astype(_I64)
    magic = prefix["magic"]
    if not np.all((magic == MESSAGE_MAGIC_CODE) | (magic == MESSAGE_MAGIC_CODE_V2)):
        return None
    ix.start, ix.end = start, start + total
    for name, field in (("queue_id", "queue_id"), ("flag", "flag"), ("queue_offset", "queue_offset"),
                        ("commit_log_offset", "commit_log_offset"), ("sys_flag", "sys_flag"),
                        ("born_timestamp_ms", "born_ts"), ("body_crc", "crc")):
        setattr(ix, name, prefix[field].astype(_I64))
    topic_len_size = np.where(magic == MESSAGE_MAGIC_CODE, 1, 2).astype(_I64)
    if not _index_heads(ix, u8, topic_len_size):
        return None
    if not _index_strings(ix, u8, topic_len_size):
        return None
    if check_crc and not _crcs_match(data, ix):
        return None
    return ix


def _index_heads(ix: MessageIndex, u8: np.ndarray[Any, Any], topic_len_size: Any) -> bool:
    """Fill the head fields after the born timestamp, per host layout; False if a record is
    shorter than its head or has a bad port."""
    layout = (ix.sys_flag >> 4) & 3
    for name in ("store_timestamp_ms", "reconsume_times", "prepared_transaction_offset", "body_start",
                 "body_end", "born_host_start", "born_host_end", "store_host_start", "store_host_end"):
        setattr(ix, name, np.empty(ix.count, dtype=_I64))
    for bits in np.unique(layout).tolist():
        born, store, tail = _LAYOUTS[bits]
        sel = np.flatnonzero(layout == bits)
        at = ix.start[sel]
        head = _BORN_HOST_AT + tail.itemsize
        if np.any(ix.end[sel] - at < head + topic_len_size[sel] + 2):
            return False
        rows = _gather(u8, at + _BORN_HOST_AT, tail)
        ports = np.concatenate([rows["born_port"], rows["store_port"]])
        if np.any((ports < 0) | (ports > _PORT_MAX)):
            return False
        ix.store_timestamp_ms[sel] = rows["store_ts"]
        ix.reconsume_times[sel] = rows["reconsume"]
        ix.prepared_transaction_offset[sel] = rows["prepared"]
        ix.body_start[sel] = at + head
        ix.born_host_start[sel] = at + _BORN_HOST_AT
        ix.born_host_end[sel] = at + _BORN_HOST_AT + born
        ix.store_host_start[sel] = at + _BORN_HOST_AT + born + 8
        ix.store_host_end[sel] = at + _BORN_HOST_AT + born + 8 + store
        ix.body_end[sel] = at + head + rows["body_len"].astype(_I64)
    return True


def _index_strings(ix: MessageIndex, u8: np.ndarray[Any, Any], topic_len_size: Any) -> bool:
    """Fill where topics and properties are; False if a length is negative or does not end the
    record at its total size (``decode_message_exts``'s checks, in its order)."""
    b1, end = ix.body_end, ix.end
    if np.any((b1 < ix.body_start) | (b1 + topic_len_size > end)):
        return False
    last = len(u8) - 1
    hi = u8[b1].astype(np.int8).astype(_I64)
    topic_len = np.where(topic_len_size == 1, hi, hi * 256 + u8[np.minimum(b1 + 1, last)])
    t0 = b1 + topic_len_size
    t1 = t0 + topic_len
    if np.any((topic_len < 0) | (t1 + 2 > end)):
        return False
    props_len = u8[t1].astype(np.int8).astype(_I64) * 256 + u8[t1 + 1]
    if np.any((props_len < 0) | (t1 + 2 + props_len != end)):
        return False
    ix.topic_start, ix.topic_end = t0, t1
    ix.props_start, ix.props_end = t1 + 2, end
    return True


def _crcs_match(data: bytes, ix: MessageIndex) -> bool:
    """Whether every non-empty body's CRC32 (``& 0x7FFFFFFF``) is its record's."""
    views = map(memoryview(data).__getitem__, map(slice, ix.body_start.tolist(), ix.body_end.tolist()))
    crcs = np.fromiter(map(zlib.crc32, views), dtype=_I64, count=ix.count) & _CRC_MASK
    return bool(np.all((crcs == ix.body_crc) | (ix.body_end == ix.body_start)))


# --- MessageExt objects from the index ----------------------------------------------------------


def decode_message_exts_bulk(data: bytes, *, check_crc: bool = True,
                             inflate: bool = True) -> list[MessageExt]:
    """Records back to back (a pull response body) → messages, exactly as
    :func:`~txmq.protocol.decode_message_exts` gives them (same fields, same errors), built from
    a :class:`MessageIndex` with no per-record interpretation of the head: each message costs a
    body slice, a split of its properties string and the ``MessageExt`` itself; topic and host
    strings are decoded once per distinct value in the buffer.

    Raises:
        MalformedMessage: as :func:`~txmq.protocol.decode_message_exts` (which runs whenever the
            index refuses the buffer or a record fails to decode here, so the error is its own).
    """
    data = bytes(data)
    ix = index_message_exts(data, check_crc=False)  # checked below on the bodies' bytes
    if ix is not None:
        try:
            return _messages(data, ix, check_crc, inflate)
        except (MalformedMessage, UnicodeDecodeError):
            pass
    return decode_message_exts(data, check_crc=check_crc, inflate=inflate)


def _slices(data: bytes, starts: Any, ends: Any) -> list[bytes]:
    """``data[s:e]`` for each range (numpy arrays of positions), in C-level loops."""
    return list(map(data.__getitem__, map(slice, starts.tolist(), ends.tolist())))


def _distinct_decoded(raws: list[bytes], decode: Callable[[bytes], str]) -> list[str]:
    """``decode(raw)`` for each of ``raws``, decoding each distinct value once (topics and hosts
    repeat within a reply); no per-record Python beyond C-level ``dict`` and ``map`` loops."""
    table = dict.fromkeys(raws, "")
    for raw in table:
        table[raw] = decode(raw)
    return list(map(table.__getitem__, raws))


def _field_strings(data: bytes, u8: np.ndarray[Any, Any], starts: Any, ends: Any,
                   decode: Callable[[bytes], str]) -> list[str]:
    """``decode(data[s:e])`` for each range, each distinct value decoded once. When every range
    has the same length (hosts of one family, topics of one name) the distinct values are found
    by numpy on the gathered bytes, with no Python object per record but the result's slots."""
    width = int(ends[0] - starts[0]) if len(starts) else 0
    if not 0 < width <= len(_SPAN) or np.any(ends - starts != width):
        return _distinct_decoded(_slices(data, starts, ends), decode)
    rows = _gather(u8, starts, np.dtype(f"V{width}"))
    distinct, inverse = np.unique(rows, return_inverse=True)
    names = [decode(v.tobytes()) for v in distinct]
    return list(map(names.__getitem__, inverse.tolist()))


def _utf8(raw: bytes) -> str:
    return raw.decode()


def _common_properties(texts: list[str]) -> list[dict[str, str]] | None:
    """The properties strings as dicts when all are in the common form (``name\u0001value\u0002``
    entries, names and values non-empty, each string ending with ``\u0002``): checked once on the
    joined strings, then each split in C. None when one is not (see :func:`_ext_properties`)."""
    joined = "".join(texts)
    if (sum(map(str.endswith, texts, repeat(PROPERTY_SEPARATOR))) != len(texts) - texts.count("")
            or joined.startswith((NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR))
            or "\u0001\u0002" in joined or "\u0002\u0001" in joined or "\u0002\u0002" in joined):
        return None
    split, sep, sep2 = str.split, repeat(NAME_VALUE_SEPARATOR), PROPERTY_SEPARATOR
    try:  # an entry without a separator or with two raises
        return [dict(map(split, text.split(sep2)[:-1], sep)) for text in texts]
    except ValueError:
        return None


def _ext_properties(text: str) -> dict[str, str]:
    """One properties string → a dict, as :func:`~txmq.protocol.decode_properties` reads it
    (the common form split in C)."""
    entries = text.split(PROPERTY_SEPARATOR)
    if entries[-1] == "":
        entries.pop()
    try:
        props = dict(map(str.split, entries, repeat(NAME_VALUE_SEPARATOR)))
    except ValueError:  # an entry without a separator, or with two
        return decode_properties(text)
    if "" in props or "" in props.values():
        return decode_properties(text)
    return props


def _properties(data: bytes, ix: MessageIndex) -> tuple[list[dict[str, str]], list[str], list[str]]:
    """Each record's properties without ``TAGS``, ``KEYS`` and ``__CRC32#``, its tags, its keys."""
    texts = list(map(bytes.decode, _slices(data, ix.props_start, ix.props_end)))
    dicts = _common_properties(texts)
    if dicts is None:
        dicts = list(map(_ext_properties, texts))
    n = len(dicts)
    list(map(dict.pop, dicts, repeat(PROPERTY_CRC32, n), repeat(None, n)))
    tags = list(map(dict.pop, dicts, repeat(PROPERTY_TAGS, n), repeat("", n)))
    keys = list(map(dict.pop, dicts, repeat(PROPERTY_KEYS, n), repeat("", n)))
    return dicts, tags, keys


def _messages(data: bytes, ix: MessageIndex, check_crc: bool, inflate: bool) -> list[MessageExt]:
    u8 = np.frombuffer(data, np.uint8)
    topics = _field_strings(data, u8, ix.topic_start, ix.topic_end, _utf8)
    props, tags, keys = _properties(data, ix)
    born = _field_strings(data, u8, ix.born_host_start, ix.born_host_end, unpack_host)
    store = _field_strings(data, u8, ix.store_host_start, ix.store_host_end, unpack_host)
    bodies = _slices(data, ix.body_start, ix.body_end)
    if check_crc:
        crcs = np.fromiter(map(zlib.crc32, bodies), dtype=_I64, count=ix.count) & _CRC_MASK
        if not np.all((crcs == ix.body_crc) | (ix.body_end == ix.body_start)):
            raise MalformedMessage("body CRC mismatch")  # (the caller re-raises the spec's error)
    sys_flags = ix.sys_flag.tolist()
    if inflate and np.any(ix.sys_flag & COMPRESSED_FLAG):
        for i in np.flatnonzero((ix.sys_flag & COMPRESSED_FLAG) & (ix.body_end > ix.body_start)):
            bodies[i] = inflate_body(bodies[i], sys_flags[i])
            sys_flags[i] &= ~COMPRESSED_FLAG
    return [MessageExt(topic=topic, body=body, tags=tags, keys=keys, properties=p, flag=flag,
                       queue_id=qid, queue_offset=qoff, commit_log_offset=clo,
                       born_timestamp_ms=bts, store_timestamp_ms=sts, reconsume_times=rt,
                       born_host=bh, store_host=sh, sys_flag=sf, body_crc=crc,
                       prepared_transaction_offset=pto, store_size=size)
            for topic, body, p, tags, keys, flag, qid, qoff, clo, bts, sts, rt, bh, sh, sf, crc,
            pto, size in zip(topics, bodies, props, tags, keys, ix.flag.tolist(), ix.queue_id.tolist(),
                             ix.queue_offset.tolist(), ix.commit_log_offset.tolist(),
                             ix.born_timestamp_ms.tolist(), ix.store_timestamp_ms.tolist(),
                             ix.reconsume_times.tolist(), born, store, sys_flags,
                             ix.body_crc.tolist(), ix.prepared_transaction_offset.tolist(),
                             (ix.end - ix.start).tolist(), strict=True)]
