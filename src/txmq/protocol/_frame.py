"""Frames and commands: the sans-IO wire codec.

A frame is modelled on RocketMQ's ``RemotingCommand``, with the header encoded by msgspec (msgpack)::

     0          4          8                    8+H                  4+L
     +----------+----------+--------------------+--------------------+
     | L: u32   | H: u32   | header (msgpack)   | body (raw bytes)   |
     +----------+----------+--------------------+--------------------+
     L = 4 + H + len(body)   (bytes after the first field), big-endian

The header is the msgpack array ``[code, opaque, flags, version, remark, ext]`` where ``flags`` bit 0
marks a response and bit 1 a one-way request, and ``ext`` is a map of named fields (RocketMQ's
"extFields"). Nothing here touches a socket or a clock: :class:`FrameDecoder` takes bytes and returns
commands; :func:`encode_command` takes a command and returns bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Union

import msgspec

from txmq.errors import FrameTooLarge, MalformedFrame
from txmq.limits import FRAME_HEADER_EXT_DEPTH_MAX, FRAME_HEADER_MAX_BYTES, FRAME_SIZE_MAX_BYTES

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "Command",
    "FrameDecoder",
    "encode_command",
]

_PREFIX = struct.Struct(">II")  # L: u32 frame length, H: u32 header length
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
PROTOCOL_VERSION = 1


class Command(msgspec.Struct, array_like=True, omit_defaults=False):
    """One request or response.

    Attributes:
        code: a :class:`~txmq.protocol.RequestCode` for requests, a
            :class:`~txmq.errors.ResponseCode` for responses.
        opaque: request id chosen by the requester; the response carries the same value.
        flags: ``FLAG_RESPONSE`` | ``FLAG_ONEWAY``.
        version: protocol version of the sender.
        remark: human-readable text (error explanations).
        ext: named header fields, values of msgpack-native types.
        body: payload bytes (not part of the msgpack header).
    """

    code: int
    opaque: int = 0
    flags: int = 0
    version: int = PROTOCOL_VERSION
    remark: str = ""
    ext: dict[str, Any] = msgspec.field(default_factory=dict)
    body: bytes = msgspec.field(default=b"")

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)

    def response(self, code: int, remark: str = "", ext: dict[str, Any] | None = None,
                 body: bytes = b"") -> Command:
        """The response to this request: same opaque, ``FLAG_RESPONSE`` set."""
        return Command(code=int(code), opaque=self.opaque, flags=FLAG_RESPONSE, remark=remark,
                       ext=ext or {}, body=body)


_Scalar = Union[None, bool, int, float, str]  # noqa: UP007 (a runtime type for msgspec)
_ExtValue = Union[_Scalar, list[_Scalar], dict[str, _Scalar]]  # noqa: UP007
assert FRAME_HEADER_EXT_DEPTH_MAX == 2  # _ExtValue: a container of scalars at most


class _Header(msgspec.Struct, array_like=True):
    """What the decoder accepts: ``ext`` values nest at most ``FRAME_HEADER_EXT_DEPTH_MAX``
    levels, so a deeply nested header fails validation at its second level instead of recursing."""

    code: int
    opaque: int
    flags: int
    version: int
    remark: str
    ext: dict[str, _ExtValue]


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)


def encode_command(cmd: Command) -> bytes:
    """Encode one command as a frame.

    Raises:
        FrameTooLarge: the frame would exceed ``FRAME_SIZE_MAX_BYTES``.
    """
    header = _encoder.encode(
        _Header(cmd.code, cmd.opaque, cmd.flags, cmd.version, cmd.remark, cmd.ext)
    )
    if len(header) > FRAME_HEADER_MAX_BYTES:
        raise FrameTooLarge(f"header of {len(header)} bytes exceeds {FRAME_HEADER_MAX_BYTES}")
    length = 4 + len(header) + len(cmd.body)
    if length > FRAME_SIZE_MAX_BYTES:
        raise FrameTooLarge(f"frame of {length} bytes exceeds {FRAME_SIZE_MAX_BYTES}")
    return b"".join((_PREFIX.pack(length, len(header)), header, cmd.body))


class FrameDecoder:
    """Incremental frame decoder: feed bytes, get whole commands.

    After it raises, the decoder is poisoned (the stream has lost framing) and every later call
    raises again; the caller should answer with an error and close the connection.

    Args:
        max_frame_bytes: the largest frame accepted (``limits.FRAME_SIZE_MAX_BYTES``).
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

    def feed(self, data: bytes) -> list[Command]:
        """Add received bytes; return every command now complete, in order.

        Raises:
            FrameTooLarge: a frame declares a length above the limit.
            MalformedFrame: the length fields are inconsistent or the header does not decode.
        """
        if self._error is not None:
            raise self._error
        self._buf += data
        out: list[Command] = []
        try:
            while (cmd := self._next()) is not None:
                out.append(cmd)
        except (FrameTooLarge, MalformedFrame) as exc:
            self._error = exc
            raise
        return out

    def _next(self) -> Command | None:
        buf = self._buf
        if len(buf) < _PREFIX.size:
            return None
        length, header_len = _PREFIX.unpack_from(buf)
        if length > self._max:
            raise FrameTooLarge(f"frame declares {length} bytes, limit is {self._max}")
        if header_len > FRAME_HEADER_MAX_BYTES or header_len + 4 > length:
            raise MalformedFrame(f"header length {header_len} does not fit frame length {length}")
        if len(buf) < 4 + length:
            return None
        start = _PREFIX.size
        try:
            h = _header_decoder.decode(bytes(buf[start : start + header_len]))
        except (msgspec.MsgspecError, ValueError, RecursionError, MemoryError) as exc:
            # ValueError covers UnicodeDecodeError (a str that is not UTF-8)
            raise MalformedFrame(f"header does not decode: {type(exc).__name__}: "
                                 f"{str(exc)[:200]}") from exc
        body = bytes(buf[start + header_len : 4 + length])
        del buf[: 4 + length]
        return Command(h.code, h.opaque, h.flags, h.version, h.remark, h.ext, body)
