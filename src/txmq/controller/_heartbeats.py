"""The controller leader's view of broker liveness and master leases (leader-local, not replicated).

Sans-IO: every method takes ``now_ms`` from the caller's monotonic clock (``time.monotonic()``), so
wall-clock jumps neither expire brokers nor extend leases.

- A broker is alive from its BROKER_HEARTBEAT until its channel closes or it is silent longer than
  its timeout (the heartbeat's ``heartbeatTimeoutMills``, else the table's default). RocketMQ
  ``DefaultBrokerHeartbeatManager`` (``onBrokerHeartbeat``, ``onBrokerChannelClose``,
  ``scanNotActiveBroker``).
- Leases (txmq, beyond RocketMQ; docs/controller.md): each SUCCESS answer to a master's heartbeat
  grants it until ``now + lease_ms``; :meth:`may_replace_master` is False before that time, and
  for one lease after this controller became leader (it cannot know its predecessor's grants).
"""

from __future__ import annotations

import msgspec

from txmq.controller._state import Candidate

__all__ = ["BrokerLive", "HeartbeatTable"]


class BrokerLive(msgspec.Struct):
    """One broker's last heartbeat (RocketMQ ``BrokerLiveInfo``); times are monotonic ms."""

    broker_name: str
    broker_id: int
    address: str
    last_seen_ms: int
    timeout_ms: int
    epoch: int = 0
    max_offset: int = 0
    confirm_offset: int = 0
    priority: int = 0
    conn: int | None = None


class HeartbeatTable:
    """Live brokers by (brokerName, brokerId) and master leases by brokerName.

    Args:
        timeout_ms: a broker silent this long is inactive when its heartbeat names no timeout
            (txmq ``controller_heartbeat_timeout_ms`` 3000; RocketMQ
            ``controllerHeartBeatTimeoutMills`` 10 s).
        lease_ms: a master's write lease (txmq ``controller_lease_ms``).
    """

    def __init__(self, timeout_ms: int, lease_ms: int) -> None:
        self.timeout_ms, self.lease_ms = timeout_ms, lease_ms
        self._live: dict[tuple[str, int], BrokerLive] = {}
        self._leases: dict[str, int] = {}
        self._no_election_before_ms = 0

    def heartbeat(self, live: BrokerLive) -> None:
        """Record a heartbeat (``live.last_seen_ms`` = when it arrived)."""
        if live.timeout_ms <= 0:
            live.timeout_ms = self.timeout_ms
        self._live[(live.broker_name, live.broker_id)] = live

    def get(self, broker_name: str, broker_id: int) -> BrokerLive | None:
        return self._live.get((broker_name, broker_id))

    def is_alive(self, broker_name: str, broker_id: int, now_ms: int) -> bool:
        b = self._live.get((broker_name, broker_id))
        return b is not None and now_ms - b.last_seen_ms <= b.timeout_ms

    def alive_ids(self, broker_name: str, now_ms: int) -> frozenset[int]:
        return frozenset(i for (n, i) in list(self._live)
                         if n == broker_name and self.is_alive(n, i, now_ms))

    def candidates(self, broker_name: str, now_ms: int) -> tuple[Candidate, ...]:
        """The group's live brokers with their last heartbeat's epoch, maxOffset, priority."""
        return tuple(Candidate(b.broker_id, b.epoch, b.max_offset, b.priority)
                     for b in list(self._live.values())
                     if b.broker_name == broker_name
                     and self.is_alive(b.broker_name, b.broker_id, now_ms))

    def channel_closed(self, conn: int) -> list[BrokerLive]:
        """Forget the brokers that heartbeat on connection ``conn``; returns them."""
        gone = [b for b in self._live.values() if b.conn == conn]
        for b in gone:
            del self._live[(b.broker_name, b.broker_id)]
        return gone

    def scan(self, now_ms: int) -> list[BrokerLive]:
        """Forget brokers silent longer than their timeout; returns them (RocketMQ
        ``scanNotActiveBroker``)."""
        gone = [b for b in self._live.values() if now_ms - b.last_seen_ms > b.timeout_ms]
        for b in gone:
            del self._live[(b.broker_name, b.broker_id)]
        return gone

    def became_leader(self, now_ms: int, extra_ms: int = 0) -> None:
        """This controller just became leader: no master is replaced for one lease plus
        ``extra_ms`` (the time an old leader may go on granting leases before it steps down)."""
        self._no_election_before_ms = now_ms + self.lease_ms + extra_ms
        self._leases.clear()

    def grant_lease(self, broker_name: str, received_ms: int) -> None:
        """The group's master heartbeat arrived at ``received_ms`` and is answered SUCCESS."""
        self._leases[broker_name] = max(self._leases.get(broker_name, 0),
                                        received_ms + self.lease_ms)

    def lease_end_ms(self, broker_name: str) -> int:
        """When the group's current master's lease ends at the latest (monotonic ms)."""
        return max(self._leases.get(broker_name, 0), self._no_election_before_ms)

    def may_replace_master(self, broker_name: str, now_ms: int) -> bool:
        """True once no lease granted by this controller (or a predecessor) may still run."""
        return now_ms >= self.lease_end_ms(broker_name)

    def master_changed(self, broker_name: str) -> None:
        """A new master was elected: the old master's lease is moot (it is fenced by epoch)."""
        self._leases.pop(broker_name, None)
