"""Binary formats of the store: commit log records, consume queue entries and the checkpoint.

Every format is drawn next to its ``struct`` format; all integers are big-endian.

Commit log record (RocketMQ ``CommitLog`` message layout, with a CRC32C over the whole record
instead of the body only, and tags and keys as their own fields)::

     offset  size  field
          0     4  total_size          u32  bytes of the whole record, this field included
          4     4  magic               u32  RECORD_MAGIC ("TXM1")
          8     4  crc32c              u32  CRC32C of bytes [12, total_size)
         12     4  queue_id            u32
         16     4  flag                u32  the producer's flag (RocketMQ Message.flag)
         20     4  sys_flag            u32  bits 2-3: transaction type (RocketMQ MessageSysFlag)
         24     8  queue_offset        u64
         32     8  commit_log_offset   u64  where this record starts (checked on read)
         40     8  born_timestamp_ms   i64
         48     8  store_timestamp_ms  i64
         56    20  born_host           16-byte IPv6 address (IPv4-mapped) + u32 port
         76    20  store_host          same
         96     4  reconsume_times     u32
        100     4  body_len = B        u32
        104     B  body
      104+B     2  topic_len = T       u16, then T bytes of UTF-8
                2  tags_len            u16, then the tags (UTF-8)
                2  keys_len            u16, then the keys (UTF-8, space-separated)
                4  properties_len      u32, then a msgpack map of str → str
     total_size = 104 + B + 2 + T + 2 + len(tags) + 2 + len(keys) + 4 + len(properties)

Consume queue entry (RocketMQ ``ConsumeQueue.CQ_STORE_UNIT_SIZE`` = 20)::

     +-----------------------------+-------------------+-----------------------------+
     | commit log offset  u64      | size  u32         | tag hash  u64               |
     +-----------------------------+-------------------+-----------------------------+
       0                         8                  12                              20

Checkpoint file (RocketMQ ``StoreCheckpoint``, here a CRC-checked msgpack payload)::

     +-----------------+-----------------+-----------------+-----------------------+
     | magic  u32      | crc32c  u32     | length  u32     | payload (msgpack)     |
     +-----------------+-----------------+-----------------+-----------------------+
"""

from __future__ import annotations

import ipaddress
import struct
from functools import lru_cache
from typing import Any, TypeVar

import crc32c
import msgspec

from txmq.errors import CorruptRecord
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    MessageExt,
)
from txmq.store._base import Record

__all__ = [
    "CQ_ENTRY",
    "CQ_ENTRY_SIZE",
    "RECORD_HEAD",
    "RECORD_HEAD_SIZE",
    "RECORD_MAGIC",
    "Checkpoint",
    "decode_checkpoint",
    "decode_message",
    "decode_record",
    "encode_checkpoint",
    "encode_record",
    "host_bytes",
    "record_size",
    "record_tail",
    "seal",
    "tag_hash",
    "unseal",
]

T = TypeVar("T")

RECORD_MAGIC = 0x54584D31  # "TXM1"
RECORD_HEAD = struct.Struct(">IIIIIIQQqq16sI16sIII")
RECORD_HEAD_SIZE = 104
assert RECORD_HEAD.size == RECORD_HEAD_SIZE
_CRC_FROM = 12  # the CRC covers everything after the magic and the CRC itself
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
RECORD_SIZE_MIN = RECORD_HEAD_SIZE + 2 + 2 + 2 + 4
RECORD_SIZE_MAX = 64 * 1024 * 1024
"""Sanity bound on a record's declared size (a larger value is corruption)."""

SYS_FLAG_TRANSACTION_PREPARED = 0x4
SYS_FLAG_TRANSACTION_COMMIT = 0x8

CQ_ENTRY = struct.Struct(">QIQ")
CQ_ENTRY_SIZE = 20
assert CQ_ENTRY.size == CQ_ENTRY_SIZE

CHECKPOINT_MAGIC = 0x54584D43  # "TXMC"
_CHECKPOINT_HEAD = struct.Struct(">III")

_enc = msgspec.msgpack.Encoder()
_props_dec = msgspec.msgpack.Decoder(dict[str, str])
_NO_HOST = (bytes(16), 0)


@lru_cache(maxsize=1024)
def _host_bytes(host: str) -> tuple[bytes, int]:
    """``"ip:port"`` → (16-byte address, port). Anything that is not an IP literal stores zeros."""
    addr, sep, port = host.rpartition(":")
    if not sep or not port.isdigit():
        return _NO_HOST
    try:
        ip = ipaddress.ip_address(addr.strip("[]"))
    except ValueError:
        return bytes(16), int(port)
    if isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed, int(port) & 0xFFFFFFFF


@lru_cache(maxsize=1024)
def _host_str(addr: bytes, port: int) -> str:
    if addr == _NO_HOST[0] and port == 0:
        return ""
    ip = ipaddress.IPv6Address(addr)
    if ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}:{port}"
    return f"[{ip}]:{port}"


def tag_hash(tags: str) -> int:
    """The consume queue's tag hash: CRC32C of the UTF-8 tags (0 for no tags)."""
    return crc32c.crc32c(tags.encode()) if tags else 0


def _sys_flag(props: dict[str, str]) -> int:
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return SYS_FLAG_TRANSACTION_PREPARED
    if PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in props:
        return SYS_FLAG_TRANSACTION_COMMIT
    return 0


@lru_cache(maxsize=4096)
def _short_str(text: str) -> bytes:
    """u16 length + UTF-8 (topics, tags and keys repeat: cached)."""
    data = text.encode()
    if len(data) > 0xFFFF:
        raise ValueError("topic, tags and keys must each be under 64 KiB")
    return _U16.pack(len(data)) + data


_EMPTY_STR = _short_str("")
_NO_PROPS = _U32.pack(0)


def record_tail(rec: Record) -> bytes:
    """The variable part after the body (topic, tags, keys, properties).

    Raises:
        ValueError: topic, tags or keys of 64 KiB or more.
    """
    props = _enc.encode(rec.properties) if rec.properties else b""
    return b"".join((_short_str(rec.topic), _short_str(rec.tags) if rec.tags else _EMPTY_STR,
                     _short_str(rec.keys) if rec.keys else _EMPTY_STR,
                     _U32.pack(len(props)) if props else _NO_PROPS, props))


def record_size(rec: Record) -> int:
    """Bytes :func:`encode_record` produces for ``rec`` (MemoryStore offsets use it too)."""
    return RECORD_HEAD_SIZE + len(rec.body) + len(record_tail(rec))


def host_bytes(host: str) -> tuple[bytes, int]:
    """A host as stored: 16-byte address and port (zeros for "")."""
    return _host_bytes(host) if host else _NO_HOST


def encode_record(rec: Record, commit_log_offset: int, store_host: tuple[bytes, int],
                  tail: bytes | None = None) -> bytes:
    """One record in the layout above, its CRC32C filled in (``store_host`` from
    :func:`host_bytes`; ``tail`` from :func:`record_tail` saves encoding it twice).

    Raises:
        ValueError: a field does not fit its width (topic/tags/keys ≥ 64 KiB, negative offsets).
    """
    if tail is None:
        tail = record_tail(rec)
    body = rec.body
    born, born_port = _host_bytes(rec.born_host) if rec.born_host else _NO_HOST
    try:
        head = RECORD_HEAD.pack(
            RECORD_HEAD_SIZE + len(body) + len(tail), RECORD_MAGIC, 0, rec.queue_id, rec.flag,
            _sys_flag(rec.properties), rec.queue_offset, commit_log_offset, rec.born_timestamp_ms,
            rec.store_timestamp_ms, born, born_port, store_host[0], store_host[1],
            rec.reconsume_times, len(body))
    except struct.error as exc:
        raise ValueError(f"record field out of range: {exc}") from exc
    crc = crc32c.crc32c(tail, crc32c.crc32c(body, crc32c.crc32c(head[_CRC_FROM:])))
    return b"".join((head[:8], _U32.pack(crc), head[_CRC_FROM:], body, tail))


def _check(view: memoryview, pos: int, commit_log_offset: int) -> int:
    """Verify the record at ``view[pos:]``; return its size. Raises CorruptRecord."""
    if len(view) - pos < RECORD_HEAD_SIZE:
        raise CorruptRecord(f"commit log offset {commit_log_offset}: short record")
    total, magic, crc = RECORD_HEAD.unpack_from(view, pos)[:3]
    if magic != RECORD_MAGIC:
        raise CorruptRecord(f"commit log offset {commit_log_offset}: bad magic {magic:#x}")
    if not RECORD_SIZE_MIN <= total <= RECORD_SIZE_MAX or pos + total > len(view):
        raise CorruptRecord(f"commit log offset {commit_log_offset}: bad or torn size {total}")
    if crc32c.crc32c(view[pos + _CRC_FROM : pos + total]) != crc:
        raise CorruptRecord(f"commit log offset {commit_log_offset}: CRC32C mismatch")
    return int(total)


def peek_size(view: memoryview | bytes, pos: int = 0) -> int:
    """The declared total size of the record at ``pos`` (0 if fewer than 4 bytes)."""
    if len(view) - pos < 4:
        return 0
    return int(_U32.unpack_from(view, pos)[0])


def _fields(view: memoryview, pos: int, commit_log_offset: int) -> tuple[tuple[Any, ...], bytes, str,
                                                                          str, str, dict[str, str],
                                                                          int]:
    total = _check(view, pos, commit_log_offset)
    head = RECORD_HEAD.unpack_from(view, pos)
    if head[7] != commit_log_offset:
        raise CorruptRecord(f"record at {commit_log_offset} says it is at {head[7]}")
    try:
        p = pos + RECORD_HEAD_SIZE
        body = bytes(view[p : p + head[15]])
        p += head[15]
        strs = []
        for _ in range(3):
            (n,) = _U16.unpack_from(view, p)
            strs.append(str(view[p + 2 : p + 2 + n], "utf-8"))
            p += 2 + n
        (n,) = _U32.unpack_from(view, p)
        props = _props_dec.decode(view[p + 4 : p + 4 + n]) if n else {}
        if p + 4 + n != pos + total:
            raise CorruptRecord(f"record at {commit_log_offset}: field lengths do not add up")
    except (struct.error, UnicodeDecodeError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecord(f"record at {commit_log_offset} does not decode: {exc}") from exc
    return head, body, strs[0], strs[1], strs[2], props, total


def decode_record(view: memoryview, pos: int, commit_log_offset: int) -> tuple[Record, int]:
    """The record at ``view[pos:]`` (which must start at ``commit_log_offset``) and its size.

    Raises:
        CorruptRecord: bad magic, size, CRC32C, offset or field lengths.
    """
    head, body, topic, tags, keys, props, total = _fields(view, pos, commit_log_offset)
    rec = Record(topic=topic, queue_id=head[3], body=body, tags=tags, keys=keys, properties=props,
                 born_timestamp_ms=head[8], store_timestamp_ms=head[9], reconsume_times=head[14],
                 queue_offset=head[6], flag=head[4], born_host=_host_str(head[10], head[11]),
                 store_host=_host_str(head[12], head[13]))
    return rec, total


def decode_message(view: memoryview, pos: int, commit_log_offset: int) -> MessageExt:
    """The consumer view of the record at ``view[pos:]``. Raises CorruptRecord."""
    head, body, topic, tags, keys, props, _ = _fields(view, pos, commit_log_offset)
    return MessageExt(topic=topic, body=body, tags=tags, keys=keys, properties=props,
                      queue_id=head[3], queue_offset=head[6], commit_log_offset=commit_log_offset,
                      born_timestamp_ms=head[8], store_timestamp_ms=head[9],
                      reconsume_times=head[14], born_host=_host_str(head[10], head[11]),
                      store_host=_host_str(head[12], head[13]))


def store_timestamp(view: memoryview | bytes) -> int:
    """The store timestamp in a record head (no CRC check: used for retention estimates)."""
    return int(RECORD_HEAD.unpack_from(view, 0)[9])


class Checkpoint(msgspec.Struct, array_like=True, kw_only=True):
    """What was durable at the last checkpoint.

    Attributes:
        dispatched: commit log offset up to which consume queues and indexes are on disk.
        last_record: start of the record that ends at ``dispatched`` (-1 if none), verified on open.
        queues: ``[topic, queue_id, min_offset, max_offset]`` of every consume queue.
        index_files: ``[name, base_ms, min_ms, max_ms, begin_offset, end_offset, entries]`` of the
            index files.
    """

    dispatched: int
    last_record: int
    queues: list[tuple[str, int, int, int]]
    index_files: list[tuple[str, int, int, int, int, int, int]]


_checkpoint_dec = msgspec.msgpack.Decoder(Checkpoint)


def seal(magic: int, obj: msgspec.Struct) -> bytes:
    """A small state file's bytes: ``magic u32 | crc32c u32 | length u32 | msgpack payload``
    (the checkpoint's layout above; the transaction index snapshot uses it too)."""
    payload = _enc.encode(obj)
    return _CHECKPOINT_HEAD.pack(magic, crc32c.crc32c(payload), len(payload)) + payload


def unseal(magic: int, data: bytes, decoder: msgspec.msgpack.Decoder[T], what: str) -> T:
    """Parse what :func:`seal` wrote with ``magic``. Raises CorruptRecord, naming ``what``, when
    it is short, its magic, length or CRC32C does not check out, or its payload does not decode."""
    if len(data) < _CHECKPOINT_HEAD.size:
        raise CorruptRecord(f"{what} too short")
    found, crc, n = _CHECKPOINT_HEAD.unpack_from(data)
    payload = data[_CHECKPOINT_HEAD.size :]
    if found != magic or len(payload) != n or crc32c.crc32c(payload) != crc:
        raise CorruptRecord(f"{what} fails its magic, length or CRC32C check")
    try:
        return decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"{what} does not decode: {exc}") from exc


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The checkpoint file's bytes."""
    return seal(CHECKPOINT_MAGIC, cp)


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Parse a checkpoint file. Raises CorruptRecord on any damage."""
    return unseal(CHECKPOINT_MAGIC, data, _checkpoint_dec, "checkpoint")
