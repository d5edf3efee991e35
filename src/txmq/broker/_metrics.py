"""Prometheus ``/metrics`` of the broker, with RocketMQ 5's metric names and labels (RIP-46).

Names, labels, units and histogram buckets are RocketMQ's where RocketMQ defines the metric:
``BrokerMetricsConstant`` / ``BrokerMetricsManager`` (messages and throughput in and out, message
size, consumer lag, inflight, ready and latencies, DLQ, transactions, topic and group numbers),
``RemotingMetricsConstant`` / ``RemotingMetricsManager`` (``rocketmq_rpc_latency``),
``DefaultStoreMetricsConstant`` / ``DefaultStoreMetricsManager`` (storage) and
``TransactionMetrics`` (``rocketmq_half_messages``). What RocketMQ has no metric for is named
``txmq_…``. ``docs/metrics.md`` lists them all.

The broker core only counts (:class:`~txmq.broker._traffic.TrafficStats`, the transaction
service's ``stats``); a scrape builds the metric families on the broker's event loop (the store's
one writer thread), so the HTTP thread never touches broker state, and lag is computed then.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from txmq import limits
from txmq.broker._traffic import (
    MESSAGE_SIZE_BUCKETS_BYTES,
    MESSAGE_TYPES,
    RPC_LATENCY_BUCKETS_MS,
    consumer_lag,
    is_system_group,
)
from txmq.errors import ResponseCode
from txmq.protocol import DEFAULT_TOPIC, DLQ_PREFIX, RETRY_PREFIX, RequestCode, is_broker_topic

if TYPE_CHECKING:
    from txmq.broker._broker import Broker
    from txmq.broker._tls import TlsConfig

__all__ = ["broker_metrics", "start_metrics"]

log = logging.getLogger("txmq.broker.metrics")

_TRAFFIC = ("topic", "message_type", "is_system")
_OUT = ("topic", "consumer_group", "is_system")
_LAG = ("topic", "consumer_group", "is_retry", "is_system")
_RPC = ("protocol_type", "request_code", "response_code", "is_long_polling", "result")


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _system_topic(topic: str) -> bool:
    """RocketMQ ``TopicValidator.isSystemTopic`` (the topics only the broker writes)."""
    return is_broker_topic(topic) or topic == DEFAULT_TOPIC


def _counted(topic: str) -> bool:
    """RocketMQ counts no traffic of retry and DLQ topics (``BrokerMetricsManager.isRetryOrDlqTopic``)."""
    return not topic.startswith((RETRY_PREFIX, DLQ_PREFIX))


def _cumulative(counts: list[int] | list[float], bounds: tuple[int, ...]) -> list[tuple[str, float]]:
    out, acc = [], 0.0
    for le, c in zip((*(str(float(b)) for b in bounds), "+Inf"), counts, strict=True):
        acc += c
        out.append((le, acc))
    return out


def _code_name(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    """RocketMQ ``RemotingHelper.getRequestCodeDesc`` / ``getResponseCodeDesc``: the constant's
    name in lower case, else the number."""
    try:
        return enum(code).name.lower()
    except ValueError:
        return str(code)


def _traffic_metrics(broker: Broker) -> Iterator[Metric]:
    """Messages, bytes and sizes in (per topic and message type) and out (per topic and group),
    and messages sent to DLQs (``BrokerMetricsConstant``)."""
    t = broker.traffic
    n_in = CounterMetricFamily("rocketmq_messages_in_total", "Total number of incoming messages",
                               labels=_TRAFFIC)
    b_in = CounterMetricFamily("rocketmq_throughput_in_total",
                               "Total traffic of incoming messages, bytes", labels=_TRAFFIC)
    size = HistogramMetricFamily("rocketmq_message_size", "Incoming messages size, bytes",
                                 labels=_TRAFFIC)
    for topic, by_kind in sorted(t.messages_in.items()):
        if not _counted(topic):
            continue
        for kind, c in zip(MESSAGE_TYPES, by_kind, strict=True):
            if not c[0]:
                continue
            labels = [topic, kind, _b(_system_topic(topic))]
            n_in.add_metric(labels, c[0])
            b_in.add_metric(labels, c[1])
            size.add_metric(labels, _cumulative(c[2:], MESSAGE_SIZE_BUCKETS_BYTES), sum_value=c[1])
    n_out = CounterMetricFamily("rocketmq_messages_out_total", "Total number of outgoing messages",
                                labels=_OUT)
    b_out = CounterMetricFamily("rocketmq_throughput_out_total",
                                "Total traffic of outgoing messages, bytes", labels=_OUT)
    for group, by_topic in sorted(t.messages_out.items()):
        for topic, (n, nbytes) in sorted(by_topic.items()):
            if _counted(topic):
                labels = [topic, group, _b(_system_topic(topic) or is_system_group(group))]
                n_out.add_metric(labels, n)
                b_out.add_metric(labels, nbytes)
    dlq = CounterMetricFamily("rocketmq_send_to_dlq_messages_total",
                              "Consumer send to DLQ messages",
                              labels=("consumer_group", "topic", "is_system"))
    for group, counts in sorted(t.dlq.items()):
        for topic, n in sorted(counts.items()):
            dlq.add_metric([group, topic, _b(_system_topic(topic) or is_system_group(group))], n)
    yield from (n_in, b_in, size, n_out, b_out, dlq)


def _rpc_metrics(broker: Broker) -> Iterator[Metric]:
    """``rocketmq_rpc_latency`` (ms) per request and response code (``RemotingMetricsManager``)."""
    h = HistogramMetricFamily("rocketmq_rpc_latency",
                              "Rpc latency, milliseconds, from arrival to the reply's write",
                              labels=_RPC)
    for (req, resp, long_polling), counts in sorted(broker.traffic.rpc.items()):
        labels = ["remoting", _code_name(RequestCode, req), _code_name(ResponseCode, resp),
                  _b(long_polling), "success"]
        h.add_metric(labels, _cumulative(counts[:-1], RPC_LATENCY_BUCKETS_MS), sum_value=counts[-1])
    yield h


def _lag_metrics(broker: Broker, now_ms: int) -> Iterator[Metric]:
    """Consumer lag, latencies, inflight and ready messages per group and topic, computed now
    (``ConsumerLagCalculator``), connections per group, topic and group numbers."""
    fams = {name: GaugeMetricFamily(name, help_, labels=_LAG) for name, help_ in (
        ("rocketmq_consumer_lag_messages", "Consumer lag messages"),
        ("rocketmq_consumer_lag_latency", "Consumer lag time, milliseconds"),
        ("rocketmq_consumer_inflight_messages", "Consumer inflight messages"),
        ("rocketmq_consumer_queueing_latency", "Consumer queueing time, milliseconds"),
        ("rocketmq_consumer_ready_messages", "Consumer ready messages"))}
    groups: set[str] = set()
    for r in consumer_lag(broker, broker.traffic, now_ms):
        groups.add(r.group)
        labels = [r.topic, r.group, "false", _b(_system_topic(r.topic) or is_system_group(r.group))]
        for name, value in (("rocketmq_consumer_lag_messages", r.lag),
                            ("rocketmq_consumer_lag_latency", r.lag_latency_ms),
                            ("rocketmq_consumer_inflight_messages", r.inflight),
                            ("rocketmq_consumer_queueing_latency", r.queueing_latency_ms),
                            ("rocketmq_consumer_ready_messages", r.ready)):
            fams[name].add_metric(labels, value)
    yield from fams.values()
    conns = GaugeMetricFamily("rocketmq_consumer_connections", "Consumer connections",
                              labels=("consumer_group", "protocol_type", "is_system"))
    for group in sorted(broker.clients.consumer_groups()):
        groups.add(group)
        conns.add_metric([group, "remoting", _b(is_system_group(group))],
                         len(broker.clients.consumer_conns(group)))
    yield conns
    yield GaugeMetricFamily("rocketmq_topic_number", "Active topic number", value=len(broker.topics))
    yield GaugeMetricFamily("rocketmq_consumer_group_number",
                            "Consumer groups with offsets, pulls or members", value=len(groups))


def _storage_metrics(broker: Broker, now_ms: int) -> Iterator[Metric]:
    """RocketMQ's storage gauges (``DefaultStoreMetricsManager``) and txmq's commit log bounds and
    disk ratio."""
    store = broker.store
    used = _disk_used_bytes(broker.config.data_dir)
    if used is not None:
        yield GaugeMetricFamily("rocketmq_storage_size",
                                "Broker storage size: bytes used on the store's disk", value=used)
    yield GaugeMetricFamily("rocketmq_storage_flush_behind_bytes", "Broker flush behind bytes",
                            value=store.write_offset - store.flushed_offset)
    if store.write_offset > store.min_offset:
        try:
            oldest = store.read_at(store.min_offset).store_timestamp_ms
        except Exception:  # retention may have just moved the minimum: no sample this time
            log.debug("no oldest record at commit log offset %d", store.min_offset)
        else:
            yield GaugeMetricFamily("rocketmq_storage_message_reserve_time",
                                    "Broker message reserve time, milliseconds",
                                    value=max(0, now_ms - oldest))
    yield GaugeMetricFamily("txmq_storage_commit_log_bytes",
                            "Bytes of the commit log kept (max offset - min offset)",
                            value=store.write_offset - store.min_offset)
    yield GaugeMetricFamily("txmq_commit_log_max_offset_bytes",
                            "Commit log max (write) offset", value=store.write_offset)
    yield GaugeMetricFamily("txmq_commit_log_min_offset_bytes", "Commit log min offset",
                            value=store.min_offset)
    yield GaugeMetricFamily("txmq_storage_disk_ratio", "Used ratio (0..1) of the store's disk",
                            value=store.check_disk().usage_ratio)


def _disk_used_bytes(data_dir: str) -> int | None:
    try:
        return shutil.disk_usage(data_dir).used
    except OSError:
        return None


def _transaction_metrics(broker: Broker, now_ms: int) -> Iterator[Metric]:
    """Half messages and their age per topic (``TransactionMetrics``), outcomes per topic
    (``rocketmq_commit/rollback_messages_total``), txmq's transaction counters and the finish
    latency histogram."""
    tx = broker.tx
    pending = GaugeMetricFamily("rocketmq_half_messages", "Half messages pending, per topic",
                                labels=["topic"])
    age = GaugeMetricFamily("txmq_half_messages_oldest_age_seconds",
                            "Age of the oldest pending half message, per topic", labels=["topic"])
    per_topic: dict[str, list[int]] = {}
    for e in tx.index.pending.values():
        seen = per_topic.get(e.real_topic)
        if seen is None:
            per_topic[e.real_topic] = [1, e.born_ms]
        else:
            seen[0] += 1
            seen[1] = min(seen[1], e.born_ms)
    for topic, (n, born) in sorted(per_topic.items()):
        pending.add_metric([topic], n)
        age.add_metric([topic], max(0, now_ms - born) / 1000)
    yield from (pending, age)
    for name, key, help_ in (
            ("rocketmq_commit_messages_total", "commits", "Total number of commit messages"),
            ("rocketmq_rollback_messages_total", "rollbacks", "Total number of rollback messages"),
            ("txmq_transaction_discarded_messages_total", "discards",
             "Half messages discarded (checked transactionCheckMax times or not committable)")):
        c = CounterMetricFamily(name, help_, labels=["topic"])
        for topic, counts in sorted(tx.settled_by_topic.items()):
            if counts.get(key):
                c.add_metric([topic], counts[key])
        yield c
    for key, help_ in (("commits", "Transactions committed"),
                       ("rollbacks", "Transactions rolled back"),
                       ("discards", "Half messages discarded after transactionCheckMax"),
                       ("checks_sent", "Check-back requests sent"),
                       ("checks_answered", "Check-back answers received"),
                       ("duplicate_ends", "End-transaction requests for decided transactions"),
                       ("retried_halves", "Half sends answered with the pending half they retry"),
                       ("check_errors", "Check-backs that failed on the broker"),
                       ("checks_no_producer", "Check-backs deferred: no live producer")):
        c = CounterMetricFamily(f"txmq_transaction_{key}", help_)
        c.add_metric([], tx.stats[key])
        yield c
    h = HistogramMetricFamily("rocketmq_finish_message_latency_seconds",
                              "Prepare-to-finish latency of transactions")
    hist = tx.finish_latency
    h.add_metric([], hist.cumulative(), sum_value=hist.total)
    yield h


def _health_metrics(broker: Broker, now_ms: int) -> Iterator[Metric]:
    """Timer ticks, failures and restarts, and parked messages (issue 11 part 4)."""
    info = broker.runtime_info(now_ms)
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


def _ha_metrics(broker: Broker, now_ms: int) -> Iterator[Metric]:
    """Replication (docs/replication.md): RocketMQ has no HA metric in its OpenTelemetry set, so
    these are ``txmq_ha_…``, named after RocketMQ's runtime info (``slaveFallBehindMuch``,
    ``HARuntimeInfo.inSyncSlaveNums``, ``slaveAckOffset``, ``HAClientRuntimeInfo.isActivated``)."""
    if broker.ha_status is None:
        return
    ha = broker.ha_status(now_ms)
    labels = ["slave", "broker_id"]
    behind = GaugeMetricFamily("txmq_ha_slave_fall_behind_bytes",
                               "Commit log bytes a connected slave has not acknowledged",
                               labels=labels)
    lag = GaugeMetricFamily("txmq_ha_slave_lag_seconds",
                            "Time since a connected slave's acknowledgement last reached the "
                            "master's end (0: caught up)", labels=labels)
    ack = GaugeMetricFamily("txmq_ha_slave_ack_offset_bytes",
                            "Commit log offset a connected slave last acknowledged", labels=labels)
    for c in ha.ha_connection_info:
        key = [c.addr, str(c.broker_id)]
        behind.add_metric(key, c.diff)
        lag.add_metric(key, c.lag_ms / 1000)
        ack.add_metric(key, c.slave_ack_offset)
    yield from (behind, lag, ack)
    if ha.master:
        yield GaugeMetricFamily("txmq_ha_in_sync_slaves", "Connected slaves within "
                                "ha_max_gap_not_in_sync bytes", value=ha.in_sync_slave_nums)
        yield GaugeMetricFamily("txmq_ha_connected_slaves", "Slaves connected to the HA listener",
                                value=len(ha.ha_connection_info))
    else:
        yield GaugeMetricFamily("txmq_ha_master_connected", "1 while the slave's HA link to its "
                                "master is up", value=int(ha.ha_client_runtime_info.activated))


def broker_metrics(broker: Broker, now_ms: int) -> list[Metric]:
    """Every metric family of ``broker`` at ``now_ms``. Call it on the broker's event loop (it
    reads the store). A part that fails is logged and left out; the others are still returned."""
    out: list[Metric] = []
    parts: list[Callable[[], Iterator[Metric]]] = [
        partial(_traffic_metrics, broker), partial(_rpc_metrics, broker),
        partial(_lag_metrics, broker, now_ms), partial(_storage_metrics, broker, now_ms),
        partial(_transaction_metrics, broker, now_ms), partial(_health_metrics, broker, now_ms),
        partial(_ha_metrics, broker, now_ms)]
    for part in parts:
        try:
            out += list(part())
        except Exception:  # one broken part must not take the others with it
            log.exception("a part of the broker's metrics failed")
    return out


class _BrokerCollector(Collector):
    """Builds the broker's metric families on its event loop, from the HTTP server's thread."""

    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration: it would wait for the loop it runs on

    def collect(self) -> Iterator[Metric]:
        async def on_loop() -> list[Metric]:
            return broker_metrics(self.broker, time.time_ns() // 1_000_000)

        fut = asyncio.run_coroutine_threadsafe(on_loop(), self.loop)
        yield from fut.result(timeout=limits.METRICS_SCRAPE_TIMEOUT_MS / 1000)


def start_metrics(broker: Broker, port: int, tls: TlsConfig | None = None) -> CollectorRegistry:
    """Serve ``/metrics`` on ``127.0.0.1:port`` from a daemon thread: the broker's metrics
    (built on the running event loop, which must be the broker's) and the process's (CPU, memory,
    GC). Returns the registry. Raises OSError if the port cannot be bound.

    With ``tls`` not disabled (the broker's ``[tls]`` table) it serves HTTPS only, in
    ``permissive`` mode too (prometheus_client cannot tell a TLS client from a plaintext one), with
    the table's certificate, key and, for ``need_client_auth = "require"``, client CAs."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_BrokerCollector(broker, asyncio.get_running_loop()))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    if tls is None or not tls.enabled:
        start_http_server(port, addr="127.0.0.1", registry=registry)
        return registry
    if tls.server_mode == "permissive":
        log.warning("metrics endpoint: HTTPS only (tls.server_mode permissive applies to the "
                    "remoting port; an HTTP scrape is refused)")
    start_http_server(port, addr="127.0.0.1", registry=registry, certfile=tls.cert_file,
                      keyfile=tls.key_file, client_cafile=tls.ca_file or None,
                      client_auth_required=tls.need_client_auth == "require",
                      tls_min_version=ssl.TLSVersion.TLSv1_2)
    return registry
