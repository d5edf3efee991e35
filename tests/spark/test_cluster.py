"""The txmq source and the transactional sink on a standalone Spark cluster (a master and two
workers, separate JVMs; executors are separate processes with their own Python workers), with the
driver a separate Python process. Each case is checked by reconcile (no missing, phantom or
duplicated key) and by the broker (no half message left pending):

- an executor JVM SIGKILLed while it runs a task of a micro-batch (Spark reruns the task elsewhere);
- the driver SIGKILLed between micro-batches, then restarted from its checkpoint;
- the broker restarted (same data directory and port) while a micro-batch runs.

A task is held at a known point by an identity ``mapInArrow`` between source and sink that writes
a marker file ``<batch>.<partition>.<attempt>.<pid>`` and, for the chosen (batch, partition)'s first
attempt, waits (at most the hold's seconds) until the test creates the driver's release file: the test
waits for the marker, so the fault lands inside that batch.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from txmq.client import Message, Producer, PullConsumer
from txmq.spark.reconcile import reconcile
from txmq.testing import FAST_START_JAVA_OPTIONS, BrokerProcess, SparkCluster, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROWS = 400
PER_TRIGGER = 100
"""``maxOffsetsPerTrigger``: 4 micro-batches of 2 tasks (one per queue of ``in``)."""
DRIVER_TIMEOUT_S = 180.0

_DRIVER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import txmq.spark
    from txmq.spark import spark_session
    master, endpoints, ckpt, marks, hold, trigger, release = sys.argv[1:8]
    spark = spark_session("txmq-cluster-test", master=master,
                          conf={"spark.task.maxFailures": "8", "spark.cores.max": "2"})
    txmq.spark.register(spark)

    def held(batches):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        at = f"{ctx.getLocalProperty('streaming.sql.batchId')}.{ctx.partitionId()}"
        Path(marks, f"{at}.{ctx.attemptNumber()}.{os.getpid()}").touch()
        if ctx.attemptNumber() == 0 and hold.startswith(at + ":"):
            deadline = time.monotonic() + float(hold.split(":")[1])
            while time.monotonic() < deadline and not Path(release).exists():
                time.sleep(0.05)
        yield from batches

    src = (spark.readStream.format("txmq").option("endpoints", endpoints).option("topic", "in")
           .option("maxOffsetsPerTrigger", "PER_TRIGGER").load().select("key", "body"))
    w = (src.mapInArrow(held, src.schema).writeStream.format("txmq")
         .option("endpoints", endpoints).option("topic", "out").option("checkpointLocation", ckpt))
    w = w.trigger(availableNow=True) if trigger == "now" else w.trigger(processingTime=trigger)
    w.start().awaitTermination()
""").replace("PER_TRIGGER", str(PER_TRIGGER))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker with ``ROWS`` keyed messages in ``in`` (2 queues) and an empty ``out``."""
    bp = BrokerProcess(tmp_path / "b", {"topics": {"in": 2, "out": 2}})
    bp.start()
    try:
        with Producer("feeder", bp.endpoints) as p:
            for i in range(ROWS):
                p.send(Message(topic="in", body=f"row-{i}".encode(), keys=f"k{i}"))
        yield bp
    finally:
        bp.stop()


class Driver:
    """The streaming query's driver: a separate Python process on the cluster (own process group)."""

    def __init__(self, cluster: SparkCluster, endpoints: str, tmp: Path, hold: str = "-",
                 trigger: str = "now", name: str = "driver") -> None:
        self.marks = tmp / f"{name}-marks"
        self.marks.mkdir()
        self.ckpt = tmp / "ckpt"
        self.log = tmp / f"{name}.log"
        self.release_file = tmp / f"{name}-release"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _DRIVER, cluster.master_url, endpoints, str(self.ckpt),
                 str(self.marks), hold, trigger, str(self.release_file)],
                stdout=log, stderr=log, start_new_session=True,
                env={**os.environ, "JAVA_TOOL_OPTIONS": FAST_START_JAVA_OPTIONS})

    def release(self) -> None:
        """End the held task's wait (``hold``) now."""
        self.release_file.touch()

    def batches_run(self) -> set[int]:
        """Batch ids whose tasks this driver ran."""
        return {int(p.name.split(".")[0]) for p in self.marks.iterdir()}

    def marked(self, batch: int, partition: int, attempt: int) -> list[int]:
        """Python worker pids that started ``(batch, partition, attempt)``."""
        prefix = f"{batch}.{partition}.{attempt}."
        return [int(p.name.rsplit(".", 1)[1]) for p in self.marks.iterdir() if p.name.startswith(prefix)]

    def committed_batches(self) -> int:
        commits = self.ckpt / "commits"
        return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0

    def wait(self) -> None:
        try:
            rc = self.proc.wait(DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
        assert rc == 0, f"driver exited with {rc}: {self.log.read_text()[-3000:]}"

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def ancestor_in(pid: int, candidates: list[int]) -> int:
    """The first of ``candidates`` that is ``pid`` or one of its ancestors (``/proc``)."""
    while pid > 1:
        if pid in candidates:
            return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise AssertionError("not a descendant of any executor")


def stats(endpoints: str) -> dict[str, int]:
    with PullConsumer(endpoints) as pc:
        return pc.transaction_stats()


def assert_exactly_once(spark: SparkSession, endpoints: str, tmp: Path) -> None:
    """Reconcile ``out`` against a table holding every key fed to ``in``; nothing left pending."""
    db = tmp / "fed.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE fed (k TEXT PRIMARY KEY)")
        c.executemany("INSERT INTO fed VALUES (?)", [(f"k{i}",) for i in range(ROWS)])
    r = reconcile(spark, endpoints=endpoints, topic="out", db_url=f"sqlite:///{db}", table="fed",
                  key_column="k")
    assert (r.db_keys, r.topic_messages, r.missing, r.phantom, r.duplicated) == (ROWS, ROWS, 0, 0, 0)
    assert r.consistent
    assert stats(endpoints)["PENDING"] == 0


def test_an_executor_killed_mid_batch(spark: SparkSession, spark_cluster: SparkCluster,
                                      broker: BrokerProcess, tmp_path: Path) -> None:
    driver = Driver(spark_cluster, broker.endpoints, tmp_path, hold="1.0:300")
    try:
        wait_until(lambda: bool(driver.marked(1, 0, 0)), DRIVER_TIMEOUT_S)
        executors = spark_cluster.executor_pids()
        assert len(executors) == 2  # one per worker, separate processes
        executor = ancestor_in(driver.marked(1, 0, 0)[0], executors)
        wait_until(lambda: stats(broker.endpoints)["PENDING"] > 0, 60)  # the other task's halves
        spark_cluster.kill_executor(executor)
        driver.wait()
    finally:
        if driver.proc.poll() is None:
            driver.kill()
    assert driver.marked(1, 0, 1), "Spark did not rerun the killed task"
    assert driver.committed_batches() == ROWS // PER_TRIGGER
    assert_exactly_once(spark, broker.endpoints, tmp_path)
    assert stats(broker.endpoints)["sink_batches"] == ROWS // PER_TRIGGER


def test_a_driver_killed_between_batches_restarts_from_its_checkpoint(
        spark: SparkSession, spark_cluster: SparkCluster, broker: BrokerProcess, tmp_path: Path) -> None:
    driver = Driver(spark_cluster, broker.endpoints, tmp_path, trigger="4 seconds")
    try:
        wait_until(lambda: driver.committed_batches() >= 2 and stats(broker.endpoints)["PENDING"] == 0,
                   DRIVER_TIMEOUT_S)
    finally:
        driver.kill()
    before = driver.committed_batches()
    assert before < ROWS // PER_TRIGGER, "the driver finished before it could be killed"
    restarted = Driver(spark_cluster, broker.endpoints, tmp_path, name="restarted")
    restarted.wait()
    assert min(restarted.batches_run()) >= before  # committed batches are not run again
    assert driver.committed_batches() == ROWS // PER_TRIGGER
    assert_exactly_once(spark, broker.endpoints, tmp_path)


def test_a_broker_restart_during_a_batch(spark: SparkSession, spark_cluster: SparkCluster,
                                         broker: BrokerProcess, tmp_path: Path) -> None:
    driver = Driver(spark_cluster, broker.endpoints, tmp_path, hold="1.0:60")
    try:
        wait_until(lambda: bool(driver.marked(1, 0, 0)), DRIVER_TIMEOUT_S)
        wait_until(lambda: stats(broker.endpoints)["PENDING"] > 0, 15)  # the other task's halves
        broker.stop()
        broker.start()
        assert stats(broker.endpoints)["PENDING"] > 0  # the halves survive the restart
        assert driver.proc.poll() is None and not driver.marked(1, 0, 1)  # the batch still runs
        driver.release()  # the held task goes on against the restarted broker (it slept 20 s)
        driver.wait()
    finally:
        if driver.proc.poll() is None:
            driver.kill()
    assert driver.committed_batches() == ROWS // PER_TRIGGER
    assert_exactly_once(spark, broker.endpoints, tmp_path)
