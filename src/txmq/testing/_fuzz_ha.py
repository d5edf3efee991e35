"""The fuzz target of the HA (replication) decoders (issue #25): RocketMQ's HA stream, raw."""

from __future__ import annotations

import contextlib

from txmq.broker.ha import SlaveCore
from txmq.errors import HaProtocolError
from txmq.protocol import (
    HaTransfer,
    ReportDecoder,
    TransferDecoder,
    encode_heartbeat,
    encode_report,
    encode_transfer,
)

__all__ = ["ha_seeds", "ha_target"]


def ha_target(data: bytes) -> None:
    """Byte 0 picks the stream's start offset and the chunking; the rest is fed in chunks to
    TransferDecoder (what it decodes must re-encode to a prefix of the input), ReportDecoder
    (offsets non-negative and non-decreasing) and SlaveCore (whole records, contiguous). Each may
    raise only HaProtocolError."""
    if not data:
        return
    start, cut, body = data[0] * 1000, 1 + data[0] % 23, data[1:]
    chunks = [body[i : i + cut] for i in range(0, len(body), cut)]
    events = []
    with contextlib.suppress(HaProtocolError):
        dec = TransferDecoder(start)
        for c in chunks:
            events += dec.feed(c)
    wire = b"".join(encode_transfer(e.offset, e.data) if isinstance(e, HaTransfer)
                    else encode_heartbeat(e.offset) for e in events)
    assert body.startswith(wire), "decoded frames do not re-encode to the input"
    with contextlib.suppress(HaProtocolError):
        rd, last = ReportDecoder(), 0
        for c in chunks:
            for off in rd.feed(c):
                assert off >= last
                last = off
    with contextlib.suppress(HaProtocolError):
        core, at = SlaveCore(start), start
        for c in chunks:
            for off, piece in core.feed(c):
                assert off == at and piece
                at += len(piece)


def ha_seeds() -> list[bytes]:
    record = (12).to_bytes(4, "big") + b"\xda\xa3\x20\xa7" + b"abcd"
    stream = encode_transfer(0, record * 3) + encode_heartbeat(36) + encode_transfer(36, record[:5])
    return [b"\x00" + stream, b"\x01" + encode_report(0) + encode_report(1000) + encode_report(5000),
            b"\x00" + encode_transfer(0, b"")]
