"""The transactional sink with real Spark and a real broker: every row lands exactly once, through
failures in commit, failed tasks, and a driver killed between write and commit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.utils import StreamingQueryException

import txmq.spark
from txmq.client import Message, Producer, PullConsumer
from txmq.testing import BrokerProcess, run_broker

pytestmark = pytest.mark.spark
ROWS = 120


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "b", topics={"in": 2, "out": 2}) as b:
        with Producer("feeder", b.endpoints) as p:
            for i in range(ROWS):
                p.send(Message(topic="in", body=f"row-{i}".encode(), keys=f"k{i}"))
        yield b


def start(spark: SparkSession, endpoints: str, ckpt: Path, faults: Path | None = None):  # type: ignore[no-untyped-def]
    txmq.spark.register(spark)
    src = (spark.readStream.format("txmq").option("endpoints", endpoints).option("topic", "in")
           .option("maxOffsetsPerTrigger", "50").load().select("key", "body"))
    w = (src.writeStream.format("txmq").option("endpoints", endpoints).option("topic", "out")
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True))
    if faults is not None:
        w = w.option("txmq.test.faults", str(faults))
    return w.start()


def out_keys(endpoints: str) -> Counter[str]:
    with PullConsumer(endpoints) as pc:
        return Counter(m.keys for q in pc.queue_ids("out") for m in pc.pull("out", q, 0, 1000).messages)


def stats(endpoints: str) -> dict[str, int]:
    with PullConsumer(endpoints) as pc:
        return pc.transaction_stats()


def assert_exactly_once(endpoints: str) -> None:
    keys = out_keys(endpoints)
    assert set(keys) == {f"k{i}" for i in range(ROWS)}
    assert max(keys.values()) == 1
    assert stats(endpoints)["PENDING"] == 0


def test_rows_land_exactly_once(spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    q = start(spark, broker.endpoints, tmp_path / "ckpt")
    q.awaitTermination()
    assert_exactly_once(broker.endpoints)
    assert stats(broker.endpoints)["sink_batches"] == 3  # 120 rows at 50 per trigger


def test_a_commit_that_raises_after_the_broker_committed(spark: SparkSession, broker: BrokerProcess,
                                                         tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(["commit-after:1"]))
    q = start(spark, broker.endpoints, tmp_path / "ckpt", faults)
    with pytest.raises(StreamingQueryException):
        q.awaitTermination()
    start(spark, broker.endpoints, tmp_path / "ckpt", faults).awaitTermination()  # re-runs batch 1
    assert_exactly_once(broker.endpoints)
    assert stats(broker.endpoints)["sink_duplicate_batches"] >= 1


def test_a_task_that_fails_half_way(spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(["write-half:0:0:0"]))
    q = start(spark, broker.endpoints, tmp_path / "ckpt", faults)
    with pytest.raises(StreamingQueryException):
        q.awaitTermination()
    start(spark, broker.endpoints, tmp_path / "ckpt", faults).awaitTermination()
    assert_exactly_once(broker.endpoints)
    assert stats(broker.endpoints)["ROLLBACK"] > 0  # the failed attempt's halves


_DRIVER = textwrap.dedent("""
    import sys
    import txmq.spark
    from txmq.spark import spark_session
    endpoints, ckpt, faults = sys.argv[1:4]
    spark = spark_session("killed-driver")
    txmq.spark.register(spark)
    src = (spark.readStream.format("txmq").option("endpoints", endpoints).option("topic", "in")
           .option("maxOffsetsPerTrigger", "50").load().select("key", "body"))
    (src.writeStream.format("txmq").option("endpoints", endpoints).option("topic", "out")
        .option("checkpointLocation", ckpt).option("txmq.test.faults", faults)
        .trigger(availableNow=True).start().awaitTermination())
""")


def test_a_driver_killed_between_write_and_commit(spark: SparkSession, broker: BrokerProcess,
                                                  tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps(["hang-commit-before:1"]))
    ckpt = tmp_path / "ckpt"
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, broker.endpoints, str(ckpt), str(faults)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while json.loads(faults.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)  # the fault is consumed when commit of batch 1 starts hanging
        assert json.loads(faults.read_text()) == [], "the driver never reached commit of batch 1"
        assert stats(broker.endpoints)["PENDING"] == 50  # batch 1 written, not committed
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    start(spark, broker.endpoints, ckpt).awaitTermination()
    assert_exactly_once(broker.endpoints)
    assert stats(broker.endpoints)["sink_orphans_rolled_back"] == 50


def test_arrow_batches_become_half_messages_column_by_column() -> None:
    import pyarrow as pa

    from txmq.spark._sink import SinkOptions, TxmqStreamWriter

    opts = SinkOptions.parse({"endpoints": "127.0.0.1:1", "topic": "out", "sinkId": "s",
                              "tagColumn": "tag"})
    w = TxmqStreamWriter(opts, ["key", "body", "tag"])
    rb = pa.record_batch({"key": pa.array(["k1", None, "k3"]),
                          "body": pa.array(["text", None, "é"], pa.string()),
                          "tag": pa.array([None, "TagB", "TagC"])})
    props = {"P": "1"}
    msgs = w._messages(rb, props)
    assert [(m.topic, m.body, m.keys, m.tags) for m in msgs] == [
        ("out", b"text", "k1", ""), ("out", b"", "", "TagB"), ("out", "é".encode(), "k3", "TagC")]
    assert all(m.properties == props for m in msgs)
    binary = pa.record_batch({"body": pa.array([b"\x00\x01"], pa.binary())})
    only_body = TxmqStreamWriter(SinkOptions.parse({"endpoints": "h:1", "topic": "t", "sinkId": "s"}),
                                 ["body"])
    assert [(m.body, m.keys, m.tags) for m in only_body._messages(binary, {})] == [(b"\x00\x01", "", "")]
