"""Sans-IO routes and queue choice (#23 items 1-2): build_route, FaultStrategy's RocketMQ 5 tables,
QueueSelector's round robin with last-broker avoidance and fault tolerance."""

from __future__ import annotations

import random

import pytest

from txmq.client._route import (
    FAULT_ISOLATION_LATENCY_MS,
    FaultStrategy,
    QueueSelector,
    build_route,
)
from txmq.errors import MalformedHeader
from txmq.protocol import PERM_READ, PERM_WRITE, BrokerData, MessageQueue, QueueData, TopicRouteData

RW = PERM_READ | PERM_WRITE


def route(*groups: tuple[str, dict[int, str], int, int], order: str | None = None) -> TopicRouteData:
    """(broker name, {id: addr}, queues, perm) per group, listed in the order given."""
    return TopicRouteData(
        order_topic_conf=order,
        queue_datas=[QueueData(broker_name=n, read_queue_nums=q, write_queue_nums=q, perm=p)
                     for n, _, q, p in groups],
        broker_datas=[BrokerData(cluster="c", broker_name=n, broker_addrs=a)
                      for n, a, _, _ in groups])


def test_publish_in_broker_name_order_only_groups_with_a_master_subscribe_all() -> None:
    r = build_route(route(("broker-b", {0: "b:1"}, 2, RW), ("broker-a", {0: "a:1"}, 1, RW),
                          ("broker-c", {1: "c-slave:1"}, 2, RW)), "t")
    assert r.publish == (MessageQueue("t", 0, "broker-a"), MessageQueue("t", 0, "broker-b"),
                         MessageQueue("t", 1, "broker-b"))
    assert {mq.broker_name for mq in r.subscribe} == {"broker-a", "broker-b", "broker-c"}
    assert len(r.subscribe) == 5 and list(r.subscribe) == sorted(r.subscribe)
    assert r.master("broker-c") is None and r.master("broker-b") == "b:1"
    assert r.broker_names() == ["broker-a", "broker-b", "broker-c"]


def test_perm_decides_publish_and_subscribe() -> None:
    r = build_route(route(("broker-a", {0: "a:1"}, 2, PERM_READ),
                          ("broker-b", {0: "b:1"}, 2, PERM_WRITE)), "t")
    assert {mq.broker_name for mq in r.publish} == {"broker-b"}
    assert {mq.broker_name for mq in r.subscribe} == {"broker-a"}


def test_order_topic_conf_gives_the_publish_queues() -> None:
    r = build_route(route(("broker-a", {0: "a:1"}, 8, RW), ("broker-b", {0: "b:1"}, 8, RW),
                          order="broker-b:2;broker-a:1"), "t")
    assert r.publish == (MessageQueue("t", 0, "broker-b"), MessageQueue("t", 1, "broker-b"),
                         MessageQueue("t", 0, "broker-a"))
    with pytest.raises(MalformedHeader):
        build_route(route(("broker-a", {0: "a:1"}, 1, RW), order="broker-a:x"), "t")


@pytest.mark.parametrize(("latency", "avoided"), [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 2000), (1799, 2000),
    (1800, 5000), (3000, 6000), (5000, 10000), (14999, 10000), (15000, 30000),
    (FAULT_ISOLATION_LATENCY_MS, 10000),
])
def test_rocketmq5_latency_tables(latency: int, avoided: int) -> None:
    assert FaultStrategy.not_available_ms(latency) == avoided


def test_a_failed_broker_is_avoided_for_the_isolation_time() -> None:
    f = FaultStrategy()
    f.update("broker-a", 0, 1_000, failed=True)
    assert not f.available("broker-a", 1_000) and not f.reachable("broker-a")
    assert not f.available("broker-a", 10_999) and f.available("broker-a", 11_000)
    f.update("broker-a", 10, 12_000)
    assert f.available("broker-a", 12_000) and f.reachable("broker-a")
    off = FaultStrategy(enabled=False)
    off.update("broker-a", 0, 1_000, failed=True)
    assert off.available("broker-a", 1_000)


QS = [MessageQueue("t", i, b) for b in ("broker-a", "broker-b", "broker-c") for i in range(2)]


def test_round_robin_over_every_queue() -> None:
    s = QueueSelector(FaultStrategy(), random.Random(7))
    picks = [s.select("t", QS, None, 0) for _ in range(len(QS) * 3)]
    assert all(picks.count(mq) == 3 for mq in QS)


def test_a_retry_avoids_the_last_broker_with_or_without_fault_tolerance() -> None:
    for enabled in (True, False):
        s = QueueSelector(FaultStrategy(enabled), random.Random(1))
        for _ in range(20):
            assert s.select("t", QS, "broker-b", 0).broker_name != "broker-b"
    one = [MessageQueue("t", 0, "broker-a")]
    assert QueueSelector(FaultStrategy()).select("t", one, "broker-a", 0) == one[0]


def test_an_unavailable_broker_is_skipped_then_chosen_again() -> None:
    f = FaultStrategy()
    s = QueueSelector(f, random.Random(3))
    f.update("broker-b", 0, 0, failed=True)
    assert all(s.select("t", QS, None, 5_000).broker_name != "broker-b" for _ in range(30))
    assert "broker-b" in {s.select("t", QS, None, 10_000).broker_name for _ in range(30)}


def test_every_broker_unavailable_prefers_a_reachable_one_then_any() -> None:
    f = FaultStrategy()
    s = QueueSelector(f, random.Random(5))
    f.update("broker-a", 0, 0, failed=True)
    f.update("broker-b", 0, 0, failed=True)
    f.update("broker-c", 3000, 0)  # slow, not failed: unavailable 6 s but reachable
    assert {s.select("t", QS, None, 100).broker_name for _ in range(20)} == {"broker-c"}
    f.update("broker-c", 0, 0, failed=True)
    assert s.select("t", QS, "broker-a", 100).broker_name != "broker-a"
    with pytest.raises(ValueError):
        s.select("t", [], None, 0)
