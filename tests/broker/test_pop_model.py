"""Pop against a model, with Hypothesis: random sends, pops, acks, changes of invisible time,
clock steps, ticks and restarts (with and without saved offsets). No message is delivered while
a valid handle of it is out or after it was acked, a handle works exactly until its invisible time,
and at the end every message was acked or is in the DLQ."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from txmq.broker import Popped, dlq_topic
from txmq.errors import InvalidReceiptHandle
from txmq.protocol import PROPERTY_UNIQ_KEY
from txmq.store import FileStore, MemoryStore, Store
from txmq.testing import BrokerHarness

GROUP = "cg"


class PopModel(RuleBasedStateMachine):
    CONFIG: ClassVar[dict[str, Any]] = {"topics": {"t": 2}}
    FILE = False

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="txmq-pop-")) if self.FILE else None
        self.store: Store = FileStore(self.dir) if self.dir else MemoryStore()
        self.h = BrokerHarness(store=self.store, **self.CONFIG)
        self.fifo = self.h.broker.pop.is_fifo(GROUP)
        self.first_seen: dict[int, list[str]] = {0: [], 1: []}  # queue → uniq keys, first pops
        self.queue_of: dict[str, int] = {}
        self.sent: set[str] = set()
        self.acked: set[str] = set()
        self.out: dict[str, tuple[str, int]] = {}  # handle → (uniq key, invisible until)
        self.n = 0

    def _uniq(self, p: Popped) -> str:
        return p.message.properties[PROPERTY_UNIQ_KEY]

    def _valid(self) -> dict[str, tuple[str, int]]:
        return {k: v for k, v in self.out.items() if v[1] > self.h.now_ms}

    @rule(queue_id=st.integers(0, 1))
    def send(self, queue_id: int) -> None:
        self.n += 1
        r = self.h.send(1, "t", b"x", queue_id=queue_id,
                        properties={PROPERTY_UNIQ_KEY: f"U{self.n:05d}"})
        assert r.code == 0
        self.sent.add(f"U{self.n:05d}")
        self.queue_of[f"U{self.n:05d}"] = queue_id

    @rule(n=st.integers(1, 8), inv=st.sampled_from([1_000, 5_000, 20_000]))
    def pop(self, n: int, inv: int) -> None:
        got = self.h.broker.pop.pop(GROUP, "t", None, n, inv, None, self.h.now_ms)
        self.h.store.flush()
        busy = {u for u, _ in self._valid().values()}
        busy_queues = {self.queue_of[u] for u in busy}
        for p in got:
            u = self._uniq(p)
            assert u not in self.acked, f"{u} delivered after its ack"
            assert u not in busy, f"{u} delivered while a valid handle of it is out"
            if self.fifo:
                q = self.queue_of[u]
                assert q not in busy_queues, f"FIFO queue {q} popped while blocked"
                if u not in self.first_seen[q]:
                    self.first_seen[q].append(u)
                    assert self.first_seen[q] == sorted(self.first_seen[q]), "FIFO order broken"
            busy.add(u)
            self.out[p.receipt_handle] = (u, p.invisible_until_ms)

    @precondition(lambda self: bool(self.out))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        handle = data.draw(st.sampled_from(sorted(self.out)))
        u, until = self.out.pop(handle)
        if until > self.h.now_ms:
            self.h.broker.pop.ack(GROUP, "t", handle, self.h.now_ms)
            self.acked.add(u)
        else:
            try:
                self.h.broker.pop.ack(GROUP, "t", handle, self.h.now_ms)
            except InvalidReceiptHandle:
                pass
            else:
                raise AssertionError("an expired handle was accepted")
        self.h.store.flush()

    @precondition(lambda self: bool(self.out))
    @rule(data=st.data(), inv=st.sampled_from([0, 2_000, 30_000]))
    def change(self, data: st.DataObject, inv: int) -> None:
        handle = data.draw(st.sampled_from(sorted(self.out)))
        u, until = self.out.pop(handle)
        if until <= self.h.now_ms:
            return
        new, _ = self.h.broker.pop.change_invisible(GROUP, "t", handle, inv, self.h.now_ms)
        self.h.store.flush()
        self.out[new] = (u, self.h.now_ms + inv)

    @rule(ms=st.sampled_from([0, 500, 1_000, 5_000, 25_000]))
    def advance(self, ms: int) -> None:
        self.h.now_ms += ms
        self.h.broker.tick(self.h.now_ms)
        self.h.store.flush()

    @rule(persist=st.booleans())
    def restart(self, persist: bool) -> None:
        if persist:
            self.h.broker.persist_offsets()
        if self.dir is not None:
            self.store.flush()
            self.store.close()
            self.store = FileStore(self.dir)
        self.h = BrokerHarness(store=self.store, now_ms=self.h.now_ms, **self.CONFIG)

    @invariant()
    def pop_timer_healthy(self) -> None:
        assert "pop" not in self.h.broker.health.errors

    def teardown(self) -> None:
        for _ in range(40):
            self.h.now_ms += 40_000
            self.h.broker.tick(self.h.now_ms)
            self.h.store.flush()
            got = self.h.broker.pop.pop(GROUP, "t", None, 32, 30_000, None, self.h.now_ms)
            self.h.store.flush()
            for p in got:
                assert self._uniq(p) not in self.acked
                self.h.broker.pop.ack(GROUP, "t", p.receipt_handle, self.h.now_ms)
                self.acked.add(self._uniq(p))
            self.h.store.flush()
        dead = {m.properties[PROPERTY_UNIQ_KEY] for m in self.h.all_messages(dlq_topic(GROUP))}
        assert self.sent == self.acked | dead, f"lost: {sorted(self.sent - self.acked - dead)}"
        if self.dir is not None:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)


class FifoPopModel(PopModel):
    CONFIG: ClassVar[dict[str, Any]] = {
        "topics": {"t": 2}, "groups": {GROUP: {"consume_message_orderly": True}}}


class FilePopModel(PopModel):
    FILE = True


PopModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
FifoPopModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
FilePopModel.TestCase.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
test_pop_model = PopModel.TestCase
test_pop_model_fifo = FifoPopModel.TestCase
test_pop_model_file_store = FilePopModel.TestCase
