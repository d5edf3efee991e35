"""Offsets keyed by broker group and the plan of a sink batch over broker groups (pure functions)."""

from __future__ import annotations

import pytest

from txmq.errors import ConfigError
from txmq.spark._offsets import (
    key_name,
    normalize_brokers,
    offsets_from_json,
    offsets_to_json,
    parse_queue_key,
)
from txmq.spark._sink_commit import plan_batch


def test_queue_keys_with_and_without_a_broker() -> None:
    assert parse_queue_key("orders/broker-a/3", "o") == ("orders", "broker-a", 3)
    assert parse_queue_key("orders/3", "o") == ("orders", "", 3)  # the one-broker format
    for bad in ("orders", "orders//3", "a/b/c/3", "orders/b/x"):
        with pytest.raises(ConfigError):
            parse_queue_key(bad, "o")
    assert key_name(("orders", "broker-a", 3)) == "orders/broker-a/3"
    assert key_name(("orders", "", 3)) == "orders/3"
    offsets = {("t", "broker-b", 0): 1, ("t", "broker-a", 10): 2, ("t", "broker-a", 2): 3}
    assert list(offsets_to_json(offsets)) == ["t/broker-a/2", "t/broker-a/10", "t/broker-b/0"]
    assert offsets_from_json(offsets_to_json(offsets)) == offsets


def test_a_queue_without_a_broker_is_the_topics_only_group() -> None:
    known = [("one", "broker-a", 0), ("one", "broker-a", 1), ("two", "broker-a", 0),
             ("two", "broker-b", 0)]
    old = offsets_from_json({"one/0": 5, "one/1": 7, "gone/0": 1})
    assert normalize_brokers(old, known) == {("one", "broker-a", 0): 5, ("one", "broker-a", 1): 7,
                                             ("gone", "", 0): 1}
    with pytest.raises(ConfigError, match=r"broker groups \['broker-a', 'broker-b'\]"):
        normalize_brokers({("two", "", 0): 1}, known)
    named = {("two", "broker-b", 0): 4}
    assert normalize_brokers(named, known) == named


def test_plan_batch() -> None:
    plan = plan_batch(["broker-b", "broker-a"], {"1.0.x": {"broker-b": 3, "broker-c": 0},
                                                 "0.0.y": {"broker-c": 2}})
    assert plan.brokers == ("broker-a", "broker-b", "broker-c")
    assert plan.decision == "broker-a"
    assert plan.parts == {"broker-a": {}, "broker-b": {"1.0.x": 3}, "broker-c": {"0.0.y": 2}}
    with pytest.raises(ValueError):
        plan_batch([], {})
