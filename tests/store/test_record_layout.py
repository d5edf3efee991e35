"""The commit log holds RocketMQ MessageExt records (enabledAppendPropCRC): the layout, every kind of
damage to a record, and recovery of a log damaged each way."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import CommitLogDamaged, CorruptRecord
from txmq.protocol import (
    CRC32_RESERVED_LEN,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    decode_message_exts,
)
from txmq.store import FileStore, MemoryStore, Record, check_store, repair_store, tag_hash
from txmq.store import _raw_read as raw_read
from txmq.store._codec import CQ_ENTRY
from txmq.store.codec import check_record, decode_record, encode_record, place_record


def rec(i: int, **kw: object) -> Record:
    base: dict[str, object] = dict(topic="t", queue_id=i % 2, body=f"m{i}".encode() * 10,
                                   tags="even" if i % 2 == 0 else "odd", keys=f"k{i} shared",
                                   properties={"UNIQ_KEY": f"ID{i}", "x": "ü"},
                                   store_timestamp_ms=1000 + i, born_timestamp_ms=900 + i,
                                   born_host="10.0.0.2:4567", flag=7)
    base.update(kw)
    return Record(**base)  # type: ignore[arg-type]


def placed(r: Record, at: int = 4096, host: str = "10.0.0.1:10911") -> bytes:
    buf = encode_record(r, host)
    place_record(buf, 0, len(buf), at)
    return bytes(buf)


def test_a_record_is_a_messageext_record_with_the_crc_property_last() -> None:
    data = placed(rec(3, queue_offset=5))
    total, magic, body_crc, qid, flag, qo, phys, sys_flag = struct.unpack_from(">iIiiiqqi", data)
    assert (total, magic, qid, flag, qo, phys, sys_flag) == (len(data), MESSAGE_MAGIC_CODE, 1, 7, 5,
                                                             4096, 0)
    assert body_crc == zlib.crc32(b"m3" * 10) & 0x7FFFFFFF
    tail = data[-CRC32_RESERVED_LEN:]
    crc = zlib.crc32(data[:-CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    # RocketMQ MessageDecoder.createCrc32: ten digits, least significant first
    assert tail == b"__CRC32#\x01" + str(crc).zfill(10)[::-1].encode() + b"\x02"
    [m] = decode_message_exts(data)  # what a consumer reads: the SDK hides __CRC32#
    assert m.properties == {"UNIQ_KEY": "ID3", "x": "ü"} and m.tags == "odd"
    assert m.keys == "k3 shared" and m.store_host == "10.0.0.1:10911"
    assert m.born_host == "10.0.0.2:4567" and m.commit_log_offset == 4096
    got, size = decode_record(data, 0, 4096)
    assert size == len(data) and got.properties == {"UNIQ_KEY": "ID3", "x": "ü"}


def test_transaction_types_and_the_prepared_offset_are_stored() -> None:
    half = placed(rec(1, properties={"TRAN_MSG": "true", "REAL_TOPIC": "t", "REAL_QID": "1"}))
    commit = placed(rec(1, properties={"TRAN_PREPARED_QUEUE_OFFSET": "0"},
                        prepared_transaction_offset=777))
    # RocketMQ TransactionalMessageBridge.parseHalfMessageInner stores a half as NOT_TYPE
    assert decode_message_exts(half)[0].sys_flag & 0xC == TRANSACTION_NOT_TYPE
    m = decode_message_exts(commit)[0]
    assert m.sys_flag & 0xC == TRANSACTION_COMMIT_TYPE and m.prepared_transaction_offset == 777


def test_a_long_topic_takes_the_v2_magic_and_a_sent_crc_property_is_replaced() -> None:
    data = placed(rec(0, topic="T" * 200, properties={"__CRC32#": "bogus"}))
    assert struct.unpack_from(">I", data, 4)[0] == MESSAGE_MAGIC_CODE_V2
    assert data.count(b"__CRC32#") == 1 and check_record(data, 0, 4096) == len(data)


def _set(data: bytearray, at: int, fmt: str, value: int) -> None:
    struct.pack_into(fmt, data, at, value)


DAMAGE: dict[str, tuple[Callable[[bytearray], bytes], str]] = {
    "size too big": (lambda d: (_set(d, 0, ">i", 1 << 30), bytes(d))[1], "bad or torn size"),
    "size too small": (lambda d: (_set(d, 0, ">i", 40), bytes(d))[1], "bad or torn size"),
    "negative size": (lambda d: (_set(d, 0, ">i", -5), bytes(d))[1], "bad or torn size"),
    "bad magic": (lambda d: (_set(d, 4, ">I", 0xCBD43194), bytes(d))[1], "bad magic"),
    "bad crc": (lambda d: (d.__setitem__(100, d[100] ^ 1), bytes(d))[1], "CRC32 mismatch"),
    "bad crc digits": (lambda d: (d.__setitem__(len(d) - 2, ord("x")), bytes(d))[1], "no __CRC32#"),
    "no crc property": (lambda d: (d.__setitem__(slice(-20, -12), b"__CRC33#"), bytes(d))[1],
                        "no __CRC32#"),
    "torn tail": (lambda d: bytes(d[:-7]), "bad or torn size"),
    "short": (lambda d: bytes(d[:6]), "short record"),
    "wrong physical offset": (lambda d: (_set(d, 28, ">q", 8192), place_record(d, 0, len(d), 8192),
                                         bytes(d))[2], "says it is at 8192"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_every_kind_of_damage_is_caught_on_read(kind: str) -> None:
    damage, message = DAMAGE[kind]
    data = damage(bytearray(placed(rec(2))))
    with pytest.raises(CorruptRecord, match=message):
        decode_record(data, 0, 4096)


def _damage_record(root: Path, offset: int, size: int, kind: str) -> None:
    seg = sorted((root / "commitlog").iterdir())[-1]
    base = int(seg.name)
    raw = bytearray(seg.read_bytes())
    start = offset - base
    damaged = DAMAGE[kind][0](bytearray(raw[start : start + size]))
    if kind == "wrong physical offset":  # keep it where it is, claiming another place
        damaged = bytearray(damaged)
        _set(damaged, 28, ">q", offset + 1)
        place_record(damaged, 0, len(damaged), offset + 1)
    seg.write_bytes(bytes(raw[:start]) + bytes(damaged) + bytes(raw[start + size :]))


@pytest.mark.parametrize("kind", [k for k in DAMAGE if k != "short"])
def test_a_damaged_last_record_is_a_torn_tail_cut_at_recovery(tmp_path: Path, kind: str) -> None:
    s = FileStore(tmp_path)
    res = s.append([rec(i) for i in range(5)])
    s.flush()  # then a crash: no checkpoint covers the last record
    s.checkpoint()
    last = res[-1]
    _damage_record(tmp_path, last.commit_log_offset, last.size, kind)
    (tmp_path / "checkpoint").unlink(missing_ok=True)
    s2 = FileStore(tmp_path)
    assert s2.write_offset == last.commit_log_offset and s2.truncated_bytes > 0
    assert [m.body for m in s2.read_queue("t", 0, 0, 10, 1 << 20)] == [b"m0" * 10, b"m2" * 10]
    assert s2.queue_bounds("t", 0) == (0, 2) and s2.queue_bounds("t", 1) == (0, 2)
    s2.close()


@pytest.mark.parametrize("kind", ["bad crc", "bad magic", "wrong physical offset", "size too big"])
def test_damage_under_the_checkpoint_is_found_stops_the_start_and_repair_cuts_it(
        tmp_path: Path, kind: str) -> None:
    s = FileStore(tmp_path)
    res = s.append([rec(i) for i in range(5)])
    s.close()
    _damage_record(tmp_path, res[2].commit_log_offset, res[2].size, kind)
    found = check_store(tmp_path)
    assert not found.ok and found.damaged[0].start == res[2].commit_log_offset
    s = FileStore(tmp_path)  # the checkpoint's last record checks out: found on read
    with pytest.raises(CorruptRecord):
        s.read_at(res[2].commit_log_offset)
    s.close()
    _damage_record(tmp_path, res[4].commit_log_offset, res[4].size, kind)
    with pytest.raises(CommitLogDamaged, match="txmq store repair"):
        FileStore(tmp_path)
    repair_store(tmp_path)
    s2 = FileStore(tmp_path)
    assert s2.write_offset == res[2].commit_log_offset
    s2.close()


_CQ_RUNS = raw_read._compiled


@pytest.fixture(scope="module", params=["compiled", "pure"])
def walk(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a raw-read test with the C walk over consume queue entries (``txmq.store._ccqruns``)
    and with the pure-Python loop."""
    if request.param == "compiled" and _CQ_RUNS is None:
        pytest.skip("the C extension is not built here (TXMQ_PURE_PYTHON=1 or no compiler); "
                    "test_the_consume_queue_walk_is_in_the_installed_wheel fails in CI if so")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(raw_read, "_compiled", _CQ_RUNS if request.param == "compiled" else None)
        yield str(request.param)


def test_memory_and_file_stores_lay_out_the_same_bytes(tmp_path: Path, walk: str) -> None:
    records = [rec(i) for i in range(6)]
    f, m = FileStore(tmp_path), MemoryStore()
    for s in (f, m):
        s.set_store_host("10.0.0.1:10911")
        s.append([msg.__copy__() for msg in records])
        s.flush()
    for qid in (0, 1):
        a = f.read_queue_raw("t", qid, 0, 10, 1 << 20)
        b = m.read_queue_raw("t", qid, 0, 10, 1 << 20)
        assert a == b and a.count == 3 and a.next_offset == 3
        assert [x.body for x in decode_message_exts(a.body)] == [
            r.body for r in records if r.queue_id == qid]
    f.close()


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_raw_read_filters_by_tag_hash_and_bounds_bytes(tmp_path: Path, kind: str, walk: str) -> None:
    s = FileStore(tmp_path) if kind == "file" else MemoryStore()
    res = s.append([rec(i, queue_id=0, tags="a" if i % 3 == 0 else "b") for i in range(9)])
    s.flush()
    got = s.read_queue_raw("t", 0, 0, 100, 1 << 20, frozenset({tag_hash("a")}))
    assert got.count == 3 and got.next_offset == 9
    assert [m.queue_offset for m in decode_message_exts(got.body)] == [0, 3, 6]
    one = s.read_queue_raw("t", 0, 1, 100, 1)  # at least one record, whatever the byte bound
    assert one.count == 1 and one.next_offset == 2 and len(one.body) == res[1].size
    none = s.read_queue_raw("t", 0, 9, 100, 1 << 20)
    assert none.count == 0 and none.next_offset == 9 and none.body == b""
    s.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["a", "b"]), st.integers(0, 300)),
                min_size=1, max_size=30),
       st.integers(1, 4000), st.booleans(), st.integers(0, 5))
def test_raw_reads_of_interleaved_queues_match_the_memory_store(
        tmp_path_factory: pytest.TempPathFactory, walk: str, spec: list[tuple[int, str, int]],
        max_bytes: int, only_a: bool, start: int) -> None:
    """Records of three queues interleaved in the log (the file store slices runs of adjacent
    kept records at once): the same bytes, counts and next offsets as the memory store, with a
    tag filter and a byte bound."""
    records = [rec(i, queue_id=q, tags=t, body=b"x" * n) for i, (q, t, n) in enumerate(spec)]
    f, m = FileStore(tmp_path_factory.mktemp("raw")), MemoryStore()
    for s in (f, m):
        s.set_store_host("10.0.0.1:10911")
        s.append([r.__copy__() for r in records])
        s.flush()
    hashes = frozenset({tag_hash("a")}) if only_a else None
    for qid in range(3):
        assert f.read_queue_raw("t", qid, start, 20, max_bytes, hashes) == m.read_queue_raw(
            "t", qid, start, 20, max_bytes, hashes)
    f.close()


def test_pulls_keep_only_a_bounded_number_of_segments_mapped(tmp_path: Path, walk: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from txmq import limits
    from txmq.store import StoreConfig

    monkeypatch.setattr(limits, "COMMIT_LOG_MAPS_MAX", 2)
    s = FileStore(tmp_path, StoreConfig(mapped_file_size_commit_log=64 * 1024))
    for i in range(5):  # five segments of one 40 KiB record each
        s.append([rec(i, queue_id=0, body=bytes([65 + i]) * 40_000)])
    s.flush()
    assert len(s._log.segments) == 5
    for i in range(5):
        got = s.read_queue_raw("t", 0, i, 1, 1 << 20)
        assert decode_message_exts(got.body)[0].body == bytes([65 + i]) * 40_000
    assert sum(seg.mm is not None for seg in s._log.segments) == 2
    s.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 10, 900, 9000, 30_000])),
                min_size=1, max_size=40),
       st.integers(1, 90_000), st.integers(0, 5))
def test_an_unfiltered_raw_read_matches_a_filter_that_keeps_everything(
        tmp_path_factory: pytest.TempPathFactory, walk: str, spec: list[tuple[int, int]],
        max_bytes: int, start: int) -> None:
    """A raw read without a tag filter (cut into runs of adjacent records by whole-reply calls)
    gives the bytes, count and next offset of the record-by-record loop, which a filter keeping
    every tag forces: queues interleaved, records across 64 KiB segments, a byte bound."""
    from txmq.store import StoreConfig

    s = FileStore(tmp_path_factory.mktemp("unfiltered"), StoreConfig(mapped_file_size_commit_log=64 * 1024))
    s.append([rec(i, queue_id=q, tags="a", body=b"x" * n) for i, (q, n) in enumerate(spec)])
    s.flush()
    every = frozenset({tag_hash("a")})
    for qid in range(3):
        got = s.read_queue_raw("t", qid, start, 30, max_bytes)
        assert got == s.read_queue_raw("t", qid, start, 30, max_bytes, every)
        assert [m.body for m in decode_message_exts(got.body)] == [
            b"x" * n for q, n in spec if q == qid][start : start + got.count]
    s.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 1, 50, 400]), st.integers(0, 3)),
                max_size=60),
       st.integers(0, 3000), st.sampled_from([None, set(), {1}, {0, 2}]))
def test_the_c_walk_over_consume_queue_entries_matches_the_loop(
        layout: list[tuple[int, int, int]], max_bytes: int, hashes: set[int] | None) -> None:
    """``_ccqruns.runs`` over packed entries (gaps of 0-3 bytes between records, holes of size 0,
    tag hashes 0-3) keeps the records, stops and forms the runs the pure-Python model does."""
    if _CQ_RUNS is None:
        pytest.skip("the C extension is not built here (TXMQ_PURE_PYTHON=1 or no compiler)")
    entries, clo = [], 1000
    for gap, size, h in layout:
        clo += gap
        entries.append((clo, size, h))
        clo += size
    count = total = 0
    looked = len(entries)
    runs: list[list[int]] = []
    for k, (c, size, h) in enumerate(entries):  # the model: read_raw's loop, one span
        if not size or (hashes is not None and h not in hashes):
            continue
        if count and total + size > max_bytes:
            looked = k
            break
        if runs and runs[-1][1] == c:
            runs[-1][1] = c + size
        else:
            runs.append([c, c + size])
        total, count = total + size, count + 1
    packed = b"".join(CQ_ENTRY.pack(*e) for e in entries)
    assert _CQ_RUNS.runs(packed, max_bytes, hashes) == (count, looked, [tuple(r) for r in runs])


def test_the_c_walk_refuses_what_is_not_entries() -> None:
    if _CQ_RUNS is None:
        pytest.skip("the C extension is not built here (TXMQ_PURE_PYTHON=1 or no compiler)")
    with pytest.raises(ValueError, match="not whole consume queue entries"):
        _CQ_RUNS.runs(b"x" * 21, 100, None)
    with pytest.raises(TypeError, match="tag_hashes"):
        _CQ_RUNS.runs(b"", 100, [1])
    assert _CQ_RUNS.runs(b"", 100, None) == (0, 0, [])


def test_the_consume_queue_walk_is_in_the_installed_wheel() -> None:
    """CI (``.ci/test``: ``TXMQ_REQUIRE_INSTALLED=1``) tests the wheel as installed: the broker's
    compiled walk must be there, so the suite cannot silently test the pure path alone."""
    import os

    if os.environ.get("TXMQ_REQUIRE_INSTALLED") != "1":
        pytest.skip("only where the installed wheel is tested (TXMQ_REQUIRE_INSTALLED=1)")
    assert _CQ_RUNS is not None, "txmq.store._ccqruns is missing from the installed wheel"
    assert "site-packages" in str(_CQ_RUNS.__file__)
