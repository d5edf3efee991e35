"""Traffic counters of the broker core, sans-IO: plain ints in dicts, read at scrape time.

What RocketMQ 5 records with OpenTelemetry instruments (RIP-46: ``BrokerMetricsManager``,
``RemotingMetricsManager``, ``ConsumerLagCalculator``) is counted here as cheaply as the send path
allows: one dict look-up and a few integer increments per request (never a labels object or a lock
per message); lag, inflight and ready messages are not counted at all but computed by
:func:`consumer_lag` when ``/metrics`` is scraped. :mod:`txmq.broker._metrics` turns these into
Prometheus metric families.

Threads: every method here runs on the broker's event loop (the one writer thread of the store).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

import msgspec

from txmq.protocol import DLQ_PREFIX, RETRY_PREFIX

if TYPE_CHECKING:
    from txmq.broker._broker import Broker

__all__ = ["MESSAGE_SIZE_BUCKETS_BYTES", "MESSAGE_TYPES", "RPC_LATENCY_BUCKETS_MS", "GroupLag",
           "TrafficStats", "consumer_lag"]

MESSAGE_TYPES = ("normal", "fifo", "delay", "transaction")
"""Values of the ``message_type`` label (RocketMQ ``TopicMessageType.getMetricsValue``), indexed by
the ``kind`` :meth:`TrafficStats.sent` takes."""
NORMAL, FIFO, DELAY, TRANSACTION = range(4)

MESSAGE_SIZE_BUCKETS_BYTES = (1024, 4 * 1024, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024,
                              4 * 1024 * 1024)
"""Upper bounds of ``rocketmq_message_size`` (RocketMQ ``BrokerMetricsManager.registerMetricsView``:
1 KiB, 4 KiB, 512 KiB, 1 MiB, 2 MiB, 4 MiB)."""

RPC_LATENCY_BUCKETS_MS = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)
"""Upper bounds of ``rocketmq_rpc_latency`` in ms (RocketMQ ``RemotingMetricsManager.getMetricsView``)."""

_RB = len(RPC_LATENCY_BUCKETS_MS) + 1

SYSTEM_GROUP_PREFIX = "cid_rmq_sys_"
"""A consumer group whose lower-cased name starts so is a system group (RocketMQ
``BrokerMetricsManager.SYSTEM_GROUP_PREFIX_LIST``: ``MixAll.CID_RMQ_SYS_PREFIX``)."""


class TrafficStats:
    """Messages and bytes in and out, pull positions and request latencies since start.

    Attributes:
        messages_in: topic → per message type (:data:`MESSAGE_TYPES` order) ``[count, bytes,
            size histogram bucket counts…]`` (:data:`MESSAGE_SIZE_BUCKETS_BYTES` and +Inf). Bytes
            are the stored record's size (RocketMQ ``AppendMessageResult.wroteBytes``).
        messages_out: consumer group → topic → ``[count, bytes]`` (pulled and popped; bytes are
            the stored records' sizes, RocketMQ ``GetMessageResult.bufferTotalSize``).
        pull_offsets: consumer group → topic → queue id → the next offset the group's last pull of
            that queue was told (RocketMQ ``ConsumerOffsetManager.commitPullOffset``).
        rpc: ``(request code, response code, long polling)`` → bucket counts
            (:data:`RPC_LATENCY_BUCKETS_MS` and +Inf) and, last, the sum of the latencies in ms.
        dlq: consumer group → original topic → messages sent to the group's DLQ.
    """

    def __init__(self) -> None:
        self.messages_in: dict[str, list[list[int]]] = {}
        self.messages_out: dict[str, dict[str, list[int]]] = {}
        self.pull_offsets: dict[str, dict[str, dict[int, int]]] = {}
        self.rpc: dict[tuple[int, int, bool], list[float]] = {}
        self.dlq: dict[str, dict[str, int]] = {}

    def topic_in(self, topic: str) -> list[list[int]]:
        """``messages_in[topic]``, created with zeros if missing."""
        c = self.messages_in.get(topic)
        if c is None:
            c = self.messages_in[topic] = [[0] * (2 + _NB) for _ in MESSAGE_TYPES]
        return c

    def sent(self, topic: str, kind: int, size: int) -> None:
        """One message of ``kind`` (NORMAL, FIFO, DELAY, TRANSACTION) stored for ``topic``,
        ``size`` bytes. (The send path inlines this.)"""
        c = self.topic_in(topic)[kind]
        c[0] += 1
        c[1] += size
        c[2 + size_bucket(size)] += 1

    def delivered(self, group: str, topic: str, count: int, size: int) -> None:
        """``count`` messages of ``topic``, ``size`` bytes in all, handed to ``group``."""
        by_topic = self.messages_out.get(group)
        if by_topic is None:
            by_topic = self.messages_out[group] = {}
        c = by_topic.get(topic)
        if c is None:
            c = by_topic[topic] = [0, 0]
        c[0] += count
        c[1] += size

    def pulled(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        """A pull of ``group`` was told to go on from ``next_offset`` in that queue."""
        by_topic = self.pull_offsets.get(group)
        if by_topic is None:
            by_topic = self.pull_offsets[group] = {}
        queues = by_topic.get(topic)
        if queues is None:
            queues = by_topic[topic] = {}
        queues[queue_id] = next_offset

    def answered(self, request_code: int, response_code: int, latency_ms: float,
                 long_polling: bool = False, count: int = 1) -> None:
        """``count`` requests of ``request_code`` answered with ``response_code`` after
        ``latency_ms`` (from the request's arrival to its reply being written)."""
        key = (request_code, response_code, long_polling)
        h = self.rpc.get(key)
        if h is None:
            h = self.rpc[key] = [0.0] * (_RB + 1)
        h[bisect_left(RPC_LATENCY_BUCKETS_MS, latency_ms)] += count
        h[_RB] += latency_ms * count

    def sent_to_dlq(self, group: str, topic: str) -> None:
        """A message of ``topic`` that ``group`` failed too often went to its DLQ."""
        by_topic = self.dlq.setdefault(group, {})
        by_topic[topic] = by_topic.get(topic, 0) + 1


_NB = len(MESSAGE_SIZE_BUCKETS_BYTES) + 1


def size_bucket(size: int) -> int:
    """Index of the ``rocketmq_message_size`` bucket of ``size`` bytes (the last: +Inf)."""
    return bisect_left(MESSAGE_SIZE_BUCKETS_BYTES, size)


def is_system_group(group: str) -> bool:
    """RocketMQ ``BrokerMetricsManager.isSystemGroup``."""
    return group.lower().startswith(SYSTEM_GROUP_PREFIX)


class GroupLag(msgspec.Struct, frozen=True):
    """One consumer group's backlog on one topic, summed over its queues (RocketMQ
    ``ConsumerLagCalculator``).

    Attributes:
        lag: messages stored but not consumed: queue max offset − committed consumer offset (a
            queue the group has no offset in counts 0, as in RocketMQ).
        lag_latency_ms: ``now`` − store time of the oldest unconsumed message (0 if none).
        inflight: messages pulled but not committed: pull offset − committed offset.
        queueing_latency_ms: ``now`` − store time of the oldest message not pulled yet (0 if none).
        ready: messages stored and not pulled yet: queue max offset − pull offset (0 for a queue
            the group has not pulled).
    """

    group: str
    topic: str
    lag: int
    lag_latency_ms: int
    inflight: int
    queueing_latency_ms: int
    ready: int


def _group_topics(broker: Broker, traffic: TrafficStats) -> set[tuple[str, str]]:
    """(group, topic) pairs to report: the offset table's, the pulled ones and the subscriptions
    of connected consumers; not retry or DLQ topics, nor topics that do not exist."""
    pairs = {(g, t) for g, topics in broker.offsets.group_topics().items() for t in topics}
    pairs |= {(g, t) for g, by_topic in traffic.pull_offsets.items() for t in by_topic}
    for g, data in broker.clients.consumer_groups().items():
        pairs |= {(g, s) for s in data.subscriptions}
    return {(g, t) for g, t in pairs
            if not t.startswith((RETRY_PREFIX, DLQ_PREFIX)) and t in broker.topics}


def _store_time(broker: Broker, topic: str, queue_id: int, offset: int) -> int | None:
    msgs = broker.store.read_queue(topic, queue_id, offset, 1, 1)
    return msgs[0].store_timestamp_ms if msgs else None


def consumer_lag(broker: Broker, traffic: TrafficStats, now_ms: int) -> list[GroupLag]:
    """Every consumer group's lag, inflight and ready messages per topic, computed now from the
    queues' max offsets, the committed offsets and the last pull offsets (RocketMQ
    ``ConsumerLagCalculator.calculateLag/calculateInflight/calculateAvailable``). Reads one record
    per queue with a backlog (its store time). Raises CorruptRecord on a damaged record."""
    out: list[GroupLag] = []
    for group, topic in sorted(_group_topics(broker, traffic)):
        pulls = traffic.pull_offsets.get(group, {}).get(topic, {})
        lag = inflight = ready = 0
        oldest_unconsumed = oldest_unpulled = now_ms
        for qid in range(broker.topics[topic]):
            hi = broker.store.queue_bounds(topic, qid)[1]
            committed = broker.offsets.get(group, topic, qid)
            committed = hi if committed is None or committed < 0 else min(committed, hi)
            pulled = pulls.get(qid)
            lag += hi - committed
            if hi > committed and (ts := _store_time(broker, topic, qid, committed)) is not None:
                oldest_unconsumed = min(oldest_unconsumed, ts)
            if pulled is None:
                continue
            pulled = min(pulled, hi)
            inflight += max(0, pulled - committed)
            ready += hi - pulled
            if hi > pulled and (ts := _store_time(broker, topic, qid, pulled)) is not None:
                oldest_unpulled = min(oldest_unpulled, ts)
        out.append(GroupLag(group=group, topic=topic, lag=lag, inflight=inflight, ready=ready,
                            lag_latency_ms=now_ms - oldest_unconsumed,
                            queueing_latency_ms=now_ms - oldest_unpulled))
    return out
