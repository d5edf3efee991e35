"""Message ids and hosts as RocketMQ writes them: the offset message id, ``UNIQ_KEY``, ``ip:port``.

Sans-IO: no clock, no socket, no DNS. Times are parameters; hosts are IP literals.

Host strings. A host is ``"a.b.c.d:port"`` (IPv4) or ``"[v6 address]:port"`` (IPv6, the address in
the compressed form ``socket.inet_ntop`` gives, e.g. ``"[::1]:10911"``), the format txmq's store
already uses. ``""`` means "unknown" and travels as ``0.0.0.0:0`` (RocketMQ would not encode a
null host at all). An IPv4-mapped IPv6 address decodes as IPv4, as Java's
``InetAddress.getByAddress`` does. On the wire a host is RocketMQ ``MessageExt.socketAddress2ByteBuffer``::

    IPv4 (8 bytes)                         IPv6 (20 bytes)
    +----------------+----------------+    +--------------------------------+----------------+
    | address  4     | port  i32      |    | address  16                    | port  i32      |
    +----------------+----------------+    +--------------------------------+----------------+

Offset message id (RocketMQ ``MessageDecoder.createMessageId`` / ``decodeMessageId``): the store
host and the record's commit log offset, upper-case hex (``UtilAll.bytes2string``), 32 characters
for IPv4 and 56 for IPv6::

    +----------------+----------------+---------------------------------+
    | store address  | store port i32 | commit log offset  i64          |   ">4siq" / ">16siq"
    +----------------+----------------+---------------------------------+

``UNIQ_KEY`` (RocketMQ ``MessageClientIDSetter.createUniqID``), 32 (IPv4) or 56 (IPv6) upper hex::

    +----------------+--------+----------------+----------------+--------+
    | client ip 4/16 | pid u16| salt  u32      | ms since month | counter|   ">4sHI" + ">IH"
    |                |        | (class loader  | start  u32     |  u16   |
    |                |        |  hash in Java) |                |        |
    +----------------+--------+----------------+----------------+--------+
"""

from __future__ import annotations

import socket
import struct
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import count

from txmq import limits
from txmq.errors import MalformedMessage

__all__ = [
    "UniqKeyGenerator",
    "decode_offset_msg_id",
    "offset_msg_id",
    "pack_host",
    "uniq_key_time_ms",
    "unpack_host",
]

_PORT = struct.Struct(">i")
_OFFSET = struct.Struct(">q")
_UNIQ_FIXED = struct.Struct(">HI")
_UNIQ_VAR = struct.Struct(">IH")
_NO_HOST = bytes(8)
_V4_MAPPED = bytes(10) + b"\xff\xff"
_PORT_MAX = 0xFFFF
_OFFSET_MAX = 2**63 - 1
_NTP_SLACK_MS = 1_000_000
"""``MessageClientIDSetter.createUniqID`` writes 0 for a time up to this far before the month start."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


@lru_cache(maxsize=limits.MESSAGE_HOST_CACHE_ENTRIES)
def pack_host(host: str) -> bytes:
    """``"ip:port"`` → its wire bytes: 4-byte address + i32 port (8 bytes) for IPv4, 16 + 4 (20
    bytes) for IPv6; ``""`` → ``0.0.0.0:0``. Layout: RocketMQ ``MessageExt.socketAddress2ByteBuffer``.

    Raises:
        MalformedMessage: not an IP literal with a port in ``0..65535`` (no DNS lookups here).
    """
    if not host:
        return _NO_HOST
    addr, sep, port_text = host.rpartition(":")
    if not sep or not port_text.isdigit() or not port_text.isascii() or int(port_text) > _PORT_MAX:
        raise MalformedMessage(f"host {host!r} is not 'ip:port' with a port in 0..65535")
    port = _PORT.pack(int(port_text))
    try:
        if addr.startswith("[") and addr.endswith("]"):
            raw = socket.inet_pton(socket.AF_INET6, addr[1:-1])
            return raw[12:] + port if raw.startswith(_V4_MAPPED) else raw + port
        return socket.inet_pton(socket.AF_INET, addr) + port
    except (OSError, ValueError) as exc:
        raise MalformedMessage(f"host {host!r} is not an IPv4 or [IPv6] literal") from exc


@lru_cache(maxsize=limits.MESSAGE_HOST_CACHE_ENTRIES)
def unpack_host(raw: bytes) -> str:
    """Wire host bytes (8: IPv4 + port, 20: IPv6 + port) → ``"ip:port"`` / ``"[ip6]:port"``;
    ``0.0.0.0:0`` → ``""``. The inverse of :func:`pack_host`.

    Raises:
        MalformedMessage: a port outside ``0..65535`` (Java's ``InetSocketAddress`` refuses it too)
            or ``raw`` neither 8 nor 20 bytes long.
    """
    if len(raw) not in (8, 20):
        raise MalformedMessage(f"host of {len(raw)} bytes (8 or 20 expected)")
    port = _PORT.unpack_from(raw, len(raw) - 4)[0]
    if not 0 <= port <= _PORT_MAX:
        raise MalformedMessage(f"host port {port} outside 0..65535")
    addr = raw[:-4]
    if len(addr) == 16:
        if not addr.startswith(_V4_MAPPED):
            return f"[{socket.inet_ntop(socket.AF_INET6, addr)}]:{port}"
        addr = addr[12:]
    if port == 0 and addr == b"\0\0\0\0":
        return ""
    return f"{socket.inet_ntop(socket.AF_INET, addr)}:{port}"


def offset_msg_id(store_host: str, commit_log_offset: int) -> str:
    """The offset message id of a stored record: store host + commit log offset as upper-case hex,
    32 characters (IPv4) or 56 (IPv6). RocketMQ ``MessageDecoder.createMessageId``.

    Raises:
        MalformedMessage: ``store_host`` is not an IP literal with a port, or the offset does not
            fit a signed 64-bit integer.
    """
    if 0 <= commit_log_offset <= _OFFSET_MAX:  # the common case: no struct, one format
        return _host_hex(store_host) + format(commit_log_offset, "016X")
    try:
        return (pack_host(store_host) + _OFFSET.pack(commit_log_offset)).hex().upper()
    except struct.error as exc:
        raise MalformedMessage(f"commit log offset {commit_log_offset} does not fit i64") from exc


@lru_cache(maxsize=limits.MESSAGE_HOST_CACHE_ENTRIES)
def _host_hex(store_host: str) -> str:
    return pack_host(store_host).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """An offset message id → ``(store host "ip:port", commit log offset)``. Hex of either case is
    accepted, as ``UtilAll.string2bytes`` upper-cases it. RocketMQ ``MessageDecoder.decodeMessageId``.

    Raises:
        MalformedMessage: not 32 or 56 hex characters, or a port outside ``0..65535``.
    """
    raw = _hex_bytes(msg_id, "offset message id") if len(msg_id) in (32, 56) else b""
    if not raw or len(raw) * 2 != len(msg_id):
        raise MalformedMessage(f"offset message id {msg_id!r} is not 32 or 56 hex characters")
    return unpack_host(raw[:-8]), _OFFSET.unpack_from(raw, len(raw) - 8)[0]


def _hex_bytes(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text) if text.isascii() and " " not in text else b""
    except ValueError as exc:
        raise MalformedMessage(f"{what} {text!r} is not hexadecimal") from exc


def _month_bounds(now_ms: int) -> tuple[int, int]:
    """Start of ``now_ms``'s month and of the next one, ms since the epoch, in UTC."""
    day = _EPOCH + timedelta(milliseconds=now_ms)
    start = datetime(day.year, day.month, 1, tzinfo=UTC)
    nxt = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    return (start - _EPOCH) // _MS, (nxt - _EPOCH) // _MS


class UniqKeyGenerator:
    """``UNIQ_KEY`` values (the client message id) in RocketMQ's layout (module docstring), upper
    hex: 32 characters for an IPv4 client, 56 for IPv6. RocketMQ ``MessageClientIDSetter``.

    The time field counts ms since the start of the current month, which RocketMQ takes in the
    JVM's time zone; txmq uses UTC (a reader decoding the time with :func:`uniq_key_time_ms` must
    use the same zone). Unlike RocketMQ, a clock that steps back more than 1000 s before the
    month start recomputes the month instead of writing a negative span.

    Args:
        ip: the client's address, 4 or 16 bytes or an IP literal (``UtilAll.getIP``).
        pid: process id; its low 16 bits are written (``(short) UtilAll.getPid()``).
        salt: 32 bits telling two generators of one process apart (Java writes the class loader's
            hash code).

    Raises:
        MalformedMessage: ``ip`` is not 4 or 16 bytes nor an IP literal.
    """

    def __init__(self, ip: bytes | str, pid: int, salt: int) -> None:
        if isinstance(ip, str):
            ip = pack_host(f"[{ip}]:0" if ":" in ip else f"{ip}:0")[:-4]
        if len(ip) not in (4, 16):
            raise MalformedMessage(f"UNIQ_KEY ip of {len(ip)} bytes (4 or 16 expected)")
        self._prefix = (ip + _UNIQ_FIXED.pack(pid & 0xFFFF, salt & 0xFFFFFFFF)).hex().upper()
        self._counter = count()
        self._start = 0
        self._next_start = -(2**63)  # forces the month computation on the first call

    def next(self, now_ms: int) -> str:
        """The next key at wall-clock time ``now_ms`` (ms since the epoch); the 16-bit counter
        wraps after 65,536 keys, so keys are unique per generator for 65,536 keys per ms."""
        if now_ms >= self._next_start or now_ms < self._start - _NTP_SLACK_MS:
            self._start, self._next_start = _month_bounds(now_ms)
        span = max(now_ms - self._start, 0)
        return self._prefix + _UNIQ_VAR.pack(span & 0xFFFFFFFF, next(self._counter) & 0xFFFF).hex().upper()


def uniq_key_time_ms(key: str, now_ms: int) -> int:
    """When a ``UNIQ_KEY`` was made, ms since the epoch (UTC month, see :class:`UniqKeyGenerator`):
    the span in the key added to the start of ``now_ms``'s month, or of the month before when that
    would lie at or after ``now_ms``. RocketMQ ``MessageClientIDSetter.getNearlyTimeFromID``.

    Raises:
        MalformedMessage: ``key`` is not 32 or 56 hex characters.
    """
    raw = _hex_bytes(key, "UNIQ_KEY") if len(key) in (32, 56) else b""
    if len(raw) * 2 != len(key) or not raw:
        raise MalformedMessage(f"UNIQ_KEY {key!r} is not 32 or 56 hex characters")
    ip_len = 16 if len(raw) == 28 else 4
    span = int.from_bytes(raw[ip_len + 6 : ip_len + 10], "big")
    start, _ = _month_bounds(now_ms)
    if start + span >= now_ms:
        start, _ = _month_bounds(start - 1)
    return start + span
