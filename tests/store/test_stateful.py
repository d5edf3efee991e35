"""Hypothesis stateful tests: each store against a plain model, through appends, flushes,
checkpoints, retention, clean reopens and (FileStore) crashes that tear the unflushed tail."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from txmq.store import FileStore, MemoryStore, Record, Store, StoreConfig

CFG = StoreConfig(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=16,
                  max_hash_slot_num=64, max_index_num=100, delete_files_batch_max=2)
QUEUES = [("a", 0), ("a", 1), ("b", 0)]
KEYS = ["k1", "k2", "k3"]


@dataclass
class Stored:
    clo: int
    size: int
    topic: str
    qid: int
    qo: int
    body: bytes
    keys: str
    ts: int


body_sizes = st.integers(0, 3000) | st.sampled_from([6000, 12000, 20000])
record_spec = st.tuples(st.sampled_from(QUEUES), body_sizes, st.sampled_from(["", *KEYS]))


def abandon(s: FileStore) -> None:
    """Drop a store like a killed process would: no flush, no checkpoint, just the fds closed."""
    for cq in s._queues.values():
        cq.close()
    if s._index is not None:
        s._index.close()
    s._log.close()


class StoreMachine(RuleBasedStateMachine):
    """Rules and checks shared by both stores."""

    file = False

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="txmq-stateful-"))
        self.store: Store = self._open()
        self.recs: list[Stored] = []
        self.next_qo = {q: 0 for q in QUEUES}
        self.flushed = 0
        self.ts = 0

    def _open(self) -> Store:
        return FileStore(self.dir, CFG) if self.file else MemoryStore(CFG)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules ------------------------------------------------------------------------------------
    @rule(batch=st.lists(record_spec, min_size=1, max_size=4))
    def append(self, batch: list[tuple[tuple[str, int], int, str]]) -> None:
        recs = []
        for (topic, qid), n, keys in batch:
            self.ts += 1
            recs.append(Record(topic=topic, queue_id=qid, body=bytes([self.ts % 251]) * n, keys=keys,
                               store_timestamp_ms=self.ts))
        for r, res in zip(recs, self.store.append(recs), strict=True):
            q = (r.topic, r.queue_id)
            assert res.queue_offset == self.next_qo[q]
            self.next_qo[q] += 1
            self.recs.append(Stored(res.commit_log_offset, res.size, r.topic, r.queue_id,
                                    res.queue_offset, r.body, r.keys, r.store_timestamp_ms))

    @rule()
    def flush(self) -> None:
        self.flushed = self.store.flush()
        assert self.flushed == self.store.write_offset

    @rule()
    def checkpoint(self) -> None:
        self.store.checkpoint()()

    @rule()
    def clean(self) -> None:
        old_min = self.store.min_offset
        report = self.store.clean(10**12, delete_hour=True)
        event(f"retention deleted {min(len(report.deleted_segments), 1)}+ segments")
        assert report.min_offset == self.store.min_offset >= old_min
        assert self.store.min_offset <= self.flushed or self.store.min_offset == old_min
        self.recs = [r for r in self.recs if r.clo >= self.store.min_offset]

    # -- checks -----------------------------------------------------------------------------------
    @invariant()
    def queues_match_the_model(self) -> None:
        for q in QUEUES:
            mine = [r for r in self.recs if (r.topic, r.qid) == q]
            durable = [r for r in mine if r.clo < self.flushed]
            lo, hi = self.store.queue_bounds(*q)
            assert hi == (durable[-1].qo + 1 if durable else lo), (q, lo, hi)
            if mine:
                assert lo == mine[0].qo
            got = self.store.read_queue(*q, lo, 10_000, 1 << 30)
            assert [(m.queue_offset, m.body) for m in got] == [(r.qo, r.body) for r in durable]

    @invariant()
    def key_queries_match_the_model(self) -> None:
        for key in KEYS:
            for topic in ("a", "b"):
                want = [r.body for r in reversed(self.recs)
                        if r.topic == topic and r.keys == key and r.clo < self.flushed][:64]
                got = self.store.query_by_key(topic, key, 0, 2**62, 64)
                assert [m.body for m in got] == want


class FileStoreMachine(StoreMachine):
    """Adds what only a file store survives: a clean reopen, and a crash tearing unflushed bytes."""

    file = True

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()
        self.flushed = self.store.flushed_offset

    @rule(frac=st.floats(0, 1))
    def crash_tearing_the_unflushed_tail(self, frac: float) -> None:
        assert isinstance(self.store, FileStore)
        end = self.store.write_offset
        cut = self.flushed + int(frac * (end - self.flushed))
        event("crash cut unflushed bytes" if cut < end else "crash with nothing to cut")
        abandon(self.store)
        for seg in sorted((self.dir / "commitlog").iterdir()):
            base = int(seg.name)
            if base > cut:
                seg.unlink()
            elif base == cut and base > 0:  # its creation was fsynced (CommitLog._create): it stays
                with open(seg, "r+b") as f:
                    f.truncate(0)
            elif base + seg.stat().st_size > cut:
                with open(seg, "r+b") as f:
                    f.truncate(cut - base)
        self.store = self._open()
        self.recs = [r for r in self.recs if r.clo + r.size <= cut]
        for q in QUEUES:
            mine = [r.qo for r in self.recs if (r.topic, r.qid) == q]
            if mine:
                self.next_qo[q] = mine[-1] + 1
            else:
                self.next_qo[q] = min(self.next_qo[q], self.store.queue_bounds(*q)[1])
        self.flushed = self.store.flushed_offset
        assert self.store.write_offset == (self.recs[-1].clo + self.recs[-1].size if self.recs
                                           else self.store.min_offset)


_SETTINGS = settings(max_examples=25, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestFileStoreAgainstModel = FileStoreMachine.TestCase
TestFileStoreAgainstModel.settings = _SETTINGS
TestMemoryStoreAgainstModel = StoreMachine.TestCase
TestMemoryStoreAgainstModel.settings = _SETTINGS
