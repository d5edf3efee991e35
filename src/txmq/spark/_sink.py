"""The transactional Spark sink: ``df.writeStream.format("txmq")``, exactly once per micro-batch.

What Spark really does (docs/pyspark.md §2–3, PySpark 4.3.0): ``write`` runs in executor tasks
and may run more than once per partition (retries, speculation, re-runs after a failure) leaving
orphan output no callback reports; ``commit(messages, batchId)`` runs on the driver in a fresh
process, may run twice for one batch id across a failure and restart, and may be followed by
``abort`` for the same batch if it raised. So:

* each task attempt stores its rows as **half messages** tagged with the sink id, the batch id and a
  task key ``<partition>.<attempt>.<nonce>`` (the nonce tells apart attempts of different runs of the
  same batch), and returns ``(task key, rows)``;
* ``commit`` sends ``COMMIT_SINK_BATCH(sink/batch, {task: rows})``: the broker writes a batch marker,
  commits those attempts' halves and rolls back every other half of the batch — atomically and
  idempotently per (sink id, batch id) (:mod:`txmq.broker.transaction._sink`);
* ``abort`` rolls back an uncommitted batch and is a no-op after a commit;
* halves of a driver that died are rolled back by the broker when the sink timeout passes, without
  calling back into Spark.

Across broker groups (a topic on several brokers, option ``namesrvAddr``): a task's halves go to the
queues its rows map to, over every broker group of the topic's route, and the task reports its rows
per group. ``commit`` commits the batch on every group of the route (and any group a task stored
rows on): first on the *deciding* group (the first by name), then on the others together, each group
tried again every ``limits.SINK_COMMIT_RETRY_INTERVAL_MS`` until it answers or ``timeoutSeconds``
passes (:mod:`txmq.spark._sink_commit`). What holds:

* **Exactly once per row.** Each group commits its part atomically and idempotently per (sink id,
  batch id), and the batch is committed again until every part is: a retried ``commit``, or Spark's
  re-run of the batch after a failure (the groups that committed answer "committed before" and roll
  the re-run's halves back; the others commit the re-run's halves). The re-run's rows land on the
  same groups as the first run's when each row's queue is a function of the row: always for rows
  with a key (``crc32(key) % queue count``, the same route), and for keyless rows when Spark hands
  each partition the same rows in the same order (a replay of the same source offsets without a
  shuffle does).
* **No rollback after a decision.** ``abort`` asks the deciding group first; if its part was
  committed, the batch was decided and ``abort`` commits the other parts instead of rolling them back.
* **Between two groups' commits** a reader of the topic may see the batch's rows of one group and not
  yet those of another (for up to the retry time, ``timeoutSeconds`` at most). Rows of one key are in
  one queue, hence one group: a key's rows of a batch appear together, in order.
* **A group down longer than ``timeoutSeconds``** rolls its halves back when it returns; its part of
  the batch can then not be committed (TRANSACTION_NOT_FOUND), while the other groups' parts are:
  the query fails and that part is lost. Keep ``timeoutSeconds`` above the longest broker outage to
  ride through.

Options (strings; keys are case-insensitive): ``endpoints`` (a broker) or ``namesrvAddr`` (name
servers; one of the two is required), ``topic`` (required),
``sinkId`` (default: derived from ``checkpointLocation``, so a new checkpoint — whose batch ids restart
at 0 — is a new sink), ``bodyColumn`` (``body``; BINARY or STRING), ``keyColumn`` (``key``, optional),
``tagColumn`` (optional), ``producerGroup`` (``txmq-spark-sink``), ``timeoutSeconds`` (600: how long
halves wait for their batch commit), ``maxInFlight`` (8 batch requests in flight per task, at most
one per queue).

Order (as Spark's Kafka sink keeps it per Kafka partition): rows of one Spark partition that land in
the same queue are stored there in the order Spark handed them to ``write``. Which queue:

* a row with a key goes to queue ``crc32(key as UTF-8) % queue count`` (:func:`queue_of_key`), so
  every row of a key, from any partition or batch, is in one queue, in its partition's order (like
  Kafka's default partitioner; the order between partitions is whatever Spark's schedule makes it);
* rows without a key are spread over the queues in runs of ``SEND_BATCH_ROWS`` (the k-th keyless row
  of partition p goes to queue ``(p + k // SEND_BATCH_ROWS) % queue count``), each run in order.

A task sends each queue's rows as consecutive half batches, one request in flight per queue (the
broker commits a task's halves in the order they were stored), and up to ``maxInFlight`` queues at
once. Between batches the order is the batch order (a batch commits only after the previous one).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from txmq import limits
from txmq.broker.transaction import PROPERTY_TXMQ_SINK_BATCH, PROPERTY_TXMQ_SINK_TASK
from txmq.client import AsyncTransactionProducer, LocalTransactionState, Message
from txmq.errors import ConfigError
from txmq.protocol import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS
from txmq.spark._sink_commit import abort_batch, commit_batch

__all__ = ["SinkOptions", "TaskCommit", "TxmqStreamWriter", "queue_of_key", "queues_of_rows"]

log = logging.getLogger("txmq.spark.sink")

SEND_BATCH_ROWS = limits.SINK_SEND_BATCH_ROWS
SEND_BATCH_BYTES = limits.SINK_SEND_BATCH_BYTES


class SinkOptions(msgspec.Struct, frozen=True):
    """Parsed sink options (see the module docstring)."""

    endpoints: str
    topic: str
    sink_id: str
    body_column: str = "body"
    key_column: str = "key"
    tag_column: str = ""
    producer_group: str = "txmq-spark-sink"
    timeout_s: int = limits.SINK_TIMEOUT_S
    max_in_flight: int = limits.SINK_MAX_IN_FLIGHT
    faults: str = ""
    namesrv_addr: str = ""

    @classmethod
    def parse(cls, options: dict[str, str]) -> SinkOptions:
        """Raises ConfigError for a missing endpoint, topic or sink identity, or a bad number."""
        o = {k.lower(): v for k, v in options.items()}
        if not o.get("topic"):
            raise ConfigError("txmq sink: option 'topic' is required")
        if not o.get("endpoints") and not o.get("namesrvaddr"):
            raise ConfigError("txmq sink: option 'endpoints' (a broker) or 'namesrvAddr' "
                              "(name servers) is required")
        sink_id = o.get("sinkid") or _sink_id_of(o.get("checkpointlocation", ""))
        try:
            return cls(endpoints=o.get("endpoints", ""), namesrv_addr=o.get("namesrvaddr", ""),
                       topic=o["topic"], sink_id=sink_id,
                       body_column=o.get("bodycolumn", "body"), key_column=o.get("keycolumn", "key"),
                       tag_column=o.get("tagcolumn", ""),
                       producer_group=o.get("producergroup", "txmq-spark-sink"),
                       timeout_s=int(o.get("timeoutseconds", limits.SINK_TIMEOUT_S)),
                       max_in_flight=int(o.get("maxinflight", limits.SINK_MAX_IN_FLIGHT)),
                       faults=o.get("txmq.test.faults", ""))
        except ValueError as exc:
            raise ConfigError(f"txmq sink: {exc}") from exc


def _sink_id_of(checkpoint: str) -> str:
    if not checkpoint:
        raise ConfigError("txmq sink: set option sinkId or checkpointLocation (the sink's identity)")
    return "ckpt-" + hashlib.sha256(checkpoint.rstrip("/").encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TaskCommit(WriterCommitMessage):
    """What one successful task attempt wrote: its task key, row count, and rows per broker group
    (broker name → rows stored there as halves; the name is ``SendResult.broker_name``)."""

    task: str
    rows: int
    by_broker: dict[str, int] = field(default_factory=dict)


class _NoChecks:
    """Sink halves are settled by the broker (batch commit or timeout), never checked back."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def _fault(opts: SinkOptions, point: str) -> None:
    """Test hook: the JSON list in file ``txmq.test.faults`` names points to fail at, each once."""
    if not opts.faults or not os.path.exists(opts.faults):
        return
    path = Path(opts.faults)
    faults: list[str] = json.loads(path.read_text() or "[]")
    if point not in faults:
        return
    faults.remove(point)
    path.write_text(json.dumps(faults))
    if point.startswith("hang-"):  # stand still until killed
        time.sleep(3600)
    raise RuntimeError(f"injected fault at {point}")


def _as_bytes(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return b"" if body is None else bytes(body)


def queue_of_key(key: str, queue_count: int) -> int:
    """The queue a row with ``key`` goes to: ``crc32(key.encode()) % queue_count`` (stable across
    processes and runs, unlike ``hash``). Raises ValueError if ``queue_count < 1``."""
    if queue_count < 1:
        raise ValueError(f"queue_count must be >= 1, got {queue_count}")
    return zlib.crc32(key.encode()) % queue_count


def queues_of_rows(keys: list[str], partition: int, queue_count: int) -> list[int]:
    """The queue of every row of a partition (``""`` is no key): see *Order* in the module
    docstring. Deterministic for equal arguments."""
    out: list[int] = []
    keyless = 0
    for key in keys:
        if key:
            out.append(queue_of_key(key, queue_count))
        else:
            out.append((partition + keyless // SEND_BATCH_ROWS) % queue_count)
            keyless += 1
    return out


def _chunks(msgs: list[Message]) -> Iterator[list[Message]]:
    """Batches of at most ``SEND_BATCH_ROWS`` messages and ``SEND_BATCH_BYTES`` of bodies."""
    chunk: list[Message] = []
    size = 0
    for m in msgs:
        if chunk and (len(chunk) >= SEND_BATCH_ROWS or size + len(m.body) > SEND_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(m)
        size += len(m.body)
    if chunk:
        yield chunk


class TxmqStreamWriter(DataSourceStreamArrowWriter):
    """Writes rows as half messages; commits or aborts whole micro-batches on the broker.

    Tasks receive Arrow record batches (Spark 4.1 ``DataSourceStreamArrowWriter``): the body, key
    and tag columns are taken out column by column, without building a Spark ``Row`` per row.
    """

    def __init__(self, options: SinkOptions, columns: list[str],
                 types: dict[str, str] | None = None) -> None:
        """Raises ConfigError (when Spark creates the writer, before any task runs) if the body
        column is missing, or ``types`` (column → Spark simple type name) says it is neither
        ``binary`` nor ``string``."""
        self.opts = options
        self.columns = columns
        if options.body_column not in columns:
            raise ConfigError(f"txmq sink: no column {options.body_column!r} in {columns}")
        body_type = (types or {}).get(options.body_column, "binary")
        if body_type not in ("binary", "string"):
            raise ConfigError(f"txmq sink: column {options.body_column!r} is {body_type}; "
                              "BINARY or STRING is needed (cast it)")

    def _batch(self, batch_id: int | str) -> str:
        return f"{self.opts.sink_id}/{batch_id}"

    # -- executors --------------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        """Store this task's rows as half messages; returns its task key and row count."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "write runs in a Spark task"
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        task = f"{ctx.partitionId()}.{ctx.attemptNumber()}.{os.urandom(4).hex()}"
        _fault(self.opts, f"write:{batch_id}:{ctx.partitionId()}:{ctx.attemptNumber()}")
        props = {PROPERTY_TXMQ_SINK_BATCH: self._batch(str(batch_id)), PROPERTY_TXMQ_SINK_TASK: task,
                 PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: str(self.opts.timeout_s)}
        msgs = [m for rb in iterator for m in self._messages(rb, props)]
        loop = asyncio.new_event_loop()
        try:
            by_broker = loop.run_until_complete(
                self._send(msgs, ctx.partitionId(), ctx.attemptNumber(), batch_id))
        finally:
            loop.close()
        return TaskCommit(task, len(msgs), by_broker)

    def _column(self, rb: pa.RecordBatch, name: str) -> list[Any]:
        if not name or name not in rb.schema.names:
            return [None] * rb.num_rows
        return rb.column(name).to_pylist()  # type: ignore[no-any-return]

    def _messages(self, rb: pa.RecordBatch, props: dict[str, str]) -> list[Message]:
        """The half messages of one record batch (``props`` shared: sending copies it)."""
        topic = self.opts.topic
        bodies = self._column(rb, self.opts.body_column)
        keys = self._column(rb, self.opts.key_column)
        tags = self._column(rb, self.opts.tag_column)
        return [Message(topic=topic, body=_as_bytes(body), keys="" if key is None else str(key),
                        tags="" if tag is None else str(tag), properties=props)
                for body, key, tag in zip(bodies, keys, tags, strict=True)]

    async def _send(self, msgs: list[Message], partition: int, attempt: int,
                    batch_id: Any) -> dict[str, int]:
        """Send each queue's rows in order, one request in flight per queue (module docstring);
        returns the rows stored per broker group."""
        producer = AsyncTransactionProducer(self.opts.producer_group, self.opts.endpoints,
                                            _NoChecks(), namesrv_addr=self.opts.namesrv_addr)
        await producer.start()
        try:
            n = await producer.queue_nums(self.opts.topic)
            per_queue: dict[int, list[Message]] = {}
            for m, q in zip(msgs, queues_of_rows([m.keys for m in msgs], partition, n), strict=True):
                per_queue.setdefault(q, []).append(m)
            total = sum(len(list(_chunks(qm))) for qm in per_queue.values())
            sem = asyncio.Semaphore(self.opts.max_in_flight)
            done = 0
            by_broker: dict[str, int] = {}

            async def one_queue(queue_id: int, queue_msgs: list[Message]) -> None:
                nonlocal done
                for chunk in _chunks(queue_msgs):  # in order: the next waits for this one
                    async with sem:
                        r = await producer.send_half_batch(chunk, queue_id)
                    by_broker[r.broker_name] = by_broker.get(r.broker_name, 0) + len(chunk)
                    done += 1
                    if done == max(1, total // 2):
                        _fault(self.opts, f"write-half:{batch_id}:{partition}:{attempt}")

            await asyncio.gather(*(one_queue(q, qm) for q, qm in sorted(per_queue.items())))
            return by_broker
        finally:
            await producer.shutdown()

    # -- driver -----------------------------------------------------------------------------------
    def _tasks(self, messages: list[WriterCommitMessage | None]) -> dict[str, dict[str, int]]:
        return {m.task: dict(m.by_broker) for m in messages if isinstance(m, TaskCommit)}

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Commit the batch on every broker group of the topic (idempotent; see *Across broker
        groups* in the module docstring).

        Raises:
            txmq.errors.TransportError: a broker group did not answer within ``timeoutSeconds``.
            txmq.errors.RemoteError: a broker group refused its part.
        """
        tasks = self._tasks(messages)
        _fault(self.opts, f"hang-commit-before:{batchId}")
        answers = asyncio.run(commit_batch(
            self.opts.endpoints, self.opts.namesrv_addr, self.opts.topic, self._batch(batchId),
            self.opts.producer_group, tasks, self.opts.timeout_s))
        for broker, r in answers.items():
            log.info("txmq sink %s batch %d on %s: %s%s", self.opts.sink_id, batchId,
                     broker or self.opts.endpoints, r.outcome,
                     " (committed before)" if r.duplicate else "")
        _fault(self.opts, f"commit-after:{batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Roll back the batch's halves on every broker group, unless the batch was committed on
        its deciding group: then complete the commit (module docstring)."""
        answers = asyncio.run(abort_batch(
            self.opts.endpoints, self.opts.namesrv_addr, self.opts.topic, self._batch(batchId),
            self.opts.producer_group, self._tasks(messages), self.opts.timeout_s))
        for broker, r in answers.items():
            log.info("txmq sink %s batch %d aborted on %s: %s", self.opts.sink_id, batchId,
                     broker or self.opts.endpoints, r.outcome)
