"""Binary formats of the store: commit log records, consume queue entries and the checkpoint.

Every format is drawn next to its ``struct`` format; all integers are big-endian.

Commit log record: a RocketMQ MessageExt record in the layout an Apache RocketMQ 5 broker with
``MessageStoreConfig.enabledAppendPropCRC`` stores (``MessageExtEncoder.encode``,
``CommitLog.DefaultAppendMessageCallback.doAppend``), so a pull reply is the stored bytes and a
replica can ship them as they are. The encoding is :mod:`txmq.protocol._message_codec`'s
(:func:`~txmq.protocol.encode_message_ext_reserved`); ``H`` is 8 bytes per host (IPv4 + port) or
20 (IPv6 + port, with the sysFlag bits ``BORNHOST_V6_FLAG`` / ``STOREHOSTADDRESS_V6_FLAG``); offsets
below are for two IPv4 hosts::

     offset  size  field                        struct ">iIiiiqqiq" H "q" H "iqi"
          0     4  total size                   i   bytes of the whole record, this field included
          4     4  magic code                   I   0xDAA320A7 (v1) or 0xDAA320AB (v2, topic > 127 B)
          8     4  body CRC                     i   CRC32 of the body & 0x7FFFFFFF (UtilAll.crc32)
         12     4  queue id                     i
         16     4  flag                         i   the producer's Message.flag
         20     8  queue offset                 q   written at append
         28     8  physical offset              q   where the record starts; written at append,
                                                     checked on every read
         36     4  sysFlag                      i   transaction type in bits 2-3 (MessageSysFlag):
                                                     COMMIT on a commit record, NOT_TYPE otherwise
         40     8  born timestamp               q   ms
         48     H  born host                    8s  4-byte address + i32 port
         56     8  store timestamp              q   ms, written at append
         64     H  store host                   8s  this broker (set_store_host)
         72     4  reconsume times              i
         76     8  prepared transaction offset  q   on a commit record: its half's physical offset
         84     4  body length = B              i
         88     B  body                             as stored (a compressed send is inflated first)
       88+B   1|2  topic length = T             b (v1) | h (v2)
                T  topic                            UTF-8
                2  properties length = P        h   including the 20 reserved bytes below
              P-20 properties                       name \\u0001 value \\u0002 ..., TAGS and KEYS
                                                    among them (MessageDecoder)
               20  __CRC32# \\u0001 dddddddddd \\u0002
                                                    CRC32 & 0x7FFFFFFF of bytes [0, total - 20),
                                                    ten decimal digits least significant first
                                                    (CommitLog.CRC32_RESERVED_LEN,
                                                    MessageDecoder.createCrc32)
     total = 88 + B + (1|2) + T + 2 + P

A record is valid when its magic code is one of the two, its total size is within
``[RECORD_SIZE_MIN, RECORD_SIZE_MAX]`` and inside the log, its physical offset is where it lies
and its CRC property matches (RocketMQ ``CommitLog.checkMessageAndReturnSize`` with
``forceVerifyPropCRC``); recovery, reads and ``txmq store check`` all check that.

Consume queue entry (RocketMQ ``ConsumeQueue.CQ_STORE_UNIT_SIZE`` = 20; the tag hash is
CRC32C of the tags, not Java's ``String.hashCode``)::

     +-----------------------------+-------------------+-----------------------------+
     | commit log offset  u64      | size  u32         | tag hash  u64               |
     +-----------------------------+-------------------+-----------------------------+
       0                         8                  12                              20
     struct ">QIQ"

Checkpoint file (RocketMQ ``StoreCheckpoint``, here a CRC-checked msgpack payload)::

     +-----------------+-----------------+-----------------+-----------------------+
     | magic  u32      | crc32c  u32     | length  u32     | payload (msgpack)     |
     +-----------------+-----------------+-----------------+-----------------------+
     struct ">III"
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import TypeVar

import crc32c
import msgspec
from isal.isal_zlib import crc32

from txmq import limits
from txmq.errors import CorruptRecord, MalformedMessage
from txmq.protocol import (
    BORNHOST_V6_FLAG,
    CRC32_RESERVED_LEN,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_SEPARATOR,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    MessageExt,
    decode_message_ext,
    encode_properties,
    pack_host,
    prop_crc,
    reset_transaction_type,
)
from txmq.store._base import Record

__all__ = [
    "CQ_ENTRY",
    "CQ_ENTRY_SIZE",
    "RECORD_MAGICS",
    "RECORD_SIZE_MAX",
    "RECORD_SIZE_MIN",
    "Checkpoint",
    "check_record",
    "decode_checkpoint",
    "decode_message",
    "decode_record",
    "encode_checkpoint",
    "encode_record",
    "peek_size",
    "place_record",
    "seal",
    "store_timestamp",
    "tag_hash",
    "unseal",
    "wire_host",
]

T = TypeVar("T")

RECORD_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
"""The magic codes of a stored record (RocketMQ ``MessageDecoder.MESSAGE_MAGIC_CODE``, ``_V2``)."""
RECORD_SIZE_MIN = 88 + 1 + 2 + CRC32_RESERVED_LEN
"""Smallest valid record: IPv4 hosts, empty body, topic and properties, the CRC property."""
RECORD_SIZE_MAX = 64 * 1024 * 1024
"""Sanity bound on a record's declared size (a larger value is corruption)."""
_SIZE_MAGIC = struct.Struct(">iI")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEADS = tuple(struct.Struct(f">iIiiiqqiq{born}sq{store}siqi")
               for store in (8, 20) for born in (8, 20))
"""Record head up to the body length (layout above), indexed by ``(sysFlag >> 4) & 3`` (the
born and store host V6 bits)."""
assert _HEADS[0].size == 88 and _HEADS[3].size == 112
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_CRC_MASK = 0x7FFFFFFF
_CRC_NAME = (PROPERTY_CRC32 + NAME_VALUE_SEPARATOR).encode()
_CRC_END = PROPERTY_SEPARATOR.encode()
_CRC_PROPERTY = _CRC_NAME + b"%b" + _CRC_END
"""The CRC property with its ten digits to fill in (``%`` formatting)."""
_CRC_BLANK = bytes(CRC32_RESERVED_LEN)
"""The reserve :func:`encode_record` leaves for the CRC property (:func:`place_record` fills it)."""
_CRC_COPY_MAX_BYTES = 64 * 1024
"""Up to this record size :func:`place_record` CRCs a copy of the record's bytes (for a 1 KiB
record the copy costs less than making a memoryview and slicing it: timeit, docs/benchmarks.md),
above it a view (no copy of a large record)."""
_PHYSICAL_OFFSET_AT = 28
_SYS_FLAG_AT = 36
_BORN_HOST_AT = 48

CQ_ENTRY = struct.Struct(">QIQ")
CQ_ENTRY_SIZE = 20
assert CQ_ENTRY.size == CQ_ENTRY_SIZE

CHECKPOINT_MAGIC = 0x54584D43  # "TXMC"
_CHECKPOINT_HEAD = struct.Struct(">III")

_enc = msgspec.msgpack.Encoder()


def tag_hash(tags: str) -> int:
    """The consume queue's tag hash: CRC32C of the UTF-8 tags (0 for no tags)."""
    return crc32c.crc32c(tags.encode()) if tags else 0


@lru_cache(maxsize=1024)
def wire_host(host: str) -> str:
    """``host`` if it is an ``ip:port`` a record can hold, else "" (stored as ``0.0.0.0:0``)."""
    try:
        pack_host(host)
    except MalformedMessage:
        return ""
    return host


def _sys_flag(rec: Record, born: bytes, store: bytes) -> int:
    """``rec.sys_flag`` with the transaction type a record stores and the hosts' V6 bits. A half
    is stored as a normal message (``TRAN_MSG`` in its properties, RocketMQ
    ``TransactionalMessageBridge.parseHalfMessageInner``), a commit record as COMMIT
    (``EndTransactionProcessor``; txmq marks it with ``TRAN_PREPARED_QUEUE_OFFSET``)."""
    props, flag = rec.properties, rec.sys_flag
    if not flag and len(born) == len(store) == 8 and PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET \
            not in props:  # the common plain send: nothing to set (a half's type is NOT_TYPE)
        return 0
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        flag = reset_transaction_type(flag, TRANSACTION_NOT_TYPE)
    elif PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in props:
        flag = reset_transaction_type(flag, TRANSACTION_COMMIT_TYPE)
    flag &= ~_V6_FLAGS
    if len(born) != 8:
        flag |= BORNHOST_V6_FLAG
    if len(store) != 8:
        flag |= STOREHOSTADDRESS_V6_FLAG
    return flag


def encode_record(rec: Record, store_host: str) -> bytearray:
    """``rec`` as a record (layout above) with its physical offset 0 and its CRC property blank
    (zero bytes): :func:`place_record` fills both in once the offset is known. The queue offset and store
    timestamp are ``rec``'s; the transaction type comes from its properties (``TRAN_MSG``: a
    half, stored as NOT_TYPE as RocketMQ does; ``TRAN_PREPARED_QUEUE_OFFSET``: a commit record)
    or ``rec.sys_flag``; a ``__CRC32#`` property in ``rec`` is dropped (RocketMQ
    ``CommitLog.asyncPutMessage``). A host that is not an ``ip:port`` is stored as ``0.0.0.0:0``.

    Built in one pass, the bytes :func:`txmq.protocol.encode_message_ext_reserved` gives for the
    same message (RocketMQ ``MessageExtEncoder.encode``), with the topic's and hosts' encodings
    remembered between records and no :class:`~txmq.protocol.MessageExt` in between.

    Raises:
        ValueError: a field does not fit the layout (topic over 32,767 bytes, properties over
            ``PROPERTIES_MAX_BYTES`` with the CRC property, a bad property name or value, text
            that is not UTF-8, a value outside Java's int/long).
    """
    props = rec.properties
    if PROPERTY_CRC32 in props:
        props = {k: v for k, v in props.items() if k != PROPERTY_CRC32}
    try:
        text = encode_properties(props, rec.tags, rec.keys).encode()
    except (MalformedMessage, UnicodeEncodeError) as exc:
        raise ValueError(f"properties: {exc}") from exc
    props_len = len(text) + CRC32_RESERVED_LEN
    if props_len > limits.PROPERTIES_MAX_BYTES:
        raise ValueError(f"properties of {props_len} bytes exceed {limits.PROPERTIES_MAX_BYTES}")
    magic, topic = _topic_field(rec.topic)
    born, store = _packed_host(rec.born_host), _packed_host(store_host)
    sys_flag = _sys_flag(rec, born, store)
    head = _HEADS[(sys_flag >> 4) & 3]
    body = rec.body
    total = head.size + len(body) + len(topic) + 2 + props_len
    try:
        packed = head.pack(
            total, magic, crc32(body) & _CRC_MASK, rec.queue_id, rec.flag, rec.queue_offset, 0,
            sys_flag, rec.born_timestamp_ms, born, rec.store_timestamp_ms, store,
            rec.reconsume_times, rec.prepared_transaction_offset, len(body))
    except struct.error as exc:
        raise ValueError(f"record field out of range (Java int/long): {exc}") from exc
    return bytearray().join((packed, body, topic, _I16.pack(props_len), text, _CRC_BLANK))


@lru_cache(maxsize=limits.RECORD_TOPIC_CACHE_ENTRIES)
def _topic_field(topic: str) -> tuple[int, bytes]:
    """The magic code a record of ``topic`` takes and its topic length + UTF-8 topic bytes: v1
    (1-byte length) up to ``MESSAGE_TOPIC_V1_MAX_BYTES``, else v2 (2-byte length); RocketMQ
    ``CommitLog`` ``autoMessageVersionOnTopicLen``. Raises ValueError (too long, not UTF-8)."""
    raw = topic.encode()  # UnicodeEncodeError is a ValueError
    if len(raw) <= limits.MESSAGE_TOPIC_V1_MAX_BYTES:
        return MESSAGE_MAGIC_CODE, _I8.pack(len(raw)) + raw
    if len(raw) <= limits.MESSAGE_TOPIC_MAX_BYTES:
        return MESSAGE_MAGIC_CODE_V2, _I16.pack(len(raw)) + raw
    raise ValueError(f"topic of {len(raw)} bytes exceeds {limits.MESSAGE_TOPIC_MAX_BYTES}")


@lru_cache(maxsize=limits.MESSAGE_HOST_CACHE_ENTRIES)
def _packed_host(host: str) -> bytes:
    """``host``'s record bytes (:func:`~txmq.protocol.pack_host`); those of ``0.0.0.0:0`` for
    ``""`` or a host a record cannot hold (:func:`wire_host`)."""
    return pack_host(wire_host(host) if host else "")


def place_record(buf: bytearray, start: int, size: int, commit_log_offset: int) -> None:
    """Write the physical offset and then the CRC property of the record ``buf[start:start+size]``
    made by :func:`encode_record` (RocketMQ ``doAppend``'s order: offsets first, CRC last): CRC32
    ``& 0x7FFFFFFF`` of the bytes before the property, ten decimal digits least significant first
    (what :func:`txmq.protocol.fill_prop_crc` writes; RocketMQ ``MessageDecoder.createCrc32``)."""
    _I64.pack_into(buf, start + _PHYSICAL_OFFSET_AT, commit_log_offset)
    end = start + size - CRC32_RESERVED_LEN
    if size <= _CRC_COPY_MAX_BYTES:
        crc = crc32(buf[start:end]) & _CRC_MASK
    else:
        with memoryview(buf) as view:
            crc = crc32(view[start:end]) & _CRC_MASK
    buf[end : end + CRC32_RESERVED_LEN] = _CRC_PROPERTY % (b"%010d" % crc)[::-1]


def peek_size(view: memoryview | bytes, pos: int = 0) -> int:
    """The declared total size of the record at ``pos`` (0 if fewer than 4 bytes or negative)."""
    if len(view) - pos < 4:
        return 0
    return max(0, int(_I32.unpack_from(view, pos)[0]))


def check_record(view: memoryview | bytes, pos: int, commit_log_offset: int) -> int:
    """Verify the record at ``view[pos:]``, which must start at ``commit_log_offset``; return
    its size.

    Raises:
        CorruptRecord: short, bad magic code, a size out of bounds or past the data (torn), a
            physical offset that is not ``commit_log_offset``, no CRC property, or a CRC mismatch.
    """
    at = f"commit log offset {commit_log_offset}"
    if len(view) - pos < 8:
        raise CorruptRecord(f"{at}: short record")
    total, magic = _SIZE_MAGIC.unpack_from(view, pos)
    if magic not in RECORD_MAGICS:
        raise CorruptRecord(f"{at}: bad magic code {magic:#x}")
    if not RECORD_SIZE_MIN <= total <= RECORD_SIZE_MAX or pos + total > len(view):
        raise CorruptRecord(f"{at}: bad or torn size {total}")
    (phys,) = _I64.unpack_from(view, pos + _PHYSICAL_OFFSET_AT)
    if phys != commit_log_offset:
        raise CorruptRecord(f"record at {commit_log_offset} says it is at {phys}")
    crc = prop_crc(view, pos, total)
    if crc is None:
        raise CorruptRecord(f"{at}: no {PROPERTY_CRC32} property at the end of the record")
    if crc[0] != crc[1]:
        raise CorruptRecord(f"{at}: CRC32 mismatch (stored {crc[0]}, computed {crc[1]})")
    return int(total)


def decode_message(view: memoryview | bytes, pos: int, commit_log_offset: int) -> MessageExt:
    """The consumer view of the record at ``view[pos:]`` (checked by :func:`check_record`;
    the body as stored, no ``__CRC32#`` among the properties).

    Raises:
        CorruptRecord: it fails its check or its fields do not decode.
    """
    size = check_record(view, pos, commit_log_offset)
    try:
        return decode_message_ext(bytes(view[pos : pos + size]), check_crc=False, inflate=False)
    except MalformedMessage as exc:
        raise CorruptRecord(f"record at {commit_log_offset} does not decode: {exc}") from exc


def decode_record(view: memoryview | bytes, pos: int, commit_log_offset: int) -> tuple[Record, int]:
    """The record at ``view[pos:]`` (which must start at ``commit_log_offset``) and its size.

    Raises:
        CorruptRecord: as :func:`decode_message`.
    """
    m = decode_message(view, pos, commit_log_offset)
    rec = Record(topic=m.topic, queue_id=m.queue_id, body=m.body, tags=m.tags, keys=m.keys,
                 properties=m.properties, born_timestamp_ms=m.born_timestamp_ms,
                 store_timestamp_ms=m.store_timestamp_ms, reconsume_times=m.reconsume_times,
                 queue_offset=m.queue_offset, flag=m.flag, born_host=m.born_host,
                 store_host=m.store_host, sys_flag=m.sys_flag,
                 prepared_transaction_offset=m.prepared_transaction_offset)
    return rec, m.store_size


def store_timestamp(view: memoryview | bytes) -> int:
    """The store timestamp in a record head (no CRC check: used for retention estimates)."""
    (sys_flag,) = _I32.unpack_from(view, _SYS_FLAG_AT)
    at = _BORN_HOST_AT + (20 if sys_flag & BORNHOST_V6_FLAG else 8)
    return int(_I64.unpack_from(view, at)[0])


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
