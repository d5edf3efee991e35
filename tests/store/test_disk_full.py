"""Disk full on a real small filesystem (a size-limited tmpfs): writes are refused with DiskFull
(DISK_FULL over the wire), nothing stored is damaged, and writes resume once space is freed.

Mounting needs root (or CAP_SYS_ADMIN). Where that is impossible the tests skip and say why; set
``TXMQ_REQUIRE_TMPFS=1`` (CI does) to make that a failure instead.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.client import Message, Producer, PullConsumer
from txmq.errors import DiskFull, RemoteError, ResponseCode
from txmq.store import FileStore, Record, StoreConfig
from txmq.testing import BrokerProcess

SMALL_INDEX = dict(max_hash_slot_num=1024, max_index_num=10_000)


def _mount(path: Path, size: str) -> str:
    """Mount a tmpfs; return "" or why it could not be done."""
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    if os.geteuid() != 0:
        cmd = ["sudo", "-n", *cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fs"
    path.mkdir()
    why = _mount(path, "24m")
    if why:
        msg = f"cannot mount a size-limited tmpfs here ({why}); needs root or CAP_SYS_ADMIN"
        if os.environ.get("TXMQ_REQUIRE_TMPFS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    try:
        yield path
    finally:
        prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
        subprocess.run([*prefix, "umount", "-l", str(path)], check=False, capture_output=True)


def ballast(fs: Path, mib: int) -> Path:
    p = fs / "ballast"
    with open(p, "wb") as f:
        f.write(os.urandom(1024 * 1024) * mib)
    return p


def body(i: int, n: int = 64 * 1024) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


def fill_until_full(s: FileStore, check_every: int) -> int:
    """Append flushed 64 KiB records until DiskFull; return how many were stored."""
    for i in range(10_000):
        try:
            s.append([Record(topic="t", queue_id=0, body=body(i), keys=f"k{i}")])
        except DiskFull:
            return i
        s.flush()
        if i % check_every == 0:
            s.check_disk()
    raise AssertionError("the disk never filled up")


def assert_intact(s: FileStore, n: int) -> None:
    got = s.read_queue("t", 0, 0, 100_000, 1 << 40)
    assert [m.body for m in got] == [body(i) for i in range(n)]


def test_writes_are_refused_above_the_warning_ratio_and_resume_when_space_returns(
        small_fs: Path) -> None:
    extra = ballast(small_fs, 6)
    store_dir = small_fs / "store"
    s = FileStore(store_dir, StoreConfig(mapped_file_size_commit_log=1024 * 1024, **SMALL_INDEX))
    n = fill_until_full(s, check_every=1)
    status = s.check_disk()
    assert not status.writable and status.usage_ratio > 0.90
    with pytest.raises(DiskFull, match="writes refused until space is freed"):
        s.append([Record(topic="t", queue_id=0, body=b"one more")])
    s.save_meta("still-fine", b"metadata has the reserve")  # the last 10 % is left for the rest
    assert_intact(s, n)
    extra.unlink()
    assert s.check_disk().writable
    assert s.append([Record(topic="t", queue_id=0, body=body(n))])[0].queue_offset == n
    s.close()
    s = FileStore(store_dir, StoreConfig(mapped_file_size_commit_log=1024 * 1024, **SMALL_INDEX))
    assert_intact(s, n + 1)
    s.close()


def test_a_write_that_runs_out_of_space_changes_nothing(small_fs: Path) -> None:
    off = StoreConfig(mapped_file_size_commit_log=1024 * 1024, disk_max_used_space_ratio=1.0,
                      disk_space_clean_forcibly_ratio=1.0, disk_space_warning_level_ratio=1.0,
                      **SMALL_INDEX)
    extra = ballast(small_fs, 4)
    store_dir = small_fs / "store"
    s = FileStore(store_dir, off)
    n = fill_until_full(s, check_every=1)  # ENOSPC from the kernel, not the ratio
    before = (s.write_offset, s.queue_bounds("t", 0))
    with pytest.raises(DiskFull, match="disk full writing the commit log"):
        s.append([Record(topic="t", queue_id=0, body=body(n))])
    assert (s.write_offset, s.queue_bounds("t", 0)) == before
    assert_intact(s, n)
    s.checkpoint()()  # may fail for lack of space: logged, never raised
    extra.unlink()
    assert s.append([Record(topic="t", queue_id=0, body=body(n))])[0].queue_offset == n
    s.flush()
    s.close()
    s = FileStore(store_dir, off)
    assert_intact(s, n + 1)
    assert s.recovery.truncated_bytes == 0
    s.close()


def test_a_broker_answers_disk_full_and_resumes(small_fs: Path, tmp_path: Path) -> None:
    extra = ballast(small_fs, 6)
    broker = BrokerProcess(small_fs, {"topics": {"t": 1}}, log_path=tmp_path / "broker.log")
    broker.start()
    acked: list[bytes] = []
    try:
        with Producer("pg", broker.endpoints) as p:
            refused = None
            for i in range(1000):
                try:
                    p.send(Message(topic="t", body=body(i, 256 * 1024)))
                    acked.append(body(i, 256 * 1024))
                except RemoteError as exc:
                    refused = exc
                    break
            assert refused is not None and refused.response_code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert refused.retriable
            extra.unlink()
            deadline = time.monotonic() + 15
            while True:  # the broker re-reads disk usage every second
                try:
                    p.send(Message(topic="t", body=b"after"))
                    acked.append(b"after")
                    break
                except RemoteError as exc:
                    assert exc.response_code == ResponseCode.SERVICE_NOT_AVAILABLE
                    assert time.monotonic() < deadline, "writes did not resume"
                    time.sleep(0.1)
        broker.stop()
        broker.start()
        with PullConsumer(broker.endpoints) as pc:
            got, off = [], 0
            while True:
                r = pc.pull("t", 0, off, 64)
                if not r.messages:
                    break
                got += [m.body for m in r.messages]
                off = r.next_begin_offset
        assert got == acked
    finally:
        broker.stop()


def test_a_broker_killed_on_a_full_disk_starts_serves_reads_and_refuses_writes(
        small_fs: Path, tmp_path: Path) -> None:
    """Issue 11: base failed to start with ``DiskFull`` saving ``meta/topics.json``."""
    home = tmp_path / "broker"
    home.mkdir()
    (home / "store").symlink_to(small_fs)  # only the data directory is on the small disk
    extra = ballast(small_fs, 6)
    broker = BrokerProcess(home, {"topics": {"t": 1}}, log_path=tmp_path / "broker.log")
    broker.start()
    acked: list[bytes] = []
    try:
        with Producer("pg", broker.endpoints) as p:
            for i in range(1000):
                try:
                    p.send(Message(topic="t", body=body(i, 256 * 1024)))
                    acked.append(body(i, 256 * 1024))
                except RemoteError as exc:
                    assert exc.response_code == ResponseCode.SERVICE_NOT_AVAILABLE
                    break
        with open(small_fs / "ballast2", "wb") as f:  # now 100 % full
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        broker.kill()
        broker.start()
        with PullConsumer(broker.endpoints) as pc:
            r = pc.pull("t", 0, 0, 4)
            assert [m.body for m in r.messages] == acked[:4]
        with Producer("pg", broker.endpoints) as p:
            with pytest.raises(RemoteError) as refused:
                p.send(Message(topic="t", body=b"refused"))
            assert refused.value.response_code == ResponseCode.SERVICE_NOT_AVAILABLE
            extra.unlink()
            (small_fs / "ballast2").unlink()
            deadline = time.monotonic() + 15
            while True:  # the broker re-reads disk usage every second
                try:
                    p.send(Message(topic="t", body=b"after"))
                    break
                except RemoteError as exc:
                    assert exc.response_code == ResponseCode.SERVICE_NOT_AVAILABLE
                    assert time.monotonic() < deadline, "writes did not resume"
                    time.sleep(0.1)
    finally:
        broker.stop()
