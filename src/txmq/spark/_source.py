"""The ``txmq`` Spark data source: committed messages of txmq topics as rows.

Use ``spark.readStream.format("txmq")`` (micro-batch streaming) or ``spark.read.format("txmq")``
(batch) after :func:`txmq.spark.register`. Every row is one committed message: a transactional
message reaches its real topic only when it is committed, so whatever a topic's queues hold is
committed (invariant I9 in DESIGN.md). Rows of one queue come in queue order.

Schema (fixed; :data:`SCHEMA_DDL`)::

    key STRING                 first of the message's space-separated keys, NULL when it has none
    tags STRING                the filter tag, NULL when empty
    body BINARY                payload bytes
    topic STRING               topic the message was read from
    queue_id INT               message queue within the topic
    queue_offset BIGINT        position in the queue (0-based, dense)
    message_id STRING          the producer's message id (property UNIQ_KEY), NULL when absent
    born_timestamp TIMESTAMP   producer clock at send (ms precision, UTC)
    store_timestamp TIMESTAMP  broker clock at store (ms precision, UTC)
    properties MAP<STRING,STRING>  all user and system properties as stored

Options (strings; Spark lower-cases the keys, so any case works):

``endpoints`` or ``namesrvAddr`` (one is required)
    ``host:port`` of the broker, or of the name server(s) (``host:port;host:port``, RocketMQ's
    ``namesrvAddr``), as :class:`txmq.client.PullConsumer` takes them. With name servers the
    source reads every broker group of each topic's route (a cluster): one partition (or more) per
    queue of each group.
``topic`` (required)
    one topic or a comma-separated list.
``startingOffsets``
    ``earliest`` (default), ``latest``, or a JSON map (see *Offsets*). Queues missing from the map
    start at ``earliest``. A stream starting at ``latest`` needs ``consumerGroup`` (see *Starting
    offsets*). A start beyond a queue's ``max_offset`` is a ConfigError, one below its
    ``min_offset`` a :class:`DataLossError` (``failOnDataLoss``), both when the query starts.
``startingTimestamp``, ``startingOffsetsByTimestamp``
    start by store time (ms since the epoch, UTC), like Kafka's options of the same names: one
    timestamp for every queue, or a JSON map like ``startingOffsets`` with timestamps as values
    (queues missing from it use ``startingOffsets``). Precedence: ``startingTimestamp`` >
    ``startingOffsetsByTimestamp`` > ``startingOffsets``. A queue starts at its first offset whose
    store timestamp is ``>= t`` (the broker's SEARCH_OFFSET_BY_TIMESTAMP); a queue whose messages
    are all older starts at its end (Kafka fails such a query by default; here the queue reads
    nothing). Stable across re-evaluations until retention deletes the found messages.
``endingOffsets`` (batch only)
    ``latest`` (default), ``earliest``, or a JSON map. Queues missing from the map end at
    ``latest``; an explicit end beyond a queue's ``max_offset`` is an error.
``endingTimestamp``, ``endingOffsetsByTimestamp`` (batch only)
    end by store time, same forms and precedence as the starting ones: a queue ends (exclusively)
    at its first offset whose store timestamp is ``>= t``, so the read holds the messages stored
    before ``t``; at its end when all are older.
``maxOffsetsPerTrigger`` (streaming only)
    most rows per micro-batch, spread fairly over the queues (see :func:`fair_shares`).
``failOnDataLoss``
    ``true`` (default) or ``false``: what to do when a range starts below a queue's
    ``min_offset`` (retention deleted it) or the broker's ``max_offset`` went backwards.
``consumerGroup``
    consumer group name given to the broker (default ``txmq-spark``). The source never commits
    progress as group offsets: the Spark checkpoint is the only record of progress. A stream whose
    start uses ``latest`` stores that start as this group's offsets (*Starting offsets*), so it
    must name a group of its own, used by no other consumer or query.
``timeoutMs``
    each request's timeout in milliseconds, on the driver and the executors (default
    ``limits.REQUEST_TIMEOUT_MS``, 10000; the ``timeout_ms`` of :class:`txmq.client.PullConsumer`).
    A driver-side read that gets no answer is tried once more on a new connection, so a query
    against name servers or a broker that never answer fails after about twice this.

Offsets: a flat JSON object ``{"<topic>/<broker_name>/<queue_id>": next_offset}`` over the queues
of every broker group of the topics' routes, keys in (topic, broker name, queue id) order, e.g.
``{"orders/broker-a/0": 17, "orders/broker-b/0": 4}``; ``next_offset`` is the first offset *not* yet
read, like Kafka's. The one-broker format ``"<topic>/<queue_id>"`` (checkpoints and options written
before broker groups were named) is still read: such a queue is on the topic's only broker group,
and a ConfigError names the groups when the topic is on several (then the key must name one). A
checkpoint of that format therefore resumes on a one-group topic; its first new batch writes the
new keys. In ``startingOffsets``/``endingOffsets`` (and the ``…ByTimestamp`` maps) the nested form
``{"orders": {"broker-a/0": 17}}`` (or ``{"orders": {"0": 17}}``) is accepted too, and ``-2`` means
earliest, ``-1`` latest. Broker names holding ``/`` cannot be keyed (ConfigError).

What Spark guarantees and what this source adds (facts from docs/pyspark.md, PySpark 4.3.0):

* Spark writes the planned ``end`` of every micro-batch to ``checkpoint/offsets/N`` before running
  it and replays exactly that range after a failure; ``read`` of a range therefore always returns
  the same rows (queues are append-only and dense), and stops exactly at ``end``. A range the
  broker can no longer serve fails loudly (:class:`DataLossError`), it is never silently
  shortened, unless ``failOnDataLoss=false`` and the missing rows were deleted by retention.
* *Starting offsets.* ``initialOffset`` is re-evaluated by Spark (twice in batch 0, again when
  batch 0 is replayed after a restart, in a new reader) and Python sources get no checkpoint
  directory to persist it in. ``earliest``, JSON offsets and timestamps are stable (they only move
  when retention deletes rows, which are gone anyway). ``latest`` is pinned: a reader remembers its
  first answer, and the first resolution is stored on the broker as the ``consumerGroup``'s offsets
  (UPDATE_CONSUMER_OFFSET) before ``initialOffset`` returns; a later reader finds them
  (QUERY_CONSUMER_OFFSET) and starts there. So a stream with ``latest`` needs its own
  ``consumerGroup``, and a new query (a new checkpoint) that should start at the then latest needs
  a new group (or the group's offsets removed).
* ``read`` runs on executors in other processes: each partition carries everything it needs
  (endpoints or name servers, topic, broker group, queue, start, end) and opens its own
  :class:`~txmq.client.PullConsumer`.
* ``commit(end)`` is a no-op (like Spark's Kafka source): Spark calls it one batch late and not at
  all for the last batch before a stop.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from txmq import limits
from txmq.errors import ConfigError
from txmq.spark._offsets import (
    EARLIEST,
    LATEST,
    DataLossError,
    OffsetSpec,
    QueueKey,
    advance_offsets,
    apply_read_limit,
    check_start,
    fair_shares,
    key_name,
    normalize_brokers,
    offsets_from_json,
    offsets_to_json,
    range_start,
)
from txmq.spark._options import DEFAULT_CONSUMER_GROUP, SourceOptions, fault
from txmq.spark._source_broker import Broker, PullConsumerShape, at_broker

if TYPE_CHECKING:
    from txmq.protocol import MessageExt
    from txmq.spark._arrow import ARROW_SCHEMA, PullBatch, messages_to_record_batch

__all__ = [
    "ARROW_BATCH_BYTES_MAX",
    "ARROW_SCHEMA",
    "DEFAULT_CONSUMER_GROUP",
    "EARLIEST",
    "LATEST",
    "PARTITION_ROWS_MAX",
    "ROWS_PER_ARROW_BATCH",
    "SCHEMA",
    "SCHEMA_DDL",
    "DataLossError",
    "OffsetSpec",
    "QueueRange",
    "SourceOptions",
    "TxmqBatchReader",
    "TxmqDataSource",
    "TxmqStreamReader",
    "advance_offsets",
    "apply_read_limit",
    "fair_shares",
    "messages_to_record_batch",
    "offsets_from_json",
    "offsets_to_json",
    "range_start",
    "read_queue_range",
    "split_range",
]

_log = logging.getLogger(__name__)

_ARROW_NAMES = frozenset({"ARROW_SCHEMA", "messages_to_record_batch"})
"""Names of :mod:`txmq.spark._arrow` this module exports, imported on first access: Spark imports
this module in two fresh Python processes per streaming query (its source runner, and the worker
that plans the read), which only plan; the decoding modules (``txmq.protocol``, msgspec,
``txmq.spark._arrow``) are only needed where ``read`` runs (issue #24)."""


def __getattr__(name: str) -> Any:
    """The :data:`_ARROW_NAMES`, from :mod:`txmq.spark._arrow` (PEP 562)."""
    if name in _ARROW_NAMES:
        from txmq.spark import _arrow

        return getattr(_arrow, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

ROWS_PER_ARROW_BATCH = 4096
"""Most rows in one ``pyarrow.RecordBatch`` yielded by ``read``."""

ARROW_BATCH_BYTES_MAX = 32 * 1024 * 1024
"""A batch yielded by ``read`` is closed once its bodies reach this many bytes (so a batch of large
messages stays far below Arrow's 2 GiB per column; one message alone may exceed it)."""

PARTITION_ROWS_MAX = limits.SPARK_SOURCE_PARTITION_ROWS_MAX
"""Most offsets one partition reads (see :func:`split_range`)."""

PULL_MAX_NUMS = limits.PULL_BATCH_MAX
"""Most messages asked for in one pull while reading a range (the broker may return fewer)."""

SCHEMA_DDL = (
    "key STRING, tags STRING, body BINARY, topic STRING, queue_id INT, queue_offset BIGINT, "
    "message_id STRING, born_timestamp TIMESTAMP, store_timestamp TIMESTAMP, "
    "properties MAP<STRING,STRING>"
)
"""The source's fixed schema as DDL (every column nullable)."""

SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("tags", StringType()),
        StructField("body", BinaryType()),
        StructField("topic", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("queue_offset", LongType()),
        StructField("message_id", StringType()),
        StructField("born_timestamp", TimestampType()),
        StructField("store_timestamp", TimestampType()),
        StructField("properties", MapType(StringType(), StringType())),
    ]
)
"""The source's fixed schema as a ``StructType`` (same as :data:`SCHEMA_DDL`)."""


def _new_consumer(endpoints: str, consumer_group: str, namesrv_addr: str = "",
                  timeout_ms: int = limits.REQUEST_TIMEOUT_MS) -> PullConsumerShape:
    """Create and start a pull consumer (module-level so tests can substitute a fake);
    ``timeout_ms`` is each request's timeout (option ``timeoutMs``).

    Raises:
        txmq.errors.BrokerUnavailable: no connection to ``endpoints``.
    """
    from txmq.client import PullConsumer

    consumer = cast(PullConsumerShape, PullConsumer(endpoints=endpoints, consumer_group=consumer_group,
                                                namesrv_addr=namesrv_addr, timeout_ms=timeout_ms))
    consumer.start()  # type: ignore[attr-defined]
    return consumer


def _open_consumer(opts: SourceOptions) -> PullConsumerShape:
    """The driver's consumer (:class:`~txmq.spark._source_broker.Broker`'s factory)."""
    return _new_consumer(opts.endpoints, opts.consumer_group, opts.namesrv_addr, opts.timeout_ms)


# --- reading one range (executor side) -----------------------------------------------------------


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One queue's offsets ``[start, end)``: everything an executor needs to read them (picklable).

    Attributes:
        endpoints: broker address for the executor's own :class:`~txmq.client.PullConsumer`.
        namesrv_addr: or the name servers it finds the broker through.
        consumer_group: group name the consumer identifies itself with.
        topic, queue_id: the queue.
        start: first offset to read (inclusive).
        broker_name: the queue's broker group ("" when not named: the topic's only one).
        end: offset to stop before (exclusive); ``end > start``.
        fail_on_data_loss: the ``failOnDataLoss`` option.
        timeout_ms: the ``timeoutMs`` option (each request's timeout, ms).
    """

    endpoints: str
    consumer_group: str
    topic: str
    queue_id: int
    start: int
    end: int
    fail_on_data_loss: bool = True
    namesrv_addr: str = ""
    broker_name: str = ""
    timeout_ms: int = limits.REQUEST_TIMEOUT_MS


def _plan_ranges(
    opts: SourceOptions, start: Mapping[QueueKey, int], end: Mapping[QueueKey, int]
) -> list[QueueRange]:
    """The :class:`QueueRange` partitions of every queue with rows in ``[start, end)``, in queue
    and offset order: one per queue, or :func:`split_range`'s pieces when a queue's range is
    longer than :data:`PARTITION_ROWS_MAX` (the same offsets always give the same partitions)."""
    ranges = []
    for key in sorted(end):
        for low, high in split_range(range_start(start, key), end[key], PARTITION_ROWS_MAX):
            ranges.append(
                QueueRange(
                    endpoints=opts.endpoints,
                    consumer_group=opts.consumer_group,
                    topic=key[0],
                    broker_name=key[1],
                    queue_id=key[2],
                    start=low,
                    end=high,
                    fail_on_data_loss=opts.fail_on_data_loss,
                    namesrv_addr=opts.namesrv_addr,
                    timeout_ms=opts.timeout_ms,
                )
            )
    return ranges


def split_range(start: int, end: int, rows_max: int) -> list[tuple[int, int]]:
    """``[start, end)`` as the fewest consecutive pieces of at most ``rows_max`` offsets, their sizes
    differing by one at most (larger first); ``[]`` when ``end <= start``. Raises ValueError when
    ``rows_max < 1``."""
    if rows_max < 1:
        raise ValueError(f"rows_max must be >= 1, got {rows_max}")
    if end <= start:
        return []
    pieces = -(-(end - start) // rows_max)
    size, extra = divmod(end - start, pieces)
    out, low = [], start
    for i in range(pieces):
        high = low + size + (1 if i < extra else 0)
        out.append((low, high))
        low = high
    return out


def read_queue_range(part: QueueRange) -> Iterator[pa.RecordBatch]:
    """Read offsets ``[part.start, part.end)`` of one queue as :data:`ARROW_SCHEMA` batches.

    Opens its own consumer (this runs on an executor) and yields batches of at most
    :data:`ROWS_PER_ARROW_BATCH` rows (closed early at :data:`ARROW_BATCH_BYTES_MAX` body bytes) in
    queue order: exactly ``end - start`` rows, one per offset, so the same range always yields the
    same rows. The next pull is in flight while a batch is converted and handed to Spark.

    Raises:
        DataLossError: an offset in the range cannot be read (see :class:`DataLossError`); with
            ``fail_on_data_loss=False`` offsets deleted by retention, or beyond a ``max_offset``
            that went backwards, are skipped with a warning instead.
        txmq.errors.BrokerUnavailable, txmq.errors.RemoteError: the broker cannot be reached or
            refuses the pull (Spark retries the task up to ``spark.task.maxFailures``).
    """
    consumer = _new_consumer(part.endpoints, part.consumer_group, part.namesrv_addr, part.timeout_ms)
    pulls = _Pulls(consumer, part)
    try:
        yield from _record_batches(_runs_in_range(pulls, part))
    finally:
        pulls.close()
        consumer.shutdown()


def _record_batches(runs: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Regroup runs of rows into batches of :data:`ROWS_PER_ARROW_BATCH` rows at most, each
    closed once its bodies reach :data:`ARROW_BATCH_BYTES_MAX` bytes."""
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    for run in runs:
        while run.num_rows:
            take = min(run.num_rows, ROWS_PER_ARROW_BATCH - rows)
            bodies = run.column(2)  # binary: int32 offsets, from the slice's offset on
            ends = memoryview(bodies.buffers()[1]).cast("i")[bodies.offset :]
            if size + ends[take] - ends[0] >= ARROW_BATCH_BYTES_MAX:  # rare: find the row
                take = next(i for i in range(1, take + 1)
                            if size + ends[i] - ends[0] >= ARROW_BATCH_BYTES_MAX)
            pending.append(run.slice(0, take))
            rows += take
            size += ends[take] - ends[0]
            run = run.slice(take)
            if rows >= ROWS_PER_ARROW_BATCH or size >= ARROW_BATCH_BYTES_MAX:
                yield _joined(pending)
                pending, rows, size = [], 0, 0
    if pending:
        yield _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


class _Reply:
    """One pull's answer before decoding: status name, the reply body (raw pulls) or messages (a
    consumer without raw pulls), and the offset the broker says comes next."""

    __slots__ = ("messages", "next_offset", "raw", "status")

    def __init__(self, status: str, raw: bytes, messages: Sequence[MessageExt], next_offset: int) -> None:
        self.status, self.raw, self.messages, self.next_offset = status, raw, messages, next_offset

    def rows(self) -> PullBatch | None:
        """The rows (decoded here, on the caller's thread), or None when it found nothing."""
        if self.status != "FOUND" or not (self.raw or self.messages):
            return None
        from txmq.spark._arrow import PullBatch, messages_to_record_batch, pull_body_to_record_batch

        if self.raw:
            return pull_body_to_record_batch(self.raw)
        ms = self.messages
        return PullBatch(messages_to_record_batch(ms), [m.queue_offset for m in ms],
                         {(m.topic, m.queue_id) for m in ms})


class _Pulls:
    """The pulls reading one range, with the next one requested ahead on a helper thread.

    :meth:`prefetch` starts the pull the reader will most likely need next (where the broker says
    the last one ended) before the reader decodes the last one, so the broker reads and sends it
    while the reader decodes and hands rows to Spark; :meth:`get` returns it if it is for the
    wanted offset and pulls directly otherwise. Every request is ``pull_raw`` (or ``pull``, for a
    consumer without it) of ``(topic, queue_id, offset, min(PULL_MAX_NUMS, end - offset))``.
    """

    def __init__(self, consumer: PullConsumerShape, part: QueueRange) -> None:
        self.consumer = consumer
        self._part = part
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[int, Future[_Reply]] | None = None

    def _pull(self, offset: int) -> _Reply:
        part = self._part
        want = min(PULL_MAX_NUMS, part.end - offset)
        raw = getattr(self.consumer, "pull_raw", None)
        if raw is None:  # a consumer without raw pulls (the tests' fakes): messages
            result = self.consumer.pull(part.topic, part.queue_id, offset, max_nums=want,
                                        **at_broker(part.broker_name))
            ms = result.messages if result.status.name == "FOUND" else ()
            return _Reply(result.status.name, b"", ms, ms[-1].queue_offset + 1 if ms else offset)
        reply = raw(part.topic, part.queue_id, offset, max_nums=want, **at_broker(part.broker_name))
        return _Reply(reply.status.name, reply.body, (), reply.next_begin_offset)

    def get(self, offset: int) -> _Reply:
        """The pull at ``offset``. Raises what the consumer's ``pull`` raises."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[0] == offset:
                return ahead[1].result()
            ahead[1].exception()  # wait: one request at a time besides the prefetch
        return self._pull(offset)

    def prefetch(self, offset: int) -> None:
        """Start the pull at ``offset`` unless it is outside the range or one is in flight."""
        if self._ahead is not None or not self._part.start < offset < self._part.end:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txmq-source-pull")
        self._ahead = (offset, self._pool.submit(self._pull, offset))

    def close(self) -> None:
        """Wait for a pull still in flight (its result or error is dropped); stop the thread."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].exception()
        if self._pool is not None:
            self._pool.shutdown()


def _runs_in_range(pulls: _Pulls, part: QueueRange) -> Iterator[pa.RecordBatch]:
    """The rows of ``[part.start, part.end)`` in offset order, as runs of pulled rows."""
    offset = part.start
    while offset < part.end:
        reply = pulls.get(offset)
        if reply.status == "FOUND":
            pulls.prefetch(reply.next_offset)  # before decoding: the broker works meanwhile
        rows = reply.rows()
        if rows is None:
            offset = _after_missing(pulls.consumer, part, offset, reply.status)
            continue
        if _is_dense(rows, part, offset):
            run = rows.batch.slice(0, part.end - offset)
            offset += run.num_rows
        else:
            run, offset = _checked_run(pulls.consumer, part, offset, rows)
        if run.num_rows:
            yield run


def _is_dense(rows: PullBatch, part: QueueRange, offset: int) -> bool:
    """Whether ``rows`` are the queue's offsets ``offset, offset + 1, ...`` (the usual case)."""
    offsets = rows.queue_offsets
    return (rows.queues == {(part.topic, part.queue_id)} and offsets[0] == offset
            and offsets[-1] == offset + len(offsets) - 1 and rows.consecutive())


def _checked_run(
    consumer: PullConsumerShape, part: QueueRange, offset: int, rows: PullBatch
) -> tuple[pa.RecordBatch, int]:
    """Check a pull at ``offset`` row by row: skip offsets deleted by retention (with
    ``failOnDataLoss=false``) or raise :class:`DataLossError`. Returns the rows to keep and the
    next offset to read (``>= part.end`` when the range is done)."""
    keep: list[int] = []
    topics = rows.batch.column("topic").to_pylist()
    queue_ids = rows.batch.column("queue_id").to_pylist()
    for i, found in enumerate(rows.queue_offsets):
        if found != offset:
            offset = _after_gap(consumer, part, offset, found)
        if offset >= part.end:
            break
        if topics[i] != part.topic or queue_ids[i] != part.queue_id:
            raise DataLossError(
                f"txmq {_where(part)}: pull at offset {offset} returned a message of "
                f"{topics[i]}/{queue_ids[i]}"
            )
        keep.append(i)
        offset += 1
    indices = pa.Array.from_buffers(pa.int32(), len(keep), [None, pa.py_buffer(array("i", keep))])
    return rows.batch.take(indices), offset  # (pa.array would import pandas: see _arrow)


def _where(part: QueueRange) -> str:
    name = key_name((part.topic, part.broker_name, part.queue_id))
    return f"queue {name} range [{part.start}, {part.end})"


def _data_loss(part: QueueRange, what: str) -> None:
    """Raise :class:`DataLossError`, or only warn when ``failOnDataLoss=false``."""
    if part.fail_on_data_loss:
        raise DataLossError(
            f"txmq {_where(part)}: {what}. Set failOnDataLoss=false to skip the missing offsets."
        )
    _log.warning("txmq %s: %s; skipping them (failOnDataLoss=false)", _where(part), what)


def _after_missing(consumer: PullConsumerShape, part: QueueRange, offset: int, status: str) -> int:
    """Where to continue after a pull at ``offset`` returned no message (or raise)."""
    low = consumer.min_offset(part.topic, part.queue_id, **at_broker(part.broker_name))
    high = consumer.max_offset(part.topic, part.queue_id, **at_broker(part.broker_name))
    if offset < low:
        _data_loss(part, f"offsets {offset}..{low - 1} were deleted (min_offset is {low})")
        return min(low, part.end)
    if offset >= high:
        _data_loss(part, f"max_offset is {high}, below the planned end {part.end}")
        return part.end
    raise DataLossError(
        f"txmq {_where(part)}: the broker returned no message at offset {offset} (pull status "
        f"{status}) although it lies inside [min_offset {low}, max_offset {high})"
    )


def _after_gap(consumer: PullConsumerShape, part: QueueRange, offset: int, found: int) -> int:
    """The pull at ``offset`` returned ``found`` instead: skip to it (retention) or raise."""
    low = consumer.min_offset(part.topic, part.queue_id, **at_broker(part.broker_name))
    if offset < found <= max(low, offset):
        _data_loss(part, f"offsets {offset}..{found - 1} were deleted (min_offset is {low})")
        return found
    raise DataLossError(
        f"txmq {_where(part)}: the broker returned offset {found} where {offset} was expected "
        f"(min_offset {low}); offsets must be dense"
    )


# --- Spark classes -------------------------------------------------------------------------------


def _as_range(partition: InputPartition) -> QueueRange:
    if not isinstance(partition, QueueRange):
        raise TypeError(f"expected a txmq QueueRange partition, got {partition!r}")
    return partition


class TxmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: offsets ``{"<topic>/<broker_name>/<queue_id>": next_offset}`` (module
    docstring).

    Driver methods run in one long-lived Python process per query, so the reader keeps a broker
    connection between calls; ``read`` runs on executors on a separately pickled instance.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts
        self._broker = Broker(opts, _open_consumer)
        self._target: dict[QueueKey, int] | None = None
        self._latest: dict[QueueKey, int] | None = None
        self._initial: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        """Offsets of ``startingOffsets`` (or the timestamps) for every queue of the topics.

        Spark calls this again whenever batch 0 is (re)planned. This reader answers the same each
        time, and a start that uses ``latest`` is pinned as the ``consumerGroup``'s offsets on the
        broker when first resolved, and read back from there by a later reader (a restart before
        batch 0 is committed), so it does not move (see *Starting offsets* in the module docstring).

        Raises:
            txmq.errors.RemoteError: TOPIC_NOT_EXIST; txmq.errors.BrokerUnavailable: no broker or
                name server answers. txmq.errors.ConfigError: a JSON map names a queue the topic
                does not have, or a start is beyond its queue's ``max_offset``.
            DataLossError: a start below its queue's ``min_offset`` (``failOnDataLoss``).
        """
        if self._initial is None:
            spec = self._opts.starting_offsets
            start, bounds = self._broker.resolve(spec)
            if spec.uses_latest():
                start = self._broker.pin(start)
            check_start(start, bounds, fail_on_data_loss=self._opts.fail_on_data_loss)
            self._initial = offsets_to_json(start)
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` if the option is set, else ``ReadAllAvailable``."""
        rows = self._opts.max_offsets_per_trigger
        return ReadAllAvailable() if rows is None else ReadMaxRows(rows)

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin every queue's current ``max_offset`` as the target; later rows are not read."""
        self._target = self._broker.max_offsets()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """End of the next batch: the broker's ``max_offset`` per queue, capped by the
        AvailableNow target and by ``limit``. Returns ``start`` unchanged when nothing is new.

        Raises:
            DataLossError: a queue's ``max_offset`` went below ``start`` (``failOnDataLoss``).
        """
        fault(self._opts.faults, "latest-offset")
        latest = self._broker.max_offsets()
        begin = normalize_brokers(offsets_from_json(start), latest)
        self._latest = latest
        target = self._target
        if target is not None:
            latest = {k: min(v, target[k]) for k, v in latest.items() if k in target}
        end = advance_offsets(begin, latest, fail_on_data_loss=self._opts.fail_on_data_loss)
        out = apply_read_limit(begin, end, limit)
        return dict(start) if out == begin else offsets_to_json(out)  # a one-broker start stays

    def reportLatestOffset(self) -> dict[str, int] | None:
        """The broker's ``max_offset`` per queue seen by the last ``latestOffset`` (for progress
        metrics), or None before the first call."""
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """:class:`QueueRange` partitions of the rows between ``start`` and ``end``: one per queue,
        more for a queue with over :data:`PARTITION_ROWS_MAX` of them. Queues named without a
        broker (a checkpoint of the one-broker format) are read on the topic's only broker group.

        Raises:
            txmq.errors.ConfigError: such a queue's topic is on several broker groups.
        """
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        if any(not k[1] for k in (*begin, *stop)):
            known = self._broker.queues()
            begin, stop = normalize_brokers(begin, known), normalize_brokers(stop, known)
        return _plan_ranges(self._opts, begin, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Rows of one :class:`QueueRange` (see :func:`read_queue_range`)."""
        return read_queue_range(_as_range(partition))

    def commit(self, end: dict[str, int]) -> None:
        """No-op: the Spark checkpoint is the source of truth (as with Spark's Kafka source)."""

    def stop(self) -> None:
        """Close the driver's broker connection (Spark does not always call this)."""
        self._broker.close()


class TxmqBatchReader(DataSourceReader):
    """Batch reader over ``[startingOffsets, endingOffsets)`` of every queue of the topics."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        """Resolve the offsets and timestamps once (on the planning worker) and plan the ranges.

        Raises:
            txmq.errors.ConfigError: a start or an end beyond a queue's ``max_offset``, or an end
                below its start. DataLossError: a start below ``min_offset`` (``failOnDataLoss``).
            txmq.errors.RemoteError: TOPIC_NOT_EXIST. txmq.errors.BrokerUnavailable: no broker
                or name server answers.
        """
        broker = Broker(self._opts, _open_consumer)
        try:
            start, bounds = broker.resolve(self._opts.starting_offsets)
            end, _ = broker.resolve(self._opts.ending_offsets)
        finally:
            broker.close()
        check_start(start, bounds, fail_on_data_loss=self._opts.fail_on_data_loss)
        for key, high in end.items():
            where = f"queue {key_name(key)}"
            if high > bounds[key][1]:
                raise ConfigError(
                    f"endingOffsets: {high} for {where} is beyond its max_offset {bounds[key][1]}"
                )
            if high < start[key]:
                raise ConfigError(f"{where}: endingOffsets {high} < startingOffsets {start[key]}")
        return _plan_ranges(self._opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Rows of one :class:`QueueRange` (see :func:`read_queue_range`); none for the placeholder
        ``InputPartition(None)`` PySpark plans when :meth:`partitions` returned no range."""
        if type(partition) is InputPartition and partition.value is None:
            return iter(())
        return read_queue_range(_as_range(partition))


def _check_schema(schema: StructType) -> None:
    given = [(f.name, f.dataType) for f in schema.fields]
    if given != [(f.name, f.dataType) for f in SCHEMA.fields]:
        raise ConfigError(f"the txmq source has a fixed schema ({SCHEMA_DDL}); got {schema}")


class TxmqDataSource(DataSource):
    """``format("txmq")``: committed messages of txmq topics (see the module docstring).

    Examples:
        >>> import txmq.spark
        >>> txmq.spark.register(spark)  # doctest: +SKIP
        >>> df = (spark.readStream.format("txmq")  # doctest: +SKIP
        ...       .option("endpoints", "127.0.0.1:10911").option("topic", "orders").load())
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``"txmq"``."""
        return "txmq"

    def schema(self) -> StructType:
        """The fixed :data:`SCHEMA`."""
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reader. Raises :class:`~txmq.errors.ConfigError` on bad options or schema."""
        _check_schema(schema)
        return TxmqBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Micro-batch reader. Raises :class:`~txmq.errors.ConfigError` on bad options or schema,
        or ``startingOffsets`` using ``latest`` without an explicit ``consumerGroup``."""
        _check_schema(schema)
        opts = SourceOptions.parse(self.options)
        if opts.starting_offsets.uses_latest() and not opts.consumer_group_set:
            raise ConfigError(
                "startingOffsets latest in a stream needs option consumerGroup, a group of this query "
                "alone: the start is pinned as that group's offsets on the broker (module docstring)"
            )
        if opts.ending_offsets.default_ms is not None or opts.ending_offsets.explicit_ms:
            raise ConfigError("endingTimestamp/endingOffsetsByTimestamp are for batch reads only")
        return TxmqStreamReader(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The transactional sink (:mod:`txmq.spark._sink`). Raises ConfigError on bad options or
        a body column that is missing or neither BINARY nor STRING."""
        from txmq.spark._sink import SinkOptions, TxmqStreamWriter

        return TxmqStreamWriter(SinkOptions.parse(dict(self.options)), schema.fieldNames(),
                                {f.name: f.dataType.simpleString() for f in schema.fields})
