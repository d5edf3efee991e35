"""FileStore recovery: reopen, torn tails, corrupt records, zero-filled tails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txmq.errors import CorruptRecord
from txmq.store import FileStore, Record


def _fill(root: Path, n: int) -> list[int]:
    s = FileStore(root)
    res = s.append([Record(topic="t", queue_id=i % 2, body=f"m{i}".encode() * 10) for i in range(n)])
    s.close()
    return [r.commit_log_offset for r in res]


def _log(root: Path) -> Path:
    return root / "commitlog" / f"{0:020d}"


def test_reopen_recovers_every_record_and_queue(tmp_path: Path) -> None:
    _fill(tmp_path, 10)
    s = FileStore(tmp_path)
    assert s.recovered_records == 10 and s.truncated_bytes == 0
    assert s.queue_bounds("t", 0) == (0, 5) and s.queue_bounds("t", 1) == (0, 5)
    assert [m.body for m in s.read_queue("t", 1, 0, 10, 1 << 20)][-1] == b"m9" * 10
    r = s.append([Record(topic="t", queue_id=0, body=b"new")])[0]
    assert r.queue_offset == 5
    s.close()


@pytest.mark.parametrize("damage", ["truncate", "flip", "zeros"])
def test_damaged_tail_is_cut_and_earlier_records_survive(tmp_path: Path, damage: str) -> None:
    offsets = _fill(tmp_path, 6)
    path = _log(tmp_path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if damage == "truncate":
            f.truncate(size - 5)
        elif damage == "flip":
            f.seek(size - 3)
            b = f.read(1)
            f.seek(size - 3)
            f.write(bytes([b[0] ^ 0xFF]))
        else:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * 4096)
    s = FileStore(tmp_path)
    assert s.recovered_records == (6 if damage == "zeros" else 5)
    assert path.stat().st_size == (size if damage == "zeros" else offsets[5])
    assert len(s.read_queue("t", 0, 0, 10, 1 << 20)) == 3
    assert s.append([Record(topic="t", queue_id=1, body=b"again")])[0].queue_offset == (
        3 if damage == "zeros" else 2)
    s.close()


def test_corruption_in_the_middle_is_detected_on_read(tmp_path: Path) -> None:
    offsets = _fill(tmp_path, 3)
    s = FileStore(tmp_path)
    with open(_log(tmp_path), "r+b") as f:
        f.seek(offsets[1] + 12)
        f.write(b"\xff\xff")
    with pytest.raises(CorruptRecord):
        s.read_at(offsets[1])
    assert s.read_at(offsets[2]).body == b"m2" * 10
    s.close()
