"""Routes and broker choice, sans-IO: what a client makes of a ``TopicRouteData`` (publish and
subscribe queues over every broker group) and which queue a send picks (round robin with latency
fault tolerance).

Sources: RocketMQ ``MQClientInstance.topicRouteData2TopicPublishInfo`` /
``topicRouteData2TopicSubscribeInfo`` (queue lists), ``findBrokerAddressInPublish`` /
``findBrokerAddressInSubscribe`` (addresses), ``TopicPublishInfo.selectOneMessageQueue`` (round
robin avoiding the last broker) and 5.x ``latency.MQFaultStrategy`` /
``LatencyFaultToleranceImpl`` (the latency → not-available tables).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from txmq.errors import MalformedHeader, RemoteError, ResponseCode, TransportError
from txmq.protocol import (
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    MessageQueue,
    TopicRouteData,
    decode_route,
)

__all__ = [
    "FAULT_ISOLATION_LATENCY_MS",
    "FAULT_LATENCY_MAX_MS",
    "FAULT_NOT_AVAILABLE_DURATION_MS",
    "MASTER_MOVED_CODES",
    "MASTER_MOVED_REMARKS",
    "NAMESRV_REFRESH_MIN_INTERVAL_MS",
    "UNREACHABLE_ROUTE_REFRESH_MS",
    "FaultStrategy",
    "QueueSelector",
    "RouteRefreshGate",
    "TopicRoute",
    "build_route",
    "decode_topic_route",
    "master_may_have_moved",
]

FAULT_LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
"""Latency steps of a send (RocketMQ 5.x ``MQFaultStrategy.latencyMax``)."""
FAULT_NOT_AVAILABLE_DURATION_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
"""How long a broker is avoided after a send of the matching latency step (RocketMQ 5.x
``MQFaultStrategy.notAvailableDuration``)."""
FAULT_ISOLATION_LATENCY_MS = 10_000
"""The latency a failed send counts as (RocketMQ 5.x ``updateFaultItem(..., isolation=true)`` uses
10 000 ms), so a broker that cannot be reached is avoided for 10 s."""

assert len(FAULT_LATENCY_MAX_MS) == len(FAULT_NOT_AVAILABLE_DURATION_MS)

UNREACHABLE_ROUTE_REFRESH_MS = 1_000
"""While a broker group of a topic's route is avoided because a send to it failed, a producer
looks the route up in the background at most this often (txmq): sends go to the other groups
meanwhile, so no send would ask for it, and the group's new master (a failover) would be found only
when the isolation (``FAULT_ISOLATION_LATENCY_MS``, 10 s) ends."""

NAMESRV_REFRESH_MIN_INTERVAL_MS = 200
"""Least time between two route lookups of one topic triggered by failures (txmq; RocketMQ looks
only on its 30 s ``pollNameServerInterval`` timer). Short enough that a client sees a new master
well within a second of the name server's route changing (a failover's election takes seconds),
long enough that a burst of failing sends asks the name server a few times a second, not once per
request."""

MASTER_MOVED_CODES = frozenset({ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SLAVE_NOT_AVAILABLE})
"""Refusals that mean "not the master (any more)": SERVICE_NOT_AVAILABLE, what a slave answers a
send (RocketMQ ``SendMessageProcessor`` for ``PutMessageStatus.SERVICE_NOT_AVAILABLE``), and
SLAVE_NOT_AVAILABLE, what a slave answers an end request (RocketMQ
``EndTransactionProcessor``: "Message store is slave mode, so end transaction is forbidden")."""

MASTER_MOVED_REMARKS = ("slave", "not master", "fenced", "in-sync replicas",
                        "in_sync_replicas_not_enough", "epoch")
"""Words of a refusal's remark (any code) that say the broker is not, or no longer, the master
its group can write to: a slave, a master fenced after losing its controller lease, a master
whose SyncStateSet shrank below ``minInSyncReplicas`` (RocketMQ answers
``PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH`` with SYSTEM_ERROR), an end of another epoch.
Matched lower-case."""


class TopicRoute(msgspec.Struct, frozen=True):
    """A topic's route as a client uses it.

    Attributes:
        topic: the topic.
        publish: writable queues of every broker group that has a master (id 0), in broker-name
            order, queue ids ascending (RocketMQ ``TopicPublishInfo.messageQueueList``); or the
            ``orderTopicConf`` list when the route has one.
        subscribe: readable queues of every broker group, master or not, sorted
            (RocketMQ ``topicRouteData2TopicSubscribeInfo``).
        brokers: broker name → {broker id → ``host:port``} (id 0 is the master).
    """

    topic: str
    publish: tuple[MessageQueue, ...]
    subscribe: tuple[MessageQueue, ...]
    brokers: dict[str, dict[int, str]]

    def master(self, broker_name: str) -> str | None:
        """The master address of ``broker_name``, or None when the group has no master
        (RocketMQ ``findBrokerAddressInPublish``)."""
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def masterless(self) -> list[str]:
        """Broker groups the route lists without a master (id 0), sorted: a failover's gap, in
        which sends go to the other groups until the route names the new master."""
        return sorted(n for n, addrs in self.brokers.items() if MASTER_ID not in addrs)

    def broker_names(self) -> list[str]:
        """Every broker group of the route, sorted."""
        return sorted(self.brokers)


def _order_conf(topic: str, conf: str) -> list[MessageQueue]:
    """``"broker-a:4;broker-b:4"`` → queues (RocketMQ ``orderTopicConf``). Raises MalformedHeader."""
    out: list[MessageQueue] = []
    for item in filter(None, conf.split(";")):
        name, _, nums = item.partition(":")
        if not name or not nums.isdigit():
            raise MalformedHeader(f"orderTopicConf item {item!r} is not broker:queues")
        out.extend(MessageQueue(topic, i, name) for i in range(int(nums)))
    return out


def build_route(route: TopicRouteData, topic: str) -> TopicRoute:
    """The :class:`TopicRoute` of a decoded ``TopicRouteData``. Raises MalformedHeader for an
    ``orderTopicConf`` that does not parse."""
    brokers = {bd.broker_name: dict(bd.broker_addrs) for bd in route.broker_datas}
    if route.order_topic_conf:
        publish = _order_conf(topic, route.order_topic_conf)
    else:
        publish = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.perm & PERM_WRITE and MASTER_ID in brokers.get(qd.broker_name, {}):
                publish.extend(MessageQueue(topic, i, qd.broker_name)
                               for i in range(qd.write_queue_nums))
    subscribe = sorted({MessageQueue(topic, i, qd.broker_name)
                        for qd in route.queue_datas if qd.perm & PERM_READ
                        for i in range(qd.read_queue_nums)})
    return TopicRoute(topic, tuple(publish), tuple(subscribe), brokers)


def decode_topic_route(data: bytes, topic: str) -> TopicRoute:
    """The :class:`TopicRoute` of a GET_ROUTEINFO_BY_TOPIC body. Raises MalformedHeader."""
    return build_route(decode_route(data), topic)


def master_may_have_moved(exc: BaseException | None) -> bool:
    """Whether a failed request says its broker group's master may have moved, so the route is
    worth fetching again at once: the connection failed (refused, reset, closed, timed out:
    TransportError), or the broker refused with one of :data:`MASTER_MOVED_CODES` or a remark
    with one of :data:`MASTER_MOVED_REMARKS` (txmq; RocketMQ waits for its 30 s route timer)."""
    if isinstance(exc, TransportError):
        return True
    if not isinstance(exc, RemoteError):
        return False
    remark = exc.remark.lower()
    return exc.response_code in MASTER_MOVED_CODES or any(w in remark for w in MASTER_MOVED_REMARKS)


class RouteRefreshGate:
    """When a failure may look a topic's route up again: one lookup in flight per topic (others
    wait for it), at most one started per ``min_interval_ms``. Times are monotonic ms.

    Args:
        min_interval_ms: least time between two starts (:data:`NAMESRV_REFRESH_MIN_INTERVAL_MS`).
    """

    def __init__(self, min_interval_ms: int = NAMESRV_REFRESH_MIN_INTERVAL_MS) -> None:
        self._min_ms = min_interval_ms
        self._started: dict[str, int] = {}
        self._in_flight: set[str] = set()

    def begin(self, topic: str, now_ms: int) -> bool:
        """True: start a lookup of ``topic`` now (call :meth:`end` when it is over); False: one is
        in flight, or one started less than ``min_interval_ms`` ago."""
        last = self._started.get(topic)
        if topic in self._in_flight or (last is not None and now_ms - last < self._min_ms):
            return False
        self._started[topic] = now_ms
        self._in_flight.add(topic)
        return True

    def may_begin(self, topic: str, now_ms: int) -> bool:
        """Whether :meth:`begin` would start a lookup of ``topic`` now (it changes nothing)."""
        last = self._started.get(topic)
        return topic not in self._in_flight and (last is None or now_ms - last >= self._min_ms)

    def since_last(self, topic: str, now_ms: int) -> int | None:
        """ms since the last lookup of ``topic`` started (None: never)."""
        last = self._started.get(topic)
        return None if last is None else now_ms - last

    def end(self, topic: str) -> None:
        """The lookup of ``topic`` is over (answered or failed)."""
        self._in_flight.discard(topic)

    def in_flight(self, topic: str) -> bool:
        """Whether a lookup of ``topic`` is under way."""
        return topic in self._in_flight


class _FaultItem(msgspec.Struct):
    latency_ms: int
    available_from_ms: int
    reachable: bool


class FaultStrategy:
    """Latency fault tolerance (RocketMQ 5.x ``MQFaultStrategy`` with
    ``sendLatencyFaultEnable``): each send's latency per broker maps to a time the broker is avoided
    (``FAULT_NOT_AVAILABLE_DURATION_MS``); a send that failed counts as ``FAULT_ISOLATION_LATENCY_MS``
    and marks the broker unreachable. On by default in txmq (RocketMQ's default is off, so its
    producer keeps choosing a dead broker).

    Args:
        enabled: False: plain round robin avoiding only the last broker tried, as RocketMQ's default.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._items: dict[str, _FaultItem] = {}

    @staticmethod
    def not_available_ms(latency_ms: int) -> int:
        """How long a send of ``latency_ms`` makes its broker avoided (the tables' lookup, from the
        top: the first step the latency reaches)."""
        for step, duration in zip(reversed(FAULT_LATENCY_MAX_MS),
                                  reversed(FAULT_NOT_AVAILABLE_DURATION_MS), strict=True):
            if latency_ms >= step:
                return duration
        return 0

    def update(self, broker: str, latency_ms: int, now_ms: int, *, failed: bool = False) -> None:
        """Record a send to ``broker`` that took ``latency_ms`` (or failed: isolation)."""
        if not self.enabled:
            return
        latency = FAULT_ISOLATION_LATENCY_MS if failed else latency_ms
        self._items[broker] = _FaultItem(latency, now_ms + self.not_available_ms(latency),
                                         reachable=not failed)

    def forget(self, broker: str) -> None:
        """Drop what is known of ``broker``: its group has a new master, whose address the past
        failures were not about."""
        self._items.pop(broker, None)

    def available(self, broker: str, now_ms: int) -> bool:
        """Whether ``broker`` may be chosen now."""
        item = self._items.get(broker)
        return item is None or now_ms >= item.available_from_ms

    def reachable(self, broker: str) -> bool:
        """False while the last send to ``broker`` failed."""
        item = self._items.get(broker)
        return item is None or item.reachable


class QueueSelector:
    """Round-robin queue choice of one producer (RocketMQ ``TopicPublishInfo.sendWhichQueue``, a
    counter with a random start), filtered by a :class:`FaultStrategy`.

    Args:
        faults: the producer's fault strategy.
        rng: randomness for the counter's start (a parameter, for replayable simulations).
    """

    def __init__(self, faults: FaultStrategy, rng: random.Random | None = None) -> None:
        self.faults = faults
        self._rng = rng or random.Random()
        self._index: dict[str, int] = {}

    def _next(self, topic: str) -> int:
        i = self._index.get(topic)
        if i is None:
            i = self._rng.randrange(1 << 16)
        self._index[topic] = i + 1
        return i

    def select(self, topic: str, queues: Sequence[MessageQueue], last_broker: str | None,
               now_ms: int) -> MessageQueue:
        """The queue for the next attempt: the next in round robin whose broker is available and not
        ``last_broker`` (the broker of the failed previous attempt); else one on a reachable broker
        other than ``last_broker``; else one not on ``last_broker``; else plain round robin
        (RocketMQ 5.x ``MQFaultStrategy.selectOneMessageQueue``).

        Raises:
            ValueError: ``queues`` is empty.
        """
        if not queues:
            raise ValueError(f"topic {topic!r} has no queue to send to")
        start = self._next(topic)
        n = len(queues)
        f = self.faults
        if f.enabled:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != last_broker and f.available(mq.broker_name, now_ms):
                    return mq
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != last_broker and f.reachable(mq.broker_name):
                    return mq
        if last_broker is not None:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != last_broker:
                    return mq
        return queues[start % n]
