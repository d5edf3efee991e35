"""FileStore as a replica: read_log on the master, append_replica on the slave (issue #25)."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq.errors import CorruptRecord
from txmq.store import FileStore, MemoryStore, Record, StoreConfig

SMALL = StoreConfig(mapped_file_size_commit_log=64 * 1024)


def rec(i: int) -> Record:
    return Record(topic=f"t{i % 3}", queue_id=i % 2, body=f"m{i}".encode() * 40, tags=f"tag{i % 4}",
                  keys=f"k{i}", properties={"UNIQ_KEY": f"ID{i}"}, store_timestamp_ms=1000 + i)


def ship(master: FileStore, slave: FileStore) -> int:
    """Copy everything the slave lacks, one segment piece at a time (whole records)."""
    while (at := slave.write_offset) < master.write_offset:
        slave.append_replica(at, master.read_log(at, 1 << 30))
    return slave.write_offset


def log_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((root / "commitlog").iterdir()))


def queue(s: FileStore, topic: str, qid: int) -> list[tuple[int, int, bytes]]:
    return [(m.queue_offset, m.commit_log_offset, m.body)
            for m in s.read_queue(topic, qid, 0, 10_000, 1 << 30)]


def test_a_replica_is_byte_identical_and_dispatches_queues_and_index(tmp_path: Path) -> None:
    master, slave = FileStore(tmp_path / "m", SMALL), FileStore(tmp_path / "s", SMALL)
    master.append([rec(i) for i in range(200)])
    for i in range(200, 260):
        master.append([rec(i)])
    master.flush()
    assert ship(master, slave) == master.write_offset
    slave.flush()
    assert log_bytes(tmp_path / "s") == log_bytes(tmp_path / "m")
    for topic in ("t0", "t1", "t2"):
        for qid in (0, 1):
            assert queue(slave, topic, qid) == queue(master, topic, qid) != []
    [m] = slave.query_by_msg_id("ID77", 1)
    [want] = master.query_by_msg_id("ID77", 1)
    assert m.body == rec(77).body and m.commit_log_offset == want.commit_log_offset
    master.close()
    slave.close()


def test_a_bad_record_or_a_wrong_offset_writes_nothing(tmp_path: Path) -> None:
    master, slave = FileStore(tmp_path / "m"), FileStore(tmp_path / "s")
    master.append([rec(i) for i in range(5)])
    data = bytearray(master.read_log(0, 1 << 20))
    with pytest.raises(CorruptRecord, match="ends at 0"):
        slave.append_replica(7, bytes(data))
    data[100] ^= 0x01  # a body byte: the record's __CRC32# no longer matches
    with pytest.raises(CorruptRecord, match="CRC"):
        slave.append_replica(0, bytes(data))
    with pytest.raises(CorruptRecord):
        slave.append_replica(0, master.read_log(0, 1 << 20)[:-3])  # the last record cut short
    assert slave.write_offset == 0 and queue(slave, "t0", 0) == []
    master.close()
    slave.close()


def test_a_killed_replica_recovers_what_it_appended(tmp_path: Path) -> None:
    master, slave = FileStore(tmp_path / "m", SMALL), FileStore(tmp_path / "s", SMALL)
    master.append([rec(i) for i in range(120)])
    master.flush()
    end = ship(master, slave)
    slave.flush()  # no close: no checkpoint, as after SIGKILL
    again = FileStore(tmp_path / "s", SMALL)
    assert again.write_offset == end
    assert queue(again, "t1", 1) == queue(master, "t1", 1)
    master.close()
    again.close()


def test_a_memory_store_cannot_replicate() -> None:
    with pytest.raises(Exception, match="replica"):
        MemoryStore().append_replica(0, b"")
