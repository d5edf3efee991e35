"""Helpers for tests, ours and our users': a real broker process on a free port, and a sans-IO
broker harness with a hand-driven clock, and a polling wait for conditions on real processes."""

from txmq.testing._broker import BrokerProcess, run_broker
from txmq.testing._harness import END_TYPES, BrokerHarness
from txmq.testing._wait import wait_until

__all__ = ["END_TYPES", "BrokerHarness", "BrokerProcess", "run_broker", "wait_until"]
