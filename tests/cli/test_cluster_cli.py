"""``txmq topic …`` and ``txmq group lag`` on a cluster (a real name server and three real broker
processes, ``txmq.testing.run_cluster``): with ``--namesrv-addr`` a topic is created, widened,
listed and deleted on every master broker (mqadmin ``updateTopic -c``), status and lag have a row
per broker and queue and sum over the brokers, and a broker that is down is reported by name with
exit 1 while the others are still done."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from txmq.cli import app
from txmq.client import Admin, Message, Producer, PullConsumer
from txmq.testing import ClusterProcess, run_cluster, wait_until

pytestmark = pytest.mark.slow

_runner = CliRunner()
BROKERS = ["broker-a", "broker-b", "broker-c"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    with run_cluster(brokers=3) as c:
        yield c


def txmq(c: ClusterProcess, *args: str) -> Result:
    return _runner.invoke(app, [*args, "--namesrv-addr", c.namesrv_addr])


def queues_on(c: ClusterProcess, name: str, topic: str) -> int | None:
    with Admin(c.brokers[name].endpoints) as a:
        cfg = a.topic_configs().topic_config_table.get(topic)
    return None if cfg is None else cfg.write_queue_nums


def route_brokers(c: ClusterProcess, topic: str) -> list[str]:
    r = txmq(c, "topic", "route", topic, "--json")
    if r.exit_code != 0:
        return []
    return sorted(q["brokerName"] for q in json.loads(r.stdout)["queueDatas"])


def test_create_update_status_lag_delete_on_every_broker(cluster: ClusterProcess) -> None:
    made = txmq(cluster, "topic", "create", "ct", "-q", "2")
    assert made.exit_code == 0, made.output
    assert all(f"created with 2 queues on {b}" in made.output for b in BROKERS)
    assert [queues_on(cluster, b, "ct") for b in BROKERS] == [2, 2, 2]
    wait_until(lambda: route_brokers(cluster, "ct") == BROKERS, 30)
    again = txmq(cluster, "topic", "create", "ct", "-q", "2")
    assert again.exit_code == 1 and "exists" in again.output
    wider = txmq(cluster, "topic", "update", "ct", "-q", "3")
    assert wider.exit_code == 0, wider.output
    assert [queues_on(cluster, b, "ct") for b in BROKERS] == [3, 3, 3]
    assert txmq(cluster, "topic", "update", "ct", "-q", "1").exit_code == 2
    for n, b in enumerate(BROKERS, start=1):  # 1 message on broker-a, 2 on b, 3 on c
        with Producer("pg", cluster.brokers[b].endpoints) as p:
            for _ in range(n):
                p.send(Message(topic="ct", body=b"x"), queue_id=0)
    status = txmq(cluster, "topic", "status", "ct", "--json")
    assert status.exit_code == 0, status.output
    rows = json.loads(status.stdout)["offsetTable"]
    assert len(rows) == 9 and {r["brokerName"] for r in rows} == set(BROKERS)
    assert sum(r["maxOffset"] - r["minOffset"] for r in rows) == 6
    table = txmq(cluster, "topic", "status", "ct")
    assert "broker-b" in table.stdout and "total" in table.stdout
    with PullConsumer(cluster.brokers["broker-c"].endpoints, "cg") as consumer:
        consumer.commit_offset("ct", 0, 1)  # 1 of broker-c's 3 consumed
    lag = txmq(cluster, "group", "lag", "cg", "--topic", "ct", "--json")
    assert lag.exit_code == 0, lag.output
    lags = json.loads(lag.stdout)
    assert {r["broker"] for r in lags} == set(BROKERS)
    by_broker = {b: sum(r["lag"] for r in lags if r["broker"] == b) for b in BROKERS}
    assert by_broker == {"broker-a": 1, "broker-b": 2, "broker-c": 2}
    assert "total" in txmq(cluster, "group", "lag", "cg", "--topic", "ct").stdout
    gone = txmq(cluster, "topic", "delete", "ct", "--yes")
    assert gone.exit_code == 0, gone.output
    assert [queues_on(cluster, b, "ct") for b in BROKERS] == [None, None, None]
    assert route_brokers(cluster, "ct") == []


def test_one_broker_with_b_and_an_unknown_cluster(cluster: ClusterProcess) -> None:
    one = _runner.invoke(app, ["topic", "create", "solo", "-b", cluster.brokers["broker-b"].endpoints])
    assert one.exit_code == 0, one.output
    assert [queues_on(cluster, b, "solo") for b in BROKERS] == [None, 4, None]
    assert txmq(cluster, "topic", "create", "x", "-c", "NoSuchCluster").exit_code == 2
    assert txmq(cluster, "topic", "create", "x2", "-c", "DefaultCluster").exit_code == 0
    assert [queues_on(cluster, b, "x2") for b in BROKERS] == [4, 4, 4]


def test_a_broker_that_is_down_is_named_and_the_others_are_done(cluster: ClusterProcess) -> None:
    """A broker the name server still lists but that does not answer (stopped with SIGSTOP: its
    registration connection stays open) fails after the request timeout; a broker that dies is
    dropped from the name server at once (its connection closes) and is then not listed."""
    assert txmq(cluster, "topic", "create", "dt", "-q", "1").exit_code == 0
    hung = cluster.brokers["broker-c"]
    assert hung.proc is not None
    os.kill(hung.proc.pid, signal.SIGSTOP)
    try:
        made = txmq(cluster, "topic", "create", "dt2", "-q", "1")
        assert made.exit_code == 1, made.output
        assert "broker-c" in made.stderr and hung.endpoints in made.stderr
        assert "created with 1 queues on broker-a" in made.stdout
        assert [queues_on(cluster, b, "dt2") for b in BROKERS[:2]] == [1, 1]
        status = txmq(cluster, "topic", "status", "dt", "--json")
        assert status.exit_code == 1 and "broker-c" in status.stderr
        assert {r["brokerName"] for r in json.loads(status.stdout)["offsetTable"]} == \
            {"broker-a", "broker-b"}
        lag = txmq(cluster, "group", "lag", "cg", "--topic", "dt")
        assert lag.exit_code == 1 and "broker-c" in lag.stderr and "broker-a" in lag.stdout
        gone = txmq(cluster, "topic", "delete", "dt", "--yes")
        assert gone.exit_code == 1 and "broker-c" in gone.stderr
        assert [queues_on(cluster, b, "dt") for b in BROKERS[:2]] == [None, None]
    finally:
        os.kill(hung.proc.pid, signal.SIGCONT)
    assert queues_on(cluster, "broker-c", "dt2") is None
    assert queues_on(cluster, "broker-c", "dt") == 1  # it was down: deleted on the others only
