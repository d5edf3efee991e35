"""The console on a cluster, through its JSON API: a real name server and real broker processes
(``txmq.testing.run_cluster``). A topic is created on every master the name server lists when it
is created, also one that registered after the console found the others; a group's lag has a row
per broker and queue, named by broker, and is summed over the brokers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from txmq.cli._cluster import cluster_masters
from txmq.client import Admin, Message, Producer, PullConsumer
from txmq.console import ConsoleConfig
from txmq.testing import BrokerProcess, run_cluster, wait_until

pytestmark = pytest.mark.slow

BROKERS = ["broker-a", "broker-b", "broker-c"]


def _queues(addr: str, topic: str) -> int | None:
    with Admin(addr) as a:
        cfg = a.topic_configs().topic_config_table.get(topic)
    return None if cfg is None else cfg.write_queue_nums


def test_topics_go_to_every_master_and_lag_is_per_broker(
        tmp_path: Path, serve_console: Callable[..., Any]) -> None:
    with run_cluster(brokers=2, data_dir=tmp_path / "cl") as cluster, \
            serve_console(ConsoleConfig(namesrv_addr=cluster.namesrv_addr)) as s, \
            httpx.Client(base_url=s.url, timeout=30) as api:
        assert api.get("/api/topics").status_code == 200  # the console found broker-a and -b
        late = BrokerProcess(tmp_path / "broker-c", {"broker_name": "broker-c",
                                                     "namesrv_addr": cluster.namesrv_addr})
        late.start()
        try:
            wait_until(lambda: "broker-c" in cluster_masters(cluster.namesrv_addr), 30)
            addrs = {**{n: b.endpoints for n, b in cluster.brokers.items()}, "broker-c": late.endpoints}
            made = api.post("/api/topics", json={"topic": "orders", "queues": 2})
            assert (made.status_code, made.json()) == (201, {"topic": "orders", "queues": 2})
            assert [_queues(addrs[b], "orders") for b in BROKERS] == [2, 2, 2]

            def route() -> list[str]:
                r = api.get("/api/topics/orders").json()["route"]
                return sorted(q["brokerName"] for q in r.get("queueDatas", []))
            wait_until(lambda: route() == BROKERS, 30)
            for n, b in enumerate(BROKERS, start=1):  # 1 message on broker-a, 2 on b, 3 on c
                with Producer("pg", addrs[b]) as p:
                    for _ in range(n):
                        p.send(Message(topic="orders", body=b"x"), queue_id=0)
                with PullConsumer(addrs[b], "ledger") as c:
                    c.commit_offset("orders", 0, 1 if b == "broker-c" else 0)
            group = api.get("/api/groups/ledger")
            assert group.status_code == 200, group.text
            queues = group.json()["queues"]
            assert {q["broker"] for q in queues} == set(BROKERS)
            by_broker = {b: sum(q["lag"] for q in queues if q["broker"] == b) for b in BROKERS}
            assert by_broker == {"broker-a": 1, "broker-b": 2, "broker-c": 2}
            assert group.json()["lag"] == 5
            [row] = [g for g in api.get("/api/groups").json() if g["group"] == "ledger"]
            assert row["lag"] == 5
        finally:
            late.stop()
