"""Message bodies a client compressed: inflated once, by the broker, on receipt.

RocketMQ clients compress a body above ``compressMsgBodyOverHowmuch`` (4 KiB) and set
``MessageSysFlag.COMPRESSED_FLAG``; 4.x clients use zlib with no type bits, 5.x clients name the
algorithm in ``sysFlag`` bits 8-10 (``MessageSysFlag.COMPRESSION_TYPE_COMPARATOR``: LZ4 1, ZSTD 2,
ZLIB 3). txmq stores bodies inflated, so every consumer reads them as they were sent.
"""

from __future__ import annotations

import zlib

from txmq.errors import InvalidRequest, ResponseCode

__all__ = ["COMPRESSION_TYPE_MASK", "COMPRESSION_ZLIB", "inflate"]

COMPRESSION_TYPE_MASK = 0x7 << 8
"""RocketMQ ``MessageSysFlag.COMPRESSION_TYPE_COMPARATOR``."""
COMPRESSION_ZLIB = 0x3 << 8
"""RocketMQ ``MessageSysFlag.COMPRESSION_ZLIB_TYPE``."""
_NAMES = {0x1 << 8: "LZ4", 0x2 << 8: "ZSTD"}


def inflate(body: bytes, sys_flag: int, max_bytes: int) -> bytes:
    """The body of a message sent with ``COMPRESSED_FLAG``, inflated.

    Args:
        body: the compressed bytes.
        sys_flag: the send header's ``sysFlag`` (its compression type bits).
        max_bytes: the largest inflated body accepted.

    Raises:
        InvalidRequest: MESSAGE_ILLEGAL for an algorithm other than zlib, a body that does not
            inflate, or one that inflates past ``max_bytes``.
    """
    kind = sys_flag & COMPRESSION_TYPE_MASK
    if kind not in (0, COMPRESSION_ZLIB):
        raise InvalidRequest(ResponseCode.MESSAGE_ILLEGAL,
                             f"{_NAMES.get(kind, hex(kind))} compressed bodies are not supported; "
                             "send zlib (the 4.x default) or uncompressed")
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidRequest(ResponseCode.MESSAGE_ILLEGAL,
                             f"compressed body does not inflate: {exc}") from exc
    if len(out) > max_bytes:
        raise InvalidRequest(ResponseCode.MESSAGE_ILLEGAL, "the message body size over max value, "
                             f"MAX: {max_bytes} (after inflating)")
    if not d.eof:
        raise InvalidRequest(ResponseCode.MESSAGE_ILLEGAL, "compressed body is truncated")
    return out
