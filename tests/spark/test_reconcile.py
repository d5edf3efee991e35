"""``txmq reconcile`` logic: missing, phantom and duplicated messages between a database and a topic."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from txmq.client import Message, Producer
from txmq.spark.reconcile import reconcile
from txmq.testing import run_broker

pytestmark = pytest.mark.spark


def test_reconcile_finds_each_kind_of_disagreement(spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "svc.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE orders (o_orderkey INTEGER PRIMARY KEY, cancelled INTEGER)")
        c.executemany("INSERT INTO orders VALUES (?, ?)", [(k, int(k == 3)) for k in range(1, 11)])
    with run_broker(tmp_path / "b", topics={"orders": 2}) as b:
        with Producer("p", b.endpoints) as p:
            for k in [1, 2, 4, 5, 5, 6, 7, 8, 9, 11]:  # 10 missing, 11 phantom, 5 twice, 3 cancelled
                p.send(Message(topic="orders", body=b"{}", keys=str(k)))
        r = reconcile(spark, endpoints=b.endpoints, topic="orders", db_url=f"sqlite:///{db}",
                      table="orders", key_column="o_orderkey", where="cancelled = 0")
    assert (r.db_keys, r.topic_messages) == (9, 10)
    assert (r.missing_sample, r.phantom_sample, r.duplicated_sample) == (["10"], ["11"], ["5"])
    assert not r.consistent
