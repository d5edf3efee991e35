"""Reader of txmq's store format before MessageExt records ("TXM1"), kept only for
``txmq store migrate`` (:mod:`txmq.store._migrate`). Nothing writes this format any more.

Commit log record (RocketMQ ``CommitLog`` message layout, with a CRC32C over the whole record
instead of the body only, and tags and keys as their own fields)::

     offset  size  field               struct ">IIIIIIQQqq16sI16sIII"
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

Consume queue entries and the checkpoint file had the layouts they still have
(:mod:`txmq.store._codec`).
"""

from __future__ import annotations

import ipaddress
import struct
from functools import lru_cache
from typing import Any

import crc32c
import msgspec

from txmq.errors import CorruptRecord
from txmq.store._base import Record

__all__ = ["RECORD_MAGIC", "decode_record", "peek_size"]

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

_props_dec = msgspec.msgpack.Decoder(dict[str, str])
_NO_HOST = (bytes(16), 0)


@lru_cache(maxsize=1024)
def _host_str(addr: bytes, port: int) -> str:
    if addr == _NO_HOST[0] and port == 0:
        return ""
    ip = ipaddress.IPv6Address(addr)
    if ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}:{port}"
    return f"[{ip}]:{port}"


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
