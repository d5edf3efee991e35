"""Helpers for tests, ours and our users': a real broker process on a free port."""

from txmq.testing._broker import BrokerProcess, run_broker

__all__ = ["BrokerProcess", "run_broker"]
