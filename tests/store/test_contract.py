"""One contract suite, run against every Store implementation (MemoryStore, FileStore)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.errors import CorruptRecord, DiskFull, StoreError
from txmq.store import FileStore, MemoryStore, Record, Store, StoreConfig

StoreFactory = Callable[..., Store]
SMALL = StoreConfig(mapped_file_size_commit_log=64 * 1024)
HOUR_MS = 3_600_000


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    stores: list[Store] = []

    def make(config: StoreConfig | None = None, **kw: Any) -> Store:
        root = tmp_path / f"s{len(stores)}"
        s: Store = (MemoryStore(config, **kw) if request.param == "memory"
                    else FileStore(root, config, **kw))
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def rec(topic: str, qid: int, body: bytes, **kw: Any) -> Record:
    return Record(topic=topic, queue_id=qid, body=body, **kw)


def test_append_assigns_dense_queue_offsets(make_store: StoreFactory) -> None:
    s = make_store()
    res = s.append([rec("a", 0, b"1"), rec("a", 1, b"2"), rec("a", 0, b"3")])
    assert [r.queue_offset for r in res] == [0, 0, 1]
    assert res[0].commit_log_offset < res[1].commit_log_offset < res[2].commit_log_offset
    assert res[1].commit_log_offset == res[0].commit_log_offset + res[0].size
    s.flush()
    assert s.queue_bounds("a", 0) == (0, 2)
    assert [m.body for m in s.read_queue("a", 0, 0, 10, 1 << 20)] == [b"1", b"3"]
    assert s.queue_ids("a") == [0, 1]
    assert s.commit_log_offset_at("a", 0, 1) == res[2].commit_log_offset
    assert s.commit_log_offset_at("a", 0, 2) is None


def test_unflushed_records_are_invisible_to_readers(make_store: StoreFactory) -> None:
    s = make_store()
    r = s.append([rec("a", 0, b"1", keys="k", properties={"UNIQ_KEY": "ID1"})])[0]
    assert s.queue_bounds("a", 0) == (0, 0)
    assert s.read_queue("a", 0, 0, 10, 1 << 20) == []
    assert s.query_by_key("a", "k", 0, 2**62, 10) == []
    assert s.read_at(r.commit_log_offset).body == b"1"  # read_at sees written records
    assert s.flush() == s.write_offset == s.flushed_offset
    assert s.queue_bounds("a", 0) == (0, 1)
    assert [m.body for m in s.query_by_key("a", "k", 0, 2**62, 10)] == [b"1"]


def test_a_read_limit_caps_what_readers_see_and_only_rises(make_store: StoreFactory) -> None:
    """Controller mode's confirm offset (set_read_limit): records at or past it are invisible to
    consume queue reads and bounds, persisted (checkpointed) ones too; it never falls."""
    s = make_store()
    res = s.append([rec("a", 0, f"{i}".encode(), tags="T") for i in range(6)])
    s.flush()
    s.checkpoint()()  # (FileStore: the entries are in the consume queue files now)
    s.set_read_limit(res[3].commit_log_offset)
    assert s.visible_offset == res[3].commit_log_offset
    assert s.queue_bounds("a", 0) == (0, 3) and s.queue_durable_max("a", 0) == 6
    assert [m.body for m in s.read_queue("a", 0, 0, 10, 1 << 20)] == [b"0", b"1", b"2"]
    assert s.read_queue_raw("a", 0, 3, 10, 1 << 20).count == 0
    s.set_read_limit(res[1].commit_log_offset)  # lower: ignored
    assert s.queue_bounds("a", 0) == (0, 3)
    s.set_read_limit(res[5].commit_log_offset + res[5].size)
    assert s.queue_bounds("a", 0) == (0, 6)
    more = s.append([rec("a", 0, b"6")])
    s.flush()  # flushed past the limit: not visible
    assert s.queue_bounds("a", 0) == (0, 6) and s.queue_durable_max("a", 0) == 7
    s.set_read_limit(None)
    assert s.queue_bounds("a", 0) == (0, 7) and s.visible_offset == s.flushed_offset
    assert more[0].queue_offset == 6


def test_read_at_returns_every_field_and_rejects_non_boundaries(make_store: StoreFactory) -> None:
    s = make_store()
    r = s.append([rec("t", 2, b"body", tags="T", keys="k1 k2", properties={"p": "v"},
                      born_timestamp_ms=5, store_timestamp_ms=7, reconsume_times=3)])[0]
    m = s.read_at(r.commit_log_offset)
    assert (m.topic, m.queue_id, m.body, m.tags, m.keys, m.properties) == (
        "t", 2, b"body", "T", "k1 k2", {"p": "v"})
    assert (m.born_timestamp_ms, m.store_timestamp_ms, m.reconsume_times, m.queue_offset,
            m.commit_log_offset) == (5, 7, 3, 0, r.commit_log_offset)
    with pytest.raises(CorruptRecord):
        s.read_at(r.commit_log_offset + 1)
    with pytest.raises(CorruptRecord):
        s.read_at(s.write_offset)


def test_read_queue_respects_count_and_bytes_but_returns_at_least_one(make_store: StoreFactory) -> None:
    s = make_store()
    s.append([rec("a", 0, b"x" * 100) for _ in range(10)])
    s.flush()
    assert len(s.read_queue("a", 0, 0, 3, 1 << 20)) == 3
    assert len(s.read_queue("a", 0, 0, 10, 250)) == 2
    assert len(s.read_queue("a", 0, 0, 10, 1)) == 1
    assert [m.queue_offset for m in s.read_queue("a", 0, 8, 10, 1 << 20)] == [8, 9]
    assert s.read_queue("a", 0, 10, 10, 1 << 20) == []
    assert s.read_queue("a", 0, -1, 10, 1 << 20) == []
    assert s.read_queue("nope", 0, 0, 10, 1 << 20) == []


def test_a_batch_is_all_or_nothing(make_store: StoreFactory) -> None:
    s = make_store()
    s.append([rec("a", 0, b"1")])
    before = s.write_offset
    with pytest.raises(StoreError):
        s.append([rec("a", 0, b"2"), rec("x" * 70_000, 0, b"3")])
    assert s.write_offset == before
    assert s.append([rec("a", 0, b"4")])[0].queue_offset == 1
    s.flush()
    assert [m.body for m in s.read_queue("a", 0, 0, 10, 1 << 20)] == [b"1", b"4"]


def test_metadata_round_trip(make_store: StoreFactory) -> None:
    s = make_store()
    assert s.load_meta("x") is None
    s.save_meta("x", b"1")
    s.save_meta("x", b"2")
    assert s.load_meta("x") == b"2"


def test_iter_records_in_commit_log_order_from_an_offset_or_by_topic(
        make_store: StoreFactory) -> None:
    s = make_store()
    res = s.append([rec("a", 0, b"1"), rec("b", 0, b"2"), rec("a", 1, b"3"), rec("c", 0, b"4")])
    s.flush()
    got = [(off, r.topic) for off, r in s.iter_records()]
    assert got == [(r.commit_log_offset, t) for r, t in zip(res, "abac", strict=True)]
    assert [r.topic for _, r in s.iter_records(res[2].commit_log_offset)] == ["a", "c"]
    assert [r.body for _, r in s.iter_records(topics=("a", "c"))] == [b"1", b"3", b"4"]
    assert [r.body for _, r in s.iter_records(res[1].commit_log_offset, topics=("a",))] == [b"3"]


def test_segments_roll_at_the_configured_size_and_offsets_match_across_stores(
        make_store: StoreFactory, tmp_path: Path) -> None:
    s = make_store(SMALL)
    model = MemoryStore(SMALL)
    batches = [[rec("a", i % 3, bytes([i]) * (1000 + 500 * i)) for i in range(j % 5 + 1)]
               for j in range(60)]
    for b in batches:
        got = s.append([r.__copy__() for r in b])
        want = model.append([r.__copy__() for r in b])
        assert got == want
    s.flush()
    assert s.write_offset > 4 * 64 * 1024
    for qid in range(3):
        assert [m.body for m in s.read_queue("a", qid, 0, 1000, 1 << 30)] == [
            r.body for b in batches for r in b if r.queue_id == qid]


def test_query_by_key_and_by_msg_id(make_store: StoreFactory) -> None:
    s = make_store()
    s.append([rec("t", 0, b"1", keys="order-1 cust-9", store_timestamp_ms=1000,
                  properties={"UNIQ_KEY": "A"}),
              rec("t", 1, b"2", keys="order-2", store_timestamp_ms=2000, properties={"UNIQ_KEY": "B"}),
              rec("u", 0, b"3", keys="order-1", store_timestamp_ms=3000, properties={"UNIQ_KEY": "C"}),
              rec("t", 0, b"4", keys="order-1", store_timestamp_ms=4000, properties={"UNIQ_KEY": "A"})])
    s.flush()
    assert [m.body for m in s.query_by_key("t", "order-1", 0, 10_000, 10)] == [b"4", b"1"]
    assert [m.body for m in s.query_by_key("t", "order-1", 0, 2_000, 10)] == [b"1"]
    assert [m.body for m in s.query_by_key("t", "order-1", 0, 10_000, 1)] == [b"4"]
    assert [m.body for m in s.query_by_key("t", "cust-9", 0, 10_000, 10)] == [b"1"]
    assert s.query_by_key("t", "order-3", 0, 10_000, 10) == []
    assert [m.body for m in s.query_by_msg_id("A", 10)] == [b"4", b"1"]
    assert [m.topic for m in s.query_by_msg_id("C", 10)] == ["u"]


def test_retention_deletes_expired_segments_at_the_delete_hour_only(make_store: StoreFactory) -> None:
    # the disk is "half full": on a real disk above diskMaxUsedSpaceRatio (75 %) RocketMQ's rule, and
    # the store's, is to delete outside the delete hour too, which a fuller CI disk once triggered
    s = make_store(SMALL, disk_usage=lambda: 0.5)
    for i in range(40):
        s.append([rec("a", 0, b"x" * 5000, store_timestamp_ms=i * HOUR_MS)])
    s.flush()
    now = 39 * HOUR_MS + 72 * HOUR_MS  # everything older than 72 h except the newest hour
    assert s.clean(now, delete_hour=False).deleted_segments == []
    report = s.clean(now, delete_hour=True)
    assert report.deleted_segments and report.deleted_segments[0] == 0
    assert s.min_offset == report.min_offset > 0
    lo, hi = s.queue_bounds("a", 0)
    assert 0 < lo < hi == 40
    assert s.read_queue("a", 0, 0, 10, 1 << 20) == []
    assert s.read_queue("a", 0, lo, 1, 1 << 20)[0].queue_offset == lo
    assert s.commit_log_offset_at("a", 0, lo - 1) is None
    with pytest.raises(CorruptRecord):
        s.read_at(0)
    assert s.append([rec("a", 0, b"new")])[0].queue_offset == 40


def test_retention_never_deletes_what_a_hook_needs_unless_forced(make_store: StoreFactory) -> None:
    usage = [0.5]
    s = make_store(SMALL, disk_usage=lambda: usage[0])
    res = [s.append([rec("a", 0, b"x" * 5000, store_timestamp_ms=0)])[0] for _ in range(40)]
    s.flush()
    needed = res[20].commit_log_offset
    s.set_retention_hook("group g", lambda: needed)
    s.set_retention_hook("idle", lambda: None)
    report = s.clean(200 * HOUR_MS, delete_hour=True)
    assert s.min_offset <= needed and report.held == {"group g": needed}
    assert s.read_at(needed).body == b"x" * 5000
    usage[0] = 0.86  # above disk_space_clean_forcibly_ratio: deleted, and said so
    report = s.clean(200 * HOUR_MS, delete_hour=False)
    assert report.deleted_needed == {"group g": needed}
    s.set_retention_hook("group g", None)


def test_disk_pressure_cleans_young_segments_only_above_the_forcibly_ratio(
        make_store: StoreFactory) -> None:
    usage = [0.80]
    s = make_store(SMALL, disk_usage=lambda: usage[0])
    for _ in range(40):
        s.append([rec("a", 0, b"x" * 5000, store_timestamp_ms=0)])
    s.flush()
    assert s.clean(HOUR_MS, delete_hour=True).deleted_segments == []  # young, disk fine
    usage[0] = 0.86
    report = s.clean(HOUR_MS, delete_hour=False)
    assert 0 < len(report.deleted_segments) <= s.config.delete_files_batch_max


def test_writes_are_refused_when_the_disk_is_nearly_full_and_resume(make_store: StoreFactory) -> None:
    usage = [0.5]
    s = make_store(disk_usage=lambda: usage[0])
    s.append([rec("a", 0, b"1")])
    usage[0] = 0.91
    assert s.check_disk().writable is False
    before = s.write_offset
    with pytest.raises(DiskFull) as exc:
        s.append([rec("a", 0, b"2")])
    assert exc.value.retriable and "91" in str(exc.value)
    assert s.write_offset == before
    usage[0] = 0.87  # between the ratios: still refused (hysteresis, as RocketMQ)
    assert s.check_disk().writable is False
    usage[0] = 0.85
    assert s.check_disk().writable is True
    assert s.append([rec("a", 0, b"3")])[0].queue_offset == 1
    s.flush()
    assert [m.body for m in s.read_queue("a", 0, 0, 10, 1 << 20)] == [b"1", b"3"]


def test_flush_from_another_thread_while_appending(make_store: StoreFactory) -> None:
    s = make_store(SMALL)
    stop = threading.Event()

    def flusher() -> None:
        while not stop.is_set():
            s.flush()

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(2000):
            s.append([rec("a", i % 2, str(i).encode() * 20)])
            if i % 100 == 0:
                s.checkpoint()()
    finally:
        stop.set()
        t.join()
    s.flush()
    assert s.queue_bounds("a", 0) == (0, 1000)
    assert [int(m.body[: len(m.body) // 20]) for m in s.read_queue("a", 1, 0, 2000, 1 << 30)] == list(
        range(1, 2000, 2))


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
