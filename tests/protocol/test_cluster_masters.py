"""ClusterInfo.masters: the master address of every broker group of a cluster (mqadmin
CommandUtil.fetchMasterAddrByClusterName), sorted by broker name; groups without a master left out."""

from __future__ import annotations

import pytest

from txmq.errors import ConfigError
from txmq.protocol import BrokerData, ClusterInfo


def _info() -> ClusterInfo:
    return ClusterInfo(
        broker_addr_table={
            "broker-b": BrokerData(cluster="C1", broker_name="broker-b", broker_addrs={0: "h:2", 1: "h:3"}),
            "broker-a": BrokerData(cluster="C1", broker_name="broker-a", broker_addrs={0: "h:1"}),
            "broker-s": BrokerData(cluster="C1", broker_name="broker-s", broker_addrs={1: "h:9"}),
            "broker-x": BrokerData(cluster="C2", broker_name="broker-x", broker_addrs={0: "h:7"}),
        },
        cluster_addr_table={"C1": ["broker-b", "broker-a", "broker-s"], "C2": ["broker-x"]})


def test_every_cluster_or_one() -> None:
    assert list(_info().masters().items()) == [("broker-a", "h:1"), ("broker-b", "h:2"),
                                               ("broker-x", "h:7")]
    assert _info().masters("C2") == {"broker-x": "h:7"}


def test_an_unknown_cluster_is_an_error() -> None:
    with pytest.raises(ConfigError, match="C3"):
        _info().masters("C3")
