"""RocketMQ's ``RemotingCommand``: the frame and both header codecs, sans-IO.

A frame (RocketMQ ``RemotingCommand.encode`` / ``NettyDecoder``)::

     0          4     5                 8                        8+H                 4+L
     +----------+-----+-----------------+------------------------+-------------------+
     | L: u32   | T:u8| H: u24          | header (T: JSON or     | body (raw bytes)  |
     |          |     |                 |  ROCKETMQ binary)      |                   |
     +----------+-----+-----------------+------------------------+-------------------+
     L = 4 + H + len(body) (bytes after the first field); all integers big-endian.
     T = serialize type: 0 JSON (the default of Java, Go and C++ clients), 1 ROCKETMQ.

The JSON header is what fastjson writes for ``RemotingCommand``::

    {"code":310,"extFields":{"a":"pg",...},"flag":0,"language":"PYTHON","opaque":7,
     "serializeTypeCurrentRPC":"JSON","version":479}

The ROCKETMQ binary header (RocketMQ ``RocketMQSerializable.rocketMQProtocolEncode``)::

     +--------+-------+---------+---------+--------+---------+--------+----------+-----------+
     |code i16|lang u8|vers. i16|opaque   |flag i32|remark   |remark  |ext len   |ext entries|
     |        |       |         |i32      |        |len i32  |UTF-8   |i32       |           |
     +--------+-------+---------+---------+--------+---------+--------+----------+-----------+
     ext entry: key len i16 | key UTF-8 | value len i32 | value UTF-8

``flag`` bit 0 marks a response, bit 1 a one-way request. A response goes out in its request's
serialize type. Nothing here touches a socket or a clock: :class:`FrameDecoder` takes bytes and
returns commands, :func:`encode_command` takes a command and returns bytes.
"""

from __future__ import annotations

import struct
from typing import Union

import msgspec

from txmq.errors import FrameTooLarge, MalformedFrame
from txmq.limits import FRAME_HEADER_MAX_BYTES, FRAME_SIZE_MAX_BYTES

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "LANGUAGE_CODES",
    "REMOTING_VERSION",
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "Command",
    "FrameDecoder",
    "encode_command",
]

FLAG_RESPONSE = 0x1
"""``flag`` bit 0 (RocketMQ ``RemotingCommand.RPC_TYPE``): the command is a response."""
FLAG_ONEWAY = 0x2
"""``flag`` bit 1 (RocketMQ ``RemotingCommand.RPC_ONEWAY``): no response is expected."""
SERIALIZE_JSON = 0
"""Serialize type 0 (RocketMQ ``SerializeType.JSON``)."""
SERIALIZE_ROCKETMQ = 1
"""Serialize type 1 (RocketMQ ``SerializeType.ROCKETMQ``)."""
REMOTING_VERSION = 479
"""The ``version`` txmq sends: RocketMQ ``MQVersion.Version.V5_3_3.ordinal()``."""

LANGUAGE_CODES: dict[str, int] = {
    "JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5, "RUBY": 6,
    "OTHER": 7, "HTTP": 8, "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12, "NODE_JS": 13,
}
"""RocketMQ ``LanguageCode``: name (JSON header) to code (ROCKETMQ header)."""
_LANGUAGE_NAMES = {v: k for k, v in LANGUAGE_CODES.items()}

_PREFIX = struct.Struct(">II")  # L: u32 frame length, T << 24 | H
_BIN_FIXED = struct.Struct(">hBhiii")  # code, language, version, opaque, flag, remark length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U24 = 0xFFFFFF


class Command(msgspec.Struct):
    """One request or response (RocketMQ ``RemotingCommand``).

    Attributes:
        code: a :class:`~txmq.protocol.RequestCode` for requests, a
            :class:`~txmq.errors.ResponseCode` for responses.
        opaque: request id chosen by the requester; the response carries the same value.
        flag: ``FLAG_RESPONSE`` | ``FLAG_ONEWAY``.
        version: the sender's RocketMQ version ordinal (``MQVersion.Version``).
        remark: human-readable text (error explanations), None when absent.
        ext: ``extFields``, the request or response header as strings (see
            :func:`~txmq.protocol.to_ext` / :func:`~txmq.protocol.from_ext`).
        body: payload bytes.
        language: the sender's ``LanguageCode`` name.
        serialize_type: ``SERIALIZE_JSON`` or ``SERIALIZE_ROCKETMQ``, the header codec.
    """

    code: int
    opaque: int = 0
    flag: int = 0
    version: int = REMOTING_VERSION
    remark: str | None = None
    ext: dict[str, str] = msgspec.field(default_factory=dict)
    body: bytes = b""
    language: str = "PYTHON"
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, remark: str | None = None, ext: dict[str, str] | None = None,
                 body: bytes = b"") -> Command:
        """The response to this request: same opaque and serialize type, ``FLAG_RESPONSE`` set."""
        return Command(int(code), self.opaque, FLAG_RESPONSE, REMOTING_VERSION, remark,
                       ext or {}, body, "PYTHON", self.serialize_type)


class _JsonHeader(msgspec.Struct):
    """The JSON header as the decoder reads it (a missing field is Java's default)."""

    code: int
    extFields: dict[str, str] | None = None
    flag: int = 0
    language: str = "JAVA"
    opaque: int = 0
    remark: str | None = None
    serializeTypeCurrentRPC: str = "JSON"
    version: int = 0


class _JsonHeaderOut(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The JSON header as fastjson writes it: every non-null field, in alphabetical order."""

    code: int
    extFields: dict[str, str] | None = None
    flag: int
    language: str
    opaque: int
    remark: str | None = None
    serializeTypeCurrentRPC: str
    version: int


_Loose = Union[None, bool, int, float, str]  # noqa: UP007 (a runtime type for msgspec)


class _LooseJsonHeader(msgspec.Struct):
    """What the decoder falls back to: the C++ client writes some ext values as JSON numbers."""

    code: int
    extFields: dict[str, _Loose] | None = None
    flag: int = 0
    language: str = "JAVA"
    opaque: int = 0
    remark: str | None = None
    version: int = 0


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(_JsonHeader)
_loose_decoder = msgspec.json.Decoder(_LooseJsonHeader)


def _json_header(cmd: Command) -> bytes:
    return _json_encoder.encode(_JsonHeaderOut(
        code=cmd.code, extFields=cmd.ext or None, flag=cmd.flag, language=cmd.language,
        opaque=cmd.opaque, remark=cmd.remark, serializeTypeCurrentRPC="JSON", version=cmd.version))


def _binary_header(cmd: Command) -> bytes:
    remark = cmd.remark.encode() if cmd.remark else b""
    parts = [_BIN_FIXED.pack(cmd.code, LANGUAGE_CODES.get(cmd.language, LANGUAGE_CODES["OTHER"]),
                             cmd.version, cmd.opaque, cmd.flag, len(remark)), remark]
    ext = [(k.encode(), v.encode()) for k, v in cmd.ext.items()]
    parts.append(_I32.pack(sum(6 + len(k) + len(v) for k, v in ext)))
    for k, v in ext:
        parts += (_I16.pack(len(k)), k, _I32.pack(len(v)), v)
    return b"".join(parts)


def encode_command(cmd: Command) -> bytes:
    """Encode one command as a frame, its header in ``cmd.serialize_type``.

    Raises:
        FrameTooLarge: the header exceeds ``FRAME_HEADER_MAX_BYTES`` or the frame
            ``FRAME_SIZE_MAX_BYTES``.
        MalformedFrame: an unknown serialize type, or a field out of its binary range.
    """
    if cmd.serialize_type == SERIALIZE_JSON:
        header = _json_header(cmd)
    elif cmd.serialize_type == SERIALIZE_ROCKETMQ:
        try:
            header = _binary_header(cmd)
        except struct.error as exc:
            raise MalformedFrame(f"field out of range for a ROCKETMQ header: {exc}") from exc
    else:
        raise MalformedFrame(f"unknown serialize type {cmd.serialize_type}")
    if len(header) > FRAME_HEADER_MAX_BYTES:
        raise FrameTooLarge(f"header of {len(header)} bytes exceeds {FRAME_HEADER_MAX_BYTES}")
    length = 4 + len(header) + len(cmd.body)
    if length > FRAME_SIZE_MAX_BYTES:
        raise FrameTooLarge(f"frame of {length} bytes exceeds {FRAME_SIZE_MAX_BYTES}")
    prefix = _PREFIX.pack(length, cmd.serialize_type << 24 | len(header))
    return b"".join((prefix, header, cmd.body)) if cmd.body else prefix + header


def _stringify(v: _Loose) -> str:
    """An ext value the C++ client sent as a JSON scalar, as Java would read it into a String."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def _decode_json(data: bytes, body: bytes) -> Command:
    try:
        h = _json_decoder.decode(data)
        ext = h.extFields or {}
    except msgspec.ValidationError:
        try:
            loose = _loose_decoder.decode(data)
        except (msgspec.MsgspecError, ValueError) as exc:
            raise MalformedFrame(f"JSON header does not decode: {str(exc)[:200]}") from exc
        ext = {k: _stringify(v) for k, v in (loose.extFields or {}).items()}
        h = _JsonHeader(loose.code, None, loose.flag, loose.language, loose.opaque, loose.remark,
                        "JSON", loose.version)
    except (msgspec.MsgspecError, ValueError, RecursionError) as exc:
        # ValueError covers UnicodeDecodeError (a str that is not UTF-8)
        raise MalformedFrame(f"JSON header does not decode: {str(exc)[:200]}") from exc
    return Command(h.code, h.opaque, h.flag, h.version, h.remark, ext, body, h.language,
                   SERIALIZE_JSON)


def _take(data: bytes, pos: int, n: int) -> tuple[bytes, int]:
    if n < 0 or pos + n > len(data):
        raise MalformedFrame(f"ROCKETMQ header: a length of {n} at byte {pos} runs past its end")
    return data[pos : pos + n], pos + n


def _decode_binary(data: bytes, body: bytes) -> Command:
    try:
        code, lang, version, opaque, flag, remark_len = _BIN_FIXED.unpack_from(data)
        remark_b, pos = _take(data, _BIN_FIXED.size, remark_len)
        (ext_len,) = _I32.unpack_from(data, pos)
        ext_b, pos = _take(data, pos + 4, ext_len)
        ext: dict[str, str] = {}
        p = 0
        while p < len(ext_b):
            (klen,) = _I16.unpack_from(ext_b, p)
            k, p = _take(ext_b, p + 2, klen)
            (vlen,) = _I32.unpack_from(ext_b, p)
            v, p = _take(ext_b, p + 4, vlen)
            ext[k.decode()] = v.decode()
        remark = remark_b.decode() if remark_len > 0 else None
    except (struct.error, UnicodeDecodeError) as exc:
        raise MalformedFrame(f"ROCKETMQ header does not decode: {exc}") from exc
    language = _LANGUAGE_NAMES.get(lang, "OTHER")
    return Command(code, opaque, flag, version, remark, ext, body, language, SERIALIZE_ROCKETMQ)


class FrameDecoder:
    """Incremental frame decoder: feed bytes, get whole commands.

    After it raises, the decoder is poisoned (the stream has lost framing) and every later call
    raises again; the caller should close the connection.

    Args:
        max_frame_bytes: the largest frame accepted (``limits.FRAME_SIZE_MAX_BYTES``, RocketMQ
            ``NettySystemConfig.frameMaxLength``).
    """

    def __init__(self, max_frame_bytes: int = FRAME_SIZE_MAX_BYTES) -> None:
        assert max_frame_bytes > _PREFIX.size
        self._buf = bytearray()
        self._max = max_frame_bytes
        self._error: Exception | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf)

    @property
    def frame_bytes(self) -> int:
        """Size (length prefix included) of the frame being received, once its 4-byte length has
        arrived; 0 before."""
        buf = self._buf
        return 4 + int.from_bytes(buf[:4], "big") if len(buf) >= 4 else 0

    def feed(self, data: bytes | bytearray) -> list[Command]:
        """Add received bytes; return every command now complete, in order.

        Raises:
            FrameTooLarge: a frame declares a length above the limit.
            MalformedFrame: inconsistent lengths, an unknown serialize type, or a header that
                does not decode.
        """
        if self._error is not None:
            raise self._error
        if self._buf:
            buf = self._buf
            buf += data
            if len(buf) < _PREFIX.size or len(buf) < self.frame_bytes:
                return self._check_partial()  # a large frame arriving: no copy per chunk
            data, self._buf = buf, bytearray()  # decoded where it is: its body copied once
        out: list[Command] = []
        pos = 0
        try:
            while (got := self._next(data, pos)) is not None:
                cmd, pos = got
                out.append(cmd)
        except (FrameTooLarge, MalformedFrame) as exc:
            self._error = exc
            raise
        if pos < len(data):
            self._buf += data[pos:]
            self._check_partial()
        return out

    def _check_partial(self) -> list[Command]:
        """Check the prefix of the incomplete frame buffered (so an oversized one is refused
        before its body arrives); nothing is complete yet."""
        if len(self._buf) >= _PREFIX.size:
            try:
                self._next(bytes(self._buf[: _PREFIX.size]), 0)
            except (FrameTooLarge, MalformedFrame) as exc:
                self._error = exc
                raise
        return []

    def _next(self, data: bytes | bytearray, pos: int) -> tuple[Command, int] | None:
        """The command starting at ``data[pos]`` and the position after it, or None when it is
        not all there yet."""
        if len(data) - pos < _PREFIX.size:
            return None
        length, marked = _PREFIX.unpack_from(data, pos)
        if length > self._max:
            raise FrameTooLarge(f"frame declares {length} bytes, limit is {self._max}")
        kind, header_len = marked >> 24, marked & _U24
        if kind not in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
            raise MalformedFrame(f"unknown serialize type {kind}")
        if header_len > FRAME_HEADER_MAX_BYTES or header_len + 4 > length:
            raise MalformedFrame(f"header length {header_len} does not fit frame length {length}")
        end = pos + 4 + length
        if len(data) < end:
            return None
        start = pos + _PREFIX.size
        header = bytes(data[start : start + header_len])  # (of a bytes slice: no copy)
        body = data[start + header_len : end] if type(data) is bytes else \
            bytes(memoryview(data)[start + header_len : end])
        if kind == SERIALIZE_JSON:
            return _decode_json(header, body), end
        return _decode_binary(header, body), end

