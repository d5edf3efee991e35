"""The broker's controller client in controller mode, sans-IO (RocketMQ ``ReplicasManager``).

:class:`ReplicasCore` takes the time (monotonic ms), the broker's :class:`BrokerStatus` and the
controllers' answers, and returns actions: requests to send, the broker id file to write, role
changes, SyncStateSet updates, write leases and fencing. The asyncio shell
(``_replicas_shell``) performs them on a :class:`~txmq.broker._roles.RoleTarget`.

Life of a broker (RocketMQ ``ReplicasManager.startBasicService``):

1. find the controller leader (CONTROLLER_GET_METADATA_INFO to each controller in turn);
2. without a broker id file: CONTROLLER_GET_NEXT_BROKER_ID, then CONTROLLER_APPLY_BROKER_ID with a
   random check code; the id is written to ``<store>/.broker.meta`` (:func:`encode_broker_meta`);
3. CONTROLLER_REGISTER_BROKER with its address; a group without a master: CONTROLLER_ELECT_MASTER
   naming itself;
4. BROKER_HEARTBEAT every ``heartbeat_interval_ms``; a SUCCESS answer that names this broker master
   in its epoch renews the lease to ``sent + lease_ms`` (``sent`` = when the heartbeat left);
   CONTROLLER_GET_REPLICA_INFO every ``REPLICA_INFO_POLL_MS``; NOTIFY_BROKER_ROLE_CHANGED pushes.
   Only a newer master epoch changes the role (RocketMQ ``changeToMaster`` / ``changeToSlave``);
   a master the controller no longer names (same epoch, no master) fences itself;
5. as master, every ``ALTER_CHECK_MS``: CONTROLLER_ALTER_SYNC_STATE_SET to {self} + the slaves
   the broker reports caught up, when that differs from the current set.
"""

from __future__ import annotations

import struct
import zlib
from enum import Enum

import msgspec

from txmq.errors import CorruptRecord, MalformedHeader, ResponseCode
from txmq.protocol import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    Command,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    RequestCode,
    SyncStateSet,
    decode_controller_body,
    encode_controller_body,
    from_ext,
    to_ext,
)

__all__ = [
    "ALTER_CHECK_MS",
    "BROKER_META_FILE",
    "DISCOVER_RETRY_MS",
    "REPLICA_INFO_POLL_MS",
    "Action",
    "BecomeMaster",
    "BecomeSlave",
    "BrokerMeta",
    "BrokerStatus",
    "Fence",
    "ReplicasConfig",
    "ReplicasCore",
    "Request",
    "SaveMeta",
    "SetLease",
    "SetSyncStateSet",
    "decode_broker_meta",
    "encode_broker_meta",
]

BROKER_META_FILE = ".broker.meta"
"""The broker id file under the store directory (RocketMQ ``BrokerMetadata``, ``.broker.meta``)."""
REPLICA_INFO_POLL_MS = 5_000
"""How often a broker polls its group (RocketMQ ``BrokerConfig.syncBrokerMetadataPeriod`` 5 s)."""
ALTER_CHECK_MS = 1_000
"""How often a master compares its SyncStateSet with its caught-up slaves (RocketMQ
``checkSyncStateSetPeriod`` 5 s; 1 s so a slave rejoins the set, and so may be elected, soon)."""
DISCOVER_RETRY_MS = 1_000
"""Pause between two rounds of asking every controller for the leader."""


class BrokerMeta(msgspec.Struct, frozen=True, rename="camel"):
    """The broker's controller id (RocketMQ ``BrokerMetadata``)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    register_check_code: str


_META_HEAD = struct.Struct(">I")
# .broker.meta layout:
#   0        4
#   +--------+------------------------------------------------------------------+
#   | crc32  | JSON {clusterName, brokerName, brokerId, registerCheckCode} UTF-8 |
#   +--------+------------------------------------------------------------------+
#   crc32 = zlib.crc32 of the JSON bytes, big-endian u32 (">I")


def encode_broker_meta(meta: BrokerMeta) -> bytes:
    body = msgspec.json.encode(meta)
    return _META_HEAD.pack(zlib.crc32(body)) + body


def decode_broker_meta(data: bytes) -> BrokerMeta:
    """Read ``.broker.meta``. Raises CorruptRecord (short, CRC mismatch, or not the JSON shape)."""
    if len(data) < _META_HEAD.size:
        raise CorruptRecord(f"{BROKER_META_FILE}: {len(data)} bytes")
    (crc,) = _META_HEAD.unpack_from(data)
    body = data[_META_HEAD.size:]
    if zlib.crc32(body) != crc:
        raise CorruptRecord(f"{BROKER_META_FILE}: CRC mismatch")
    try:
        return msgspec.json.decode(body, type=BrokerMeta)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecord(f"{BROKER_META_FILE}: {exc}") from exc


class ReplicasConfig(msgspec.Struct, frozen=True):
    """What the manager needs of BrokerConfig (controller mode fields, docs/controller.md)."""

    cluster_name: str
    broker_name: str
    broker_addr: str
    controller_addrs: tuple[str, ...]
    heartbeat_interval_ms: int = 1_000
    lease_ms: int = 3_000
    heartbeat_timeout_ms: int = 3_000
    election_priority: int = 0


class BrokerStatus(msgspec.Struct, frozen=True):
    """The broker now, read from its RoleTarget by the shell."""

    max_phy_offset: int = 0
    confirm_offset: int = 0
    last_epoch: int = 0
    in_sync_slaves: frozenset[int] = frozenset()


class Request(msgspec.Struct, frozen=True):
    """Send ``code``/``ext``/``body`` to ``addr`` (None: the controller leader) and give the
    answer (or None on failure) to :meth:`ReplicasCore.on_response` with this request."""

    code: int
    ext: dict[str, str]
    body: bytes = b""
    addr: str | None = None
    sent_ms: int = 0


class SaveMeta(msgspec.Struct, frozen=True):
    data: bytes


class BecomeMaster(msgspec.Struct, frozen=True):
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int


class BecomeSlave(msgspec.Struct, frozen=True):
    master_epoch: int
    master_broker_id: int
    master_addr: str


class SetSyncStateSet(msgspec.Struct, frozen=True):
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int


class SetLease(msgspec.Struct, frozen=True):
    expires_mono_ms: int


class Fence(msgspec.Struct, frozen=True):
    pass


Action = Request | SaveMeta | BecomeMaster | BecomeSlave | SetSyncStateSet | SetLease | Fence


class _Phase(Enum):
    DISCOVER = 0
    NEXT_ID = 1
    APPLY_ID = 2
    REGISTER = 3
    RUNNING = 4


class ReplicasCore:
    """The controller client's state machine (see the module docstring).

    Args:
        config: the broker's names, address, controllers and timings.
        meta: the broker id file's content, None when there is none yet.
        check_code: the register check code to apply a new id with (random, from the caller).
    """

    def __init__(self, config: ReplicasConfig, meta: BrokerMeta | None, check_code: str) -> None:
        self.config, self.meta, self._check_code = config, meta, check_code
        self.leader: str | None = None
        self._phase = _Phase.DISCOVER
        self._probe = 0
        self._in_flight: set[int] = set()
        self._due: dict[int, int] = {}  # request code -> next time it may be sent (ms)
        self._next_id = 0
        self.master_epoch = 0
        self.master_broker_id: int | None = None
        self.is_master = False
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = 0

    @property
    def broker_id(self) -> int | None:
        return None if self.meta is None else self.meta.broker_id

    # --- time ----------------------------------------------------------------------------------

    def tick(self, now_ms: int, status: BrokerStatus) -> list[Action]:
        """Requests due at ``now_ms``."""
        if self.leader is None:
            return self._discover(now_ms)
        c = self.config
        if self._phase is _Phase.NEXT_ID:
            return self._send(now_ms, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                              GetNextBrokerIdRequestHeader(cluster_name=c.cluster_name,
                                                           broker_name=c.broker_name))
        if self._phase is _Phase.APPLY_ID:
            return self._send(now_ms, RequestCode.CONTROLLER_APPLY_BROKER_ID,
                              ApplyBrokerIdRequestHeader(
                                  cluster_name=c.cluster_name, broker_name=c.broker_name,
                                  applied_broker_id=self._next_id,
                                  register_check_code=self._check_code))
        bid = self.broker_id
        if bid is None:
            return []
        if self._phase is _Phase.REGISTER:
            return self._send(now_ms, RequestCode.CONTROLLER_REGISTER_BROKER,
                              RegisterBrokerToControllerRequestHeader(
                                  cluster_name=c.cluster_name, broker_name=c.broker_name,
                                  broker_id=bid, broker_address=c.broker_addr))
        return self._running(now_ms, status, bid)

    def _running(self, now_ms: int, status: BrokerStatus, bid: int) -> list[Action]:
        c = self.config
        out = self._send(now_ms, RequestCode.BROKER_HEARTBEAT, BrokerHeartbeatRequestHeader(
            cluster_name=c.cluster_name, broker_addr=c.broker_addr, broker_name=c.broker_name,
            broker_id=bid, epoch=status.last_epoch, max_offset=status.max_phy_offset,
            confirm_offset=status.confirm_offset, heartbeat_timeout_mills=c.heartbeat_timeout_ms,
            election_priority=c.election_priority), c.heartbeat_interval_ms)
        out += self._send(now_ms, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                          GetReplicaInfoRequestHeader(broker_name=c.broker_name),
                          REPLICA_INFO_POLL_MS)
        if self.master_broker_id is None:
            out += self._send(now_ms, RequestCode.CONTROLLER_ELECT_MASTER,
                              ElectMasterRequestHeader(cluster_name=c.cluster_name,
                                                       broker_name=c.broker_name, broker_id=bid),
                              c.heartbeat_interval_ms)
        elif self.is_master:
            wanted = frozenset({bid}) | status.in_sync_slaves
            if wanted != self.sync_state_set:
                body = encode_controller_body(SyncStateSet(
                    sync_state_set=sorted(wanted), sync_state_set_epoch=self.sync_state_set_epoch))
                out += self._send(now_ms, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                                  AlterSyncStateSetRequestHeader(
                                      broker_name=c.broker_name, master_broker_id=bid,
                                      master_epoch=self.master_epoch),
                                  ALTER_CHECK_MS, body)
        return out

    def _send(self, now_ms: int, code: int, header: msgspec.Struct, every_ms: int = 0,
              body: bytes = b"", addr: str | None = None) -> list[Action]:
        if code in self._in_flight or now_ms < self._due.get(code, 0):
            return []
        self._in_flight.add(code)
        self._due[code] = now_ms + every_ms
        return [Request(code, to_ext(header), body, addr, now_ms)]

    def _discover(self, now_ms: int) -> list[Action]:
        addrs = self.config.controller_addrs
        if not addrs or RequestCode.CONTROLLER_GET_METADATA_INFO in self._in_flight:
            return []
        if now_ms < self._due.get(RequestCode.CONTROLLER_GET_METADATA_INFO, 0):
            return []
        addr = addrs[self._probe % len(addrs)]
        self._probe += 1
        self._in_flight.add(RequestCode.CONTROLLER_GET_METADATA_INFO)
        if self._probe % len(addrs) == 0:  # a full round without a leader: pause
            self._due[RequestCode.CONTROLLER_GET_METADATA_INFO] = now_ms + DISCOVER_RETRY_MS
        return [Request(RequestCode.CONTROLLER_GET_METADATA_INFO, {}, b"", addr, now_ms)]

    # --- answers -------------------------------------------------------------------------------

    def on_response(self, req: Request, resp: Command | None, now_ms: int) -> list[Action]:
        """The answer to ``req`` (None: no connection, or no answer in time). Never raises on
        what a controller answers."""
        self._in_flight.discard(req.code)
        if req.code == RequestCode.CONTROLLER_GET_METADATA_INFO:
            return self._on_metadata(resp)
        if resp is None or resp.code == ResponseCode.CONTROLLER_NOT_LEADER:
            self.leader = None  # find the leader again
            return []
        try:
            return self._on_answer(req, resp, now_ms)
        except MalformedHeader:
            return []

    def _on_metadata(self, resp: Command | None) -> list[Action]:
        if resp is None or resp.code != ResponseCode.SUCCESS:
            return []
        try:
            h = from_ext(resp.ext, GetMetaDataResponseHeader)
        except MalformedHeader:
            return []
        if not h.controller_leader_address:
            return []
        self.leader = h.controller_leader_address
        self._due.clear()
        if self._phase is _Phase.DISCOVER:
            self._phase = _Phase.NEXT_ID if self.meta is None else _Phase.REGISTER
        return []

    def _on_answer(self, req: Request, resp: Command, now_ms: int) -> list[Action]:
        code, ok = req.code, resp.code == ResponseCode.SUCCESS
        if code == RequestCode.CONTROLLER_GET_NEXT_BROKER_ID and ok:
            nxt = from_ext(resp.ext, GetNextBrokerIdResponseHeader).next_broker_id
            if nxt is not None:
                self._next_id, self._phase = nxt, _Phase.APPLY_ID
        elif code == RequestCode.CONTROLLER_APPLY_BROKER_ID:
            return self._on_applied(ok)
        elif code == RequestCode.CONTROLLER_REGISTER_BROKER:
            return self._on_registered(resp)
        elif code == RequestCode.BROKER_HEARTBEAT and ok:
            h = from_ext(resp.ext, GetReplicaInfoResponseHeader)
            out = self._master_info(h.master_broker_id, h.master_address, h.master_epoch, None)
            if self.is_master and h.master_broker_id == self.broker_id and (
                    h.master_epoch == self.master_epoch):
                out.append(SetLease(req.sent_ms + self.config.lease_ms))
            return out
        elif code == RequestCode.CONTROLLER_GET_REPLICA_INFO and ok:
            h = from_ext(resp.ext, GetReplicaInfoResponseHeader)
            sss = decode_controller_body(resp.body, SyncStateSet) if resp.body else None
            return self._master_info(h.master_broker_id, h.master_address, h.master_epoch, sss)
        elif code == RequestCode.CONTROLLER_ELECT_MASTER and resp.code in (
                ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            e = from_ext(resp.ext, ElectMasterResponseHeader)
            body = decode_controller_body(resp.body, ElectMasterResponseBody)
            sss = SyncStateSet(sync_state_set=body.sync_state_set,
                               sync_state_set_epoch=e.sync_state_set_epoch or 0)
            return self._master_info(e.master_broker_id, e.master_address, e.master_epoch, sss)
        elif code == RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET:
            return self._on_altered(req, resp)
        return []

    def _on_applied(self, ok: bool) -> list[Action]:
        if not ok:  # the id was taken meanwhile: ask for the next one again
            self._phase = _Phase.NEXT_ID
            return []
        c = self.config
        self.meta = BrokerMeta(c.cluster_name, c.broker_name, self._next_id, self._check_code)
        self._phase = _Phase.REGISTER
        return [SaveMeta(encode_broker_meta(self.meta))]

    def _on_registered(self, resp: Command) -> list[Action]:
        if resp.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST and self.meta:
            self._next_id, self._check_code = self.meta.broker_id, self.meta.register_check_code
            self._phase = _Phase.APPLY_ID  # the controller forgot us: claim the same id again
            return []
        if resp.code != ResponseCode.SUCCESS:
            return []
        self._phase = _Phase.RUNNING
        h = from_ext(resp.ext, RegisterBrokerToControllerResponseHeader)
        sss = decode_controller_body(resp.body, SyncStateSet) if resp.body else None
        return self._master_info(h.master_broker_id, h.master_address, h.master_epoch, sss)

    def _on_altered(self, req: Request, resp: Command) -> list[Action]:
        if resp.code != ResponseCode.SUCCESS:
            self._due.pop(RequestCode.CONTROLLER_GET_REPLICA_INFO, None)  # poll now
            return []
        epoch = from_ext(resp.ext, AlterSyncStateSetResponseHeader).new_sync_state_set_epoch
        wanted = frozenset(decode_controller_body(req.body, SyncStateSet).sync_state_set)
        if epoch <= self.sync_state_set_epoch:
            return []
        self.sync_state_set, self.sync_state_set_epoch = wanted, epoch
        return [SetSyncStateSet(wanted, epoch)]

    def on_notify(self, cmd: Command) -> list[Action]:
        """NOTIFY_BROKER_ROLE_CHANGED from a controller. Raises MalformedHeader."""
        h = from_ext(cmd.ext, NotifyBrokerRoleChangedRequestHeader)
        sss = decode_controller_body(cmd.body, SyncStateSet) if cmd.body else None
        return self._master_info(h.master_broker_id, h.master_address, h.master_epoch, sss)

    def on_disconnected(self) -> list[Action]:
        """The connection to the leader dropped: find the leader again."""
        self.leader = None
        self._in_flight.clear()
        return []

    def _master_info(self, master_id: int | None, master_addr: str | None, epoch: int | None,
                     sss: SyncStateSet | None) -> list[Action]:
        """What the controller says of the group's master; only a newer epoch changes the role
        (RocketMQ ``ReplicasManager.changeToMaster`` / ``changeToSlave``)."""
        if epoch is None or epoch < self.master_epoch:
            return []
        if master_id is None:  # no master now: a master that was deposed must stop writing
            self.master_broker_id = None
            if self.is_master:
                self.is_master = False
                return [Fence()]
            return []
        bid = self.broker_id
        if epoch == self.master_epoch:
            self.master_broker_id = master_id
            if (self.is_master and master_id == bid and sss is not None
                    and sss.sync_state_set_epoch > self.sync_state_set_epoch):
                self.sync_state_set = frozenset(sss.sync_state_set)
                self.sync_state_set_epoch = sss.sync_state_set_epoch
                return [SetSyncStateSet(self.sync_state_set, self.sync_state_set_epoch)]
            return []
        self.master_epoch, self.master_broker_id = epoch, master_id
        if master_id != bid:
            self.is_master = False
            return [BecomeSlave(epoch, master_id, master_addr or "")]
        self.is_master = True
        self._due.pop(RequestCode.BROKER_HEARTBEAT, None)  # heartbeat now: the lease comes with it
        if sss is None:
            self._due.pop(RequestCode.CONTROLLER_GET_REPLICA_INFO, None)  # learn the set now
            self.sync_state_set, self.sync_state_set_epoch = frozenset({master_id}), 0
        else:
            self.sync_state_set = frozenset(sss.sync_state_set)
            self.sync_state_set_epoch = sss.sync_state_set_epoch
        return [BecomeMaster(epoch, self.sync_state_set, self.sync_state_set_epoch)]
