"""Unit tests of where the source starts and ends: ``latest`` pinned across re-evaluations,
timestamps, and starting offsets outside the retained range (a fake broker, no Spark session)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import StructType
from test_source_unit import FakeBroker, FakePullConsumer, opts

from txmq.errors import ConfigError
from txmq.spark import _source
from txmq.spark._offsets import OffsetSpec, check_start, with_timestamps
from txmq.spark._source import (
    EARLIEST,
    LATEST,
    SCHEMA,
    DataLossError,
    SourceOptions,
    TxmqBatchReader,
    TxmqDataSource,
    TxmqStreamReader,
)


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    fake = FakeBroker()
    fake.add_topic("orders", 3)
    monkeypatch.setattr(_source, "_new_consumer",
                        lambda endpoints, group, namesrv_addr="", timeout_ms=0: FakePullConsumer(fake))
    return fake


def fresh(**extra: str) -> TxmqStreamReader:
    return TxmqStreamReader(opts(consumerGroup="q1", **extra))


def test_latest_is_pinned_on_the_broker_across_fresh_readers(broker: FakeBroker) -> None:
    broker.send("orders", 0, 5)
    first = fresh(startingOffsets="latest")
    pinned = first.initialOffset()
    assert pinned == {"orders/0": 5, "orders/1": 0, "orders/2": 0}
    assert broker.group_offsets == {("orders", 0): 5, ("orders", 1): 0, ("orders", 2): 0}
    broker.send("orders", 0, 3)
    broker.send("orders", 1, 2)
    assert first.initialOffset() == pinned  # same reader: Spark's second call in batch 0
    assert fresh(startingOffsets="latest").initialOffset() == pinned  # a restart's new reader
    assert fresh(startingOffsets='{"orders/1": -1}').initialOffset() == pinned


def test_earliest_and_explicit_starts_store_nothing(broker: FakeBroker) -> None:
    broker.send("orders", 0, 5)
    assert fresh().initialOffset() == {"orders/0": 0, "orders/1": 0, "orders/2": 0}
    assert fresh(startingOffsets='{"orders/0": 2}').initialOffset()["orders/0"] == 2
    assert broker.group_offsets == {}


def test_latest_in_a_stream_needs_its_own_consumer_group() -> None:
    source = TxmqDataSource({"endpoints": "h:1", "topic": "orders", "startingOffsets": "latest"})
    with pytest.raises(ConfigError, match="consumerGroup"):
        source.streamReader(SCHEMA)
    source = TxmqDataSource({"endpoints": "h:1", "topic": "orders", "startingOffsets": "latest",
                             "consumerGroup": "mine"})
    assert isinstance(source.streamReader(SCHEMA), TxmqStreamReader)
    batch = TxmqDataSource({"endpoints": "h:1", "topic": "orders", "startingOffsets": "latest"})
    assert isinstance(batch.reader(SCHEMA), TxmqBatchReader)
    ending = TxmqDataSource({"endpoints": "h:1", "topic": "orders", "endingTimestamp": "5"})
    with pytest.raises(ConfigError, match="batch reads only"):
        ending.streamReader(StructType(SCHEMA.fields))


def test_timestamp_options_parse_and_take_precedence() -> None:
    o = opts(startingTimestamp="1700000000502", startingOffsetsByTimestamp='{"orders/1": 7}',
             endingOffsetsByTimestamp='{"orders": {"2": 9}}')
    assert o.starting_offsets.default_ms == 1_700_000_000_502
    assert o.starting_offsets.by_time([("orders", "", 0), ("orders", "", 1)]) == {
        ("orders", "", 0): 1_700_000_000_502, ("orders", "", 1): 1_700_000_000_502}
    assert o.ending_offsets.by_time([("orders", "", 0), ("orders", "", 2)]) == {("orders", "", 2): 9}
    assert not OffsetSpec(LATEST, default_ms=3).uses_latest()
    assert not OffsetSpec(EARLIEST, {("t", "", 0): LATEST}, explicit_ms={("t", "", 0): 1}).uses_latest()
    assert OffsetSpec(0, {("t", "", 0): LATEST}).uses_latest()
    for bad in ({"startingTimestamp": "-1"}, {"startingTimestamp": "soon"},
                {"endingOffsetsByTimestamp": '{"orders/0": -2}'},
                {"startingOffsetsByTimestamp": '{"other/0": 1}'}):
        with pytest.raises(ConfigError):
            opts(**bad)
    with pytest.raises(ConfigError, match="endingTimestamp"):
        with_timestamps(OffsetSpec(LATEST), "x", None, ("endingTimestamp", "endingOffsetsByTimestamp"))


def test_batch_read_by_timestamp(broker: FakeBroker) -> None:
    broker.send("orders", 0, 10)  # store timestamps 1_700_000_000_500 + offset
    broker.send("orders", 1, 3)
    reader = TxmqBatchReader(opts(startingTimestamp="1700000000504", endingTimestamp="1700000000508"))
    ranges = {(p.queue_id, p.start, p.end) for p in reader.partitions()}  # type: ignore[attr-defined]
    assert ranges == {(0, 4, 8)}  # queue 1's messages are all older: it starts and ends at its end
    by_queue = TxmqBatchReader(opts(startingOffsetsByTimestamp='{"orders/0": 1700000000507}'))
    ranges = {(p.queue_id, p.start, p.end) for p in by_queue.partitions()}  # type: ignore[attr-defined]
    assert ranges == {(0, 7, 10), (1, 0, 3)}  # queue 1 falls back to startingOffsets (earliest)


def test_starts_outside_the_retained_range_fail_at_planning(broker: FakeBroker) -> None:
    broker.send("orders", 0, 10)
    broker.queues[("orders", 0)].min_offset = 4
    with pytest.raises(DataLossError, match=r"orders/0.*below min_offset 4"):
        fresh(startingOffsets='{"orders/0": 2}').initialOffset()
    with pytest.raises(DataLossError, match="orders/0"):
        TxmqBatchReader(opts(startingOffsets='{"orders/0": 2}')).partitions()
    lenient = fresh(startingOffsets='{"orders/0": 2}', failOnDataLoss="false")
    assert lenient.initialOffset()["orders/0"] == 2  # the read skips 2..3 with a warning
    with pytest.raises(ConfigError, match="beyond its max_offset 10"):
        fresh(startingOffsets='{"orders/0": 11}').initialOffset()
    with pytest.raises(ConfigError, match="beyond its max_offset 0"):
        TxmqBatchReader(opts(startingOffsets='{"orders/1": 1}')).partitions()


def test_check_start_ignores_queues_it_has_no_bounds_for() -> None:
    check_start({("t", "", 0): 5}, {}, fail_on_data_loss=True)
    with pytest.raises(ConfigError):
        check_start({("t", "", 0): 5}, {("t", "", 0): (0, 4)}, fail_on_data_loss=False)


def test_options_keep_whether_the_group_was_given() -> None:
    assert not SourceOptions.parse({"endpoints": "h:1", "topic": "t"}).consumer_group_set
    assert SourceOptions.parse({"endpoints": "h:1", "topic": "t", "consumergroup": "g"}).consumer_group_set
