"""The source's start and end against a real broker: ``latest`` pinned across re-evaluations (fresh
readers, and a stream restarted before batch 0 committed), batch reads by timestamp, and bad input
that must fail loudly at query start (never a silent empty batch)."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.utils import StreamingQueryException

import txmq.spark
from txmq import limits
from txmq.client import Message, Producer, PullConsumer
from txmq.spark._source import SourceOptions, TxmqStreamReader
from txmq.testing import BrokerProcess, run_broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "b", topics={"in": 1, "two": 2, "out": 2}) as b:
        yield b


def send(endpoints: str, topic: str, bodies: range, queue_id: int = 0) -> None:
    with Producer("feeder", endpoints) as p:
        for i in bodies:
            p.send(Message(topic=topic, body=str(i).encode(), keys=f"k{i}"), queue_id=queue_id)


def group_offset(endpoints: str, group: str, topic: str, queue_id: int) -> int | None:
    with PullConsumer(endpoints, consumer_group=group) as pc:
        return pc.fetch_consumer_offset(topic, queue_id)


def test_latest_stays_where_the_first_reader_put_it(broker: BrokerProcess) -> None:
    send(broker.endpoints, "two", range(5))
    options = {"endpoints": broker.endpoints, "topic": "two", "startingOffsets": "latest",
               "consumerGroup": "pin-readers"}
    first = TxmqStreamReader(SourceOptions.parse(options))
    assert first.initialOffset() == {"two/broker-a/0": 5, "two/broker-a/1": 0}
    send(broker.endpoints, "two", range(5, 8))
    send(broker.endpoints, "two", range(8, 10), queue_id=1)
    assert first.initialOffset() == {"two/broker-a/0": 5, "two/broker-a/1": 0}
    again = TxmqStreamReader(SourceOptions.parse(options))  # what a restarted query creates
    assert again.initialOffset() == {"two/broker-a/0": 5, "two/broker-a/1": 0}
    other = TxmqStreamReader(SourceOptions.parse({**options, "consumerGroup": "another-query"}))
    assert other.initialOffset() == {"two/broker-a/0": 8, "two/broker-a/1": 2}
    for reader in (first, again, other):
        reader.stop()


def _out_bodies(endpoints: str) -> Counter[int]:
    with PullConsumer(endpoints) as pc:
        return Counter(int(m.body) for q in pc.queue_ids("out") for m in pc.pull("out", q, 0, 500).messages)


@pytest.mark.spark
def test_a_stream_restarted_before_batch_0_was_logged_keeps_its_latest_start(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """The first run resolves ``latest`` (offset 10) and dies before batch 0 reaches the offset
    log; rows 10..14 arrive; the restart re-evaluates ``initialOffset`` in a new reader and must
    still start at 10 (a moved start would skip rows 10..14)."""
    send(broker.endpoints, "in", range(10))
    txmq.spark.register(spark)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(["latest-offset"]))  # fail right after initialOffset, once

    def start():  # type: ignore[no-untyped-def]
        src = (spark.readStream.format("txmq").option("endpoints", broker.endpoints)
               .option("topic", "in").option("startingOffsets", "latest")
               .option("consumerGroup", "restarted-query").option("txmq.test.faults", str(faults))
               .load().select("key", "body"))
        return (src.writeStream.format("txmq").option("endpoints", broker.endpoints)
                .option("topic", "out").option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(availableNow=True).start())

    with pytest.raises(StreamingQueryException, match="injected fault at latest-offset"):
        start().awaitTermination(120)
    assert not (tmp_path / "ckpt" / "offsets" / "0").exists()
    assert group_offset(broker.endpoints, "restarted-query", "in", 0) == 10  # the pin
    send(broker.endpoints, "in", range(10, 15))
    start().awaitTermination(120)
    assert _out_bodies(broker.endpoints) == Counter(range(10, 15))


@pytest.mark.spark
def test_batch_read_by_timestamp(spark: SparkSession, broker: BrokerProcess) -> None:
    """Three groups of messages stored at distinct times; a queue whose messages are all older
    than ``startingTimestamp`` reads nothing (it starts at its end)."""
    send(broker.endpoints, "two", range(3), queue_id=1)
    marks = []
    for group in range(3):
        time.sleep(0.05)
        marks.append(int(time.time() * 1000))
        time.sleep(0.05)
        send(broker.endpoints, "two", range(10 * group, 10 * group + 4))
    txmq.spark.register(spark)

    def bodies(**options: str) -> list[tuple[int, int]]:
        r = spark.read.format("txmq").option("endpoints", broker.endpoints).option("topic", "two")
        for k, v in options.items():
            r = r.option(k, v)
        return sorted((row.queue_id, int(row.body)) for row in r.load().collect())

    middle = bodies(startingTimestamp=str(marks[1]), endingTimestamp=str(marks[2]))
    assert middle == [(0, i) for i in range(10, 14)]
    assert bodies(startingTimestamp=str(marks[2])) == [(0, i) for i in range(20, 24)]
    per_queue = bodies(startingOffsetsByTimestamp=json.dumps({"two/0": marks[2]}))
    assert per_queue == [(0, i) for i in range(20, 24)] + [(1, i) for i in range(3)]
    assert bodies(startingTimestamp=str(int(time.time() * 1000) + 60_000)) == []


# --- bad input: a clear error when the query starts ----------------------------------------------


def _stream_error(spark: SparkSession, ckpt: Path, **options: str) -> str:
    txmq.spark.register(spark)
    r = spark.readStream.format("txmq")
    for k, v in options.items():
        r = r.option(k, v)
    q = (r.load().writeStream.format("memory").queryName(f"bad_{ckpt.name}")
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException) as info:
        q.awaitTermination(120)
    return str(info.value)


@pytest.mark.spark
def test_a_stream_of_a_topic_that_does_not_exist_fails(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    message = _stream_error(spark, tmp_path / "c1", endpoints=broker.endpoints, topic="missing-topic")
    assert "TOPIC_NOT_EXIST" in message and "missing-topic" in message


@pytest.mark.spark
def test_a_stream_starting_beyond_max_offset_fails(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    send(broker.endpoints, "in", range(3))
    message = _stream_error(spark, tmp_path / "c2", endpoints=broker.endpoints, topic="in",
                            startingOffsets='{"in/0": 50}')
    assert "startingOffsets: 50 for queue in/broker-a/0 is beyond its max_offset 3" in message


SILENT_TIMEOUT_MS = 1_000
"""Option ``timeoutMs`` of the silent name server case (a request's timeout)."""


@pytest.mark.spark
def test_name_servers_that_do_not_answer_fail(spark: SparkSession, tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            refused = probe.getsockname()[1]  # bound, not listening: connection refused
            for addr in (f"127.0.0.1:{refused}", f"127.0.0.1:{port}"):
                started = time.monotonic()
                message = _stream_error(spark, tmp_path / f"c{addr[-5:]}", namesrvAddr=addr, topic="in",
                                        timeoutMs=str(SILENT_TIMEOUT_MS))
                assert f"no answer from name server(s) {addr} (option namesrvAddr)" in message
                r = (spark.read.format("txmq").option("namesrvAddr", addr).option("topic", "in")
                     .option("timeoutMs", str(SILENT_TIMEOUT_MS)))
                with pytest.raises(Exception, match="option namesrvAddr"):
                    r.load().collect()
                # two tries of the stream, two of the read: 4 timeouts of 1 s (the 10 s default: 40 s)
                assert time.monotonic() - started < 4 * limits.REQUEST_TIMEOUT_MS / 1000


@pytest.mark.spark
def test_a_sink_without_the_body_column_fails_before_any_task(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    send(broker.endpoints, "in", range(3))
    txmq.spark.register(spark)
    src = (spark.readStream.format("txmq").option("endpoints", broker.endpoints)
           .option("topic", "in").load().select("key"))
    w = (src.writeStream.format("txmq").option("endpoints", broker.endpoints).option("topic", "out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True))
    with pytest.raises(StreamingQueryException, match="no column 'body'") as info:
        w.start().awaitTermination(120)
    assert not (tmp_path / "ck" / "commits" / "0").exists()
    assert "Failed to initialize Python data source writer" in str(info.value)  # not in a task


@pytest.mark.spark
def test_a_sink_body_column_of_another_type_fails_before_any_task(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    send(broker.endpoints, "in", range(3))
    txmq.spark.register(spark)
    src = (spark.readStream.format("txmq").option("endpoints", broker.endpoints)
           .option("topic", "in").load().selectExpr("key", "queue_offset AS body"))
    w = (src.writeStream.format("txmq").option("endpoints", broker.endpoints).option("topic", "out")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True))
    with pytest.raises(StreamingQueryException, match="column 'body' is bigint; BINARY or STRING"):
        w.start().awaitTermination(120)
