"""The demo's broker choice: what its services and Spark are told, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq.demo._brokers import DEMO_BROKERS_MAX, Brokers, start_brokers
from txmq.errors import ConfigError


def test_a_cluster_is_reached_through_the_name_server_and_one_broker_directly() -> None:
    cluster = Brokers("", "127.0.0.1:9876", {"broker-a": "127.0.0.1:1", "broker-b": "127.0.0.1:2"})
    assert cluster.args() == ["--namesrv-addr", "127.0.0.1:9876"]
    assert cluster.spark_options() == {"namesrvAddr": "127.0.0.1:9876"}
    assert "broker-a at 127.0.0.1:1, broker-b at 127.0.0.1:2" in cluster.describe()
    one = Brokers("127.0.0.1:10911", "", {"broker": "127.0.0.1:10911"})
    assert one.args() == ["--endpoints", "127.0.0.1:10911"]
    assert one.spark_options() == {"endpoints": "127.0.0.1:10911"}
    assert one.describe() == "broker at 127.0.0.1:10911"


@pytest.mark.parametrize("n", [0, DEMO_BROKERS_MAX + 1])
def test_a_broker_count_outside_the_range_is_refused(tmp_path: Path, n: int) -> None:
    with pytest.raises(ConfigError, match="--brokers"):
        start_brokers(n, tmp_path, {"orders": 4})


def test_a_cluster_cannot_be_started_next_to_given_brokers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="drop --broker"):
        start_brokers(2, tmp_path, {"orders": 4}, broker="127.0.0.1:10911")
    with pytest.raises(ConfigError, match="drop --broker"):
        start_brokers(3, tmp_path, {"orders": 4}, namesrv_addr="127.0.0.1:9876")


def test_replicas_go_with_the_one_broker_the_demo_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--replicas 2"):
        start_brokers(1, tmp_path, {"orders": 4}, replicas=2)
    with pytest.raises(ConfigError, match="drop --brokers"):
        start_brokers(2, tmp_path, {"orders": 4}, replicas=1)
    with pytest.raises(ConfigError, match="drop --brokers"):
        start_brokers(1, tmp_path, {"orders": 4}, broker="127.0.0.1:10911", replicas=1)
    assert Brokers("127.0.0.1:1", "", {"broker": "127.0.0.1:1"}).replica_report() == {"replicas": 0}
