"""The fuzz target of the HA (replication) decoders (issue #25): RocketMQ's HA stream, raw."""

from __future__ import annotations

import contextlib

from txmq.broker.ha import SlaveCore
from txmq.errors import HaProtocolError
from txmq.protocol import (
    HA_HELLO_HEADER,
    HA_MAGIC,
    HaTransfer,
    HelloDecoder,
    ReportDecoder,
    TransferDecoder,
    decode_challenge,
    encode_challenge,
    encode_heartbeat,
    encode_hello,
    encode_report,
    encode_transfer,
)

__all__ = ["ha_seeds", "ha_target"]


def ha_target(data: bytes) -> None:
    """Byte 0 picks the stream's start offset and the chunking; the rest is fed in chunks to
    TransferDecoder (what it decodes must re-encode to a prefix of the input), ReportDecoder
    (offsets non-negative and non-decreasing), SlaveCore (whole records, contiguous), and the
    handshake: HelloDecoder (a decoded hello re-encodes to the bytes it consumed) and
    decode_challenge. Each may raise only HaProtocolError."""
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
    _handshake(chunks, body)
    with contextlib.suppress(HaProtocolError):
        core, at = SlaveCore(start), start
        for c in chunks:
            for off, piece in core.feed(c):
                assert off == at and piece
                at += len(piece)


def _handshake(chunks: list[bytes], body: bytes) -> None:
    """HelloDecoder on the chunks: a decoded hello, laid out again from its fields, is exactly the
    input bytes it consumed; decode_challenge round-trips the first 20 bytes."""
    with contextlib.suppress(HaProtocolError):
        dec, hello, fed = HelloDecoder(), None, 0
        for c in chunks:
            fed += len(c)
            if (hello := dec.feed(c)) is not None:
                break
        if hello is not None:
            parts = [hello.broker_name.encode(), hello.access_key.encode(), hello.signature.encode()]
            wire = HA_HELLO_HEADER.pack(HA_MAGIC, hello.broker_id, *map(len, parts)) + b"".join(parts)
            assert body[: fed - len(dec.rest)] == wire, "a decoded hello does not re-encode"
    with contextlib.suppress(HaProtocolError):
        assert encode_challenge(decode_challenge(body[:20])) == body[:20]


def ha_seeds() -> list[bytes]:
    record = (12).to_bytes(4, "big") + b"\xda\xa3\x20\xa7" + b"abcd"
    stream = encode_transfer(0, record * 3) + encode_heartbeat(36) + encode_transfer(36, record[:5])
    return [b"\x00" + stream, b"\x01" + encode_report(0) + encode_report(1000) + encode_report(5000),
            b"\x00" + encode_transfer(0, b""),
            b"\x02" + encode_hello("broker-a", 1, "repl", "repl-sk", bytes(16)) + encode_report(0),
            b"\x03" + encode_challenge(bytes(range(16)))]
