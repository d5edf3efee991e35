"""The Spark source's bulk decoder of pull replies (``pull_body_to_record_batch``).

Its specification is the per-message path it replaces: ``messages_to_record_batch(
decode_message_exts(body))``. Every test compares the two on the same bytes: random messages in
RocketMQ's wire layout, hand-made properties strings RocketMQ's decoder reads leniently, and damaged
replies (both must raise the same error, or both must give the same rows).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txmq.spark._arrow as arrow
from txmq.errors import MalformedMessage
from txmq.protocol import (
    COMPRESSED_FLAG,
    MESSAGE_MAGIC_CODE,
    MessageExt,
    decode_message_exts,
    encode_message_exts,
)
from txmq.spark._arrow import PullBatch, messages_to_record_batch, pull_body_to_record_batch


@pytest.fixture(autouse=True, scope="module")
def columnar_for_every_size() -> Iterator[None]:
    """The tests' replies are small: let the columnar path take them all (it only leaves replies
    under ``COLUMNAR_MIN_RECORDS`` records to the per-message path for speed)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arrow, "COLUMNAR_MIN_RECORDS", 0)
        yield


def per_message(data: bytes) -> PullBatch:
    messages = decode_message_exts(data)
    return PullBatch(messages_to_record_batch(messages), [m.queue_offset for m in messages],
                     {(m.topic, m.queue_id) for m in messages})


def assert_same(data: bytes) -> PullBatch:
    """Both decoders raise the same error (MalformedMessage; OverflowError for a timestamp beyond
    64-bit microseconds), or both give equal batches, offsets and queues."""
    try:
        want = per_message(data)
    except (MalformedMessage, OverflowError) as exc:
        with pytest.raises(type(exc)):
            pull_body_to_record_batch(data)
        return PullBatch(None, [], set())
    got = pull_body_to_record_batch(data)
    assert got.batch.equals(want.batch), (got.batch.to_pylist(), want.batch.to_pylist())
    assert list(got.queue_offsets) == list(want.queue_offsets)
    assert got.queues == want.queues
    return got


_names = st.text(st.characters(exclude_characters="\u0001\u0002", exclude_categories=["Cs"]),
                 min_size=1, max_size=8)
_values = st.text(st.characters(exclude_characters="\u0001\u0002", exclude_categories=["Cs"]),
                  max_size=8)
_hosts = st.sampled_from(["", "127.0.0.1:10911", "10.1.2.3:5", "[2001:db8::1]:9876"])


@st.composite
def messages(draw: st.DrawFn) -> MessageExt:
    sys_flag = draw(st.sampled_from([0, 0, COMPRESSED_FLAG]))
    return MessageExt(
        topic=draw(st.sampled_from(["orders", "ü-topic", "t" * 130])),
        body=draw(st.binary(max_size=40)),
        tags=draw(_values),
        keys=draw(st.sampled_from(["", "k1", "k1 k2", " lead", "a\u3000b", "x\x1cy"])),
        properties=draw(st.dictionaries(_names, _values, max_size=4)),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        queue_offset=draw(st.integers(0, 2**62)),
        born_timestamp_ms=draw(st.integers(0, 2**42)),
        store_timestamp_ms=draw(st.integers(0, 2**42)),
        born_host=draw(_hosts),
        store_host=draw(_hosts),
        sys_flag=sys_flag,
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(), max_size=6))
def test_random_messages_decode_as_per_message(msgs: list[MessageExt]) -> None:
    data = encode_message_exts(msgs, compress=True)
    got = assert_same(data)
    assert len(got.queue_offsets) == len(msgs)


def test_the_common_case_takes_the_bulk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """IPv4 and IPv6 hosts, v1 and v2 magic codes, uncompressed: no per-message decoding at all
    (the columnar path)."""
    msgs = [MessageExt(topic="orders", body=b"b%d" % i, keys=f"k{i} x", tags="t",
                       properties={"UNIQ_KEY": f"id{i}", "b": "2", "a": "1"}, queue_id=1,
                       queue_offset=7 + i, born_host="[2001:db8::1]:1" if i % 2 else "127.0.0.1:1",
                       store_host="127.0.0.1:2")
            for i in range(5)]
    data = encode_message_exts(msgs)
    want = per_message(data)

    def refuse(data: bytes) -> list[MessageExt]:
        raise AssertionError("fell back to the per-message decoder")

    monkeypatch.setattr(arrow, "decode_message_exts", refuse)
    got = pull_body_to_record_batch(data)
    assert got.batch.equals(want.batch)
    assert list(got.queue_offsets) == [7, 8, 9, 10, 11]
    assert got.queues == {("orders", 1)}
    assert got.batch.column("properties").to_pylist()[0] == [("UNIQ_KEY", "id0"), ("a", "1"),
                                                            ("b", "2")]
    assert got.batch.column("key").to_pylist() == [f"k{i}" for i in range(5)]


_HEAD = struct.Struct(">iIiiiqqiq8sq8siqi")


def record(props: bytes, body: bytes = b"body", topic: bytes = b"orders", offset: int = 0) -> bytes:
    """One v1 record with IPv4 hosts and a properties string given as bytes (anything)."""
    total = _HEAD.size + len(body) + 1 + len(topic) + 2 + len(props)
    head = _HEAD.pack(total, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, 3, 0, offset, 0, 0,
                      1_700_000_000_000, bytes(8), 1_700_000_000_001, bytes(8), 0, 0, len(body))
    return head + body + bytes([len(topic)]) + topic + struct.pack(">h", len(props)) + props


_pieces = st.sampled_from(["a", "b", "TAGS", "KEYS", "UNIQ_KEY", "__CRC32#", "\u0001", "\u0002", " ",
                           "é", "k1 k2", "\u3000", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_pieces, max_size=12).map("".join), min_size=1, max_size=4))
def test_lenient_properties_strings_read_as_rocketmq_reads_them(texts: list[str]) -> None:
    """Missing trailing separators, entries without a name, a value or a separator, repeated
    names, TAGS and KEYS anywhere: the same rows as the per-message decoder."""
    data = b"".join(record(t.encode(), offset=i) for i, t in enumerate(texts))
    assert_same(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=3), st.data())
def test_damaged_replies_fail_or_match_as_per_message(msgs: list[MessageExt], data: st.DataObject) -> None:
    body = bytearray(encode_message_exts(msgs))
    cut = data.draw(st.integers(0, len(body)))
    if data.draw(st.booleans()):
        del body[cut:]
    elif cut < len(body):
        body[cut] ^= data.draw(st.integers(1, 255))
    assert_same(bytes(body))


def test_empty_body_gives_an_empty_batch() -> None:
    got = assert_same(b"")
    assert got.batch.num_rows == 0


def test_rocketmq5_crc32_property_is_hidden() -> None:
    """RocketMQ 5's ``__CRC32#`` entry (``enabledAppendPropCRC``) at the end of the properties."""
    props = "UNIQ_KEY\u0001id\u0002KEYS\u0001k1 k2\u0002a\u00011\u0002__CRC32#\u00019876543210\u0002"
    got = assert_same(b"".join(record(props.encode(), offset=i) for i in range(2)))
    assert got.batch.column("properties").to_pylist() == [[("UNIQ_KEY", "id"), ("a", "1")]] * 2
    assert got.batch.column("key").to_pylist() == ["k1", "k1"]


def test_a_fresh_process_decodes_without_importing_pandas() -> None:
    """``pa.array``, ``pa.scalar`` and ``Array.to_numpy`` import pandas; the columnar path must not
    (a fresh Spark worker would pay about a second for it)."""
    import subprocess
    import sys

    msgs = [MessageExt(topic="t", body=b"x", keys="k a", tags="t", properties={"UNIQ_KEY": "i"})]
    code = ("import sys; from txmq.spark._arrow import pull_body_to_record_batch; "
            f"pull_body_to_record_batch({encode_message_exts(msgs * 3)!r}); "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_small_replies_take_the_per_message_path_and_large_ones_the_columnar(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrow, "COLUMNAR_MIN_RECORDS", 128)
    msgs = [MessageExt(topic="t", body=b"%d" % i, keys=f"k{i}", properties={"UNIQ_KEY": f"i{i}"},
                       queue_offset=i) for i in range(128)]
    small, large = encode_message_exts(msgs[:127]), encode_message_exts(msgs)
    assert_same(small)
    assert_same(large)
    calls: list[int] = []
    monkeypatch.setattr(arrow, "messages_to_record_batch",
                        lambda ms: calls.append(len(ms)) or messages_to_record_batch(ms))
    pull_body_to_record_batch(small)
    pull_body_to_record_batch(large)
    assert calls == [127]
