"""The Spark source, the transactional sink and reconciliation on a txmq cluster: a name server and two
broker groups (real processes), topics on both; every row exactly once, a broker restarted between
batches, a batch commit that waits for a broker that is down."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import txmq.spark
from txmq.broker.transaction import PROPERTY_TXMQ_SINK_BATCH, PROPERTY_TXMQ_SINK_TASK
from txmq.client import Admin, AsyncTransactionProducer, Message, Producer, PullConsumer
from txmq.errors import ConfigError
from txmq.protocol import PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS
from txmq.spark._options import SourceOptions
from txmq.spark._sink import _NoChecks
from txmq.spark._sink_commit import abort_batch, commit_batch, plan_batch
from txmq.spark._source import TxmqStreamReader
from txmq.spark.reconcile import reconcile
from txmq.testing import ClusterProcess, run_cluster, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BROKERS = ("broker-a", "broker-b")
ROWS = 120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    topics = {t: 2 for t in ("read", "in", "out", "direct", "aborted")}
    with run_cluster(brokers=2, data_dir=tmp_path_factory.mktemp("txmq-cluster"), topics=topics) as c:
        yield c


def feed(ns: str, topic: str, keys: range) -> Counter[str]:
    """Send one message per key round robin over both brokers; the brokers that stored them."""
    with Producer("feeder", namesrv_addr=ns) as p:
        return Counter(p.send(Message(topic=topic, body=f"row-{k}".encode(), keys=f"k{k}")).broker_name
                       for k in keys)


def keys_on(ns: str, topic: str) -> dict[str, Counter[str]]:
    """broker group → keys of the messages its queues of ``topic`` hold."""
    out: dict[str, Counter[str]] = {}
    with PullConsumer(namesrv_addr=ns) as pc:
        for mq in pc.queues(topic):
            r = pc.pull(topic, mq.queue_id, 0, 1000, broker_name=mq.broker_name)
            out.setdefault(mq.broker_name, Counter()).update(m.keys for m in r.messages)
    return out


def routed_on_both(ns: str, topic: str) -> bool:
    """Whether the name server routes ``topic`` to a master of every broker group."""
    with Admin(namesrv_addr=ns) as a:
        route = a.topic_route(topic)
    return ({q.broker_name for q in route.queue_datas} == set(BROKERS)
            and all(0 in b.broker_addrs for b in route.broker_datas))


def stats(c: ClusterProcess, broker: str) -> dict[str, int]:
    with Admin(c.brokers[broker].endpoints) as a:
        return a.transaction_stats()


def test_batch_read_and_offsets_cover_every_broker(spark: SparkSession,
                                                   cluster: ClusterProcess) -> None:
    ns = cluster.namesrv_addr
    assert set(feed(ns, "read", range(40))) == set(BROKERS)
    txmq.spark.register(spark)
    rows = spark.read.format("txmq").option("namesrvAddr", ns).option("topic", "read").load().collect()
    assert sorted(r["key"] for r in rows) == sorted(f"k{k}" for k in range(40))
    reader = TxmqStreamReader(SourceOptions.parse({"namesrvAddr": ns, "topic": "read"}))
    try:
        start = reader.initialOffset()
        assert set(start) == {f"read/{b}/{q}" for b in BROKERS for q in (0, 1)}
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert sum(end.values()) == 40
        parts = reader.partitions(start, end)
        assert {p.broker_name for p in parts} == set(BROKERS)  # type: ignore[attr-defined]
    finally:
        reader.stop()
    one_broker_form = SourceOptions.parse({"namesrvAddr": ns, "topic": "read",
                                           "startingOffsets": '{"read/0": 1}'})
    with pytest.raises(ConfigError, match="broker groups"):  # ambiguous on two groups
        TxmqStreamReader(one_broker_form).initialOffset()
    named = SourceOptions.parse({"namesrvAddr": ns, "topic": "read",
                                 "startingOffsets": '{"read/broker-b/1": 3}'})
    assert TxmqStreamReader(named).initialOffset()["read/broker-b/1"] == 3


def run_stream(spark: SparkSession, ns: str, ckpt: Path) -> None:
    txmq.spark.register(spark)
    src = (spark.readStream.format("txmq").option("namesrvAddr", ns).option("topic", "in")
           .option("maxOffsetsPerTrigger", "25").load().select("key", "body"))
    (src.writeStream.format("txmq").option("namesrvAddr", ns).option("topic", "out")
     .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start().awaitTermination())


def test_stream_exactly_once_across_brokers_with_a_restart(spark: SparkSession,
                                                           cluster: ClusterProcess,
                                                           tmp_path: Path) -> None:
    ns = cluster.namesrv_addr
    feed(ns, "in", range(ROWS // 2))
    run_stream(spark, ns, tmp_path / "ckpt")
    cluster.kill("broker-b")  # between batches: the next run's reader and writers find it again
    cluster.restart("broker-b")
    wait_until(lambda: routed_on_both(ns, "in") and routed_on_both(ns, "out"), 60)
    assert set(feed(ns, "in", range(ROWS // 2, ROWS))) == set(BROKERS)
    run_stream(spark, ns, tmp_path / "ckpt")
    by_broker = keys_on(ns, "out")
    assert set(by_broker) == set(BROKERS) and all(by_broker.values())
    total = sum(by_broker.values(), Counter())
    assert total == Counter(f"k{k}" for k in range(ROWS))  # no missing, phantom or duplicated key
    assert all(stats(cluster, b)["PENDING"] == 0 for b in BROKERS)
    # every batch committed on both groups: 2 x 60 rows at 25 per batch; broker-b's counters
    # restarted with it
    assert [stats(cluster, b)["sink_batches"] for b in BROKERS] == [6, 3]
    db = tmp_path / "svc.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (k TEXT PRIMARY KEY)")
        conn.executemany("INSERT INTO orders VALUES (?)", [(f"k{k}",) for k in range(ROWS)])
    report = reconcile(spark, namesrv_addr=ns, topic="out", db_url=f"sqlite:///{db}",
                       table="orders", key_column="k")
    assert report.consistent and (report.db_keys, report.topic_messages) == (ROWS, ROWS)


async def write_halves(ns: str, topic: str, batch: str, task: str, n: int) -> dict[str, int]:
    """What a sink task does: ``n`` halves of ``batch`` over the topic's queues; rows per broker."""
    p = AsyncTransactionProducer("txmq-spark-sink", "", _NoChecks(), namesrv_addr=ns)
    await p.start()
    try:
        by_broker: Counter[str] = Counter()
        props = {PROPERTY_TXMQ_SINK_BATCH: batch, PROPERTY_TXMQ_SINK_TASK: task,
                 PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "600"}  # as the sink: wait for a commit
        for i in range(n):
            m = Message(topic=topic, body=b"x", keys=f"{task}-{i}", properties=dict(props))
            by_broker[(await p.send_half_batch([m], i % 4)).broker_name] += 1
        return dict(by_broker)
    finally:
        await p.shutdown()


def test_a_batch_commit_waits_for_a_broker_that_is_down(cluster: ClusterProcess) -> None:
    ns = cluster.namesrv_addr
    rows = asyncio.run(write_halves(ns, "direct", "s/0", "0.0.x", 8))
    assert rows == {"broker-a": 4, "broker-b": 4}
    cluster.kill("broker-b")
    back = threading.Timer(3.0, cluster.restart, ("broker-b",))
    back.start()
    began = time.monotonic()
    answers = asyncio.run(commit_batch("", ns, "direct", "s/0", "txmq-spark-sink",
                                       {"0.0.x": rows}, timeout_s=60))
    back.join()
    waited = time.monotonic() - began
    assert waited >= 3.0, waited  # it waited for broker-b
    assert {b: a.outcome for b, a in answers.items()} == dict.fromkeys(BROKERS, "COMMIT")
    assert {b: sum(c.values()) for b, c in keys_on(ns, "direct").items()} == rows
    again = asyncio.run(commit_batch("", ns, "direct", "s/0", "txmq-spark-sink",
                                     {"0.0.x": rows}, timeout_s=10))
    assert all(a.duplicate for a in again.values())  # idempotent on every group


def test_abort_after_the_deciding_commit_completes_it(cluster: ClusterProcess) -> None:
    ns = cluster.namesrv_addr
    rows = asyncio.run(write_halves(ns, "aborted", "s/1", "0.0.y", 8))
    plan = plan_batch(BROKERS, {"0.0.y": rows})
    with Admin(cluster.brokers[plan.decision].endpoints) as a:  # a commit cut short after one group
        a.commit_sink_batch("s/1", "txmq-spark-sink", plan.parts[plan.decision])
    answers = asyncio.run(abort_batch("", ns, "aborted", "s/1", "txmq-spark-sink",
                                      {"0.0.y": rows}, timeout_s=10))
    assert answers["broker-b"].outcome == "COMMIT" and not answers["broker-b"].duplicate
    assert {b: sum(c.values()) for b, c in keys_on(ns, "aborted").items()} == rows
    rolled_back = asyncio.run(write_halves(ns, "aborted", "s/2", "0.0.z", 4))
    undecided = asyncio.run(abort_batch("", ns, "aborted", "s/2", "txmq-spark-sink",
                                        {"0.0.z": rolled_back}, timeout_s=10))
    assert {a.outcome for a in undecided.values()} == {"ROLLBACK"}
    assert all(s["PENDING"] == 0 for s in (stats(cluster, b) for b in BROKERS))
