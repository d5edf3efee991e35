"""The txmq Spark source against a real broker process and a real local Spark.

Checks invariant I9: the source yields only committed messages, in queue order, and the same offset
range always yields the same rows (batch reads of a fixed range, and a streaming batch replayed
from the checkpoint after a simulated crash). Also: Trigger.AvailableNow terminates and
``maxOffsetsPerTrigger`` bounds every micro-batch.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import txmq.spark
from txmq.client import LocalTransactionState, Producer, TransactionProducer
from txmq.protocol import Message, MessageExt
from txmq.testing import run_broker

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

QUEUES = 4
Row = tuple[int, int, bytes, str]
"""(queue_id, queue_offset, body, message_id) of one source row."""

_topic_ids = itertools.count()


class Listener:
    """Local transaction outcome = the ``arg`` of the send; check-backs stay UNKNOWN."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        assert isinstance(arg, LocalTransactionState)
        return arg

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


@pytest.fixture(scope="module")
def endpoints() -> Iterator[str]:
    with run_broker() as broker:
        yield broker.endpoints


@pytest.fixture(scope="module")
def producer(endpoints: str) -> Iterator[Producer]:
    p = Producer("spark-source-test", endpoints)
    p.start()
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def tx_producer(endpoints: str) -> Iterator[TransactionProducer]:
    p = TransactionProducer("spark-source-tx-test", endpoints, Listener())
    p.start()
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def registered(spark: SparkSession) -> SparkSession:
    txmq.spark.register(spark)
    return spark


@pytest.fixture
def topic(producer: Producer) -> str:
    name = f"spark-src-{next(_topic_ids)}"
    producer.create_topic(name, QUEUES)
    return name


def send_plain(producer: Producer, topic: str, n: int, tag: str) -> dict[bytes, str]:
    """Send ``n`` plain messages round-robin over the queues; ``{body: msg_id}``."""
    sent = {}
    for i in range(n):
        body = f"{tag}-{i}".encode()
        result = producer.send(
            Message(topic=topic, body=body, tags=tag, keys=f"k{i} other"), queue_id=i % QUEUES
        )
        sent[body] = result.msg_id
    return sent


def send_transactional(tx: TransactionProducer, topic: str, n: int) -> dict[bytes, str]:
    """Send ``n`` transactional messages: every third commits, the others roll back or stay
    pending (UNKNOWN). Returns ``{body: msg_id}`` of the committed ones only."""
    states = [
        LocalTransactionState.COMMIT_MESSAGE,
        LocalTransactionState.ROLLBACK_MESSAGE,
        LocalTransactionState.UNKNOWN,
    ]
    committed = {}
    for i in range(n):
        state = states[i % 3]
        body = f"tx-{state.name}-{i}".encode()
        result = tx.send_message_in_transaction(Message(topic=topic, body=body), state)
        expected = {"COMMIT_MESSAGE": "COMMIT", "ROLLBACK_MESSAGE": "ROLLBACK"}
        assert result.outcome == expected.get(state.name, "PENDING")
        if state is LocalTransactionState.COMMIT_MESSAGE:
            committed[body] = result.msg_id
    return committed


def reader(spark: SparkSession, endpoints: str, topic: str, **options: str) -> DataFrame:
    r = spark.read.format("txmq").option("endpoints", endpoints).option("topic", topic)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def rows_of(df: DataFrame) -> list[Row]:
    return sorted((r.queue_id, r.queue_offset, bytes(r.body), r.message_id) for r in df.collect())


def assert_dense_queues(rows: list[Row]) -> None:
    for queue_id, group in itertools.groupby(sorted(rows), key=lambda r: r[0]):
        offsets = [r[1] for r in group]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), queue_id


# --- batch -----------------------------------------------------------------------------------------


def test_batch_read_returns_exactly_the_committed_messages(
    registered: SparkSession,
    endpoints: str,
    topic: str,
    producer: Producer,
    tx_producer: TransactionProducer,
) -> None:
    expected = send_plain(producer, topic, 10, "plain")
    expected |= send_transactional(tx_producer, topic, 9)
    expected |= send_plain(producer, topic, 5, "late")

    df = reader(registered, endpoints, topic)
    assert df.schema == txmq.spark.TxmqDataSource({}).schema()
    rows = rows_of(df)
    assert {body: msg_id for _, _, body, msg_id in rows} == expected
    assert len(rows) == len(expected)  # no duplicates
    assert all(not body.startswith((b"tx-ROLLBACK", b"tx-UNKNOWN")) for _, _, body, _ in rows)
    assert_dense_queues(rows)
    assert {(q, o) for q, o, _, _ in rows} == {
        (q, o) for q in range(QUEUES) for o in range(sum(1 for r in rows if r[0] == q))
    }
    # queue order: plain messages of one queue come in send order
    in_queue_0 = [body for q, _, body, _ in rows if q == 0 and body.startswith(b"plain")]
    assert in_queue_0 == [b"plain-0", b"plain-4", b"plain-8"]

    detail = df.where("queue_id = 0 AND queue_offset = 0").collect()[0]
    assert (detail.key, detail.tags, detail.topic) == ("k0", "plain", topic)
    assert detail.properties["UNIQ_KEY"] == detail.message_id
    assert detail.born_timestamp is not None and detail.store_timestamp is not None


def test_batch_read_of_a_fixed_range_is_repeatable(
    registered: SparkSession, endpoints: str, topic: str, producer: Producer
) -> None:
    send_plain(producer, topic, 16, "m")  # 4 per queue
    span = json.dumps({f"{topic}/0": 1, f"{topic}/2": 0})
    until = json.dumps({topic: {"0": 3, "1": 0, "2": 4, "3": 0}})  # the nested form
    first = rows_of(reader(registered, endpoints, topic, startingOffsets=span, endingOffsets=until))
    assert [(q, o) for q, o, _, _ in first] == [(0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (2, 3)]

    send_plain(producer, topic, 8, "more")  # the topic grows; the range does not
    again = rows_of(reader(registered, endpoints, topic, startingOffsets=span, endingOffsets=until))
    assert again == first


def test_batch_read_of_an_unknown_topic_fails(registered: SparkSession, endpoints: str) -> None:
    with pytest.raises(Exception, match="TOPIC_NOT_EXIST"):
        reader(registered, endpoints, "no-such-topic").collect()


def test_batch_read_rejects_an_end_beyond_max_offset(
    registered: SparkSession, endpoints: str, topic: str, producer: Producer
) -> None:
    send_plain(producer, topic, 4, "m")
    with pytest.raises(Exception, match="beyond its max_offset"):
        reader(registered, endpoints, topic, endingOffsets=json.dumps({f"{topic}/0": 5})).collect()


# --- streaming -------------------------------------------------------------------------------------


def run_available_now(
    spark: SparkSession, endpoints: str, topic: str, checkpoint: Path, max_rows: int
) -> list[tuple[int, list[Row]]]:
    """Run one AvailableNow query to completion; returns ``[(batch_id, rows)]``."""
    batches: list[tuple[int, list[Row]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, rows_of(df)))

    query = (
        spark.readStream.format("txmq")
        .option("endpoints", endpoints)
        .option("topic", topic)
        .option("maxOffsetsPerTrigger", str(max_rows))
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(240), "an AvailableNow query must terminate by itself"
    assert query.exception() is None
    return batches


def forget_last_commit(checkpoint: Path, batch_id: int) -> None:
    """Simulate a crash after the sink ran but before Spark recorded ``commits/<batch_id>``."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


def test_stream_available_now_limits_batches_and_replays_identically(
    registered: SparkSession,
    endpoints: str,
    topic: str,
    producer: Producer,
    tx_producer: TransactionProducer,
    tmp_path: Path,
) -> None:
    expected = send_plain(producer, topic, 21, "a")
    expected |= send_transactional(tx_producer, topic, 6)
    checkpoint = tmp_path / "checkpoint"

    run1 = run_available_now(registered, endpoints, topic, checkpoint, max_rows=7)
    assert [b for b, _ in run1] == list(range(len(run1)))
    assert all(0 < len(rows) <= 7 for _, rows in run1)
    assert sorted(r[2] for _, rows in run1 for r in rows) == sorted(expected)

    last_id, last_rows = run1[-1]
    forget_last_commit(checkpoint, last_id)
    expected |= send_plain(producer, topic, 9, "b")

    run2 = run_available_now(registered, endpoints, topic, checkpoint, max_rows=7)
    assert run2[0] == (last_id, last_rows), "a replayed batch must have the same rows"
    assert [b for b, _ in run2] == list(range(last_id, last_id + len(run2)))
    assert all(0 < len(rows) <= 7 for _, rows in run2)

    by_batch = dict(run1) | dict(run2)
    every_row = [r for rows in by_batch.values() for r in rows]
    assert {body: msg_id for _, _, body, msg_id in every_row} == expected
    assert len(every_row) == len(expected)  # exactly once across the restart
    assert_dense_queues(every_row)

    run3 = run_available_now(registered, endpoints, topic, checkpoint, max_rows=7)
    assert run3 == [], "nothing new: no batch"
