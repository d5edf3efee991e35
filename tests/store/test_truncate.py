"""Crash-safe truncation (issue #26): a kill between any two stages, then a restart, leaves the
commit log, consume queues, index and epoch file cut at the same offset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from txmq.errors import StoreError
from txmq.store import FileStore, Record, StoreConfig
from txmq.store._truncate import TRUNCATE_MARKER, decode_marker, encode_marker

SMALL = StoreConfig(mapped_file_size_commit_log=64 * 1024)


def rec(i: int) -> Record:
    return Record(topic=f"t{i % 2}", queue_id=0, body=f"m{i}".encode() * 50, keys=f"k{i}",
                  properties={"UNIQ_KEY": f"ID{i}"}, store_timestamp_ms=1000 + i)


def fill(root: Path) -> int:
    """300 records in epochs 1 and 2; returns the offset where epoch 2 began (the cut)."""
    s = FileStore(root, SMALL)
    s.epochs.append(1, 0)
    s.append([rec(i) for i in range(150)])
    cut = s.write_offset
    s.epochs.append(2, cut)
    for i in range(150, 300):
        s.append([rec(i)])
    s.flush()
    s.close()
    return cut


def check_cut(root: Path, cut: int) -> None:
    s = FileStore(root, SMALL)
    try:
        assert s.write_offset == cut and not (root / TRUNCATE_MARKER).exists()
        assert s.epochs.cache.pairs() == [(1, 0)]
        got = [m.body for t in ("t0", "t1") for m in s.read_queue(t, 0, 0, 1000, 1 << 30)]
        assert sorted(got) == sorted(rec(i).body for i in range(150))
        assert s.query_by_msg_id("ID149", 1) and not s.query_by_msg_id("ID150", 1)
        assert s.queue_bounds("t0", 0)[1] == 75
        s.append([rec(1000)])  # it writes on from the cut
        assert s.write_offset > cut
    finally:
        s.close()


def test_truncate_log_cuts_everything_and_survives_reopen(tmp_path: Path) -> None:
    cut = fill(tmp_path)
    s = FileStore(tmp_path, SMALL)
    assert s.truncate_log(cut) > 0
    assert s.write_offset == s.flushed_offset == cut
    s.close()
    check_cut(tmp_path, cut)
    assert any((tmp_path / "quarantine").rglob("*"))  # what was cut is kept


_CHILD = """
import os, sys
from pathlib import Path
from txmq.store import FileStore, StoreConfig
root, cut, stage = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = FileStore(root, StoreConfig(mapped_file_size_commit_log=64 * 1024))
def step(name):
    if name == stage:
        os._exit(9)  # a kill: no close, no checkpoint
s.truncate_log(cut, step)
os._exit(0)
"""


@pytest.mark.parametrize("stage", ["marker", "commitlog", "queues", "epochs", "checkpoint"])
def test_a_kill_between_stages_is_finished_at_restart(tmp_path: Path, stage: str) -> None:
    cut = fill(tmp_path)
    r = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), str(cut), stage],
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 9, r.stderr.decode()[-2000:]
    assert decode_marker((tmp_path / TRUNCATE_MARKER).read_bytes()) == cut
    check_cut(tmp_path, cut)


def test_a_damaged_marker_cuts_nothing_but_rebuilds(tmp_path: Path) -> None:
    cut = fill(tmp_path)
    end = FileStore(tmp_path, SMALL)
    full = end.write_offset
    end.close()
    (tmp_path / TRUNCATE_MARKER).write_bytes(encode_marker(cut)[:-1] + b"\0")
    s = FileStore(tmp_path, SMALL)
    assert s.write_offset == full and not (tmp_path / TRUNCATE_MARKER).exists()
    assert s.queue_bounds("t0", 0)[1] == 150
    s.close()


def test_a_cut_past_the_end_is_refused(tmp_path: Path) -> None:
    fill(tmp_path)
    s = FileStore(tmp_path, SMALL)
    with pytest.raises(StoreError, match="cannot truncate"):
        s.truncate_log(s.write_offset + 1)
    s.close()
