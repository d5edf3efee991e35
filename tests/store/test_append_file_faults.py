"""Append is all-or-nothing when an index or consume-queue file cannot be created (the fd limit,
EMFILE, or a full disk, ENOSPC): it raises StoreError (DiskFull) with nothing appended, or it
succeeds; a message is never stored behind an error (a client would resend it: a duplicate)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.errors import DiskFull, StoreError
from txmq.protocol import PROPERTY_UNIQ_KEY
from txmq.store import FileStore, Record, StoreConfig
from txmq.store._index import Index

CONFIG = StoreConfig(max_hash_slot_num=64, max_index_num=4)


def rec(topic: str, n: int, keys: str = "") -> Record:
    return Record(topic=topic, queue_id=0, body=f"m{n}".encode(), keys=keys,
                  properties={PROPERTY_UNIQ_KEY: f"id-{topic}-{n}"}, store_timestamp_ms=1_000 + n)


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, int], None]]:
    """``fault(part, errno)``: every os.open of a path under ``<root>/<part>`` fails."""
    real_open = os.open
    state: dict[str, Any] = {"part": None, "errno": 0, "hits": 0}

    def fake_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if state["part"] is not None and f"/{state['part']}/" in os.fspath(path):
            state["hits"] += 1
            raise OSError(state["errno"], os.strerror(state["errno"]), os.fspath(path))
        return real_open(path, flags, *args, **kw)

    def set_fault(part: str | None, code: int = errno.EMFILE) -> None:
        state["part"], state["errno"] = part, code

    monkeypatch.setattr(os, "open", fake_open)
    yield set_fault  # type: ignore[misc]
    assert state["hits"] or state["part"] is None


def log_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "commitlog").iterdir())


def bodies(store: FileStore, topic: str) -> list[bytes]:
    return [m.body for m in store.read_queue(topic, 0, 0, 100, 1 << 20)]


@pytest.mark.parametrize(("code", "exc_type"), [(errno.EMFILE, StoreError), (errno.ENOSPC, DiskFull)])
def test_first_index_file_cannot_be_created(tmp_path: Path, fault: Callable[..., None], code: int,
                                            exc_type: type[StoreError]) -> None:
    store = FileStore(tmp_path, CONFIG)
    before, end = log_bytes(tmp_path), store.write_offset
    fault("index", code)
    with pytest.raises(exc_type):
        store.append([rec("fresh", 0)])
    assert (store.write_offset, log_bytes(tmp_path)) == (end, before)
    assert store.queue_bounds("fresh", 0) == (0, 0)
    fault(None)
    store.append([rec("fresh", 1)])
    store.close()
    reopened = FileStore(tmp_path, CONFIG)
    assert bodies(reopened, "fresh") == [b"m1"]  # no ghost of the refused m0
    assert [m.body for m in reopened.query_by_msg_id("id-fresh-1", 4)] == [b"m1"]
    reopened.close()


@pytest.mark.parametrize("batch", [False, True])
def test_index_rollover_cannot_be_created(tmp_path: Path, fault: Callable[..., None],
                                          batch: bool) -> None:
    """The index file fills up (4 entries): the append that rolls over to a new file is refused
    whole, in the single-record path and in the batch path."""
    store = FileStore(tmp_path, CONFIG)
    store.append([rec("t", 0, keys="a b")])  # 3 entries of 4
    store.flush()
    end = store.write_offset
    fault("index")
    new = [rec("t", 1, keys="c"), rec("u", 2)] if batch else [rec("t", 1, keys="c")]
    with pytest.raises(StoreError):
        store.append(new)
    assert store.write_offset == end
    assert store.queue_bounds("t", 0) == (0, 1) and store.queue_bounds("u", 0) == (0, 0)
    fault(None)
    store.append([rec("t", 3, keys="c"), rec("u", 4)] if batch else [rec("t", 3, keys="c")])
    store.close()
    reopened = FileStore(tmp_path, CONFIG)
    assert bodies(reopened, "t") == [b"m0", b"m3"]
    assert bodies(reopened, "u") == ([b"m4"] if batch else [])
    assert [m.body for m in reopened.query_by_key("t", "c", 0, 10**6, 4)] == [b"m3"]
    assert len(list((tmp_path / "index").iterdir())) == 2  # no stray file from the refusals
    reopened.close()


def test_consume_queue_file_fault_does_not_touch_append(tmp_path: Path,
                                                        fault: Callable[..., None]) -> None:
    """Consume queue files are created by the checkpoint, which logs and retries on failure."""
    store = FileStore(tmp_path, CONFIG)
    fault("consumequeue")
    store.append([rec("q", 0)])
    store.append([rec("q", 1), rec("q", 2)])
    store.flush()
    store.checkpoint()()  # cannot create the queue's file: logged, not raised
    assert bodies(store, "q") == [b"m0", b"m1", b"m2"]
    fault(None)
    store.close()
    reopened = FileStore(tmp_path, CONFIG)
    assert bodies(reopened, "q") == [b"m0", b"m1", b"m2"]
    reopened.close()


def test_index_rollover_on_time_cannot_be_created(tmp_path: Path, fault: Callable[..., None]) -> None:
    """An index file spans at most 2**31 ms from its first entry; the record past that rolls over."""
    store = FileStore(tmp_path, StoreConfig(max_hash_slot_num=64, max_index_num=1000))
    store.append([rec("t", 0)])
    end = store.write_offset
    late = rec("t", 1)
    late.store_timestamp_ms += 2**31
    fault("index")
    with pytest.raises(StoreError):
        store.append([late])
    assert store.write_offset == end
    fault(None)
    store.append([late])
    assert len(list((tmp_path / "index").iterdir())) == 2
    store.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.text(alphabet=" a\t\u3000b", max_size=12), min_size=1, max_size=6),
       uniq=st.booleans())
def test_may_roll_false_means_add_opens_no_file(tmp_path: Path, keys: list[str], uniq: bool) -> None:
    """The cheap bound of Index.may_roll never misses a rollover (else add would open a file after
    the commit log write)."""
    index = Index(tmp_path / f"ix{len(os.listdir(tmp_path))}", 16, 7)
    index.add(Record(topic="t", queue_id=0, body=b"", keys="k"), 0)
    for i, k in enumerate(keys):
        r = Record(topic="t", queue_id=0, body=b"", keys=k,
                   properties={PROPERTY_UNIQ_KEY: f"u{i}"} if uniq else {})
        files = len(index.files)
        if not index.may_roll([r]):
            assert not index.may_roll_one(r)
            index.add(r, i + 1)
            assert len(index.files) == files
        else:
            index.reserve([(r, i + 1)])
            index.add(r, i + 1)
    index.close()


def test_a_dispatch_failure_after_the_write_does_not_fail_the_append(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should dispatch fail after the commit log write anyway, append still answers (the record is
    stored) and the store refuses later writes until it is reopened; recovery dispatches it."""
    store = FileStore(tmp_path, CONFIG)
    assert store._index is not None

    def broken(rec: Record, clo: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(store._index, "add", broken)
    store.append([rec("d", 0)])
    with pytest.raises(StoreError, match="reopened"):
        store.append([rec("d", 1)])
    store.close()
    reopened = FileStore(tmp_path, CONFIG)
    assert bodies(reopened, "d") == [b"m0"]
    reopened.close()


def test_a_checkpoint_that_fails_halfway_leaves_its_written_files_to_the_next_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queues written by a checkpoint that failed on a later queue were marked persisted but never
    fsynced, and the next checkpoint recorded them as on disk all the same (found at the fd
    limit). Now the next checkpoint's sync fsyncs them first."""
    from txmq.store._consumequeue import ConsumeQueue

    s = FileStore(tmp_path, CONFIG)
    s.append([rec("a", 1), rec("b", 1)])
    s.flush()
    real_persist = ConsumeQueue.persist
    written: list[set[int]] = []

    def persist_then_fail(self: ConsumeQueue, below: int) -> set[int]:
        if written:
            raise OSError(errno.EMFILE, "too many open files")
        written.append(real_persist(self, below))
        return written[-1]

    monkeypatch.setattr(ConsumeQueue, "persist", persist_then_fail)
    s.checkpoint()()  # the first queue is written, the second fails: no fsync, no checkpoint
    assert written and written[0]
    monkeypatch.setattr(ConsumeQueue, "persist", real_persist)
    synced: list[int] = []
    real_sync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    s.checkpoint()()  # the first queue has nothing new to write, yet its file is fsynced now
    assert written[0] <= set(synced), (written, synced)
    s.close()
