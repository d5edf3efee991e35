"""Issue 24 item 5: nothing blocking on the event loop. The consumer offsets, the delay progress and
the transaction index snapshot are copied on the loop and encoded, written and fsynced by the
shell's writer thread; the snapshot reflects the moment of the copy; the outcome table and the
discarded transactions are trimmed by retention; an interrupted save leaves a loadable snapshot."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from txmq import limits
from txmq.broker import BrokerConfig
from txmq.broker.server import BrokerServer
from txmq.broker.transaction import Outcome
from txmq.broker.transaction._snapshot import decode_snapshot, encode_snapshot, snapshot_parts
from txmq.client import AsyncConnection
from txmq.errors import ResponseCode
from txmq.protocol import RequestCode
from txmq.store import FileStore, Store, StoreConfig
from txmq.store.codec import seal
from txmq.testing import BrokerHarness

SNAPSHOT = "transactionIndex.snapshot"


class _GatedStore(FileStore):
    """A file store whose metadata writes record their thread and can be held at a gate (the
    injected slow writer)."""

    def __init__(self, root: Path, config: StoreConfig | None = None) -> None:
        super().__init__(root, config)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.threads: list[int] = []

    def save_meta(self, name: str, data: bytes) -> None:
        self.threads.append(threading.get_ident())
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        super().save_meta(name, data)


def _pending(h: BrokerHarness, n: int) -> list[int]:
    """``n`` pending halves; returns their half offsets."""
    h.heartbeat(1, "c1", ["pg"])
    return [int(h.send(1, "t", b"x", transactional=True).ext["queueOffset"]) for _ in range(n)]


def test_the_loop_serves_while_the_writer_is_held_mid_save(tmp_path: Path) -> None:
    """The writer thread is held inside a save (a slow disk): the event loop still answers
    requests, and no metadata file is written on the loop's thread."""
    store = _GatedStore(tmp_path)
    server = BrokerServer(BrokerConfig(port=0, topics={"t": 2}), store)
    # the halves are born now: with the harness's default clock (1970) the server's first
    # transaction check could discard them as older than file_reserved_time_ms before the copy
    h = BrokerHarness(store, now_ms=int(time.time() * 1000), topics={"t": 2})
    h.broker = server.broker
    _pending(h, 3000)
    h.broker.set_offset("g", "t", 0, 5)

    async def main() -> None:
        await server.start()
        loop_thread = threading.get_ident()
        try:
            store.gate.clear()
            store.threads.clear()  # (topics.json was saved at start, on this thread)
            saving = asyncio.create_task(server.save_state())
            while not store.entered.is_set():
                await asyncio.sleep(0.001)
            conn = AsyncConnection(f"127.0.0.1:{server.port}")
            await conn.connect()
            for _ in range(20):  # answered while the save is held
                r = await conn.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                assert r.code == ResponseCode.SUCCESS
            assert not saving.done()
            await conn.close()
            store.gate.set()
            await saving
            assert store.threads and loop_thread not in store.threads
        finally:
            store.gate.set()
            await server.close()

    asyncio.run(main())
    raw = (tmp_path / "meta" / SNAPSHOT).read_bytes()
    assert len(decode_snapshot(raw).pending) == 3000
    assert b'"g@t@0":5' in (tmp_path / "meta" / "consumerOffset.json").read_bytes()


def test_a_large_snapshot_is_encoded_in_chunks_that_yield_the_gil(tmp_path: Path) -> None:
    h = BrokerHarness(FileStore(tmp_path))
    _pending(h, 2 * limits.TX_SNAPSHOT_ENCODE_CHUNK + 1)
    pauses = []
    step = h.broker.tx.prepare_snapshot(pause=lambda: pauses.append(1))
    assert step is not None
    step()
    assert len(pauses) == 3
    snap = decode_snapshot((tmp_path / "meta" / SNAPSHOT).read_bytes())
    # the parts written are the bytes of sealing the whole snapshot at once
    assert encode_snapshot(snap) == (tmp_path / "meta" / SNAPSHOT).read_bytes()
    assert b"".join(snapshot_parts(snap)) == seal(0x54585349, snap)
    h.store.close()


def test_the_snapshot_is_the_index_at_the_copy_and_the_log_replays_the_rest(tmp_path: Path) -> None:
    """Changes made between the copy (on the loop) and the write (on the writer thread) are not
    in the snapshot, which says so by its log offset; a restart replays them from the log."""
    h = BrokerHarness(FileStore(tmp_path))
    h.heartbeat(1, "c1", ["pg"])
    a = h.send(1, "t", b"a", transactional=True)
    b = h.send(1, "t", b"b", transactional=True)
    step = h.broker.prepare_persist()
    copied_at = h.store.write_offset
    h.end(1, a, "COMMIT")  # after the copy: in the log, not in the snapshot
    c = h.send(1, "t", b"c", transactional=True)
    step()
    snap = decode_snapshot((tmp_path / "meta" / SNAPSHOT).read_bytes())
    assert snap.log_offset == copied_at
    assert sorted(e.half_offset for e in snap.pending) == [0, 1]
    h.store.flush()
    h.store.close()  # (no save at close: the restart must use the snapshot above)
    h2 = BrokerHarness(FileStore(tmp_path))
    idx = h2.broker.tx.index
    offs = [int(x.ext["queueOffset"]) for x in (a, b, c)]
    assert idx.outcome(offs[0]) is Outcome.COMMIT
    assert idx.outcome(offs[1]) is Outcome.PENDING and idx.outcome(offs[2]) is Outcome.PENDING
    h2.store.close()


def _settle_history(h: BrokerHarness, n: int) -> list[int]:
    """``n`` transactions committed one by one, big enough to fill small segments."""
    h.heartbeat(1, "c1", ["pg"])
    offs = []
    for _ in range(n):
        half = h.send(1, "t", b"y" * 2000, transactional=True)
        h.end(1, half, "COMMIT")
        offs.append(int(half.ext["queueOffset"]))
    return offs


def _retention(store: Store, h: BrokerHarness) -> int:
    """Delete every expired segment, as the shell's upkeep does, and tell the broker."""
    report = store.clean(h.now_ms + 400 * 3_600_000, delete_hour=True)
    assert report.deleted_segments
    h.broker.after_retention(report.min_offset)
    return report.min_offset


def test_retention_trims_outcomes_and_discarded_transactions(tmp_path: Path) -> None:
    store = FileStore(tmp_path, StoreConfig(mapped_file_size_commit_log=64 * 1024))
    h = BrokerHarness(store, transaction_check_max=1)
    h.heartbeat(1, "c1", ["pg"])
    discarded = h.send(1, "t", b"d", transactional=True)
    assert h.tick(h.config.transaction_timeout_ms + 1)  # checked once, never answered
    h.tick(h.config.transaction_check_interval_ms + 1)  # then discarded
    d_off = int(discarded.ext["queueOffset"])
    assert d_off in h.broker.tx.index.discarded and h.broker.tx.index.parked() == 1
    d_id = h.broker.tx.index.discarded_ids
    assert d_id
    settled = _settle_history(h, 200)
    late = h.send(1, "t", b"late", transactional=True)  # pending: never trimmed
    h.store.flush()
    low = _retention(store, h)
    idx = h.broker.tx.index
    half_low = store.queue_bounds("RMQ_SYS_TRANS_HALF_TOPIC", 0)[0]
    assert half_low > settled[0]
    assert idx.outcome(settled[0]) is None and idx.outcome(settled[-1]) is Outcome.COMMIT
    assert d_off not in idx.discarded and not idx.discarded_ids and idx.parked() == 0
    assert h.broker.tx.lookup(next(iter(d_id), "")) is None
    assert idx.outcome(int(late.ext["queueOffset"])) is Outcome.PENDING
    assert low <= idx.pending[int(late.ext["queueOffset"])].commit_log_offset
    # a late end of a trimmed transaction: nothing is known of it any more
    h.store.flush()
    assert h.end(1, _fake_half(settled[0]), "COMMIT").code == ResponseCode.TRANSACTION_NOT_FOUND
    h.broker.persist_offsets()
    snap = decode_snapshot((tmp_path / "meta" / SNAPSHOT).read_bytes())
    assert snap.discarded == {} and snap.discarded_ids == {}
    store.close()
    h2 = BrokerHarness(FileStore(tmp_path, StoreConfig(mapped_file_size_commit_log=64 * 1024)))
    assert h2.broker.tx.index.outcome(settled[0]) is None
    assert h2.broker.tx.index.outcome(settled[-1]) is Outcome.COMMIT
    h2.store.close()


def _fake_half(half_offset: int) -> object:
    """A send reply naming a half offset whose record is gone (commit log offset 0)."""
    from txmq.protocol import Command, SendMessageResponseHeader, offset_msg_id, to_ext

    return Command(code=0, ext=to_ext(SendMessageResponseHeader(
        msg_id=offset_msg_id("127.0.0.1:1", 0), queue_id=0, queue_offset=half_offset)))


def test_a_restart_trims_what_retention_deleted_while_the_broker_was_down(tmp_path: Path) -> None:
    cfg = StoreConfig(mapped_file_size_commit_log=64 * 1024)
    h = BrokerHarness(FileStore(tmp_path, cfg))
    settled = _settle_history(h, 200)
    h.broker.persist_offsets()
    h.store.flush()
    h.store.clean(h.now_ms + 400 * 3_600_000, delete_hour=True)  # the broker is not told
    h.store.close()
    h2 = BrokerHarness(FileStore(tmp_path, cfg))
    assert h2.broker.tx.index.settled.table.low > settled[0]
    assert h2.broker.tx.index.outcome(settled[0]) is None
    h2.store.close()


def test_the_state_table_frees_the_disk_blocks_of_trimmed_keys(tmp_path: Path) -> None:
    from txmq.store._table import FileStateTable

    t = FileStateTable(tmp_path / "s.table")
    for k in range(1 << 20):
        t.set(k, 1)
    t.sync()
    before = os.stat(t.path).st_blocks
    assert t.trim(1 << 19) == 1 << 19 and t.trim(10) == 0
    assert t.get(5) == 0 and t.get((1 << 19) + 5) == 1
    t.set(7, 2)  # below the bound: ignored
    assert t.get(7) == 0
    t.sync()
    if t._fallocate is None:
        pytest.skip("no hole punching on this system")
    assert os.stat(t.path).st_blocks < before * 0.6
    t.close()
    t = FileStateTable(tmp_path / "s.table")  # holes read as nothing recorded
    assert t.get(5) == 0 and t.get((1 << 19) + 5) == 1
    t.close()


def test_a_window_handed_over_is_read_until_written(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from txmq.store._table import FileStateTable

    monkeypatch.setattr(limits, "TX_STATE_WINDOW_ENTRIES", 10)
    t = FileStateTable(tmp_path / "s.table")
    for k in range(25):  # two windows handed over, no write yet
        t.set(k, 3)
    assert os.stat(t.path).st_size == 0 and [t.get(k) for k in (0, 19, 24)] == [3, 3, 3]
    step = t.prepare_sync()
    t.set(0, 1)  # newer than the handed-over value
    step()
    assert os.stat(t.path).st_size == 25 and t.get(0) == 1 and t.get(24) == 3
    t.close()
    t = FileStateTable(tmp_path / "s.table")
    assert t.get(0) == 1  # close wrote the window
    t.close()


@pytest.mark.parametrize("crash_at", ["write", "fsync", "replace", "dir fsync"])
def test_a_save_interrupted_at_any_step_leaves_a_loadable_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str) -> None:
    """The writer thread dies (SIGKILL) at each step of replacing the snapshot: the next start
    finds the old or the new snapshot, never a damaged one, and the index is right either way."""
    h = BrokerHarness(FileStore(tmp_path))
    first = _pending(h, 50)
    h.broker.persist_offsets()
    second = h.send(1, "t", b"z", transactional=True)
    h.end(1, h.send(1, "t", b"w", transactional=True), "ROLLBACK")
    h.store.flush()

    class Killed(BaseException):
        pass

    def dies(*args: object, **kw: object) -> None:
        raise Killed

    import txmq.store._file as file

    if crash_at == "write":  # the temp file is half written
        real_open = open

        def torn_open(path: object, mode: str = "r", *a: object, **kw: object) -> object:
            f = real_open(path, mode, *a, **kw)  # type: ignore[call-overload]
            if "w" in mode:
                f.write(b"\0\1")
                raise Killed
            return f

        monkeypatch.setattr("builtins.open", torn_open)
    else:
        target = {"fsync": (file.os, "fsync"), "replace": (file.os, "replace"),
                  "dir fsync": (file, "fsync_dir")}[crash_at]
        monkeypatch.setattr(*target, dies)
    with pytest.raises(Killed):
        h.broker.persist_offsets()
    monkeypatch.undo()
    h2 = BrokerHarness(FileStore(tmp_path))  # the crashed store is never closed
    assert not (tmp_path / "quarantine").exists() or not any((tmp_path / "quarantine").iterdir())
    decode_snapshot((tmp_path / "meta" / SNAPSHOT).read_bytes())  # CRC checks out
    idx = h2.broker.tx.index
    assert all(idx.outcome(o) is Outcome.PENDING for o in first)
    assert idx.outcome(int(second.ext["queueOffset"])) is Outcome.PENDING
    assert len(idx.pending) == 51 and idx.settled.counts[Outcome.ROLLBACK] == 1
    h2.store.close()
