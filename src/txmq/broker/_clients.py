"""Who is connected: client ids, producer groups and consumer groups per connection."""

from __future__ import annotations

import msgspec

from txmq.protocol import ConsumerData, HeartbeatData

__all__ = ["ClientRegistry"]


class _Client(msgspec.Struct):
    conn: int
    client_id: str
    producer_groups: set[str]
    consumers: dict[str, ConsumerData]
    last_beat_ms: int


class ClientRegistry:
    """Connections and the groups they belong to, as told by HEART_BEAT.

    Producer groups route check-backs; consumer groups drive rebalancing.
    """

    def __init__(self) -> None:
        self._by_conn: dict[int, _Client] = {}
        self._rr: dict[str, int] = {}

    def heartbeat(self, conn: int, data: HeartbeatData, now_ms: int) -> set[str]:
        """Record a heartbeat; return the consumer groups whose members (client ids) changed."""
        old = self._by_conn.get(conn)
        touched = (set(old.consumers) if old else set()) | {c.group_name for c in data.consumer_data_set}
        before = {g: self._member_ids(g) for g in touched}
        consumers = {c.group_name: c for c in data.consumer_data_set}
        self._by_conn[conn] = _Client(conn, data.client_id, set(data.producer_groups), consumers,
                                      now_ms)
        return {g for g in touched if self._member_ids(g) != before[g]}

    def remove(self, conn: int) -> set[str]:
        """Forget a connection; return the consumer groups whose members changed (a client that
        is still connected over another connection has not left)."""
        c = self._by_conn.pop(conn, None)
        if c is None:
            return set()
        return {g for g in c.consumers if c.client_id not in self._member_ids(g)}

    def _member_ids(self, group: str) -> set[str]:
        return {c.client_id for c in self._by_conn.values() if group in c.consumers}

    def expired(self, now_ms: int, timeout_ms: int) -> list[int]:
        """Connections silent for longer than ``timeout_ms``."""
        return [c.conn for c in self._by_conn.values() if now_ms - c.last_beat_ms > timeout_ms]

    def client_id(self, conn: int) -> str:
        c = self._by_conn.get(conn)
        return c.client_id if c else ""

    def producer_conns(self, group: str) -> dict[str, int]:
        """Live producers of ``group``: client id → connection."""
        return {c.client_id: c.conn for c in self._by_conn.values() if group in c.producer_groups}

    def pick_producer(self, group: str, prefer_client_id: str) -> int | None:
        """The connection to check back on: the sender if connected, else round-robin over the
        group's live producers (RocketMQ ``ProducerManager.getAvailableChannel``), else None."""
        conns = self.producer_conns(group)
        if prefer_client_id in conns:
            return conns[prefer_client_id]
        if not conns:
            return None
        ids = sorted(conns)
        i = self._rr.get(group, 0) % len(ids)
        self._rr[group] = i + 1
        return conns[ids[i]]

    def consumer_conns(self, group: str) -> dict[str, int]:
        """Members of consumer ``group``: client id → connection."""
        return {c.client_id: c.conn for c in self._by_conn.values() if group in c.consumers}

    def consumer_groups(self) -> dict[str, ConsumerData]:
        """Every consumer group with one member's subscription data."""
        out: dict[str, ConsumerData] = {}
        for c in self._by_conn.values():
            out.update(c.consumers)
        return out
