"""The source's partition planning (ranges split beyond ``PARTITION_ROWS_MAX``) and its read path
over raw pull replies (``pull_raw`` + the bulk decoder), against a scripted consumer that answers
with real RocketMQ wire bytes. No broker and no Spark session.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.protocol import MessageExt, encode_message_exts
from txmq.spark import _source
from txmq.spark._offsets import EARLIEST, LATEST
from txmq.spark._source import (
    ARROW_SCHEMA,
    DataLossError,
    QueueRange,
    SourceOptions,
    read_queue_range,
    split_range,
)

# --- planning ------------------------------------------------------------------------------------


@given(st.integers(0, 10**6), st.integers(0, 5_000), st.integers(1, 700))
def test_split_range_covers_the_range_in_even_bounded_pieces(start: int, rows: int, rows_max: int
                                                             ) -> None:
    pieces = split_range(start, start + rows, rows_max)
    assert [o for low, high in pieces for o in range(low, high)] == list(range(start, start + rows))
    sizes = [high - low for low, high in pieces]
    assert all(0 < s <= rows_max for s in sizes)
    assert len(pieces) == -(-rows // rows_max)
    assert sizes == sorted(sizes, reverse=True) and (not sizes or sizes[0] - sizes[-1] <= 1)


def test_split_range_rejects_a_zero_bound() -> None:
    with pytest.raises(ValueError, match="rows_max"):
        split_range(0, 10, 0)


def test_plan_splits_only_the_long_queue_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_source, "PARTITION_ROWS_MAX", 10)
    opts = SourceOptions(endpoints="b:1", topics=("t",), starting_offsets=EARLIEST,
                         ending_offsets=LATEST, max_offsets_per_trigger=None,
                         fail_on_data_loss=True, consumer_group="g")
    start = {("t", "", 0): 5, ("t", "", 1): 0}
    ranges = _source._plan_ranges(opts, start, {("t", "", 0): 30, ("t", "", 1): 7, ("t", "", 2): 0})
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [(0, 5, 14), (0, 14, 22), (0, 22, 30),
                                                               (1, 0, 7)]
    # the same offsets give the same partitions (Spark replays a batch's planned range)
    again = _source._plan_ranges(opts, start, {("t", "", 0): 30, ("t", "", 1): 7})
    assert again == ranges


# --- reading over raw pull replies ---------------------------------------------------------------


class Status(enum.Enum):
    FOUND = 0
    NO_NEW_MSG = 1


@dataclass
class Raw:
    status: Status
    body: bytes
    next_begin_offset: int


@dataclass
class RawConsumer:
    """One queue ``orders/0`` of ``size`` messages answered as wire bytes; ``deleted`` offsets are
    below ``low`` (retention), ``foreign_at`` answers a message of another queue."""

    size: int
    pull_cap: int = 3
    low: int = 0
    foreign_at: int | None = None
    requests: list[tuple[int, int]] = field(default_factory=list)

    def message(self, offset: int) -> MessageExt:
        queue_id = 9 if offset == self.foreign_at else 0
        return MessageExt(topic="orders", body=b"%03d" % offset + b"." * 7, keys=f"k{offset} x",
                          properties={"UNIQ_KEY": f"id{offset}"}, queue_id=queue_id,
                          queue_offset=offset, born_host="127.0.0.1:1", store_host="127.0.0.1:2")

    def pull_raw(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> Raw:
        self.requests.append((offset, max_nums))
        first = max(offset, self.low)
        end = min(self.size, first + min(max_nums, self.pull_cap))
        if first >= end:
            return Raw(Status.NO_NEW_MSG, b"", offset)
        return Raw(Status.FOUND, encode_message_exts(self.message(o) for o in range(first, end)), end)

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> None:
        raise AssertionError("the read path must use pull_raw when the consumer has it")

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.low

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.size

    def shutdown(self) -> None:
        pass


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> Iterator[RawConsumer]:
    fake = RawConsumer(size=20)
    monkeypatch.setattr(_source, "_new_consumer",
                        lambda endpoints, group, namesrv_addr="", timeout_ms=0: fake)
    monkeypatch.setattr(_source, "PULL_MAX_NUMS", 4)
    yield fake


def part(start: int, end: int, fail_on_data_loss: bool = True) -> QueueRange:
    return QueueRange("127.0.0.1:1", "g", "orders", 0, start, end, fail_on_data_loss)


def offsets(batches: Iterator[object]) -> list[int]:
    return [o for b in batches for o in b.column("queue_offset").to_pylist()]  # type: ignore[attr-defined]


def test_raw_pulls_give_every_offset_once_in_batches_of_the_cap(
    consumer: RawConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_source, "ROWS_PER_ARROW_BATCH", 5)
    batches = list(read_queue_range(part(2, 17)))
    assert [b.num_rows for b in batches] == [5, 5, 5]
    assert offsets(iter(batches)) == list(range(2, 17))
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    assert batches[0].column("key").to_pylist()[:2] == ["k2", "k3"]
    assert batches[0].column("body").to_pylist()[0] == b"002......."
    assert consumer.requests == [(2, 4), (5, 4), (8, 4), (11, 4), (14, 3)]


def test_raw_pulls_close_batches_at_the_byte_cap(
    consumer: RawConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_source, "ARROW_BATCH_BYTES_MAX", 35)  # bodies are 10 bytes
    assert [b.num_rows for b in read_queue_range(part(0, 10))] == [4, 4, 2]


def test_a_message_of_another_queue_is_data_loss(consumer: RawConsumer) -> None:
    consumer.foreign_at = 7
    with pytest.raises(DataLossError, match="returned a message of orders/9"):
        offsets(read_queue_range(part(0, 12)))


def test_offsets_deleted_by_retention_are_skipped_when_allowed(consumer: RawConsumer) -> None:
    consumer.low = 6
    assert offsets(read_queue_range(part(3, 12, fail_on_data_loss=False))) == list(range(6, 12))
    with pytest.raises(DataLossError, match="were deleted"):
        offsets(read_queue_range(part(3, 12)))


# --- against a real broker: the raw path gives what the per-message path gives ---------------------


@pytest.mark.slow
def test_raw_read_of_a_real_broker_equals_the_per_message_read() -> None:
    import pyarrow as pa

    from txmq.client import Producer, PullConsumer
    from txmq.protocol import Message
    from txmq.spark._arrow import messages_to_record_batch
    from txmq.testing import run_broker

    with run_broker(topics={"orders": 1}) as broker:
        p = Producer("read-path-test", broker.endpoints)
        p.start()
        try:
            for i in range(0, 2500, 500):
                p.send_batch([Message(topic="orders", body=b"%d" % j * 3, keys=f"k{j} other",
                                      tags="even" if j % 2 == 0 else "",
                                      properties={"b": "2", "a": str(j)})
                              for j in range(i, i + 500)])
        finally:
            p.shutdown()
        raw = pa.Table.from_batches(list(read_queue_range(
            QueueRange(broker.endpoints, "g", "orders", 0, 10, 2490))))
        c = PullConsumer(broker.endpoints, "g")
        c.start()
        try:
            messages: list[MessageExt] = []
            while len(messages) < 2480:
                messages += c.pull("orders", 0, 10 + len(messages), 1024).messages
        finally:
            c.shutdown()
    want = pa.Table.from_batches([messages_to_record_batch(messages[:2480])])
    assert raw.num_rows == 2480
    assert raw.combine_chunks().equals(want.combine_chunks())


def test_the_bench_reference_source_declares_the_source_schema() -> None:
    """The reference source copies the DDL (it must not import txmq); the copy must not drift."""
    from txmq.spark._bench_reference import SCHEMA_DDL

    assert SCHEMA_DDL == _source.SCHEMA_DDL
