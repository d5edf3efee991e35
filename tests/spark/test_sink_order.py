"""The sink keeps each Spark partition's row order within every queue it writes to, and sends all
rows of a key to one queue (``txmq.spark._sink``, *Order*), checked by reading the queues back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import txmq.spark
from txmq.client import Message, Producer, PullConsumer
from txmq.spark._sink import SEND_BATCH_ROWS, queue_of_key, queues_of_rows
from txmq.testing import BrokerProcess, run_broker

ROWS = 3000  # about 12 send batches per queue: enough for concurrent sends to overtake each other
OUT_QUEUES = 4


def test_keyed_rows_follow_their_key_and_keyless_rows_go_in_runs() -> None:
    keys = ["a", "", "b", "a"] + [""] * (2 * SEND_BATCH_ROWS)
    queues = queues_of_rows(keys, partition=3, queue_count=4)
    assert queues[0] == queues[3] == queue_of_key("a", 4)
    assert queues[2] == queue_of_key("b", 4)
    keyless = [q for k, q in zip(keys, queues, strict=True) if not k]
    assert keyless == [3] * SEND_BATCH_ROWS + [0] * SEND_BATCH_ROWS + [1]
    assert queue_of_key("order-17", 8) == queue_of_key("order-17", 8)  # no per-process salt
    with pytest.raises(ValueError):
        queue_of_key("a", 0)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "b", topics={"in": 1, "out": OUT_QUEUES}) as b:
        with Producer("feeder", b.endpoints) as p:
            for start in range(0, ROWS, 200):
                p.send_batch([Message(topic="in", body=str(i).encode(), keys=_key(i))
                              for i in range(start, start + 200)], queue_id=0)
        yield b


def _key(i: int) -> str:
    return "" if i % 3 == 0 else f"k{i % 11}"  # a third without key, eleven keys


@pytest.mark.spark
def test_rows_of_a_partition_keep_their_order_in_every_queue(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    txmq.spark.register(spark)
    src = (spark.readStream.format("txmq").option("endpoints", broker.endpoints)
           .option("topic", "in").option("maxOffsetsPerTrigger", "2000").load()
           .coalesce(1).select("key", "body"))  # one partition, in queue order
    (src.writeStream.format("txmq").option("endpoints", broker.endpoints).option("topic", "out")
     .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
     .start().awaitTermination())
    seen: dict[int, list[int]] = {}
    with PullConsumer(broker.endpoints) as pc:
        for q in range(OUT_QUEUES):
            seen[q] = []
            while len(seen[q]) < pc.max_offset("out", q):
                got = pc.pull("out", q, len(seen[q]), 256).messages
                assert [m.queue_offset for m in got] == list(range(len(seen[q]), len(seen[q]) + len(got)))
                seen[q] += [int(m.body) for m in got]
    assert sorted(i for rows in seen.values() for i in rows) == list(range(ROWS))
    for q, rows in seen.items():
        assert rows == sorted(rows), f"queue {q} out of order"
        for i in rows:
            if _key(i):
                assert q == queue_of_key(_key(i), OUT_QUEUES)
    assert all(seen.values())  # keyless runs reach every queue
