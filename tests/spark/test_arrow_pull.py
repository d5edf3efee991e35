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

_COMPILED = arrow._compiled


@pytest.fixture(autouse=True, scope="module", params=["compiled", "pure"])
def decoder(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs twice: with the C extension (``txmq.spark._ccolumns``) and with the pure
    Python (numpy) path. The tests' replies are small: the numpy path takes them all too (it only
    leaves replies under ``COLUMNAR_MIN_RECORDS`` records to the per-message path for speed)."""
    if request.param == "compiled" and _COMPILED is None:
        pytest.skip("the C extension is not built here (TXMQ_PURE_PYTHON=1 or no compiler); "
                    "test_the_extension_is_in_the_installed_wheel fails in CI if so")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arrow, "COLUMNAR_MIN_RECORDS", 0)
        mp.setattr(arrow, "_compiled", _COMPILED if request.param == "compiled" else None)
        yield request.param


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
        monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    """The numpy path only; the compiled one takes every reply (the next test)."""
    if decoder == "compiled":
        return
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


def test_the_compiled_decoder_takes_replies_of_any_size(monkeypatch: pytest.MonkeyPatch,
                                                        decoder: str) -> None:
    if decoder == "pure":
        return
    msgs = [MessageExt(topic="t", body=b"%d" % i, keys=f"k{i}", properties={"UNIQ_KEY": f"i{i}"},
                       queue_offset=i) for i in range(3)]
    monkeypatch.setattr(arrow, "COLUMNAR_MIN_RECORDS", 128)
    monkeypatch.setattr(arrow, "decode_message_exts", None)  # would fail if called
    got = pull_body_to_record_batch(encode_message_exts(msgs))
    assert got.batch.column("message_id").to_pylist() == ["i0", "i1", "i2"]
    assert list(got.queue_offsets) == [0, 1, 2]


def test_the_extension_is_in_the_installed_wheel() -> None:
    """CI (``.ci/test``: ``TXMQ_REQUIRE_INSTALLED=1``) tests the wheel as installed: its compiled
    decoder must be there, so the suite cannot silently test the pure path alone."""
    import os

    if os.environ.get("TXMQ_REQUIRE_INSTALLED") != "1":
        pytest.skip("only where the installed wheel is tested (TXMQ_REQUIRE_INSTALLED=1)")
    assert _COMPILED is not None, "txmq.spark._ccolumns is missing from the installed wheel"
    assert "site-packages" in str(_COMPILED.__file__)


# --- the compiled decoder against the pure one, and against hostile bytes ------------------------

def _both(data: bytes) -> tuple[PullBatch | None, PullBatch | None]:
    """The batch of each path, or None where it raised MalformedMessage / OverflowError."""
    out: list[PullBatch | None] = []
    for path in (_COMPILED, None):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(arrow, "_compiled", path)
            try:
                out.append(pull_body_to_record_batch(data))
            except (MalformedMessage, OverflowError):
                out.append(None)
    return out[0], out[1]


_many_keys = st.lists(st.sampled_from(["k1", "k2", "é", "　", " ", "\t", "x\x1fy", "z"]),
                      max_size=5).map(" ".join)


@st.composite
def varied(draw: st.DrawFn) -> MessageExt:
    """Records of every shape the columnar paths take: IPv6 hosts, keys of several words, empty
    bodies, empty / duplicate-prone / unicode properties, v1 and v2 magic (topics over 127 bytes)."""
    return MessageExt(
        topic=draw(st.sampled_from(["orders", "ü-topic", "t" * 128, "%RETRY%g"])),
        body=draw(st.sampled_from([b"", b"x", b"\x00" * 300])),
        tags=draw(st.sampled_from(["", "a", "ü"])),
        keys=draw(_many_keys),
        properties=draw(st.dictionaries(st.sampled_from(["UNIQ_KEY", "a", "b", "é", "ab", "A", "€"]),
                                        _values, max_size=5)),
        queue_id=draw(st.integers(0, 3)), queue_offset=draw(st.integers(-(2**63), 2**63 - 1)),
        born_timestamp_ms=draw(st.integers(-(2**53), 2**53)),
        store_timestamp_ms=draw(st.integers(-(2**53), 2**53)),
        born_host=draw(_hosts), store_host=draw(_hosts))


@pytest.mark.skipif(_COMPILED is None, reason="the C extension is not built here")
@settings(max_examples=300, deadline=None)
@given(st.lists(varied(), min_size=1, max_size=20))
def test_compiled_and_pure_paths_give_equal_batches(msgs: list[MessageExt]) -> None:
    compiled, pure = _both(encode_message_exts(msgs))
    assert compiled is not None and pure is not None
    assert compiled.batch.equals(pure.batch), (compiled.batch.to_pylist(), pure.batch.to_pylist())
    assert list(compiled.queue_offsets) == list(pure.queue_offsets)
    assert compiled.queues == pure.queues


@pytest.mark.skipif(_COMPILED is None, reason="the C extension is not built here")
@settings(max_examples=500, deadline=None)
@given(st.lists(varied(), min_size=1, max_size=4), st.data())
def test_compiled_decoder_survives_mutated_replies(msgs: list[MessageExt], data: st.DataObject) -> None:
    """Bytes flipped, inserted, deleted, records cut: ``decode_reply`` returns None or columns
    (never crashes, never reads outside the buffer), and the outcome is the pure path's."""
    body = bytearray(encode_message_exts(msgs))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body)))
        edit = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if edit == "flip" and at < len(body):
            body[at] ^= data.draw(st.integers(1, 255))
        elif edit == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif edit == "delete":
            del body[at : at + data.draw(st.integers(1, 8))]
        else:
            del body[at:]
    assert _COMPILED is not None
    _COMPILED.decode_reply(memoryview(body))  # any buffer
    compiled, pure = _both(bytes(body))
    assert (compiled is None) == (pure is None)
    if compiled is not None and pure is not None:
        assert compiled.batch.equals(pure.batch)


@pytest.mark.skipif(_COMPILED is None, reason="the C extension is not built here")
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_compiled_decoder_refuses_random_bytes(data: bytes) -> None:
    assert _COMPILED is not None
    assert _COMPILED.decode_reply(data) is None or data == b""


@pytest.mark.skipif(_COMPILED is None, reason="the C extension is not built here")
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=12), st.binary(max_size=12))
def test_compiled_utf8_check_is_pythons(topic: bytes, props: bytes) -> None:
    """Random bytes as the topic and the properties: taken exactly when Python decodes both."""
    assert _COMPILED is not None
    try:
        topic.decode(), props.decode()
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert (_COMPILED.decode_reply(record(props, topic=topic)) is not None) == valid


@pytest.mark.parametrize(("offsets", "consecutive"), [([5, 6, 7], True), ([5, 7, 8], False),
                                                      ([9], True), ([3, 2], False)])
def test_consecutive_queue_offsets(offsets: list[int], consecutive: bool) -> None:
    msgs = [MessageExt(topic="t", body=b"b", queue_offset=o) for o in offsets]
    got = pull_body_to_record_batch(encode_message_exts(msgs))
    assert list(got.queue_offsets) == offsets
    assert got.consecutive() is consecutive
