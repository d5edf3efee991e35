"""The epoch file (RocketMQ EpochFileCache semantics): rules, consistent point, torn files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.errors import StoreError
from txmq.store import EpochCache, EpochEntry, EpochFile
from txmq.store._epoch import OFFSET_MAX, decode_epochs, encode_epochs


def test_append_needs_strictly_larger_epoch_and_offset() -> None:
    c = EpochCache()
    assert c.append(1, 0)
    assert not c.append(1, 100)  # same epoch
    assert not c.append(2, 0)  # same start offset
    assert not c.append(0, 200)
    assert c.append(3, 100)
    assert c.entries() == [EpochEntry(1, 0, 100), EpochEntry(3, 100, OFFSET_MAX)]
    assert c.last_epoch() == 3 and c.find_by_offset(99) == EpochEntry(1, 0, 100)
    assert c.next_entry(1) == EpochEntry(3, 100, OFFSET_MAX) and c.next_entry(3) is None


def test_consistent_point_is_the_end_of_the_newest_shared_epoch() -> None:
    master = EpochCache([(1, 0), (2, 100), (4, 300)])
    slave = EpochCache([(1, 0), (2, 100), (3, 250)])  # epoch 3 was a master the group lost
    assert slave.find_consistent_point(master) == 250  # epoch 2: min(250, 300)
    assert master.find_consistent_point(master, end=420) == 420
    assert EpochCache([(5, 0)]).find_consistent_point(master) == -1
    diverged = EpochCache([(1, 0), (2, 120)])  # same epoch, other start: not shared
    assert diverged.find_consistent_point(master) == 100


def test_truncations() -> None:
    c = EpochCache([(1, 0), (2, 100), (3, 200)])
    c.truncate_suffix_by_offset(200)
    assert c.pairs() == [(1, 0), (2, 100)]
    c.truncate_suffix_by_epoch(2)
    assert c.pairs() == [(1, 0)]
    c = EpochCache([(1, 0), (2, 100), (3, 200)])
    c.truncate_prefix_by_offset(150)
    assert c.pairs() == [(2, 150), (3, 200)]
    c.truncate_prefix_by_offset(200)
    assert c.pairs() == [(3, 200)]


def test_file_format_is_rocketmq_text_plus_a_crc_line(tmp_path: Path) -> None:
    f = EpochFile(tmp_path)
    assert f.last_epoch() == 0 and not f.path.exists()
    assert f.append(1, 0) and f.append(2, 4096) and not f.append(2, 8192)
    lines = f.path.read_text().splitlines()
    assert lines[:3] == ["2", "1-0", "2-4096"] and lines[3].startswith("crc32:")
    assert f.bak.read_bytes() == f.path.read_bytes()
    assert EpochFile(tmp_path).cache.pairs() == [(1, 0), (2, 4096)]


@pytest.mark.parametrize("damage", [
    lambda b: b[: len(b) // 2],  # torn
    lambda b: b.replace(b"2-4096", b"2-4097"),  # bit flip under the CRC
    lambda b: b"",
])
def test_a_torn_or_corrupt_file_falls_back_to_bak(tmp_path: Path, damage: object) -> None:
    f = EpochFile(tmp_path)
    f.append(1, 0)
    f.append(2, 4096)
    f.path.write_bytes(damage(f.path.read_bytes()))  # type: ignore[operator]
    assert EpochFile(tmp_path).cache.pairs() == [(1, 0), (2, 4096)]


def test_both_copies_corrupt_is_an_error_not_an_empty_file(tmp_path: Path) -> None:
    f = EpochFile(tmp_path)
    f.append(1, 0)
    f.path.write_bytes(b"1\n1-0\ncrc32:00000000\n")
    f.bak.write_bytes(b"garbage")
    with pytest.raises(StoreError, match=r"no good \.bak"):
        EpochFile(tmp_path)


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    f = EpochFile(tmp_path)
    f.append(1, 0)
    calls: list[Path] = []

    def failing(path: Path, data: bytes) -> None:
        calls.append(path)
        raise OSError("disk gone")

    g = EpochFile(tmp_path, write=failing)
    with pytest.raises(OSError):
        g.append(2, 100)
    assert calls == [g.path]
    assert EpochFile(tmp_path).cache.pairs() == [(1, 0)]


_pairs = st.lists(st.tuples(st.integers(1, 50), st.integers(0, 10_000)), max_size=12).map(
    lambda xs: sorted({e: s for e, s in xs}.items()))


@given(_pairs)
def test_encode_decode_round_trip(pairs: list[tuple[int, int]]) -> None:
    c = EpochCache()
    for e, s in pairs:
        c.append(e, s)
    assert decode_epochs(encode_epochs(c)).pairs() == c.pairs()


@given(_pairs, st.binary(max_size=64))
def test_decode_garbage_is_a_store_error(pairs: list[tuple[int, int]], junk: bytes) -> None:
    c = EpochCache()
    for e, s in pairs:
        c.append(e, s)
    try:
        got = decode_epochs(encode_epochs(c)[:-3] + junk)
    except StoreError:
        return
    assert got.pairs() == c.pairs()  # only when the junk happened to restore the bytes


@given(_pairs, _pairs, st.integers(0, 20_000))
def test_consistent_point_is_symmetric_and_below_both_ends(
        a: list[tuple[int, int]], b: list[tuple[int, int]], cut: int) -> None:
    x, y = EpochCache(), EpochCache()
    for e, s in a:
        x.append(e, s)
    for e, s in b:
        y.append(e, s)
    p = x.find_consistent_point(y)
    assert p == y.find_consistent_point(x)
    if p >= 0:  # both logs wrote [.., p) in the same epochs
        ex, ey = x.find_by_offset(p - 1) if p else None, y.find_by_offset(p - 1) if p else None
        assert ex == ey or (ex is not None and ey is not None and ex.epoch == ey.epoch)
    x.truncate_suffix_by_offset(cut)
    assert all(s < cut for _, s in x.pairs())
