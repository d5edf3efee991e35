"""System records (issue #25 item 4): the sans-IO coalescer, the body decoder's refusals, the CRC
over a system record, and a master's offsets, delay progress and topics reaching a slave store
through its replicated bytes (FileStores, no processes: tests/broker/test_replication.py has those).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.broker import Broker, BrokerConfig
from txmq.broker._meta_log import (
    CONSUMER_OFFSET_TOPIC,
    DELAY_OFFSET_TOPIC,
    META_TOPICS,
    TOPIC_CONFIG_TOPIC,
    DelayBody,
    MetaCoalescer,
    OffsetBody,
    TopicBody,
    decode_meta,
    encode_meta,
)
from txmq.errors import CorruptRecord, InvalidRequest
from txmq.store import FileStore, Record, StoreConfig
from txmq.store.codec import decode_record


def _offsets(bodies: list[tuple[str, bytes]]) -> dict[tuple[str, str, int], int]:
    out: dict[tuple[str, str, int], int] = {}
    for topic, body in bodies:
        dec = decode_meta(topic, body, 0)
        if isinstance(dec, OffsetBody):
            out.update({(g, t, q): o for g, t, q, o in dec.e})
    return out


def test_a_commit_storm_makes_one_record_per_interval_with_the_latest_offsets() -> None:
    c = MetaCoalescer(interval_ms=1000)
    for i in range(10_000):
        c.offset("g", "t", i % 4, i)
    first = c.take(now_ms=0)
    assert [t for t, _ in first] == [CONSUMER_OFFSET_TOPIC]
    assert _offsets(first) == {("g", "t", q): 9996 + q for q in range(4)}
    c.offset("g", "t", 0, 10_001)
    assert c.take(now_ms=999) == []  # within the interval: held
    assert _offsets(c.take(now_ms=1000)) == {("g", "t", 0): 10_001}
    assert c.take(now_ms=5000) == []  # nothing changed: nothing written


def test_many_changed_keys_split_into_bounded_records() -> None:
    c = MetaCoalescer(interval_ms=0, entries_max=100)
    for q in range(250):
        c.offset("g", "t", q % 1000, q)
    out = c.take(0)
    assert [len(decode_meta(t, b, 0).e) for t, b in out] == [100, 100, 50]  # type: ignore[union-attr]


def test_delay_progress_is_recorded_only_when_it_moved_and_untake_gives_changes_back() -> None:
    c = MetaCoalescer(interval_ms=0)
    c.delays({1: 5, 2: 0})
    taken = c.take(0)
    want = [(DELAY_OFFSET_TOPIC, DelayBody([(1, 5), (2, 0)]))]
    assert [(t, decode_meta(t, b, 0)) for t, b in taken] == want
    c.delays({1: 5, 2: 0})
    assert c.take(1) == []
    c.delays({1: 7, 2: 0})
    c.offset("g", "t", 0, 3)
    taken = c.take(2)
    c.untake(taken)  # the append failed
    c.offset("g", "t", 0, 4)  # a newer value wins over the given-back one
    again = c.take(3)
    assert _offsets(again) == {("g", "t", 0): 4}
    assert DelayBody([(1, 7)]) in [decode_meta(t, b, 0) for t, b in again]


@pytest.mark.parametrize(("topic", "body", "why"), [
    (CONSUMER_OFFSET_TOPIC, b"{not json", "does not decode"),
    (CONSUMER_OFFSET_TOPIC, b'{"e": [["g", "t", 0]]}', "does not decode"),
    (CONSUMER_OFFSET_TOPIC, b'{"e": [["g", "t", 0, -2]]}', "out of range"),
    (CONSUMER_OFFSET_TOPIC, b'{"e": [["g", "t", 99999, 1]]}', "out of range"),
    (CONSUMER_OFFSET_TOPIC, b'{"e": [["g", "bad topic!", 0, 1]]}', "refused"),
    (CONSUMER_OFFSET_TOPIC, b'{"e": [["", "t", 0, 1]]}', "group name"),
    (CONSUMER_OFFSET_TOPIC, b'{"e": [], "x": 1}', "does not decode"),
    (DELAY_OFFSET_TOPIC, b'{"e": [[0, 1]]}', "out of range"),
    (TOPIC_CONFIG_TOPIC, b'{"t": "t", "n": 5000}', "queue count"),
    (TOPIC_CONFIG_TOPIC, b'{"t": "a/b", "n": 1}', "refused"),
    ("rmq_sys_OTHER", b"{}", "not a system metadata topic"),
])
def test_a_hostile_body_is_refused_with_a_clear_error(topic: str, body: bytes, why: str) -> None:
    with pytest.raises(CorruptRecord, match=why) as exc:
        decode_meta(topic, body, 17)
    assert topic in str(exc.value)


def test_a_good_body_round_trips() -> None:
    for topic, body in [(CONSUMER_OFFSET_TOPIC, OffsetBody([("g", "%RETRY%g", 3, -1)])),
                        (DELAY_OFFSET_TOPIC, DelayBody([(18, 4)])),
                        (TOPIC_CONFIG_TOPIC, TopicBody("orders", 0))]:
        assert decode_meta(topic, encode_meta(body), 0) == body


def test_a_system_record_with_a_flipped_byte_fails_its_crc(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s", StoreConfig())
    body = encode_meta(OffsetBody([("g", "t", 0, 42)]))
    [res] = store.append([Record(topic=CONSUMER_OFFSET_TOPIC, queue_id=0, body=body)])
    store.flush()
    raw = bytearray(store.read_log(res.commit_log_offset, res.size))
    store.close()
    decode_record(memoryview(raw), 0, res.commit_log_offset)  # intact: passes
    at = raw.find(b"42")
    raw[at] = ord("9")
    with pytest.raises(CorruptRecord, match="CRC"):
        decode_record(memoryview(raw), 0, res.commit_log_offset)


def _ship(master: FileStore, slave: FileStore) -> None:
    master.flush()
    while (at := slave.write_offset) < master.write_offset:
        slave.append_replica(at, master.read_log(at, 1 << 30))
    slave.flush()


def test_offsets_delay_progress_and_topics_follow_the_replicated_log(tmp_path: Path) -> None:
    cfg = BrokerConfig(topics={"t": 2}).validate()
    mstore, sstore = FileStore(tmp_path / "m", StoreConfig()), FileStore(tmp_path / "s", StoreConfig())
    master = Broker(cfg, mstore, 0)
    slave_cfg = msgspec.structs.replace(cfg, broker_role="SLAVE", broker_id=1, topics={}).validate()
    slave = Broker(slave_cfg, sstore, 0)
    master.set_offset("g", "t", 1, 7)
    master.schedule.offsets[2] = 3  # (as a delivery would move it)
    master.create_topic("orders", 4)
    master.tick(10_000)
    for i in range(500):  # a storm between two intervals: one more record
        master.set_offset("g", "t", 0, i)
    master.tick(10_050)  # within the interval: nothing written yet
    _ship(master.store, sstore)  # type: ignore[arg-type]
    slave.tick(10_060)
    assert slave.offsets.get("g", "t", 1) == 7 and slave.offsets.get("g", "t", 0) is None
    assert slave.topics.get("orders") == 4 and slave.schedule.offsets[2] == 3
    master.tick(11_000)
    master.offsets.reset("g", "t")
    master.topics.delete("orders")
    master.tick(12_000)
    assert mstore.queue_bounds(CONSUMER_OFFSET_TOPIC, 0)[1] <= 3
    _ship(mstore, sstore)
    slave.tick(12_010)
    assert slave.offsets.get("g", "t", 0) is None and slave.offsets.get("g", "t", 1) is None
    assert "orders" not in slave.topics
    assert slave.meta.refused == 0 and slave.meta.applied == mstore.queue_bounds(
        CONSUMER_OFFSET_TOPIC, 0)[1] + mstore.queue_bounds(DELAY_OFFSET_TOPIC, 0)[1] + \
        mstore.queue_bounds(TOPIC_CONFIG_TOPIC, 0)[1]


def test_a_restarted_broker_replays_records_newer_than_its_saved_tables(tmp_path: Path) -> None:
    cfg = BrokerConfig(topics={"t": 2}).validate()
    store = FileStore(tmp_path / "m", StoreConfig())
    b = Broker(cfg, store, 0)
    b.set_offset("g", "t", 0, 5)
    b.tick(10_000)
    b.persist_offsets()  # tables and position saved together
    b.set_offset("g", "t", 0, 9)
    b.tick(11_000)  # a record after the saved position; the table file still says 5
    store.flush()
    store.close()
    again = Broker(cfg, FileStore(tmp_path / "m", StoreConfig()), 0)
    assert again.offsets.get("g", "t", 0) == 9
    assert again.meta.position[CONSUMER_OFFSET_TOPIC] == 2


def test_clients_cannot_send_to_system_topics() -> None:
    from txmq.protocol import check_send_topic
    for topic in META_TOPICS:
        with pytest.raises(InvalidRequest):
            check_send_topic(topic)


@given(topic=st.sampled_from(META_TOPICS),
       body=st.one_of(st.binary(max_size=200),
                      st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                                   lambda c: st.lists(c, max_size=5)
                                   | st.dictionaries(st.sampled_from(["e", "t", "n", "x"]), c,
                                                     max_size=3),
                                   max_leaves=20).map(msgspec.json.encode)))
@settings(max_examples=400, deadline=None)
def test_any_body_decodes_or_is_refused_with_corrupt_record(topic: str, body: bytes) -> None:
    try:
        out = decode_meta(topic, body, 0)
    except CorruptRecord as exc:
        assert topic in str(exc)
    else:
        assert decode_meta(topic, encode_meta(out), 0) == out


def test_an_idle_master_writes_no_system_record(tmp_path: Path) -> None:
    b = Broker(BrokerConfig(topics={"t": 2}).validate(), FileStore(tmp_path / "m", StoreConfig()), 0)
    before = b.store.write_offset
    for now in range(0, 20_000, 100):
        b.tick(now)
    assert b.store.write_offset == before
    b.set_offset("g", "t", 0, 1)
    b.tick(20_000)
    assert b.store.write_offset > before
