"""RocketMQ's binary message encodings: the MessageExt record, the batch body, the properties string
and the ``sysFlag`` bits. Sans-IO: bytes in, structs out, and back.

Every integer is big-endian and signed (Java ``int`` / ``long`` / ``short``), as RocketMQ writes
them. Facts from RocketMQ ``MessageDecoder``, ``MessageSysFlag``, ``MessageVersion``,
``MessageExtEncoder`` / ``CommitLog`` (the stored layout) and ``UtilAll.crc32``.

MessageExt record (RocketMQ ``MessageDecoder.encode`` / ``decode``, ``MessageExtEncoder.encode``):
what a pull response body (several records back to back) and a check-back body (one) carry; the
layout of a commit log record. ``H`` is 8 bytes (IPv4 + port) or 20 (IPv6 + port) per host, chosen by
the ``sysFlag`` bits ``BORNHOST_V6_FLAG`` and ``STOREHOSTADDRESS_V6_FLAG``; offsets below are for
two IPv4 hosts::

     offset  size  field                         struct (_HEADS: ">iIiiiqqiq" H "q" H "iqi")
          0     4  total size (storeSize)        i   bytes of the record, this field included
          4     4  magic code                    I   0xDAA320A7 (v1) or 0xDAA320AB (v2)
          8     4  body CRC                      i   CRC32 of the body as stored, & 0x7FFFFFFF
         12     4  queue id                      i
         16     4  flag                          i   Message.flag
         20     8  queue offset                  q
         28     8  commit log offset             q   ("physical offset")
         36     4  sysFlag                       i   MessageSysFlag bits
         40     8  born timestamp                q   ms since the epoch
         48     H  born host                     8s / 20s   address + i32 port
         56     8  store timestamp               q   ms since the epoch
         64     H  store host                    8s / 20s   address + i32 port
         72     4  reconsume times               i
         76     8  prepared transaction offset   q
         84     4  body length = B               i
         88     B  body                              compressed when sysFlag has COMPRESSED_FLAG
       88+B   1|2  topic length = T              b (v1) | h (v2, MessageVersion.MESSAGE_VERSION_V2)
                T  topic                             UTF-8
                2  properties length = P         h
                P  properties                        UTF-8 properties string (below)

    +-------+-------+-----+-----+-----+---------+---------+-------+---------+------+---------+
    | total | magic | crc | qid | flag| queue   | commit  |sysFlag| born ts | born | store ts|
    |  i32  |  u32  | i32 | i32 | i32 | off i64 | off i64 |  i32  |   i64   | host |   i64   |
    +-------+-------+-----+-----+-----+---------+---------+-------+---------+------+---------+
    +-------+-----------+----------+-----+------+-------+-------+-----+------------+
    | store | reconsume | prepared | B   | body | T     | topic | P   | properties |
    | host  |    i32    | off i64  | i32 |      | i8/16 |       | i16 |            |
    +-------+-----------+----------+-----+------+-------+-------+-----+------------+

Batch body (SEND_BATCH_MESSAGE, RocketMQ ``MessageDecoder.encodeMessage`` / ``decodeMessage``;
the topic travels in the request header)::

    +---------+---------+---------+---------+---------+------+---------+------------+
    | total   | magic 0 | crc 0   | flag    | B       | body | P       | properties |   ">iiiii" + h
    |   i32   |   i32   |   i32   |   i32   |   i32   |      |   i16   |            |
    +---------+---------+---------+---------+---------+------+---------+------------+

Properties string (``MessageDecoder.messageProperties2String`` / ``string2messageProperties``):
``name \\u0001 value \\u0002`` repeated. On the wire :attr:`Message.tags` and :attr:`Message.keys`
are the properties ``TAGS`` and ``KEYS``; the decoders move them back into their fields.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping

from isal.isal_zlib import crc32

from txmq import limits
from txmq.errors import MalformedMessage
from txmq.protocol._message import PROPERTY_CRC32, PROPERTY_KEYS, PROPERTY_TAGS, Message, MessageExt
from txmq.protocol._message_id import pack_host, unpack_host

__all__ = [
    "BLANK_MAGIC_CODE",
    "BORNHOST_V6_FLAG",
    "COMPRESSED_FLAG",
    "COMPRESSION_LZ4_TYPE",
    "COMPRESSION_TYPE_COMPARATOR",
    "COMPRESSION_ZLIB_TYPE",
    "COMPRESSION_ZSTD_TYPE",
    "CRC32_RESERVED_LEN",
    "INNER_BATCH_FLAG",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "MULTI_TAGS_FLAG",
    "NAME_VALUE_SEPARATOR",
    "NEED_UNWRAP_FLAG",
    "PROPERTY_SEPARATOR",
    "STOREHOSTADDRESS_V6_FLAG",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "body_crc",
    "decode_batch",
    "decode_message_ext",
    "decode_message_exts",
    "decode_properties",
    "encode_batch",
    "encode_message_ext",
    "encode_message_ext_reserved",
    "encode_message_exts",
    "encode_properties",
    "fill_prop_crc",
    "inflate_body",
    "prop_crc",
    "reset_transaction_type",
    "transaction_type",
    "unwrap_inner_batch",
]

# --- MessageSysFlag ------------------------------------------------------------------------------
COMPRESSED_FLAG = 0x1
"""The body is compressed (with the algorithm in the compression type bits)."""
MULTI_TAGS_FLAG = 0x1 << 1
TRANSACTION_NOT_TYPE = 0
"""A normal message (bits 2-3 of sysFlag hold the transaction type)."""
TRANSACTION_PREPARED_TYPE = 0x1 << 2
"""A half message."""
TRANSACTION_COMMIT_TYPE = 0x2 << 2
TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
BORNHOST_V6_FLAG = 0x1 << 4
"""The born host is IPv6 (20 bytes on the wire instead of 8)."""
STOREHOSTADDRESS_V6_FLAG = 0x1 << 5
"""The store host is IPv6 (20 bytes on the wire instead of 8)."""
NEED_UNWRAP_FLAG = 0x1 << 6
"""With INNER_BATCH_FLAG: the body is a batch body the consumer unwraps (:func:`unwrap_inner_batch`)."""
INNER_BATCH_FLAG = 0x1 << 7
COMPRESSION_LZ4_TYPE = 0x1 << 8
COMPRESSION_ZSTD_TYPE = 0x2 << 8
COMPRESSION_ZLIB_TYPE = 0x3 << 8
"""Compression type bits 8-10 (``CompressionType``); 0 also means zlib (clients before 5.x)."""
COMPRESSION_TYPE_COMPARATOR = 0x7 << 8
"""Mask of the compression type bits."""

# --- MessageDecoder ------------------------------------------------------------------------------
MESSAGE_MAGIC_CODE = 0xDAA320A7
"""Record magic code v1, 1-byte topic length (Java ``-626843481``)."""
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
"""Record magic code v2, 2-byte topic length (Java ``-626843477``), for topics over 127 bytes."""
BLANK_MAGIC_CODE = 0xCBD43194
"""Marks the unused end of a commit log file (Java ``-875286124``); never a message."""
NAME_VALUE_SEPARATOR = "\u0001"
PROPERTY_SEPARATOR = "\u0002"

_TX_MASK = TRANSACTION_ROLLBACK_TYPE
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
_CRC_MASK = 0x7FFFFFFF
_ZLIB_LEVEL = 5
"""``MessageDecoder.encode`` compresses with level 5 (``Compressor.compress(body, 5)``)."""

_SIZE_MAGIC = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
_SYSFLAG_POSITION = 36
"""``MessageDecoder.SYSFLAG_POSITION``."""
_PREFIX_SIZE = _SYSFLAG_POSITION + 4
_HEADS = tuple(struct.Struct(f">iIiiiqqiq{born}sq{store}siqi")
               for store in (8, 20) for born in (8, 20))
"""Record head up to the body length, indexed by ``(sysFlag >> 4) & 3`` (the two V6 bits)."""
assert _HEADS[0].size == 88 and _HEADS[3].size == 112
_BATCH_HEAD = struct.Struct(">iiiii")
_BATCH_MIN = _BATCH_HEAD.size + 2


def transaction_type(sys_flag: int) -> int:
    """The transaction type bits of ``sys_flag`` (``TRANSACTION_*_TYPE``).
    RocketMQ ``MessageSysFlag.getTransactionValue``."""
    return sys_flag & _TX_MASK


def reset_transaction_type(sys_flag: int, tx_type: int) -> int:
    """``sys_flag`` with its transaction type replaced by ``tx_type``.
    RocketMQ ``MessageSysFlag.resetTransactionValue``."""
    return (sys_flag & ~_TX_MASK) | tx_type


def body_crc(body: bytes) -> int:
    """CRC32 (``java.util.zip.CRC32``) of ``body`` masked to 31 bits, as records store it.
    RocketMQ ``UtilAll.crc32``."""
    return crc32(body) & _CRC_MASK


# --- properties string ---------------------------------------------------------------------------
def encode_properties(props: Mapping[str, str], tags: str = "", keys: str = "") -> str:
    """``props`` as RocketMQ's properties string, ``name\\u0001value\\u0002`` per entry in the
    mapping's order, then ``TAGS`` and ``KEYS`` when ``tags`` / ``keys`` are not empty (the order
    a record and a batch entry carry them in). An entry with an empty value is left out:
    RocketMQ's decoder drops it anyway. RocketMQ ``MessageDecoder.messageProperties2String``.

    Raises:
        MalformedMessage: an empty name, or a name or value containing ``\\u0001`` or ``\\u0002``.
    """
    return _properties_text(props, tags, keys)


def _properties_text(props: Mapping[str, str], tags: str, keys: str) -> str:
    text = "".join([f"{k}\u0001{v}\u0002" for k, v in props.items() if v])
    if tags:
        text += f"TAGS\u0001{tags}\u0002"
    if keys:
        text += f"KEYS\u0001{keys}\u0002"
    entries = text.count(PROPERTY_SEPARATOR)
    if text.count(NAME_VALUE_SEPARATOR) != entries or "" in props:
        _bad_property(props, tags, keys)
    return text


def _bad_property(props: Mapping[str, str], tags: str, keys: str) -> None:
    for k, v in (*props.items(), (PROPERTY_TAGS, tags), (PROPERTY_KEYS, keys)):
        if not k or any(sep in k or sep in v for sep in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
            raise MalformedMessage(f"property {k!r}: names must be non-empty and names and values "
                                   "free of \\u0001 and \\u0002 (RocketMQ's separators)")
    raise MalformedMessage("property separators in the properties")  # pragma: no cover (counts agree)


def decode_properties(text: str) -> dict[str, str]:
    """RocketMQ's properties string → a dict. As RocketMQ does, the trailing ``\\u0002`` may be
    missing, an entry without ``\\u0001``, with an empty name or with an empty value is skipped,
    and a repeated name keeps its last value. RocketMQ ``MessageDecoder.string2messageProperties``.
    Never raises."""
    out: dict[str, str] = {}
    for entry in text.split(PROPERTY_SEPARATOR):
        k, _, v = entry.partition(NAME_VALUE_SEPARATOR)
        if k and v:
            out[k] = v
    return out


def _split_tags_keys(props: dict[str, str]) -> tuple[str, str]:
    """TAGS and KEYS out of the properties; the store's ``__CRC32#`` (see :func:`fill_prop_crc`)
    is dropped, so SDK users never see it (a RocketMQ client shows it as a property)."""
    props.pop(PROPERTY_CRC32, None)
    return props.pop(PROPERTY_TAGS, ""), props.pop(PROPERTY_KEYS, "")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise MalformedMessage(f"{what} is not encodable as UTF-8: {exc}") from exc


def _wire_strings(msg: Message, reserve: int = 0) -> tuple[bytes, bytes]:
    """The UTF-8 properties (with TAGS and KEYS) and its length (plus ``reserve`` bytes the caller
    appends), checked."""
    props = _utf8(_properties_text(msg.properties, msg.tags, msg.keys), "properties")
    if len(props) + reserve > limits.PROPERTIES_MAX_BYTES:
        raise MalformedMessage(f"properties of {len(props) + reserve} bytes exceed "
                               f"{limits.PROPERTIES_MAX_BYTES}")
    return props, _I16.pack(len(props) + reserve)


# --- compression ---------------------------------------------------------------------------------
def _check_zlib(sys_flag: int) -> None:
    ctype = (sys_flag & COMPRESSION_TYPE_COMPARATOR) >> 8
    if ctype not in (0, 3):
        name = {1: "LZ4", 2: "ZSTD"}.get(ctype, f"unknown type {ctype}")
        raise MalformedMessage(f"body compressed with {name}: txmq supports zlib only")


def _deflate(body: bytes, sys_flag: int) -> bytes:
    _check_zlib(sys_flag)
    return zlib.compress(body, _ZLIB_LEVEL)


def inflate_body(body: bytes, sys_flag: int,
                 limit: int = limits.MESSAGE_BODY_INFLATED_MAX_BYTES) -> bytes:
    """A body sent or stored with ``COMPRESSED_FLAG``, inflated (zlib: what 4.x clients use and
    the 5.x default ``COMPRESSION_ZLIB_TYPE``).

    Raises:
        MalformedMessage: LZ4 or ZSTD, a body that does not inflate or is truncated, or one
            that inflates past ``limit`` bytes.
    """
    _check_zlib(sys_flag)
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise MalformedMessage(f"compressed body does not inflate: {exc}") from exc
    if len(out) > limit:
        raise MalformedMessage(f"compressed body inflates past {limit} bytes")
    if not inflater.eof:
        raise MalformedMessage("compressed body is truncated")
    return out


# --- MessageExt record ---------------------------------------------------------------------------
def encode_message_ext(msg: MessageExt, *, compress: bool = False) -> bytes:
    """One MessageExt record (layout in the module docstring). RocketMQ ``MessageDecoder.encode``.

    The body CRC and total size are computed (``msg.body_crc`` and ``msg.store_size`` are not
    read), and sysFlag's two V6 bits are set from the hosts' address families. The magic code is
    v1, or v2 when the topic is over 127 UTF-8 bytes (RocketMQ ``CommitLog``
    ``autoMessageVersionOnTopicLen``; txmq counts bytes where Java counts characters).
    With ``compress`` and ``COMPRESSED_FLAG`` in ``msg.sys_flag`` the body is zlib-compressed
    (level 5, Java's ``needCompress``); without it the body is written as it is, so a stored,
    already compressed body keeps its flag and bytes.

    Raises:
        MalformedMessage: a field that does not fit its width, a topic over 32,767 bytes,
            properties over ``PROPERTIES_MAX_BYTES``, a bad property name or value, a host that is
            not an IP literal, or LZ4/ZSTD compression requested.
    """
    return b"".join(_ext_parts(msg, compress))


def encode_message_exts(msgs: Iterable[MessageExt], *, compress: bool = False) -> bytes:
    """Records back to back, as in a pull response body; see :func:`encode_message_ext`."""
    parts: list[bytes] = []
    for msg in msgs:
        parts += _ext_parts(msg, compress)
    return b"".join(parts)


def _ext_parts(msg: MessageExt, compress: bool, reserve: int = 0) -> tuple[bytes, ...]:
    body = msg.body
    sys_flag = msg.sys_flag & ~_V6_FLAGS
    if compress and sys_flag & COMPRESSED_FLAG:
        body = _deflate(body, sys_flag)
    born = pack_host(msg.born_host)
    store = pack_host(msg.store_host)
    sys_flag |= (BORNHOST_V6_FLAG if len(born) == 20 else 0) | (
        STOREHOSTADDRESS_V6_FLAG if len(store) == 20 else 0)
    topic = _utf8(msg.topic, "topic")
    if len(topic) <= limits.MESSAGE_TOPIC_V1_MAX_BYTES:
        magic, topic_len = MESSAGE_MAGIC_CODE, _I8.pack(len(topic))
    elif len(topic) <= limits.MESSAGE_TOPIC_MAX_BYTES:
        magic, topic_len = MESSAGE_MAGIC_CODE_V2, _I16.pack(len(topic))
    else:
        raise MalformedMessage(f"topic of {len(topic)} bytes exceeds {limits.MESSAGE_TOPIC_MAX_BYTES}")
    props, props_len = _wire_strings(msg, reserve)
    head = _HEADS[(sys_flag >> 4) & 3]
    total = head.size + len(body) + len(topic_len) + len(topic) + 2 + len(props) + reserve
    try:
        packed = head.pack(
            total, magic, crc32(body) & _CRC_MASK, msg.queue_id, msg.flag, msg.queue_offset,
            msg.commit_log_offset, sys_flag, msg.born_timestamp_ms, born, msg.store_timestamp_ms,
            store, msg.reconsume_times, msg.prepared_transaction_offset, len(body))
    except struct.error as exc:
        raise MalformedMessage(f"MessageExt field out of range (Java int/long): {exc}") from exc
    return packed, body, topic_len, topic, props_len, props


def decode_message_ext(data: bytes, *, check_crc: bool = True, inflate: bool = True) -> MessageExt:
    """Exactly one MessageExt record (a check-back body). See :func:`decode_message_exts`.

    Raises:
        MalformedMessage: as :func:`decode_message_exts`, or bytes after the record.
    """
    data = bytes(data)
    msg, end = _decode_ext_at(data, 0, check_crc, inflate)
    if end != len(data):
        raise MalformedMessage(f"{len(data) - end} bytes after the MessageExt record")
    return msg


def decode_message_exts(data: bytes, *, check_crc: bool = True,
                        inflate: bool = True) -> list[MessageExt]:
    """Records back to back (a pull response body) → messages. RocketMQ ``MessageDecoder.decodes``.

    Each record must fill its total size exactly. ``store_size``, ``body_crc`` and ``sys_flag`` are
    the record's; a compressed body is inflated (zlib, ``inflate``) and ``COMPRESSED_FLAG``
    cleared, as RocketMQ's client decoder does. ``TAGS`` and ``KEYS`` move from the properties
    into :attr:`Message.tags` / :attr:`Message.keys`; RocketMQ 5's ``__CRC32#``
    (``PROPERTY_CRC32``, appended to stored records by a broker with ``enabledAppendPropCRC``) is
    dropped. ``0.0.0.0:0`` hosts decode as ``""``. :func:`txmq.protocol.decode_message_exts_bulk`
    gives the same messages faster; this per-record decoder is its specification.

    Raises:
        MalformedMessage: a short buffer, a bad magic code, a negative length or one past the
            record's end, a body CRC mismatch (``check_crc``), invalid UTF-8 in the topic or
            properties, a host port outside 0..65535, or a body that does not inflate (LZ4,
            ZSTD, corrupt, or larger than ``MESSAGE_BODY_INFLATED_MAX_BYTES``).
    """
    data = bytes(data)
    out: list[MessageExt] = []
    pos, n = 0, len(data)
    while pos < n:
        msg, pos = _decode_ext_at(data, pos, check_crc, inflate)
        out.append(msg)
    return out


def _decode_ext_at(data: bytes, pos: int, check_crc: bool, inflate: bool) -> tuple[MessageExt, int]:
    """The record at ``data[pos:]`` and the position after it."""
    if len(data) - pos < _PREFIX_SIZE:
        raise MalformedMessage(f"MessageExt record at {pos}: {len(data) - pos} bytes, a head is longer")
    total, magic = _SIZE_MAGIC.unpack_from(data, pos)
    if magic == MESSAGE_MAGIC_CODE:
        topic_len_size = 1
    elif magic == MESSAGE_MAGIC_CODE_V2:
        topic_len_size = 2
    else:
        raise MalformedMessage(f"MessageExt record at {pos}: bad magic code {magic:#010x}")
    head = _HEADS[(_I32.unpack_from(data, pos + _SYSFLAG_POSITION)[0] >> 4) & 3]
    end = pos + total
    if total < head.size + topic_len_size + 2 or end > len(data):
        raise MalformedMessage(f"MessageExt record at {pos}: total size {total} does not fit "
                               f"{len(data) - pos} bytes")
    (_, _, crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_ts, born, store_ts,
     store, reconsume, prepared, body_len) = head.unpack_from(data, pos)
    b0 = pos + head.size
    b1 = b0 + body_len
    if body_len < 0 or b1 + topic_len_size > end:
        raise MalformedMessage(f"MessageExt record at {pos}: body length {body_len} past its end")
    topic_len = (_I8 if topic_len_size == 1 else _I16).unpack_from(data, b1)[0]  # signed, as Java
    t0 = b1 + topic_len_size
    t1 = t0 + topic_len
    if topic_len < 0 or t1 + 2 > end:
        raise MalformedMessage(f"MessageExt record at {pos}: topic length {topic_len} is invalid")
    props_len = _I16.unpack_from(data, t1)[0]
    if props_len < 0 or t1 + 2 + props_len != end:
        raise MalformedMessage(f"MessageExt record at {pos}: properties length {props_len} does not "
                               f"end the record at its total size {total}")
    body = data[b0:b1]
    if body_len > 0:
        if check_crc and crc32(body) & _CRC_MASK != crc:
            raise MalformedMessage(f"MessageExt record at {pos}: body CRC mismatch")
        if inflate and sys_flag & COMPRESSED_FLAG:
            body = inflate_body(body, sys_flag)
            sys_flag &= ~COMPRESSED_FLAG
    try:
        topic = data[t0:t1].decode()
        props = decode_properties(data[t1 + 2 : end].decode())
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"MessageExt record at {pos}: invalid UTF-8: {exc}") from exc
    tags, keys = _split_tags_keys(props)
    return MessageExt(
        topic=topic, body=body, tags=tags, keys=keys, properties=props, flag=flag,
        queue_id=queue_id, queue_offset=queue_offset, commit_log_offset=commit_log_offset,
        born_timestamp_ms=born_ts, store_timestamp_ms=store_ts, reconsume_times=reconsume,
        born_host=unpack_host(born), store_host=unpack_host(store), sys_flag=sys_flag,
        body_crc=crc, prepared_transaction_offset=prepared, store_size=total), end


# --- batch body ----------------------------------------------------------------------------------
def encode_batch(msgs: Iterable[Message]) -> bytes:
    """A SEND_BATCH_MESSAGE body: one entry per message (layout in the module docstring; magic
    and CRC written as 0 as RocketMQ does). The topic is not in the body: every message must have
    the first one's topic (RocketMQ ``MessageBatch.generateFromList``).
    RocketMQ ``MessageDecoder.encodeMessages``.

    Raises:
        MalformedMessage: messages of different topics, a bad property, properties over
            ``PROPERTIES_MAX_BYTES``, or a flag outside Java's int.
    """
    parts: list[bytes] = []
    topic = None
    for msg in msgs:
        if topic is None:
            topic = msg.topic
        elif msg.topic != topic:
            raise MalformedMessage(f"batch mixes topics {topic!r} and {msg.topic!r}")
        props, props_len = _wire_strings(msg)
        total = _BATCH_MIN + len(msg.body) + len(props)
        try:
            parts.append(_BATCH_HEAD.pack(total, 0, 0, msg.flag, len(msg.body)))
        except struct.error as exc:
            raise MalformedMessage(f"batch message field out of range: {exc}") from exc
        parts += (msg.body, props_len, props)
    return b"".join(parts)


def decode_batch(data: bytes, *, topic: str = "") -> list[Message]:
    """A SEND_BATCH_MESSAGE body → messages of ``topic`` (the request header's). Magic code and
    CRC are not checked (RocketMQ writes 0 and skips them), but each entry must fill its total
    size exactly. RocketMQ ``MessageDecoder.decodeMessages``.

    Raises:
        MalformedMessage: a short buffer, a negative length or one past the entry's end, or
            properties that are not UTF-8.
    """
    data = bytes(data)
    out: list[Message] = []
    pos, n = 0, len(data)
    while pos < n:
        if n - pos < _BATCH_MIN:
            raise MalformedMessage(f"batch entry at {pos}: {n - pos} bytes, a head is longer")
        total, _, _, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
        end = pos + total
        b0 = pos + _BATCH_HEAD.size
        b1 = b0 + body_len
        if total < _BATCH_MIN or end > n or body_len < 0 or b1 + 2 > end:
            raise MalformedMessage(f"batch entry at {pos}: total size {total} or body length "
                                   f"{body_len} past the end")
        props_len = _I16.unpack_from(data, b1)[0]
        if props_len < 0 or b1 + 2 + props_len != end:
            raise MalformedMessage(f"batch entry at {pos}: properties length {props_len} does not "
                                   f"end the entry at its total size {total}")
        try:
            props = decode_properties(data[b1 + 2 : end].decode())
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"batch entry at {pos}: invalid UTF-8: {exc}") from exc
        tags, keys = _split_tags_keys(props)
        out.append(Message(topic=topic, body=data[b0:b1], tags=tags, keys=keys, properties=props,
                           flag=flag))
        pos = end
    return out


def unwrap_inner_batch(msg: MessageExt) -> list[MessageExt]:
    """The messages inside a record whose sysFlag has both ``INNER_BATCH_FLAG`` and
    ``NEED_UNWRAP_FLAG`` (its body is a batch body), with the record's topic, queue, hosts,
    timestamps, sysFlag and commit log offset and consecutive queue offsets; ``[msg]`` for any
    other record. RocketMQ ``MessageDecoder.decodeMessage(MessageExt, List)``.

    Raises:
        MalformedMessage: the inner batch body is malformed (:func:`decode_batch`).
    """
    wrapped = INNER_BATCH_FLAG | NEED_UNWRAP_FLAG
    if msg.sys_flag & wrapped != wrapped:
        return [msg]
    return [MessageExt(topic=msg.topic, body=m.body, tags=m.tags, keys=m.keys, properties=m.properties,
                       flag=m.flag, queue_id=msg.queue_id, queue_offset=msg.queue_offset + i,
                       commit_log_offset=msg.commit_log_offset, born_timestamp_ms=msg.born_timestamp_ms,
                       store_timestamp_ms=msg.store_timestamp_ms, born_host=msg.born_host,
                       store_host=msg.store_host, sys_flag=msg.sys_flag)
            for i, m in enumerate(decode_batch(msg.body))]


# --- the stored record's CRC property (RocketMQ 5 enabledAppendPropCRC) ---------------------------
CRC32_RESERVED_LEN = len(PROPERTY_CRC32) + 1 + 10 + 1
"""Bytes at the end of a stored record's properties for its CRC: ``__CRC32#``, ``\\u0001``, ten
digits, ``\\u0002`` (RocketMQ ``CommitLog.CRC32_RESERVED_LEN`` = 20)."""
_CRC_NAME = PROPERTY_CRC32.encode() + NAME_VALUE_SEPARATOR.encode()
_CRC_END = PROPERTY_SEPARATOR.encode()


def encode_message_ext_reserved(msg: MessageExt) -> bytearray:
    """:func:`encode_message_ext` with :data:`CRC32_RESERVED_LEN` zero bytes at the end of the
    properties (counted in the properties length and the total size), ready for
    :func:`fill_prop_crc` once the store has written its own fields. ``msg.properties`` must not
    hold ``__CRC32#`` (RocketMQ ``CommitLog.asyncPutMessage`` deletes it). RocketMQ
    ``MessageExtEncoder.encode`` with ``MessageStoreConfig.enabledAppendPropCRC``.

    Raises:
        MalformedMessage: as :func:`encode_message_ext` (the reserve counts towards the
            properties' ``PROPERTIES_MAX_BYTES``).
    """
    out = bytearray().join(_ext_parts(msg, False, CRC32_RESERVED_LEN))
    out += bytes(CRC32_RESERVED_LEN)
    return out


def fill_prop_crc(buf: bytearray, start: int, size: int) -> None:
    """Write the CRC property into the reserved tail of the record ``buf[start:start+size]``:
    CRC32 (``& 0x7FFFFFFF``) of the record's bytes before the reserve, as ``__CRC32#``,
    ``\\u0001``, ten decimal digits least significant first (zero-padded), ``\\u0002``.
    RocketMQ ``CommitLog.DefaultAppendMessageCallback.doAppend`` and
    ``MessageDecoder.createCrc32``."""
    end = start + size - CRC32_RESERVED_LEN
    with memoryview(buf) as view:
        crc = crc32(view[start:end]) & _CRC_MASK
    buf[end : start + size] = b"".join((_CRC_NAME, str(crc).zfill(10)[::-1].encode(), _CRC_END))


def prop_crc(data: bytes | bytearray | memoryview, start: int, size: int) -> tuple[int, int] | None:
    """``(stored, computed)`` CRC of the record ``data[start:start+size]`` whose properties end
    with the CRC property (:func:`fill_prop_crc`), or None when its last
    :data:`CRC32_RESERVED_LEN` bytes are not one. RocketMQ ``CommitLog.checkMessageAndReturnSize``
    with ``forceVerifyPropCRC``."""
    end = start + size - CRC32_RESERVED_LEN
    if end < start:
        return None
    with memoryview(data) as view:
        tail = bytes(view[end : start + size])
        if tail[: len(_CRC_NAME)] != _CRC_NAME or tail[-1:] != _CRC_END:
            return None
        digits = tail[len(_CRC_NAME) : -1]
        if not digits.isdigit():
            return None
        return int(digits[::-1]), crc32(view[start:end]) & _CRC_MASK
