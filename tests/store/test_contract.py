"""One contract suite, run against every Store implementation (MemoryStore, FileStore)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.errors import CorruptRecord
from txmq.store import FileStore, MemoryStore, Record, Store

StoreFactory = Callable[[], Store]


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    stores: list[Store] = []

    def make() -> Store:
        root = tmp_path / f"s{len(stores)}"
        s: Store = MemoryStore() if request.param == "memory" else FileStore(root)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def rec(topic: str, qid: int, body: bytes, **kw: object) -> Record:
    return Record(topic=topic, queue_id=qid, body=body, **kw)  # type: ignore[arg-type]


def test_append_assigns_dense_queue_offsets(make_store: StoreFactory) -> None:
    s = make_store()
    res = s.append([rec("a", 0, b"1"), rec("a", 1, b"2"), rec("a", 0, b"3")])
    assert [r.queue_offset for r in res] == [0, 0, 1]
    assert res[0].commit_log_offset < res[1].commit_log_offset < res[2].commit_log_offset
    s.flush()
    assert s.queue_bounds("a", 0) == (0, 2)
    assert [m.body for m in s.read_queue("a", 0, 0, 10, 1 << 20)] == [b"1", b"3"]
    assert s.queue_ids("a") == [0, 1]


def test_unflushed_records_are_invisible_to_readers(make_store: StoreFactory) -> None:
    s = make_store()
    s.append([rec("a", 0, b"1")])
    assert s.queue_bounds("a", 0) == (0, 0)
    assert s.read_queue("a", 0, 0, 10, 1 << 20) == []
    s.flush()
    assert s.queue_bounds("a", 0) == (0, 1)


def test_read_at_returns_the_record_and_rejects_non_boundaries(make_store: StoreFactory) -> None:
    s = make_store()
    r = s.append([rec("t", 2, b"body", tags="T", keys="k", properties={"p": "v"})])[0]
    m = s.read_at(r.commit_log_offset)
    assert (m.topic, m.queue_id, m.body, m.tags, m.keys, m.properties) == (
        "t", 2, b"body", "T", "k", {"p": "v"})
    with pytest.raises(CorruptRecord):
        s.read_at(r.commit_log_offset + 1)


def test_read_queue_respects_count_and_bytes_but_returns_at_least_one(make_store: StoreFactory) -> None:
    s = make_store()
    s.append([rec("a", 0, b"x" * 100) for _ in range(10)])
    s.flush()
    assert len(s.read_queue("a", 0, 0, 3, 1 << 20)) == 3
    assert len(s.read_queue("a", 0, 0, 10, 250)) == 2
    assert len(s.read_queue("a", 0, 0, 10, 1)) == 1
    assert [m.queue_offset for m in s.read_queue("a", 0, 8, 10, 1 << 20)] == [8, 9]


def test_metadata_round_trip(make_store: StoreFactory) -> None:
    s = make_store()
    assert s.load_meta("x") is None
    s.save_meta("x", b"1")
    s.save_meta("x", b"2")
    assert s.load_meta("x") == b"2"


def test_iter_records_yields_commit_log_order(make_store: StoreFactory) -> None:
    s = make_store()
    res = s.append([rec("a", 0, b"1"), rec("b", 0, b"2")])
    got = [(off, r.topic) for off, r in s.iter_records()]
    assert got == [(res[0].commit_log_offset, "a"), (res[1].commit_log_offset, "b")]


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.binary(max_size=64)),
                max_size=40))
def test_store_matches_a_model(make_store: StoreFactory,
                               ops: list[tuple[str, int, bytes]]) -> None:
    s = make_store()
    model: dict[tuple[str, int], list[bytes]] = {}
    for topic, qid, body in ops:
        s.append([rec(topic, qid, body)])
        model.setdefault((topic, qid), []).append(body)
    s.flush()
    for (topic, qid), bodies in model.items():
        assert s.queue_bounds(topic, qid) == (0, len(bodies))
        assert [m.body for m in s.read_queue(topic, qid, 0, 1000, 1 << 30)] == bodies
