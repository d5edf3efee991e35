"""Unit tests of the txmq Spark source: offsets, read limits, options, Arrow output.

No broker and no Spark session: a fake pull consumer with the shape of ``txmq.client.PullConsumer``
is injected through ``_source._new_consumer``.
"""

from __future__ import annotations

import enum
import json
import pickle
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)
from pyspark.sql.types import StringType, StructField, StructType

from txmq import limits
from txmq.errors import ConfigError, RemoteError, ResponseCode
from txmq.protocol import MessageExt
from txmq.spark import _source
from txmq.spark._source import (
    ARROW_SCHEMA,
    EARLIEST,
    LATEST,
    SCHEMA,
    DataLossError,
    OffsetSpec,
    QueueRange,
    SourceOptions,
    TxmqBatchReader,
    TxmqDataSource,
    TxmqStreamReader,
    advance_offsets,
    apply_read_limit,
    fair_shares,
    messages_to_record_batch,
    offsets_from_json,
    offsets_to_json,
    read_queue_range,
)

# --- a fake broker + pull consumer ---------------------------------------------------------------


class FakeStatus(enum.Enum):
    FOUND = 0
    NO_NEW_MSG = 1
    OFFSET_ILLEGAL = 2


@dataclass
class FakePullResult:
    status: FakeStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass
class FakeQueue:
    messages: list[MessageExt] = field(default_factory=list)
    min_offset: int = 0
    skip: set[int] = field(default_factory=set)  # offsets the broker "forgets" (a gap bug)
    foreign_at: int | None = None  # offset where a message of another queue is returned


class FakeBroker:
    def __init__(self, pull_cap: int = 1000) -> None:
        self.queues: dict[tuple[str, int], FakeQueue] = {}
        self.pull_cap = pull_cap
        self.created = 0
        self.shut = 0
        self.pulls = 0
        self.group_offsets: dict[tuple[str, int], int] = {}

    def add_topic(self, topic: str, queues: int) -> None:
        for q in range(queues):
            self.queues[(topic, q)] = FakeQueue()

    def send(self, topic: str, queue_id: int, n: int = 1, **kw: str) -> None:
        queue = self.queues[(topic, queue_id)]
        for _ in range(n):
            offset = len(queue.messages)
            queue.messages.append(
                MessageExt(
                    topic=topic,
                    body=f"{topic}-{queue_id}-{offset}".encode(),
                    tags=kw.get("tags", "t"),
                    keys=kw.get("keys", f"k{offset} extra"),
                    properties={"UNIQ_KEY": f"id-{topic}-{queue_id}-{offset}", "b": "2", "a": "1"},
                    queue_id=queue_id,
                    queue_offset=offset,
                    born_timestamp_ms=1_700_000_000_000 + offset,
                    store_timestamp_ms=1_700_000_000_500 + offset,
                )
            )


class FakePullConsumer:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        broker.created += 1

    def _queue(self, topic: str, queue_id: int) -> FakeQueue:
        if not any(t == topic for t, _ in self.broker.queues):
            raise RemoteError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} not exist")
        return self.broker.queues[(topic, queue_id)]

    def queue_ids(self, topic: str) -> list[int]:
        if not any(t == topic for t, _ in self.broker.queues):
            raise RemoteError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} not exist")
        return sorted(q for t, q in self.broker.queues if t == topic)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self._queue(topic, queue_id).messages)

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> FakePullResult:
        self.broker.pulls += 1
        queue = self._queue(topic, queue_id)
        low, high = queue.min_offset, len(queue.messages)
        if offset < low or offset > high:
            return FakePullResult(FakeStatus.OFFSET_ILLEGAL, [], low, low, high)
        if offset == high:
            return FakePullResult(FakeStatus.NO_NEW_MSG, [], offset, low, high)
        out: list[MessageExt] = []
        cursor = offset
        while cursor < high and len(out) < min(max_nums, self.broker.pull_cap):
            if cursor not in queue.skip:
                message = queue.messages[cursor]
                if cursor == queue.foreign_at:
                    message = MessageExt(topic="other", body=b"", queue_id=9, queue_offset=cursor)
                out.append(message)
            cursor += 1
        status = FakeStatus.FOUND if out else FakeStatus.NO_NEW_MSG
        return FakePullResult(status, out, cursor, low, high)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        queue = self._queue(topic, queue_id)
        return next((m.queue_offset for m in queue.messages[queue.min_offset:]
                     if m.store_timestamp_ms >= timestamp_ms), len(queue.messages))

    def fetch_consumer_offset(self, topic: str, queue_id: int) -> int | None:
        self._queue(topic, queue_id)
        return self.broker.group_offsets.get((topic, queue_id))

    def commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        self._queue(topic, queue_id)
        self.broker.group_offsets[(topic, queue_id)] = offset

    def shutdown(self) -> None:
        self.broker.shut += 1


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    fake = FakeBroker()
    fake.add_topic("orders", 3)
    monkeypatch.setattr(_source, "_new_consumer",
                        lambda endpoints, group, namesrv_addr="", timeout_ms=0: FakePullConsumer(fake))
    return fake


def opts(**extra: str) -> SourceOptions:
    return SourceOptions.parse({"endpoints": "127.0.0.1:1", "topic": "orders", **extra})


def rng(start: int, end: int, queue_id: int = 0, fail: bool = True) -> QueueRange:
    return QueueRange("127.0.0.1:1", "g", "orders", queue_id, start, end, fail)


def read_rows(part: QueueRange) -> list[dict[str, object]]:
    return [row for batch in read_queue_range(part) for row in batch.to_pylist()]


# --- options -------------------------------------------------------------------------------------


def test_options_defaults_and_case_insensitive_keys() -> None:
    o = SourceOptions.parse({"ENDPOINTS": " h:1 ", "Topic": "a, b,,a"})
    assert o.endpoints == "h:1"
    assert o.topics == ("a", "b")
    assert o.starting_offsets == OffsetSpec(EARLIEST)
    assert o.ending_offsets == OffsetSpec(LATEST)
    assert o.max_offsets_per_trigger is None
    assert o.fail_on_data_loss is True
    assert o.consumer_group == "txmq-spark"


def test_options_values() -> None:
    o = opts(
        startingOffsets="latest",
        endingOffsets="earliest",
        maxOffsetsPerTrigger="7",
        failOnDataLoss="FALSE",
        consumerGroup="g1",
    )
    assert o.starting_offsets == OffsetSpec(LATEST)
    assert o.ending_offsets == OffsetSpec(EARLIEST)
    assert (o.max_offsets_per_trigger, o.fail_on_data_loss, o.consumer_group) == (7, False, "g1")


def test_options_json_maps_flat_and_nested() -> None:
    o = opts(startingOffsets='{"orders/0": 5, "orders/2": -1}')
    assert o.starting_offsets == OffsetSpec(EARLIEST, {("orders", "", 0): 5, ("orders", "", 2): LATEST})
    o = opts(endingOffsets='{"orders": {"1": 9, "0": -2}}')
    assert o.ending_offsets == OffsetSpec(LATEST, {("orders", "", 1): 9, ("orders", "", 0): EARLIEST})


@pytest.mark.parametrize(
    "extra",
    [
        {"endpoints": ""},
        {"topic": " , "},
        {"topic": "a/b"},
        {"startingOffsets": "soonest"},
        {"startingOffsets": "[1]"},
        {"startingOffsets": '{"orders/x": 1}'},
        {"startingOffsets": '{"orders": 1}'},
        {"startingOffsets": '{"orders/0": -3}'},
        {"startingOffsets": '{"orders/0": true}'},
        {"startingOffsets": '{"orders/0": 1.5}'},
        {"endingOffsets": '{"payments/0": 1}'},
        {"maxOffsetsPerTrigger": "0"},
        {"maxOffsetsPerTrigger": "ten"},
        {"failOnDataLoss": "yes"},
    ],
)
def test_options_rejected(extra: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        SourceOptions.parse({"endpoints": "h:1", "topic": "orders", **extra})


def test_offset_spec_resolve() -> None:
    bounds = {("t", "", 0): (2, 10), ("t", "", 1): (0, 4)}
    assert OffsetSpec(EARLIEST).resolve(bounds) == {("t", "", 0): 2, ("t", "", 1): 0}
    assert OffsetSpec(LATEST).resolve(bounds) == {("t", "", 0): 10, ("t", "", 1): 4}
    assert OffsetSpec(LATEST, {("t", "", 0): 3}).resolve(bounds) == {("t", "", 0): 3, ("t", "", 1): 4}
    with pytest.raises(ConfigError, match="t/7"):
        OffsetSpec(LATEST, {("t", "", 7): 3}).resolve(bounds)


# --- offsets as JSON -----------------------------------------------------------------------------


def test_offsets_json_is_sorted_by_topic_then_numeric_queue() -> None:
    offsets = {("b", "", 0): 1, ("a", "", 10): 2, ("a", "", 2): 3}
    as_json = offsets_to_json(offsets)
    assert list(as_json) == ["a/2", "a/10", "b/0"]
    assert offsets_from_json(json.loads(json.dumps(as_json))) == offsets


@pytest.mark.parametrize("bad", [{"a/0": -1}, {"a/0": "1"}, {"a": 1}, {"a/0": True}])
def test_offsets_from_json_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        offsets_from_json(bad)


# --- fair spreading of maxOffsetsPerTrigger ------------------------------------------------------


def test_fair_shares_examples() -> None:
    assert fair_shares({"a": 100, "b": 100, "c": 100}, 30) == {"a": 10, "b": 10, "c": 10}
    # a small queue gets all it needs, the rest is shared by the others
    assert fair_shares({"a": 2, "b": 100, "c": 100}, 30) == {"a": 2, "b": 14, "c": 14}
    assert fair_shares({"a": 0, "b": 5}, 30) == {"a": 0, "b": 5}
    # the remainder rotates
    assert fair_shares({"a": 9, "b": 9, "c": 9}, 4, rotation=0) == {"a": 2, "b": 1, "c": 1}
    assert fair_shares({"a": 9, "b": 9, "c": 9}, 4, rotation=1) == {"a": 1, "b": 2, "c": 1}
    assert fair_shares({"a": 9, "b": 9, "c": 9}, 1, rotation=5) == {"a": 0, "b": 0, "c": 1}
    with pytest.raises(ValueError):
        fair_shares({"a": 1}, -1)


@given(
    backlogs=st.dictionaries(st.integers(0, 20), st.integers(0, 1000), max_size=12),
    budget=st.integers(0, 3000),
    rotation=st.integers(0, 10_000),
)
def test_fair_shares_properties(backlogs: dict[int, int], budget: int, rotation: int) -> None:
    shares = fair_shares(backlogs, budget, rotation)
    assert set(shares) == set(backlogs)
    assert sum(shares.values()) == min(budget, sum(backlogs.values()))
    assert all(0 <= shares[k] <= backlogs[k] for k in backlogs)
    # max-min fair: a queue left short got at least as much as any other queue, minus one row
    for k in backlogs:
        if shares[k] < backlogs[k]:
            assert all(shares[k] >= shares[j] - 1 for j in backlogs)
    assert fair_shares(backlogs, budget, rotation) == shares


def test_round_robin_with_one_row_per_batch_serves_every_queue() -> None:
    start = {("t", q): 0 for q in range(3)}
    end = {("t", q): 100 for q in range(3)}
    seen = []
    for _ in range(6):
        nxt = apply_read_limit(start, end, ReadMaxRows(1))
        (moved,) = [k for k in nxt if nxt[k] != start[k]]
        seen.append(moved[1])
        start = nxt
    assert sorted(seen) == [0, 0, 1, 1, 2, 2]


def test_apply_read_limit() -> None:
    start = {("t", "", 0): 10, ("t", "", 1): 0}
    end = {("t", "", 0): 20, ("t", "", 1): 3, ("t", "", 2): 50}  # t/2 is a new queue: read from 0
    assert apply_read_limit(start, end, ReadAllAvailable()) == end
    assert apply_read_limit(start, end, ReadMaxRows(100)) == end
    limited = apply_read_limit(start, end, ReadMaxRows(12))
    assert limited == {("t", "", 0): 10 + 5, ("t", "", 1): 3, ("t", "", 2): 4}
    assert apply_read_limit(start, end, ReadMinRows(64)) == start
    assert apply_read_limit(start, end, ReadMinRows(63)) == end
    with pytest.raises(ConfigError):
        apply_read_limit(start, end, ReadMaxBytes(10))


def test_apply_read_limit_keeps_backwards_queue_end() -> None:
    start = {("t", "", 0): 10, ("t", "", 1): 0}
    end = {("t", "", 0): 4, ("t", "", 1): 30}
    assert apply_read_limit(start, end, ReadMaxRows(5)) == {("t", "", 0): 4, ("t", "", 1): 5}


def test_advance_offsets() -> None:
    start = {("t", "", 0): 5, ("gone", "", 0): 7}
    latest = {("t", "", 0): 9, ("t", "", 1): 2}
    assert advance_offsets(start, latest, fail_on_data_loss=True) == {
        ("t", "", 0): 9,
        ("gone", "", 0): 7,
        ("t", "", 1): 2,
    }
    with pytest.raises(DataLossError, match="t/0"):
        advance_offsets(start, {("t", "", 0): 3}, fail_on_data_loss=True)
    assert advance_offsets(start, {("t", "", 0): 3}, fail_on_data_loss=False)[("t", "", 0)] == 3


# --- Arrow conversion ----------------------------------------------------------------------------


def test_arrow_schema_is_what_spark_expects() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_messages_to_record_batch() -> None:
    messages = [
        MessageExt(
            topic="orders",
            body=b"\x00\x01",
            tags="paid",
            keys="k1 k2",
            properties={"UNIQ_KEY": "m1", "z": "1", "a": "2"},
            queue_id=2,
            queue_offset=41,
            born_timestamp_ms=1_700_000_000_123,
            store_timestamp_ms=1_700_000_000_456,
        ),
        MessageExt(topic="orders", body=b"", queue_id=2, queue_offset=42),
    ]
    batch = messages_to_record_batch(messages)
    assert batch.schema.equals(ARROW_SCHEMA)
    first, second = batch.to_pylist()
    assert first["key"] == "k1"
    assert first["tags"] == "paid"
    assert first["body"] == b"\x00\x01"
    assert (first["topic"], first["queue_id"], first["queue_offset"]) == ("orders", 2, 41)
    assert first["message_id"] == "m1"
    assert first["born_timestamp"].isoformat() == "2023-11-14T22:13:20.123000+00:00"
    assert first["store_timestamp"].microsecond == 456_000
    assert first["properties"] == [("UNIQ_KEY", "m1"), ("a", "2"), ("z", "1")]
    assert (second["key"], second["tags"], second["message_id"]) == (None, None, None)
    assert second["properties"] == []


def test_empty_batch_keeps_types() -> None:
    assert messages_to_record_batch([]).schema.equals(ARROW_SCHEMA)


# --- reading a range -----------------------------------------------------------------------------


def test_read_returns_exactly_the_range_in_order(broker: FakeBroker) -> None:
    broker.pull_cap = 3
    broker.send("orders", 0, 20)
    rows = read_rows(rng(4, 11))
    assert [r["queue_offset"] for r in rows] == list(range(4, 11))
    assert [r["body"] for r in rows] == [f"orders-0-{i}".encode() for i in range(4, 11)]
    assert rows == read_rows(rng(4, 11))  # replay: same rows
    assert broker.created == broker.shut == 2


def test_read_chunks_arrow_batches(broker: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_source, "ROWS_PER_ARROW_BATCH", 4)
    broker.send("orders", 1, 10)
    batches = list(read_queue_range(rng(0, 10, queue_id=1)))
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)


def test_read_empty_range_yields_nothing(broker: FakeBroker) -> None:
    broker.send("orders", 0, 3)
    assert list(read_queue_range(rng(3, 3))) == []


def test_read_gap_fails_even_without_fail_on_data_loss(broker: FakeBroker) -> None:
    broker.send("orders", 0, 10)
    broker.queues[("orders", 0)].skip = {5}
    for fail in (True, False):
        with pytest.raises(DataLossError, match="returned offset 6 where 5 was expected"):
            read_rows(rng(0, 10, fail=fail))
    assert broker.created == broker.shut


def test_read_message_of_another_queue_fails(broker: FakeBroker) -> None:
    broker.send("orders", 0, 10)
    broker.queues[("orders", 0)].foreign_at = 3
    with pytest.raises(DataLossError, match="other/9"):
        read_rows(rng(0, 10))


def test_read_below_min_offset(broker: FakeBroker) -> None:
    broker.send("orders", 0, 10)
    broker.queues[("orders", 0)].min_offset = 6
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        read_rows(rng(2, 8))
    rows = read_rows(rng(2, 8, fail=False))
    assert [r["queue_offset"] for r in rows] == [6, 7]
    assert read_rows(rng(2, 5, fail=False)) == []


def test_read_beyond_max_offset(broker: FakeBroker) -> None:
    broker.send("orders", 0, 5)
    with pytest.raises(DataLossError, match="max_offset is 5"):
        read_rows(rng(3, 8))
    assert [r["queue_offset"] for r in read_rows(rng(3, 8, fail=False))] == [3, 4]


def test_read_stops_at_end_although_more_exists(broker: FakeBroker) -> None:
    broker.send("orders", 2, 50)
    rows = read_rows(rng(10, 12, queue_id=2))
    assert [r["queue_offset"] for r in rows] == [10, 11]


# --- the stream reader ---------------------------------------------------------------------------


def stream(**extra: str) -> TxmqStreamReader:
    return TxmqStreamReader(opts(**extra))


def test_initial_offset(broker: FakeBroker) -> None:
    broker.send("orders", 0, 5)
    broker.send("orders", 1, 2)
    broker.queues[("orders", 0)].min_offset = 3
    assert stream().initialOffset() == {"orders/0": 3, "orders/1": 0, "orders/2": 0}
    latest = stream(startingOffsets="latest").initialOffset()
    assert latest == {"orders/0": 5, "orders/1": 2, "orders/2": 0}
    explicit = stream(startingOffsets='{"orders/1": 1}').initialOffset()
    assert explicit == {"orders/0": 3, "orders/1": 1, "orders/2": 0}


def test_unknown_topic_raises_remote_error(broker: FakeBroker) -> None:
    with pytest.raises(RemoteError) as info:
        TxmqStreamReader(SourceOptions.parse({"endpoints": "h:1", "topic": "nope"})).initialOffset()
    assert info.value.code == "TOPIC_NOT_EXIST"


def test_latest_offset_returns_start_when_nothing_new(broker: FakeBroker) -> None:
    reader = stream()
    start = reader.initialOffset()
    roundtrip = json.loads(json.dumps(start))
    assert json.dumps(reader.latestOffset(roundtrip, ReadAllAvailable())) == json.dumps(start)
    broker.send("orders", 1, 3)
    assert reader.latestOffset(roundtrip, ReadAllAvailable()) == {
        "orders/0": 0,
        "orders/1": 3,
        "orders/2": 0,
    }


def test_latest_offset_with_max_rows_and_partitions(broker: FakeBroker) -> None:
    for q, n in ((0, 100), (1, 2), (2, 100)):
        broker.send("orders", q, n)
    reader = stream(maxOffsetsPerTrigger="10")
    assert reader.getDefaultReadLimit() == ReadMaxRows(10)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"orders/0": 4, "orders/1": 2, "orders/2": 4}
    parts = reader.partitions(start, end)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 0, 4), (1, 0, 2), (2, 0, 4)]
    assert sum(len(read_rows(p)) for p in parts) == 10
    # ReadAllAvailable from the engine overrides the option
    assert reader.latestOffset(start, ReadAllAvailable()) == {
        "orders/0": 100,
        "orders/1": 2,
        "orders/2": 100,
    }
    assert reader.reportLatestOffset() == {"orders/0": 100, "orders/1": 2, "orders/2": 100}


def test_default_read_limit_without_option(broker: FakeBroker) -> None:
    reader = stream()
    assert reader.getDefaultReadLimit() == ReadAllAvailable()
    assert reader.reportLatestOffset() is None


def test_partitions_skip_empty_and_new_queues_start_at_zero(broker: FakeBroker) -> None:
    parts = stream().partitions({"orders/0": 5, "orders/1": 3}, {"orders/0": 5, "orders/1": 1, "orders/2": 4})
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(2, 0, 4)]
    assert parts[0] == QueueRange("127.0.0.1:1", "txmq-spark", "orders", 2, 0, 4, True)
    assert pickle.loads(pickle.dumps(parts[0])) == parts[0]


def test_new_queue_appears_between_batches(broker: FakeBroker) -> None:
    reader = stream()
    start = reader.initialOffset()
    broker.queues[("orders", 3)] = FakeQueue()
    broker.send("orders", 3, 2)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["orders/3"] == 2
    assert [(p.queue_id, p.start, p.end) for p in reader.partitions(start, end)] == [(3, 0, 2)]


def test_available_now_pins_target_and_converges(broker: FakeBroker) -> None:
    broker.send("orders", 0, 7)
    broker.send("orders", 2, 3)
    reader = stream(maxOffsetsPerTrigger="4")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    broker.send("orders", 0, 50)  # arrives after the target was pinned
    broker.queues[("orders", 9)] = FakeQueue()
    broker.send("orders", 9, 5)
    batches = 0
    while True:
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if json.dumps(end) == json.dumps(start):
            break
        total = sum(len(read_rows(p)) for p in reader.partitions(start, end))
        assert 0 < total <= 4
        start, batches = end, batches + 1
        assert batches < 10
    assert start == {"orders/0": 7, "orders/1": 0, "orders/2": 3}
    assert batches == 3


def test_latest_offset_backwards(broker: FakeBroker) -> None:
    broker.send("orders", 0, 3)
    start = {"orders/0": 8, "orders/1": 0, "orders/2": 0}
    with pytest.raises(DataLossError, match="max_offset 3"):
        stream().latestOffset(start, ReadAllAvailable())
    end = stream(failOnDataLoss="false").latestOffset(start, ReadAllAvailable())
    assert end["orders/0"] == 3


def test_stream_reader_pickles_without_connection(broker: FakeBroker) -> None:
    reader = stream()
    reader.initialOffset()
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._broker._consumer is None
    reader.stop()
    assert broker.shut == 1
    reader.commit({"orders/0": 1})  # no-op, nothing raised


def test_driver_reconnects_once_after_retriable_error(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txmq.errors import BrokerUnavailable

    reader = stream()
    reader.initialOffset()
    consumer = reader._broker._consumer
    assert isinstance(consumer, FakePullConsumer)

    def broken(*args: object) -> int:
        raise BrokerUnavailable("connection reset")

    monkeypatch.setattr(consumer, "max_offset", broken)
    assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert broker.created == 2 and broker.shut == 1


# --- the batch reader ----------------------------------------------------------------------------


def test_batch_reader_partitions(broker: FakeBroker) -> None:
    broker.send("orders", 0, 10)
    broker.send("orders", 1, 4)
    parts = TxmqBatchReader(opts()).partitions()
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 0, 10), (1, 0, 4)]
    parts = TxmqBatchReader(
        opts(startingOffsets='{"orders/0": 2}', endingOffsets='{"orders": {"0": 5, "1": 0}}')
    ).partitions()
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 2, 5)]
    assert broker.created == broker.shut


@pytest.mark.parametrize(
    "extra",
    [
        {"endingOffsets": '{"orders/0": 11}'},
        {"startingOffsets": '{"orders/0": 6}', "endingOffsets": '{"orders/0": 5}'},
        {"startingOffsets": '{"orders/5": 0}'},
    ],
)
def test_batch_reader_rejects_bad_ranges(broker: FakeBroker, extra: dict[str, str]) -> None:
    broker.send("orders", 0, 10)
    with pytest.raises(ConfigError):
        TxmqBatchReader(opts(**extra)).partitions()


# --- the data source -----------------------------------------------------------------------------


def test_data_source_shape() -> None:
    assert TxmqDataSource.name() == "txmq"
    ds = TxmqDataSource({"endpoints": "h:1", "topic": "orders"})
    assert ds.schema() == SCHEMA
    assert isinstance(ds.streamReader(SCHEMA), TxmqStreamReader)
    assert isinstance(ds.reader(SCHEMA), TxmqBatchReader)
    with pytest.raises(ConfigError, match="fixed schema"):
        ds.reader(StructType([StructField("key", StringType())]))
    with pytest.raises(ConfigError, match="endpoints"):
        TxmqDataSource({"topic": "orders"}).streamReader(SCHEMA)


def test_read_rejects_foreign_partition() -> None:
    from pyspark.sql.datasource import InputPartition

    stream_reader = TxmqStreamReader(opts())
    with pytest.raises(TypeError):
        stream_reader.read(InputPartition(1))


def test_importing_txmq_spark_does_not_import_pyspark() -> None:
    code = (
        "import sys, txmq.spark; "
        "assert 'pyspark' not in sys.modules and 'pyarrow' not in sys.modules; "
        "assert callable(txmq.spark.register); "
        "assert txmq.spark.TxmqDataSource.name() == 'txmq'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_name_server_address_stands_in_for_the_broker_address() -> None:
    from txmq.spark._sink import SinkOptions

    opts = _source.SourceOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t"})
    assert (opts.endpoints, opts.namesrv_addr) == ("", "127.0.0.1:9876")
    assert all(r.namesrv_addr == "127.0.0.1:9876"
               for r in _source._plan_ranges(opts, {("t", "", 0): 0}, {("t", "", 0): 5}))
    sink = SinkOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "sinkId": "s"})
    assert (sink.endpoints, sink.namesrv_addr) == ("", "127.0.0.1:9876")
    with pytest.raises(ConfigError, match="namesrvAddr"):
        _source.SourceOptions.parse({"topic": "t"})
    with pytest.raises(ConfigError, match="namesrvAddr"):
        SinkOptions.parse({"topic": "t", "sinkId": "s"})


def test_timeout_ms_reaches_every_consumer_and_rejects_bad_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []

    def new_consumer(endpoints: str, group: str, namesrv_addr: str = "",
                     timeout_ms: int = 0) -> FakePullConsumer:
        made.append(timeout_ms)
        fake = FakeBroker()
        fake.add_topic("orders", 1)
        return FakePullConsumer(fake)

    monkeypatch.setattr(_source, "_new_consumer", new_consumer)
    assert opts().timeout_ms == limits.REQUEST_TIMEOUT_MS
    o = opts(timeoutMs="1500")
    reader = TxmqStreamReader(o)
    reader.initialOffset()
    ranges = _source._plan_ranges(o, {("orders", "", 0): 0}, {("orders", "", 0): 5})
    assert made == [1500] and [r.timeout_ms for r in ranges] == [1500]
    for bad in ("0", "-5", "1.5", "soon"):
        with pytest.raises(ConfigError, match="timeoutMs: expected an integer > 0"):
            opts(timeoutMs=bad)
