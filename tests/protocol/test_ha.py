"""The HA (replication) codec: round trips, chunking, and bad input (txmq.protocol._ha)."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq import limits
from txmq.errors import HaProtocolError, ProtocolError
from txmq.protocol import (
    HA_CHALLENGE,
    HA_HELLO_HEADER,
    HA_REPORT,
    HA_TRANSFER_HEADER,
    SIGNATURE,
    HaHeartbeat,
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
    ha_hello_fields,
    remoting_content,
    remoting_signature,
)

_BATCH = limits.HA_TRANSFER_BATCH_BYTES


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def test_layout_is_rocketmq_big_endian() -> None:
    assert HA_REPORT.size == 8 and HA_TRANSFER_HEADER.size == 12
    assert encode_report(0x0102) == b"\0\0\0\0\0\0\x01\x02"
    assert encode_transfer(5, b"ab") == b"\0" * 7 + b"\x05" + b"\0\0\0\x02ab"
    assert encode_heartbeat(7) == b"\0" * 7 + b"\x07" + b"\0\0\0\0"


@given(st.lists(st.integers(0, 2**40), max_size=20), st.lists(st.integers(0, 10_000), max_size=8))
def test_reports_round_trip_in_any_chunking(offsets: list[int], cuts: list[int]) -> None:
    offsets = sorted(offsets)
    wire = b"".join(encode_report(o) for o in offsets)
    dec = ReportDecoder()
    got = [o for part in _chunks(wire, cuts) for o in dec.feed(part)]
    assert got == offsets
    assert dec.last == (offsets[-1] if offsets else -1)


@given(st.integers(0, 2**40), st.lists(st.binary(max_size=300), max_size=12),
       st.lists(st.integers(0, 100_000), max_size=8))
def test_transfers_round_trip_in_any_chunking(start: int, bodies: list[bytes], cuts: list[int]) -> None:
    wire, at, want = b"", start, []
    for body in bodies:
        wire += encode_transfer(at, body)
        want.append(HaTransfer(at, body) if body else HaHeartbeat(at))
        at += len(body)
    dec = TransferDecoder(start)
    got = [e for part in _chunks(wire, cuts) for e in dec.feed(part)]
    assert got == want
    assert dec.expected == at


def test_full_batch_is_accepted_one_byte_more_is_not() -> None:
    dec = TransferDecoder(0)
    assert dec.feed(encode_transfer(0, b"x" * _BATCH)) == [HaTransfer(0, b"x" * _BATCH)]
    with pytest.raises(HaProtocolError):
        encode_transfer(0, b"x" * (_BATCH + 1))
    with pytest.raises(HaProtocolError, match="size"):
        TransferDecoder(0).feed(HA_TRANSFER_HEADER.pack(0, _BATCH + 1))


def test_negative_size_and_offsets_are_refused() -> None:
    with pytest.raises(HaProtocolError, match="size"):
        TransferDecoder(0).feed(HA_TRANSFER_HEADER.pack(0, -1))
    with pytest.raises(HaProtocolError):
        TransferDecoder(-1)
    with pytest.raises(HaProtocolError):
        encode_report(-1)
    with pytest.raises(HaProtocolError):
        ReportDecoder().feed(HA_REPORT.pack(-5))


def test_a_gap_or_an_overlap_in_the_stream_is_refused() -> None:
    dec = TransferDecoder(100)
    dec.feed(encode_transfer(100, b"abc"))
    with pytest.raises(HaProtocolError, match="expects 103"):
        dec.feed(encode_transfer(104, b"d"))
    with pytest.raises(HaProtocolError, match="expects 100"):
        TransferDecoder(100).feed(encode_heartbeat(99))


def test_a_report_going_backwards_is_refused() -> None:
    dec = ReportDecoder()
    assert dec.feed(encode_report(10) + encode_report(10)) == [10, 10]
    with pytest.raises(HaProtocolError, match="after 10"):
        dec.feed(encode_report(9))


def test_undecoded_bytes_are_bounded() -> None:
    dec = TransferDecoder(0)
    dec.feed(HA_TRANSFER_HEADER.pack(0, _BATCH))  # a frame still waiting for its body
    with pytest.raises(HaProtocolError, match="HA_READ_BUFFER_BYTES"):
        dec.feed(b"\0" * limits.HA_READ_BUFFER_BYTES)


@given(st.binary(max_size=2_000))
def test_garbage_raises_only_the_protocol_error(data: bytes) -> None:
    for dec in (TransferDecoder(0), ReportDecoder()):
        try:
            for e in dec.feed(data):
                assert isinstance(e, HaTransfer | HaHeartbeat | int)
        except ProtocolError:
            pass


# -- the handshake (ACL on) -------------------------------------------------------------------------
NONCE = bytes(range(16))


def test_handshake_layout() -> None:
    assert HA_CHALLENGE.size == 20 and HA_HELLO_HEADER.size == 18
    assert encode_challenge(NONCE) == b"TXHA" + NONCE
    assert decode_challenge(b"TXHA" + NONCE) == NONCE
    hello = encode_hello("broker-a", 1, "repl", "sk", NONCE)
    assert hello[:4] == b"TXHA" and hello[4:12] == (1).to_bytes(8, "big")
    assert hello[12:18] == bytes([0, 8, 0, 4, 0, 28]) and hello[18:30] == b"broker-arepl"


@given(st.text(max_size=40), st.integers(-(2**63), 2**63 - 1), st.text(min_size=1, max_size=40),
       st.text(max_size=40), st.binary(min_size=16, max_size=16),
       st.lists(st.integers(0, 400), max_size=6))
def test_hello_round_trips_and_its_signature_is_the_remoting_one(
        name: str, broker_id: int, ak: str, sk: str, nonce: bytes, cuts: list[int]) -> None:
    wire = encode_hello(name, broker_id, ak, sk, nonce) + encode_report(7)
    dec, got, parts = HelloDecoder(), None, _chunks(wire, cuts)
    while got is None:
        got = dec.feed(parts.pop(0))
    assert (got.broker_name, got.broker_id, got.access_key) == (name, broker_id, ak)
    assert dec.rest + b"".join(parts) == encode_report(7)  # the first report, sent at once
    fields = ha_hello_fields(got, nonce)
    assert fields[SIGNATURE] == remoting_signature(remoting_content(fields, b""), sk)
    other = ha_hello_fields(got, bytes(16) if nonce != bytes(16) else b"\1" * 16)
    assert other[SIGNATURE] != remoting_signature(remoting_content(other, b""), sk)


def test_bad_handshake_frames_are_refused() -> None:
    with pytest.raises(HaProtocolError, match="did not send a hello"):
        HelloDecoder().feed(encode_report(0))  # a slave without credentials
    with pytest.raises(HaProtocolError, match="longer than"):
        HelloDecoder().feed(HA_HELLO_HEADER.pack(b"TXHA", 1, 256, 0, 0))
    with pytest.raises(HaProtocolError, match="UTF-8"):
        HelloDecoder().feed(HA_HELLO_HEADER.pack(b"TXHA", 1, 1, 0, 0) + b"\xff")
    with pytest.raises(HaProtocolError, match="longer than"):
        encode_hello("n" * 256, 1, "a", "s", NONCE)
    with pytest.raises(HaProtocolError):
        decode_challenge(b"RMQX" + NONCE)
    with pytest.raises(HaProtocolError):
        encode_challenge(b"short")
    assert HelloDecoder().feed(b"TXH") is None  # a prefix of the magic waits for more
    with pytest.raises(HaProtocolError, match="challenge"):  # a slave without credentials
        TransferDecoder(0).feed(encode_challenge(NONCE))


@given(st.binary(max_size=600))
def test_hello_garbage_raises_only_the_protocol_error(data: bytes) -> None:
    for payload in (data, b"TXHA" + data):
        with contextlib.suppress(HaProtocolError):
            HelloDecoder().feed(payload)


def test_auto_switch_frames_round_trip_and_refuse_a_wrong_state() -> None:
    from txmq.protocol import HA_AUTO_TRANSFER_HEADER, encode_auto_report, encode_auto_transfer

    dec = TransferDecoder(100, auto=True)
    wire = (encode_auto_transfer(100, b"ab", 3, 40, 90) + encode_auto_transfer(102, b"", 3, 40, 99))
    assert dec.feed(wire) == [HaTransfer(100, b"ab", 3, 40, 90), HaHeartbeat(102, 3, 40, 99)]
    rd = ReportDecoder(auto=True)
    assert rd.feed(encode_auto_report(7) + encode_auto_report(9)) == [7, 9]
    with pytest.raises(HaProtocolError, match="state"):
        TransferDecoder(0, auto=True).feed(HA_AUTO_TRANSFER_HEADER.pack(1, 0, 0, 1, 0, 0))
    with pytest.raises(HaProtocolError, match="state"):
        ReportDecoder(auto=True).feed(b"\0\0\0\1" + b"\0" * 8)
    assert len(encode_auto_transfer(0, b"", 1, 0, 0)) == 36 and len(encode_auto_report(0)) == 12
