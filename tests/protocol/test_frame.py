"""Frame codec: round trips, incremental decoding, malformed and oversized frames."""

from __future__ import annotations

import struct

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.errors import FrameTooLarge, MalformedFrame
from txmq.limits import FRAME_SIZE_MAX_BYTES
from txmq.protocol import (
    Command,
    FrameDecoder,
    MessageExt,
    SendMessageRequestHeader,
    decode_message_ext_msgpack,
    encode_command,
    encode_message_ext_msgpack,
    from_ext,
    to_ext,
)

ext_values = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20), st.booleans())
commands = st.builds(
    Command,
    code=st.integers(0, 2**31),
    opaque=st.integers(0, 2**31),
    flags=st.integers(0, 3),
    remark=st.text(max_size=50),
    ext=st.dictionaries(st.text(max_size=10), ext_values, max_size=5),
    body=st.binary(max_size=2000),
)


@given(st.lists(commands, min_size=1, max_size=5), st.integers(1, 64))
def test_round_trip_in_any_chunking(cmds: list[Command], chunk: int) -> None:
    wire = b"".join(encode_command(c) for c in cmds)
    dec = FrameDecoder()
    out: list[Command] = []
    for i in range(0, len(wire), chunk):
        out += dec.feed(wire[i : i + chunk])
    assert out == cmds
    assert dec.buffered == 0


def test_oversized_declared_length_is_refused_before_buffering() -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">II", FRAME_SIZE_MAX_BYTES + 1, 10))


def test_header_length_larger_than_frame_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(struct.pack(">II", 10, 50) + b"x" * 10)


def test_garbage_header_is_malformed_and_decoder_stays_poisoned() -> None:
    dec = FrameDecoder()
    frame = struct.pack(">II", 4 + 3, 3) + b"\xc1\xc1\xc1"
    with pytest.raises(MalformedFrame):
        dec.feed(frame)
    with pytest.raises(MalformedFrame):
        dec.feed(encode_command(Command(code=1)))


def test_wrong_header_shape_is_malformed() -> None:
    header = msgspec.msgpack.encode(["not", "a", "header"])
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(struct.pack(">II", 4 + len(header), len(header)) + header)


def test_encoding_an_oversized_body_raises() -> None:
    with pytest.raises(FrameTooLarge):
        encode_command(Command(code=10, body=b"x" * FRAME_SIZE_MAX_BYTES))


def test_header_struct_validation() -> None:
    h = SendMessageRequestHeader(producer_group="g", topic="t", properties={"a": "b"})
    assert from_ext(to_ext(h), SendMessageRequestHeader) == h
    with pytest.raises(MalformedFrame):
        from_ext({"topic": "t"}, SendMessageRequestHeader)  # producer_group missing
    with pytest.raises(MalformedFrame):
        from_ext({"producer_group": "g", "topic": 5}, SendMessageRequestHeader)


def test_message_ext_round_trip() -> None:
    m = MessageExt(topic="t", body=b"\x00\x01", keys="k1 k2", properties={"UNIQ_KEY": "X"},
                   queue_id=3, queue_offset=7, commit_log_offset=99, born_timestamp_ms=5)
    assert decode_message_ext_msgpack(encode_message_ext_msgpack(m)) == m
    assert m.msg_id == "X"


# -- issue 11: every decoding failure is MalformedFrame ---------------------------------------------
def _frame(header: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header), len(header)) + header


_HEAD = bytes([0x96, 10, 1, 0, 1])  # msgpack array of 6: code 10, opaque 1, flags 0, version 1


@pytest.mark.parametrize("header", [
    _HEAD + b"\xa2\xff\xfe" + b"\x80",  # remark that is not UTF-8
    _HEAD + b"\xa0" + b"\x81\xa2\xc3\x28\xc0",  # ext key that is not UTF-8
    _HEAD + b"\xa0" + b"\x81\xa1k\xa1\xff",  # ext value that is not UTF-8
], ids=["remark", "ext-key", "ext-value"])
def test_invalid_utf8_in_a_header_is_malformed(header: bytes) -> None:
    d = FrameDecoder()
    with pytest.raises(MalformedFrame):
        d.feed(_frame(header))
    with pytest.raises(MalformedFrame):  # poisoned
        d.feed(b"")


def test_sixty_thousand_nested_levels_are_malformed_not_a_recursion_error() -> None:
    header = _HEAD + b"\xa0" + b"\x81\xa1a" + b"\x91" * 60_000 + b"\xc0"
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(_frame(header))


def test_ext_values_nest_at_most_the_depth_limit() -> None:
    props = Command(code=10, ext={"properties": {"k": "v"}, "ids": ["a", "b"], "n": 1})
    [back] = FrameDecoder().feed(encode_command(props))
    assert back.ext == props.ext
    deeper = Command(code=10, ext={"properties": {"k": {"k": "v"}}})
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(encode_command(deeper))
