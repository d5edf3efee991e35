"""A broker's replication state as ``GET_BROKER_HA_STATUS`` answers it (RocketMQ ``RequestCode``
907, the request behind ``mqadmin haStatus``): the JSON body of RocketMQ 5's ``HARuntimeInfo``
(``remoting/.../protocol/body/HARuntimeInfo.java``), with RocketMQ's field names, and txmq's own
fields added (``brokerName``, ``brokerId``, ``brokerRole``, a connection's ``brokerName`` /
``brokerId`` when the HA handshake named them and its ``lagMs``). Unknown fields are ignored on
decode, so RocketMQ's own answers decode too.
"""

from __future__ import annotations

import msgspec

from txmq.errors import MalformedFrame

__all__ = ["HaClientRuntimeInfo", "HaConnectionRuntimeInfo", "HaMember", "HaRuntimeInfo"]


class HaConnectionRuntimeInfo(msgspec.Struct, kw_only=True, rename="camel"):
    """One slave connected to a master (RocketMQ ``HARuntimeInfo.HAConnectionRuntimeInfo``).

    Attributes:
        addr: the slave's ``host:port`` as the master sees it.
        slave_ack_offset: the commit log offset the slave last reported durable (bytes).
        diff: ``masterCommitLogMaxOffset - slave_ack_offset``, bytes the slave lacks.
        in_sync: within ``ha_max_gap_not_in_sync`` bytes (RocketMQ 4.9.7 ``isSlaveOK``).
        transfer_from_where: the offset the master started shipping from (the first report).
        broker_name, broker_id: what the slave's HA hello named (ACL on; "" and -1 without).
        lag_ms: how long the slave has lacked bytes the master holds: the time since its report
            last reached the master's end (RocketMQ 5 ``lastCatchUpTimeMs``); 0 when caught up.
    """

    addr: str
    slave_ack_offset: int
    diff: int
    in_sync: bool
    transfer_from_where: int
    broker_name: str = ""
    broker_id: int = -1
    lag_ms: int = 0


class HaClientRuntimeInfo(msgspec.Struct, kw_only=True, rename="camel"):
    """A slave's HA client (RocketMQ ``HARuntimeInfo.HAClientRuntimeInfo``): ``master_addr``
    (HA address), ``max_offset`` (its commit log's end, bytes), ``last_read_timestamp`` /
    ``last_write_timestamp`` (ms since the epoch of the last bytes from / to the master; 0:
    never) and ``activated`` (connected now)."""

    master_addr: str = ""
    max_offset: int = 0
    last_read_timestamp: int = 0
    last_write_timestamp: int = 0
    activated: bool = False


class HaMember(msgspec.Struct, kw_only=True):
    """One member of a broker group as one broker sees it (``txmq broker status``, the console).

    Attributes:
        member: "this broker", a slave's broker name ("slave" when its hello named none), or
            "master" (a slave's master).
        role: ``broker_role``, or SLAVE / MASTER for the others.
        offset: its commit log end (this broker) or acknowledged offset (a slave); None: unknown.
        lag_bytes, lag_s: how far it is behind the master (None: unknown, a slave's master).
        in_sync: a slave within ``ha_max_gap_not_in_sync``; a slave's master: the link is up.
    """

    member: str
    role: str
    broker_id: int
    address: str
    offset: int | None
    lag_bytes: int | None
    lag_s: float | None
    in_sync: bool


class HaRuntimeInfo(msgspec.Struct, kw_only=True, rename="camel"):
    """A broker's replication state (RocketMQ ``HARuntimeInfo``).

    Attributes:
        master: the broker is a master (ASYNC_MASTER or SYNC_MASTER).
        master_commit_log_max_offset: this broker's commit log end (bytes).
        in_sync_slave_nums: connected slaves within ``ha_max_gap_not_in_sync``.
        ha_connection_info: a master's connected slaves.
        ha_client_runtime_info: a slave's link to its master.
        broker_name, broker_id, broker_role: txmq's: who answered.
    """

    master: bool
    master_commit_log_max_offset: int
    in_sync_slave_nums: int = 0
    ha_connection_info: list[HaConnectionRuntimeInfo] = msgspec.field(default_factory=list)
    ha_client_runtime_info: HaClientRuntimeInfo = msgspec.field(default_factory=HaClientRuntimeInfo)
    broker_name: str = ""
    broker_id: int = 0
    broker_role: str = ""

    def encode(self) -> bytes:
        """The response body (JSON)."""
        return msgspec.json.encode(self)

    def members(self, address: str) -> list[HaMember]:
        """The broker group as this broker (at ``address``) sees it: itself, then a master's
        connected slaves (ack offset, lag in bytes and seconds) or a slave's master."""
        out = [HaMember(member="this broker",
                        role=self.broker_role or ("MASTER" if self.master else "SLAVE"),
                        broker_id=self.broker_id, address=address,
                        offset=self.master_commit_log_max_offset, lag_bytes=0, lag_s=0.0,
                        in_sync=True)]
        for c in self.ha_connection_info:
            out.append(HaMember(member=c.broker_name or "slave", role="SLAVE",
                                broker_id=c.broker_id, address=c.addr, offset=c.slave_ack_offset,
                                lag_bytes=c.diff, lag_s=round(c.lag_ms / 1000, 1),
                                in_sync=c.in_sync))
        if not self.master:
            client = self.ha_client_runtime_info
            out.append(HaMember(member="master", role="MASTER", broker_id=0,
                                address=client.master_addr or "(not known yet)", offset=None,
                                lag_bytes=None, lag_s=None, in_sync=client.activated))
        return out

    @classmethod
    def decode(cls, body: bytes) -> HaRuntimeInfo:
        """Parse a response body. Raises MalformedFrame when it is not an HARuntimeInfo."""
        try:
            return msgspec.json.decode(body, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedFrame(f"bad HA runtime info body: {exc}") from exc
