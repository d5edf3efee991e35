"""Recovery never refuses to start because of one bad derived file (issue 11, "What to build" 3):
what it cannot use is moved to ``quarantine/``, named in the log with the reason, and rebuilt from
the commit log. Only a commit log damaged below its checkpoint stops the start, with a message that
names ``txmq store check`` and ``txmq store repair``."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from txmq.cli import app
from txmq.errors import CommitLogDamaged, StoreError
from txmq.store import FileStore, Record, StoreConfig, check_store, repair_store

CFG = StoreConfig(mapped_file_size_consume_queue=8, mapped_file_size_commit_log=64 * 1024)
BODIES = [f"m{i}".encode() * 10 for i in range(40)]


def rec(i: int, topic: str = "t") -> Record:
    return Record(topic=topic, queue_id=i % 2, body=BODIES[i], keys=f"k{i}",
                  properties={"UNIQ_KEY": f"ID{i}"}, store_timestamp_ms=1000 + i)


def fill(root: Path, n: int = 40) -> list[int]:
    s = FileStore(root, CFG)
    res = s.append([rec(i) for i in range(n)])
    s.close()
    return [r.commit_log_offset for r in res]


def reopen_and_read(root: Path, caplog: pytest.LogCaptureFixture, n: int = 40) -> FileStore:
    """Open again; every acknowledged message is readable, by queue and by key."""
    caplog.set_level(logging.WARNING, "txmq.store")
    s = FileStore(root, CFG)
    got = [m.body for q in (0, 1) for m in s.read_queue("t", q, 0, 1000, 1 << 30)]
    assert sorted(got) == sorted(BODIES[:n])
    assert [m.body for m in s.query_by_key("t", "k7", 0, 2**62, 5)] == [BODIES[7]]
    assert s.append([rec(0)])[0].queue_offset == n // 2
    return s


def quarantined(root: Path, caplog: pytest.LogCaptureFixture, name: str) -> Path:
    """The quarantined copy of ``name`` (a path relative to the data dir), named in the log."""
    hits = sorted((root / "quarantine").glob(f"*/{name}"))
    assert hits, f"{name} not in quarantine: {list((root / 'quarantine').rglob('*'))}"
    assert any("quarantined" in r.message and str(hits[-1]) in r.message for r in caplog.records)
    return hits[-1]


def test_a_file_where_a_topic_directory_belongs(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    fill(tmp_path)
    (tmp_path / "consumequeue" / "x").write_bytes(b"not a directory")
    reopen_and_read(tmp_path, caplog).close()
    assert quarantined(tmp_path, caplog, "consumequeue/x").read_bytes() == b"not a directory"


def test_a_file_where_a_queue_directory_belongs(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """What a message to topic ``.`` left on base: ``consumequeue/./0`` is ``consumequeue/0``,
    whose 20-digit file names look like queue ids (base: ``StoreError … Not a directory``)."""
    fill(tmp_path)
    (tmp_path / "consumequeue" / "0").mkdir()
    (tmp_path / "consumequeue" / "0" / f"{0:020d}").write_bytes(b"\0" * 20)
    (tmp_path / "consumequeue" / "t" / "abc").write_bytes(b"x")
    reopen_and_read(tmp_path, caplog).close()
    quarantined(tmp_path, caplog, f"consumequeue/0/{0:020d}")
    quarantined(tmp_path, caplog, "consumequeue/t/abc")


@pytest.mark.parametrize("damage", ["short", "garbage", "directory"])
def test_a_bad_consume_queue_file_is_quarantined_and_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    fill(tmp_path)
    path = tmp_path / "consumequeue" / "t" / "1" / f"{8 * 20:020d}"
    if damage == "short":
        path.write_bytes(path.read_bytes()[:-7])
    elif damage == "garbage":
        path.write_bytes(os.urandom(path.stat().st_size))
    else:
        path.unlink()
        path.mkdir()
    s = reopen_and_read(tmp_path, caplog)
    assert s.recovery.rebuilt_queues == ["t/1"]
    s.close()
    quarantined(tmp_path, caplog, "consumequeue/t/1")


@pytest.mark.parametrize("topic", ["x" * 300, "€" * 100], ids=["300 bytes", "100 euro signs"])
def test_a_topic_whose_name_cannot_be_a_directory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An older broker stored such a message. Base: no checkpoint could be written again (``File
    name too long`` creating its consume queue), so every start re-read more of the log."""
    monkeypatch.setattr(FileStore, "_check_new_queue", staticmethod(lambda r: None), raising=False)
    s = FileStore(tmp_path, CFG)
    s.append([rec(i) for i in range(20)])
    s.append([Record(topic=topic, queue_id=0, body=b"odd")])
    s.append([rec(i) for i in range(20, 40)])
    s.flush()  # then the process dies
    monkeypatch.undo()
    s2 = reopen_and_read(tmp_path, caplog)
    assert [m.body for _, m in s2.iter_records() if m.topic == topic] == [b"odd"]
    s2.close()
    s2 = FileStore(tmp_path, CFG)
    assert s2.recovery.checkpoint_trusted and s2.recovery.records == 0  # the checkpoint was written
    with pytest.raises(StoreError, match="file name limit"):
        s2.append([Record(topic=topic, queue_id=1, body=b"refused before the write")])
    s2.close()


@pytest.mark.parametrize("damage", ["garbage", "directory inside"])
def test_a_bad_index_is_quarantined_and_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                damage: str) -> None:
    fill(tmp_path)
    (path,) = (tmp_path / "index").iterdir()
    if damage == "garbage":
        size = path.stat().st_size
        path.write_bytes(os.urandom(size))
    else:
        (tmp_path / "index" / "stray").mkdir()
    s = reopen_and_read(tmp_path, caplog)
    assert s.recovery.index_rebuilt
    assert [m.body for m in s.query_by_msg_id("ID11", 5)] == [BODIES[11]]
    s.close()
    quarantined(tmp_path, caplog, "index")


@pytest.mark.parametrize("damage", ["garbage", "directory"])
def test_a_bad_checkpoint_is_quarantined(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                         damage: str) -> None:
    fill(tmp_path)
    cp = tmp_path / "checkpoint"
    if damage == "garbage":
        cp.write_bytes(b"garbage")
    else:
        cp.unlink()
        cp.mkdir()
    s = reopen_and_read(tmp_path, caplog)
    assert s.recovery.checkpoint_offset == -1 and s.recovery.records == 40
    s.close()
    quarantined(tmp_path, caplog, "checkpoint")


def _flip(root: Path, offset: int) -> None:
    seg = sorted((root / "commitlog").iterdir())[0]
    with open(seg, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("found_by", ["queue rebuild", "no checkpoint"])
def test_damage_in_the_middle_refuses_then_check_and_repair(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, found_by: str) -> None:
    """Base cut the log at the damage: 29 acknowledged messages silently gone."""
    offsets = fill(tmp_path)
    _flip(tmp_path, offsets[10] + 40)
    if found_by == "queue rebuild":  # the rebuild reads the log below the checkpoint
        shutil.rmtree(tmp_path / "consumequeue" / "t" / "1")
    else:
        (tmp_path / "checkpoint").write_bytes(b"garbage")
    with pytest.raises(CommitLogDamaged, match=r"txmq store check .*txmq store repair .* --yes"):
        FileStore(tmp_path, CFG)
    before = sorted((tmp_path / "commitlog").iterdir())[0].read_bytes()
    found = check_store(tmp_path)
    assert not found.ok and found.cut_at == offsets[10] and found.records == 39
    assert found.damaged[0].end == offsets[11] and found.records_after_damage == 29
    runner = CliRunner()
    r = runner.invoke(app, ["store", "check", str(tmp_path)])
    assert r.exit_code == 1 and "repair would cut the log at offset" in " ".join(r.output.split())
    r = runner.invoke(app, ["store", "repair", str(tmp_path)])
    assert r.exit_code == 1  # without --yes nothing changes
    assert sorted((tmp_path / "commitlog").iterdir())[0].read_bytes() == before
    r = runner.invoke(app, ["store", "repair", str(tmp_path), "--yes"])
    assert r.exit_code == 0, r.output
    s = FileStore(tmp_path, CFG)
    got = [m.body for q in (0, 1) for m in s.read_queue("t", q, 0, 1000, 1 << 30)]
    assert sorted(got) == sorted(BODIES[:10])
    s.close()
    (kept,) = (tmp_path / "quarantine").glob(f"*/commitlog/{0:020d}.from-{offsets[10]}")
    assert kept.read_bytes() == before[offsets[10]:]  # the cut part is kept, not deleted
    assert runner.invoke(app, ["store", "check", str(tmp_path)]).exit_code == 0


def test_without_a_checkpoint_damage_before_the_last_segment_refuses(tmp_path: Path) -> None:
    s = FileStore(tmp_path, CFG)
    for i in range(2000):
        s.append([rec(i % 40)])
    s.close()
    assert len(list((tmp_path / "commitlog").iterdir())) >= 2
    (tmp_path / "checkpoint").unlink()
    _flip(tmp_path, 5000)
    with pytest.raises(CommitLogDamaged, match="good records after it"):
        FileStore(tmp_path, CFG)
    repair_store(tmp_path)
    FileStore(tmp_path, CFG).close()


def test_a_torn_tail_is_cut_and_kept_in_the_quarantine(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    offsets = fill(tmp_path)
    s = FileStore(tmp_path, CFG)
    s.append([rec(0)])
    s.flush()  # then the process dies, the last record half written
    seg = sorted((tmp_path / "commitlog").iterdir())[0]
    tail = seg.read_bytes()[s.write_offset - 3 - 100:s.write_offset - 3]
    with open(seg, "r+b") as f:
        f.truncate(s.write_offset - 3)
    caplog.set_level(logging.WARNING, "txmq.store")
    s2 = FileStore(tmp_path, CFG)
    assert s2.recovery.truncated_bytes > 0 and s2.write_offset > offsets[-1]
    s2.close()
    kept = quarantined(tmp_path, caplog, f"commitlog/{0:020d}.from-*")
    assert kept.read_bytes().endswith(tail)
    shutil.rmtree(tmp_path / "quarantine")


def test_check_refuses_a_directory_without_a_commit_log_and_creates_nothing(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["store", "check", str(tmp_path)])
    assert r.exit_code == 2 and "holds no commit log" in " ".join(r.output.split())
    assert list(tmp_path.iterdir()) == []


def test_a_stray_file_in_the_commit_log_directory(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Base: ``StoreError: unexpected file in commit log directory``."""
    fill(tmp_path)
    (tmp_path / "commitlog" / "notes.txt").write_text("x")
    (tmp_path / "commitlog" / f"{10**9:020d}").mkdir()
    reopen_and_read(tmp_path, caplog).close()
    quarantined(tmp_path, caplog, "commitlog/notes.txt")
    quarantined(tmp_path, caplog, f"commitlog/{10**9:020d}")


def test_the_broker_command_refuses_a_damaged_log_with_what_to_do(tmp_path: Path) -> None:
    """``txmq broker`` on a log damaged below its checkpoint exits 2 with one line that names
    ``txmq store check|repair`` (no traceback), and starts once the log is repaired."""
    import subprocess
    import sys
    import time

    data = tmp_path / "data"
    offsets = fill(data)
    _flip(data, offsets[10] + 40)
    shutil.rmtree(data / "consumequeue" / "t" / "1")
    cmd = [sys.executable, "-m", "txmq", "broker", "--port", "0", "--data-dir", str(data),
           "--port-file", str(tmp_path / "port")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "txmq store repair" in r.stdout + r.stderr and "Traceback" not in r.stderr
    repair_store(data)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            if (tmp_path / "port").exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert p.poll() is None and (tmp_path / "port").exists()
    finally:
        p.terminate()
        p.wait(timeout=30)
