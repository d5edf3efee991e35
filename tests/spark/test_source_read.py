"""Executor-side reading of the txmq source: Arrow conversion and the pipelined pulls of a range.

No broker and no Spark session: conversions are compared with ``pyarrow.array``-built batches, and
reads run against a small scripted pull consumer injected through ``_source._new_consumer``.
"""

from __future__ import annotations

import enum
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import BrokerUnavailable
from txmq.protocol import MessageExt
from txmq.spark import _source
from txmq.spark._source import ARROW_SCHEMA, QueueRange, messages_to_record_batch, read_queue_range

# --- Arrow conversion ----------------------------------------------------------------------------


def reference_batch(messages: list[MessageExt]) -> pa.RecordBatch:
    """The conversion as written with ``pyarrow.array`` on Python lists (the obvious way)."""
    first_keys = [m.keys.split(maxsplit=1) for m in messages]
    columns: list[list[Any]] = [
        [k[0] if k else None for k in first_keys],
        [m.tags or None for m in messages],
        [m.body for m in messages],
        [m.topic for m in messages],
        [m.queue_id for m in messages],
        [m.queue_offset for m in messages],
        [m.msg_id or None for m in messages],
        [m.born_timestamp_ms * 1000 for m in messages],
        [m.store_timestamp_ms * 1000 for m in messages],
        [sorted(m.properties.items()) for m in messages],
    ]
    arrays = [pa.array(col, type=f.type) for col, f in zip(columns, ARROW_SCHEMA, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


_words = st.sampled_from(["", " ", "a", "k1 k2", "  lead", "tab\tsep", "ünï cödé", "x\u2003y", "\n"])
_text = st.one_of(_words, st.text(max_size=12))
_timestamps = st.integers(min_value=0, max_value=253_402_300_799_999)  # up to year 9999
_messages = st.builds(
    MessageExt,
    topic=st.sampled_from(["orders", "ördersß"]),
    body=st.binary(max_size=40),
    tags=_text,
    keys=_text,
    properties=st.dictionaries(st.one_of(st.just("UNIQ_KEY"), _text), _text, max_size=4),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**62),
    born_timestamp_ms=_timestamps,
    store_timestamp_ms=_timestamps,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_messages, max_size=40))
def test_conversion_equals_the_pyarrow_array_conversion(messages: list[MessageExt]) -> None:
    batch = messages_to_record_batch(messages)
    batch.validate(full=True)
    assert batch.schema.equals(ARROW_SCHEMA)
    expected = reference_batch(messages)
    assert batch.equals(expected), (batch.to_pylist(), expected.to_pylist())


def test_null_patterns_across_bitmap_bytes() -> None:
    # 19 rows: NULLs in the first, a middle and the last byte of the validity bitmaps
    tags = ["t" if i % 3 else "" for i in range(19)]
    messages = [MessageExt(topic="o", body=b"", tags=t, queue_offset=i) for i, t in enumerate(tags)]
    batch = messages_to_record_batch(messages)
    batch.validate(full=True)
    assert batch.column("tags").to_pylist() == [t or None for t in tags]
    assert batch.column("tags").null_count == 7
    assert batch.column("key").null_count == 19


def test_conversion_does_not_import_pandas() -> None:
    # pyarrow.array imports pandas on first use; a fresh Spark worker would pay for that import
    code = (
        "import sys\n"
        "from txmq.protocol import MessageExt\n"
        "from txmq.spark._source import messages_to_record_batch\n"
        "b = messages_to_record_batch([MessageExt(topic='t', body=b'x', keys='k', tags='a',"
        " properties={'UNIQ_KEY': 'u', 'p': 'v'}, born_timestamp_ms=1)])\n"
        "assert b.num_rows == 1 and b.column('properties').to_pylist() == [[('UNIQ_KEY', 'u'), ('p', 'v')]]\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_planning_does_not_import_the_decoders() -> None:
    # Spark imports the source's module in two fresh Python processes per streaming query that
    # only plan (its source runner, the worker planning the read): the decoding modules load
    # where ``read`` runs, and the names re-exported from txmq.spark._arrow on first access
    code = (
        "import sys\n"
        "from txmq.spark import _source\n"
        "ds = _source.TxmqDataSource({'endpoints': '127.0.0.1:1', 'topic': 't'})\n"
        "reader = ds.streamReader(ds.schema())\n"
        "print(sorted(m for m in ('msgspec', 'txmq.protocol', 'txmq.spark._arrow', 'txmq.client')"
        " if m in sys.modules))\n"
        "print(_source.ARROW_SCHEMA.names[0], _source.messages_to_record_batch.__module__)\n"
        "print('txmq.spark._arrow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "key txmq.spark._arrow", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _source.nope  # noqa: B018


# --- reading a range with a pull kept in flight --------------------------------------------------


@dataclass
class Result:
    status: Status
    messages: list[MessageExt]


class Status(enum.Enum):
    FOUND = 0


@dataclass
class ScriptedConsumer:
    """A pull consumer over one queue ``orders/0`` of ``size`` messages, logging what happens."""

    size: int
    pull_cap: int = 3
    block_at: int | None = None  # a pull at this offset waits for ``release``
    fail_at: int | None = None  # a pull at this offset raises BrokerUnavailable
    release: threading.Event = field(default_factory=threading.Event)
    pulling: threading.Event = field(default_factory=threading.Event)
    events: list[str] = field(default_factory=list)
    requests: list[tuple[int, int]] = field(default_factory=list)

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> Result:
        self.requests.append((offset, max_nums))
        self.events.append(f"pull {offset}")
        if offset == self.fail_at:
            raise BrokerUnavailable("connection lost")
        if offset == self.block_at:
            self.pulling.set()
            assert self.release.wait(5)
        end = min(self.size, offset + min(max_nums, self.pull_cap))
        messages = [
            MessageExt(topic=topic, body=b"b" * 10, queue_id=queue_id, queue_offset=o)
            for o in range(offset, end)
        ]
        self.events.append(f"done {offset}")
        return Result(Status.FOUND, messages)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.size

    def queue_ids(self, topic: str) -> list[int]:
        return [0]

    def shutdown(self) -> None:
        self.events.append("shutdown")


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedConsumer]:
    fake = ScriptedConsumer(size=10)
    monkeypatch.setattr(_source, "_new_consumer",
                        lambda endpoints, group, namesrv_addr="", timeout_ms=0: fake)
    monkeypatch.setattr(_source, "PULL_MAX_NUMS", 4)
    yield fake
    fake.release.set()


def part(start: int, end: int) -> QueueRange:
    return QueueRange("127.0.0.1:1", "g", "orders", 0, start, end)


def test_requests_are_those_of_a_sequential_read(consumer: ScriptedConsumer) -> None:
    rows = [r for b in read_queue_range(part(1, 9)) for r in b.column("queue_offset").to_pylist()]
    assert rows == list(range(1, 9))
    # pulls of at most PULL_MAX_NUMS (4) from where the last one ended; the broker returns 3 each
    assert consumer.requests == [(1, 4), (4, 4), (7, 2)]
    assert consumer.events[-1] == "shutdown"


def _first_batch_then_blocked_pull(consumer: ScriptedConsumer, monkeypatch: pytest.MonkeyPatch
                                   ) -> Iterator[pa.RecordBatch]:
    """Read 0..10 in batches of 3 with the pull at offset 3 held until ``consumer.release``; return
    the reader after its first batch, once that pull has started."""
    monkeypatch.setattr(_source, "ROWS_PER_ARROW_BATCH", 3)
    consumer.block_at = 3
    batches = read_queue_range(part(0, 10))
    assert next(batches).column("queue_offset").to_pylist() == [0, 1, 2]
    assert consumer.pulling.wait(5)  # the pull at 3 started before the caller asked for more
    return batches


def test_next_pull_is_in_flight_while_a_batch_is_handed_out(
    consumer: ScriptedConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _first_batch_then_blocked_pull(consumer, monkeypatch)
    consumer.release.set()
    rest = [o for b in batches for o in b.column("queue_offset").to_pylist()]
    assert rest == list(range(3, 10))


def test_closing_early_waits_for_the_pull_in_flight_then_shuts_down(
    consumer: ScriptedConsumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _first_batch_then_blocked_pull(consumer, monkeypatch)
    threading.Timer(0.1, consumer.release.set).start()
    batches.close()  # as Spark does when a limit is reached
    assert consumer.events == ["pull 0", "done 0", "pull 3", "done 3", "shutdown"]


def test_error_of_a_prefetched_pull_is_raised(consumer: ScriptedConsumer) -> None:
    consumer.fail_at = 6
    seen: list[int] = []
    with pytest.raises(BrokerUnavailable, match="connection lost"):
        for batch in read_queue_range(part(0, 10)):
            seen += batch.column("queue_offset").to_pylist()
    assert seen == []  # the first batch (4096 rows at most) was not complete yet
    assert consumer.events[-1] == "shutdown"


def test_batches_close_at_the_byte_cap(consumer: ScriptedConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_source, "ARROW_BATCH_BYTES_MAX", 35)  # bodies are 10 bytes
    batches = list(read_queue_range(part(0, 10)))
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
