"""FileStore recovery: checkpoints, crashes, torn or corrupt tails, lost consume queue and index files."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from txmq.errors import CommitLogDamaged, CorruptRecord, StoreError
from txmq.store import FileStore, Record, StoreConfig, repair_store

SMALL = StoreConfig(mapped_file_size_commit_log=64 * 1024)
WARM = StoreConfig(warm_mapped_file_enable=True)
"""Zeros written ahead of the commit log's end (docs/storage.md)."""
SMALL_WARM = StoreConfig(mapped_file_size_commit_log=64 * 1024, warm_mapped_file_enable=True)


def rec(i: int, qid: int | None = None) -> Record:
    return Record(topic="t", queue_id=i % 2 if qid is None else qid, body=f"m{i}".encode() * 10,
                  keys=f"k{i}", properties={"UNIQ_KEY": f"ID{i}"}, store_timestamp_ms=1000 + i)


def fill(root: Path, n: int, config: StoreConfig | None = None, close: bool = True) -> list[int]:
    """n records, flushed; closed cleanly (checkpoint at the end) or left open (a crash)."""
    s = FileStore(root, config)
    res = s.append([rec(i) for i in range(n)])
    s.flush()
    if close:
        s.close()
    return [r.commit_log_offset for r in res]


def segments(root: Path) -> list[Path]:
    return sorted((root / "commitlog").iterdir())


def bodies(s: FileStore, qid: int) -> list[bytes]:
    return [m.body for m in s.read_queue("t", qid, 0, 10_000, 1 << 30)]


def test_reopen_after_close_trusts_the_checkpoint_and_scans_nothing(tmp_path: Path) -> None:
    fill(tmp_path, 10)
    s = FileStore(tmp_path)
    assert s.recovery.checkpoint_trusted and s.recovery.records == 0 and s.truncated_bytes == 0
    assert s.queue_bounds("t", 0) == (0, 5) and s.queue_bounds("t", 1) == (0, 5)
    assert bodies(s, 1)[-1] == b"m9" * 10
    assert [m.body for m in s.query_by_msg_id("ID7", 5)] == [b"m7" * 10]
    assert s.append([Record(topic="t", queue_id=0, body=b"new")])[0].queue_offset == 5
    s.close()


def test_a_crash_redispatches_only_what_the_checkpoint_did_not_cover(tmp_path: Path) -> None:
    s = FileStore(tmp_path)
    s.append([rec(i) for i in range(6)])
    s.flush()
    s.checkpoint()()
    s.append([rec(i) for i in range(6, 10)])
    s.flush()  # then the process dies: no close, no checkpoint
    s2 = FileStore(tmp_path)
    assert s2.recovery.checkpoint_trusted and s2.recovery.records == 4
    assert s2.recovery_offset == s2.recovery.scanned_from > 0
    assert bodies(s2, 0) == [f"m{i}".encode() * 10 for i in range(0, 10, 2)]
    assert [m.body for m in s2.query_by_key("t", "k9", 0, 2**62, 5)] == [b"m9" * 10]
    s2.close()


@pytest.mark.parametrize("close", [True, False], ids=["closed", "crashed"])
@pytest.mark.parametrize("damage", ["truncate", "flip", "zeros"])
def test_a_damaged_tail_is_cut_and_every_record_before_it_survives(tmp_path: Path, damage: str,
                                                                    close: bool) -> None:
    offsets = fill(tmp_path, 6, WARM, close=close)
    path = segments(tmp_path)[-1]
    # the log's end: a crashed store's file goes on with the zeros written ahead of it (a record
    # ends with its properties' separator \x02, never with a zero byte)
    size = len(path.read_bytes().rstrip(b"\0"))
    assert (path.stat().st_size > size) is not close  # zeros ahead unless closed
    with open(path, "r+b") as f:
        if damage == "truncate":
            f.truncate(size - 5)
        elif damage == "flip":
            f.seek(size - 30)
            b = f.read(1)
            f.seek(size - 30)
            f.write(bytes([b[0] ^ 0xFF]))
        else:
            f.seek(size)
            f.write(b"\0" * 4096)
    damaged_size = path.stat().st_size
    repaired = close and damage != "zeros"
    if repaired:  # the checkpoint covered the damaged record: acknowledged, so not a torn tail
        with pytest.raises(CommitLogDamaged, match="txmq store repair"):
            FileStore(tmp_path)
        assert repair_store(tmp_path)[0].cut_at == offsets[5]
    s = FileStore(tmp_path)
    survivors = 6 if damage == "zeros" else 5
    assert path.stat().st_size == (size if damage == "zeros" else offsets[5])
    # zeros after the last record are what the store writes ahead of its end (dropped, not a
    # torn tail); a cut counts every byte it removed, zeros written ahead included
    assert s.truncated_bytes == (0 if repaired or damage == "zeros" else
                                 damaged_size - offsets[5])
    assert bodies(s, 0) + bodies(s, 1) == [f"m{i}".encode() * 10 for i in range(0, 6, 2)] + [
        f"m{i}".encode() * 10 for i in range(1, survivors, 2)]
    nxt = s.append([Record(topic="t", queue_id=1, body=b"again")])[0]
    assert nxt.queue_offset == (3 if damage == "zeros" else 2)
    assert nxt.commit_log_offset == (size if damage == "zeros" else offsets[5])
    s.close()
    s = FileStore(tmp_path)
    assert s.recovery.checkpoint_trusted and bodies(s, 1)[-1] == b"again"
    s.close()


def test_a_torn_tail_after_a_segment_roll(tmp_path: Path) -> None:
    s = FileStore(tmp_path, SMALL)
    for i in range(1000):
        s.append([rec(i)])
    s.flush()
    s.checkpoint()()
    for i in range(1000, 1030):
        s.append([rec(i)])
    s.flush()
    segs = segments(tmp_path)
    assert len(segs) >= 3
    with open(segs[-1], "r+b") as f:  # (the log's end, not the file's: zeros are written ahead)
        f.truncate(s.write_offset - int(segs[-1].name) - 7)
    s2 = FileStore(tmp_path, SMALL)
    assert s2.recovery.truncated_bytes > 0
    assert bodies(s2, 0) == [f"m{i}".encode() * 10 for i in range(0, 1029, 2)]
    assert bodies(s2, 1) == [f"m{i}".encode() * 10 for i in range(1, 1029, 2)]
    s2.close()


def test_a_lost_segment_tail_before_a_newer_segment_cuts_the_log_at_the_gap(tmp_path: Path) -> None:
    s = FileStore(tmp_path, SMALL)
    for i in range(1000):
        s.append([rec(i)])
    s.flush()
    segs = segments(tmp_path)
    first_end = int(segs[1].name)
    with open(segs[0], "r+b") as f:  # a machine crash lost the first segment's last pages
        f.truncate(first_end - 100)
    s2 = FileStore(tmp_path, SMALL)
    assert s2.write_offset < first_end and len(segments(tmp_path)) == 1
    assert s2.recovery.reason and s2.truncated_bytes > 0
    n = len(bodies(s2, 0)) + len(bodies(s2, 1))
    assert 0 < n < 1000
    s2.close()


@pytest.mark.parametrize("what", ["one file", "queue dir", "all queues"])
def test_missing_consume_queue_files_are_rebuilt_from_the_commit_log(tmp_path: Path,
                                                                      what: str) -> None:
    cfg = StoreConfig(mapped_file_size_consume_queue=8)
    fill(tmp_path, 40, cfg)
    qdir = tmp_path / "consumequeue" / "t" / "1"
    if what == "one file":
        sorted(qdir.iterdir())[1].unlink()
    elif what == "queue dir":
        shutil.rmtree(qdir)
    else:
        shutil.rmtree(tmp_path / "consumequeue")
    s = FileStore(tmp_path, cfg)
    assert "t/1" in s.recovery.rebuilt_queues
    assert bodies(s, 1) == [f"m{i}".encode() * 10 for i in range(1, 40, 2)]
    assert bodies(s, 0) == [f"m{i}".encode() * 10 for i in range(0, 40, 2)]
    assert s.append([rec(40, qid=1)])[0].queue_offset == 20
    s.close()


def test_a_missing_index_file_or_checkpoint_is_rebuilt(tmp_path: Path) -> None:
    fill(tmp_path, 20)
    for p in (tmp_path / "index").iterdir():
        p.unlink()
    s = FileStore(tmp_path)
    assert s.recovery.index_rebuilt
    assert [m.body for m in s.query_by_key("t", "k3", 0, 2**62, 5)] == [b"m3" * 10]
    s.close()
    (tmp_path / "checkpoint").write_bytes(b"garbage")
    s = FileStore(tmp_path)
    assert s.recovery.checkpoint_offset == -1 and s.recovery.records == 20
    assert bodies(s, 0)[-1] == b"m18" * 10
    assert [m.body for m in s.query_by_msg_id("ID11", 5)] == [b"m11" * 10]
    s.close()


def test_corruption_in_the_middle_is_detected_on_read(tmp_path: Path) -> None:
    offsets = fill(tmp_path, 3)
    s = FileStore(tmp_path)
    with open(segments(tmp_path)[0], "r+b") as f:
        f.seek(offsets[1] + 120)
        f.write(b"\xff\xff")
    with pytest.raises(CorruptRecord):
        s.read_at(offsets[1])
    with pytest.raises(CorruptRecord):
        s.read_queue("t", 1, 0, 10, 1 << 20)
    assert s.read_at(offsets[2]).body == b"m2" * 10
    s.close()


def test_retention_survives_a_reopen(tmp_path: Path) -> None:
    s = FileStore(tmp_path, SMALL)
    for _i in range(300):
        s.append([Record(topic="t", queue_id=0, body=b"x" * 1000, store_timestamp_ms=0)])
    s.flush()
    s.checkpoint()()
    report = s.clean(10**12, delete_hour=True)
    assert report.deleted_segments
    lo = s.queue_bounds("t", 0)[0]
    s.flush()  # crash before the next checkpoint: the checkpoint still lists old queue minimums
    s2 = FileStore(tmp_path, SMALL)
    assert s2.min_offset == report.min_offset and s2.queue_bounds("t", 0) == (lo, 300)
    assert s2.read_queue("t", 0, lo, 1, 1 << 20)[0].queue_offset == lo
    assert [r.queue_offset for _, r in s2.iter_records(topics=("t",))][:1] == [lo]
    s2.close()


def test_a_log_of_another_format_is_refused_not_truncated(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    old = tmp_path / "commitlog" / f"{0:020d}"
    old.write_bytes(b"\x00\x00\x00\x10\x12\x34\x56\x78" + b"x" * 16)
    with pytest.raises(StoreError, match="does not hold a txmq commit log"):
        FileStore(tmp_path)
    assert old.stat().st_size == 24


def test_zeros_are_written_ahead_of_the_end_and_a_crash_recovers_exactly_the_records(
        tmp_path: Path) -> None:
    """The last segment keeps zeros written ahead of its end (appends then overwrite allocated
    blocks of a file whose size does not change); after a crash recovery drops them without
    calling them a torn tail, and a clean close leaves the file at the log's end."""
    offsets = fill(tmp_path, 6, WARM, close=False)
    path = segments(tmp_path)[-1]
    end = len(path.read_bytes().rstrip(b"\0"))
    assert path.stat().st_size - end >= 1 << 20  # (PREFILL_LOW_BYTES, 2 MiB, at least)
    s = FileStore(tmp_path, WARM)
    assert s.write_offset == end and s.truncated_bytes == 0 and path.stat().st_size == end
    assert bodies(s, 0) + bodies(s, 1) == [f"m{i}".encode() * 10 for i in (0, 2, 4, 1, 3, 5)]
    nxt = s.append([Record(topic="t", queue_id=0, body=b"after")])[0]
    assert nxt.commit_log_offset == end and offsets[-1] < end
    s.flush()
    s.close()
    assert path.stat().st_size == nxt.commit_log_offset + nxt.size
    s = FileStore(tmp_path)
    assert s.recovery.checkpoint_trusted and bodies(s, 0)[-1] == b"after"
    s.close()


def test_a_rolled_segment_is_cut_to_its_records_before_the_next_one_starts(tmp_path: Path) -> None:
    s = FileStore(tmp_path, SMALL_WARM)
    for i in range(1000):
        s.append([rec(i)])
    s.flush()
    segs = segments(tmp_path)
    assert len(segs) >= 3
    for a, b in itertools.pairwise(segs):  # contiguous files: no zeros inside the log
        assert int(a.name) + a.stat().st_size == int(b.name)
    assert segs[-1].stat().st_size > s.write_offset - int(segs[-1].name)  # zeros ahead
    s2 = FileStore(tmp_path, SMALL_WARM)  # (a crash: s was never closed)
    assert s2.write_offset == s.write_offset and s2.truncated_bytes == 0
    assert len(bodies(s2, 0)) == 500
    s2.close()


def test_zeros_at_a_record_boundary_of_an_older_segment_are_a_cut_not_the_end(
        tmp_path: Path) -> None:
    """Only the last segment's zeros are ones written ahead: zeros where a record of an older
    segment starts are a lost tail there, cut and reported with everything after it."""
    s = FileStore(tmp_path, SMALL)
    offsets = [s.append([rec(i)])[0].commit_log_offset for i in range(1000)]
    s.flush()  # then a crash
    segs = segments(tmp_path)
    second = int(segs[1].name)
    last_of_first = max(o for o in offsets if o < second)
    with open(segs[0], "r+b") as f:  # the first segment's last record reads as zeros
        f.seek(last_of_first)
        f.write(b"\0" * (second - last_of_first))
    s2 = FileStore(tmp_path, SMALL)
    assert s2.recovery.truncated_at == last_of_first and s2.truncated_bytes > second - last_of_first
    assert s2.write_offset == last_of_first
    s2.close()


def test_by_default_no_zeros_are_written_ahead(tmp_path: Path) -> None:
    offsets = fill(tmp_path, 6, close=False)
    path = segments(tmp_path)[-1]
    assert path.read_bytes()[-1:] == b"\x02" and path.stat().st_size > offsets[-1]

