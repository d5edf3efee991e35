"""The bulk decoder of pull replies (``decode_message_exts_bulk``, ``index_message_exts``) against
its specification, the per-record ``decode_message_exts``: random records (v1 and v2 magic codes,
IPv4 and IPv6 hosts, compressed bodies), properties strings RocketMQ reads leniently, RocketMQ 5's
``__CRC32#`` property, and damaged replies (the same error, or the same messages)."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txmq.protocol._message_bulk as bulk
from txmq.errors import MalformedMessage
from txmq.protocol import (
    COMPRESSED_FLAG,
    MESSAGE_MAGIC_CODE,
    PROPERTY_CRC32,
    MessageExt,
    decode_message_ext,
    decode_message_exts,
    decode_message_exts_bulk,
    encode_message_exts,
    index_message_exts,
)

_names = st.text(st.characters(exclude_characters="\u0001\u0002", exclude_categories=["Cs"]),
                 min_size=1, max_size=8)
_values = st.text(st.characters(exclude_characters="\u0001\u0002", exclude_categories=["Cs"]),
                  max_size=8)
_hosts = st.sampled_from(["", "127.0.0.1:10911", "10.1.2.3:5", "[2001:db8::1]:9876",
                          "[::ffff:1.2.3.4]:7"])
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def messages(draw: st.DrawFn) -> MessageExt:
    return MessageExt(
        topic=draw(st.sampled_from(["orders", "ü-topic", "t" * 130, "", "%RETRY%g"])),
        body=draw(st.binary(max_size=40)),
        tags=draw(_values),
        keys=draw(st.sampled_from(["", "k1", "k1 k2", " lead", "a\u3000b", "x\x1cy"])),
        properties=draw(st.dictionaries(_names, _values, max_size=4)),
        flag=draw(_i32), queue_id=draw(_i32), queue_offset=draw(_i64),
        commit_log_offset=draw(_i64), born_timestamp_ms=draw(_i64), store_timestamp_ms=draw(_i64),
        reconsume_times=draw(_i32), prepared_transaction_offset=draw(_i64),
        born_host=draw(_hosts), store_host=draw(_hosts),
        sys_flag=draw(st.sampled_from([0, 0, COMPRESSED_FLAG, 0x4, 0x8, COMPRESSED_FLAG | 0x300])),
    )


def assert_same(data: bytes, *, check_crc: bool = True, inflate: bool = True) -> list[MessageExt]:
    """Both decoders raise the same MalformedMessage, or both give equal messages."""
    try:
        want = decode_message_exts(data, check_crc=check_crc, inflate=inflate)
    except MalformedMessage as exc:
        with pytest.raises(MalformedMessage) as got_exc:
            decode_message_exts_bulk(data, check_crc=check_crc, inflate=inflate)
        assert str(got_exc.value) == str(exc)
        return []
    got = decode_message_exts_bulk(data, check_crc=check_crc, inflate=inflate)
    assert got == want
    return got


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(), max_size=6), st.booleans(), st.booleans())
def test_random_records_decode_as_record_by_record(msgs: list[MessageExt], check_crc: bool,
                                                  inflate: bool) -> None:
    data = encode_message_exts(msgs, compress=True)
    got = assert_same(data, check_crc=check_crc, inflate=inflate)
    assert len(got) == len(msgs)
    ix = index_message_exts(data, check_crc=check_crc)
    assert ix is not None and ix.count == len(msgs)
    assert ix.queue_offset.tolist() == [m.queue_offset for m in got]
    assert (ix.end - ix.start).tolist() == [m.store_size for m in got]


def test_the_common_case_takes_the_bulk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """v1 and v2 magic codes, IPv4 and IPv6 hosts, a compressed body: no per-record decoding."""
    msgs = [MessageExt(topic="t" * (130 if i % 2 else 3), body=b"b%d" % i * 30, keys=f"k{i} x",
                       tags="t", properties={"UNIQ_KEY": f"id{i}"}, queue_offset=i,
                       born_host="[2001:db8::1]:1" if i % 3 else "127.0.0.1:1",
                       store_host="127.0.0.1:2", sys_flag=COMPRESSED_FLAG if i == 4 else 0)
            for i in range(6)]
    data = encode_message_exts(msgs, compress=True)
    want = decode_message_exts(data)

    def refuse(data: bytes, **kwargs: object) -> list[MessageExt]:
        raise AssertionError("fell back to the per-record decoder")

    monkeypatch.setattr(bulk, "decode_message_exts", refuse)
    assert decode_message_exts_bulk(data) == want
    assert [m.body for m in want] == [m.body for m in msgs]


_HEAD = struct.Struct(">iIiiiqqiq8sq8siqi")


def record(props: bytes, body: bytes = b"body", topic: bytes = b"orders", offset: int = 0) -> bytes:
    """One v1 record with IPv4 hosts and a properties string given as bytes (anything)."""
    total = _HEAD.size + len(body) + 1 + len(topic) + 2 + len(props)
    head = _HEAD.pack(total, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, 3, 0, offset, 0, 0,
                      1_700_000_000_000, bytes(8), 1_700_000_000_001, bytes(8), 0, 0, len(body))
    return head + body + bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props


_pieces = st.sampled_from(["a", "b", "TAGS", "KEYS", "UNIQ_KEY", PROPERTY_CRC32, "\u0001",
                           "\u0002", " ", "é", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_pieces, max_size=12).map("".join), min_size=1, max_size=4))
def test_lenient_properties_strings_read_as_rocketmq_reads_them(texts: list[str]) -> None:
    """Missing trailing separators, entries without a name, a value or a separator, repeated
    names, TAGS, KEYS and __CRC32# anywhere: the same messages as record by record."""
    assert_same(b"".join(record(t.encode(), offset=i) for i, t in enumerate(texts)))


def crc_property(value: int) -> str:
    """RocketMQ 5's appended entry (``MessageDecoder.createCrc32``: 10 digits, least significant
    first, after ``__CRC32#`` and the name-value separator)."""
    digits = "".join(str(value // 10**i % 10) for i in range(10))
    return f"{PROPERTY_CRC32}\u0001{digits}\u0002"


def test_rocketmq5_crc32_property_is_accepted_and_hidden() -> None:
    props = "UNIQ_KEY\u0001id1\u0002KEYS\u0001k\u0002TAGS\u0001t\u0002"
    data = b"".join(record((props + crc_property(123456789 + i)).encode(), offset=i)
                    for i in range(3))
    for got in (decode_message_exts(data), decode_message_exts_bulk(data)):
        assert [m.properties for m in got] == [{"UNIQ_KEY": "id1"}] * 3
        assert {(m.keys, m.tags) for m in got} == {("k", "t")}
    assert decode_message_ext(record(crc_property(7).encode())).properties == {}


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=3), st.data())
def test_damaged_replies_fail_or_match_as_record_by_record(msgs: list[MessageExt],
                                                           data: st.DataObject) -> None:
    body = bytearray(encode_message_exts(msgs, compress=True))
    cut = data.draw(st.integers(0, len(body)))
    if data.draw(st.booleans()):
        del body[cut:]
    elif cut < len(body):
        body[cut] ^= data.draw(st.integers(1, 255))
    assert_same(bytes(body), check_crc=data.draw(st.booleans()))


def test_empty_and_short_buffers() -> None:
    assert decode_message_exts_bulk(b"") == []
    for raw in (b"\0", b"\0\0\0\x05", bytes(200)):
        assert_same(raw)
