"""Prometheus metrics of the broker (RocketMQ RIP-46 names where they exist)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import start_http_server
from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from txmq.broker._broker import Broker

__all__ = ["start_metrics"]


class _BrokerCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        tx = self.broker.tx
        pending = GaugeMetricFamily("rocketmq_half_messages", "Half messages pending, per topic",
                                    labels=["topic"])
        per_topic: dict[str, int] = {}
        for e in list(tx.index.pending.values()):
            per_topic[e.real_topic] = per_topic.get(e.real_topic, 0) + 1
        for topic, n in sorted(per_topic.items()):
            pending.add_metric([topic], n)
        yield pending
        for key, help_ in (("commits", "Transactions committed"),
                           ("rollbacks", "Transactions rolled back"),
                           ("discards", "Half messages discarded after transactionCheckMax"),
                           ("checks_sent", "Check-back requests sent"),
                           ("checks_answered", "Check-back answers received"),
                           ("duplicate_ends", "End-transaction requests for decided transactions"),
                           ("check_errors", "Check-backs that failed on the broker"),
                           ("checks_no_producer", "Check-backs deferred: no live producer")):
            c = CounterMetricFamily(f"txmq_transaction_{key}", help_)
            c.add_metric([], tx.stats[key])
            yield c
        yield from _health_metrics(self.broker)
        h = HistogramMetricFamily("rocketmq_finish_message_latency_seconds",
                                  "Prepare-to-finish latency of transactions")
        hist = tx.finish_latency
        h.add_metric([], hist.cumulative(), sum_value=hist.total)
        yield h


def _health_metrics(broker: Broker) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Timer ticks, failures and restarts, and parked messages (issue 11 part 4)."""
    info = broker.runtime_info(0)
    last = GaugeMetricFamily("txmq_timer_last_tick_timestamp_seconds",
                             "When each broker timer (tick part) last ran successfully",
                             labels=["timer"])
    for name, ms in sorted(info.timers.items()):
        last.add_metric([name], ms / 1000)
    yield last
    for metric, help_, label, values in (
        ("txmq_timer_errors", "Failures caught in a broker timer", "timer", info.timer_errors),
        ("txmq_timer_task_restarts", "Broker timer tasks restarted by the supervisor", "task",
         info.task_restarts),
        ("txmq_parked_messages", "Messages a scheduler could not deliver, parked with a reason",
         "source", info.parked),
    ):
        c = CounterMetricFamily(metric, help_, labels=[label])
        for name, n in sorted(values.items()):
            c.add_metric([name], n)
        yield c


def start_metrics(broker: Broker, port: int) -> None:
    """Serve ``/metrics`` on ``127.0.0.1:port`` from a daemon thread."""
    REGISTRY.register(_BrokerCollector(broker))
    start_http_server(port, addr="127.0.0.1")
