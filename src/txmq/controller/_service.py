"""The controller's request handlers: remoting commands in, responses out, over a
:class:`~txmq.controller.ControllerRaft` (replicated state) and a
:class:`~txmq.controller.HeartbeatTable` (leader-local liveness and leases).

Every request but CONTROLLER_GET_METADATA_INFO needs the Raft leader; a follower answers
CONTROLLER_NOT_LEADER naming the leader's remoting address in the remark (RocketMQ
``ControllerRequestProcessor``). Changes are proposed as events and answered once applied;
a proposal that does not commit within ``PROPOSE_TIMEOUT_MS`` is answered
CONTROLLER_NOT_LEADER (a leader cut off from its majority cannot commit).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from txmq.controller._heartbeats import BrokerLive, HeartbeatTable
from txmq.controller._raft import ControllerRaft
from txmq.controller._state import (
    FIRST_BROKER_CONTROLLER_ID,
    AlterSyncStateSet,
    ApplyBrokerId,
    Candidate,
    CleanBrokerData,
    ControllerEvent,
    ElectMaster,
    GroupView,
    Outcome,
    RegisterBroker,
)
from txmq.errors import MalformedHeader, ResponseCode
from txmq.protocol import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    ApplyBrokerIdResponseHeader,
    BrokerHeartbeatRequestHeader,
    BrokerMemberGroup,
    BrokerReplicasInfo,
    CleanControllerBrokerDataRequestHeader,
    Command,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    ReplicaIdentity,
    ReplicasInfo,
    RequestCode,
    SyncStateSet,
    decode_controller_body,
    encode_controller_body,
    from_ext,
    to_ext,
)

__all__ = ["CONTROLLER_GROUP", "PROPOSE_TIMEOUT_MS", "ControllerService", "monotonic_ms"]

log = logging.getLogger("txmq.controller")

PROPOSE_TIMEOUT_MS = 3_000
"""How long a request waits for its event to commit (txmq; RocketMQ waits on DLedger's append
future for ``ControllerConfig``'s request timeout, 3 s by default in its broker client)."""
CONTROLLER_GROUP = "txmq-controller"
"""The ``group`` answered in GET_METADATA_INFO (RocketMQ ``controllerDLegerGroup``)."""

Notify = Callable[[GroupView], None]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _sss(g: GroupView | None) -> bytes:
    if g is None:
        return b""
    return encode_controller_body(SyncStateSet(sync_state_set=sorted(g.sync_state_set),
                                               sync_state_set_epoch=g.sync_state_set_epoch))


class ControllerService:
    """Answers controller requests (see the module docstring).

    Args:
        raft: the replicated state.
        table: liveness and leases (replaced by a fresh one when this controller becomes leader).
        notify: called with a group after an election made a new master (the shell pushes
            NOTIFY_BROKER_ROLE_CHANGED to its brokers).
        clock: monotonic milliseconds.
    """

    def __init__(self, raft: ControllerRaft, table: HeartbeatTable, notify: Notify,
                 clock: Callable[[], int] = monotonic_ms) -> None:
        self.raft, self.table, self.notify, self.clock = raft, table, notify, clock
        self.ready = False
        """True once this leader has applied everything committed before its term (the shell
        sets it after its first own entry commits); until then it answers as a follower."""
        self._handlers: dict[int, Callable[[Command, int], Awaitable[Command]]] = {
            RequestCode.BROKER_HEARTBEAT: self._heartbeat,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self._next_id,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self._apply_id,
            RequestCode.CONTROLLER_REGISTER_BROKER: self._register,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self._replica_info,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self._alter,
            RequestCode.CONTROLLER_ELECT_MASTER: self._elect,
            RequestCode.CLEAN_BROKER_DATA: self._clean,
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self._sync_state_data,
        }

    async def handle(self, cmd: Command, conn: int) -> Command | None:
        """The response to one request (None for a one-way one). Never raises on input."""
        if cmd.code == RequestCode.CONTROLLER_GET_METADATA_INFO:
            return self._metadata(cmd)
        handler = self._handlers.get(cmd.code)
        if handler is None:
            resp = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                f" request type {cmd.code} not supported")
        elif not (self.ready and self.raft.is_leader()):
            resp = cmd.response(ResponseCode.CONTROLLER_NOT_LEADER,
                                "The controller is not in leader state, leader: "
                                f"{self.raft.leader_remoting_address()}")
        else:
            try:
                resp = await handler(cmd, conn)
            except MalformedHeader as exc:
                resp = cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc))
        return None if cmd.is_oneway else resp

    async def propose(self, event: ControllerEvent) -> Outcome | None:
        """Replicate ``event``; its outcome, or None if it did not commit in time."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome | None] = loop.create_future()

        def settle(out: Outcome | None) -> None:
            if not fut.done():
                fut.set_result(out)

        self.raft.propose(event, lambda out, _err: loop.call_soon_threadsafe(settle, out))
        try:
            return await asyncio.wait_for(fut, PROPOSE_TIMEOUT_MS / 1000)
        except TimeoutError:
            return None

    async def _outcome(self, cmd: Command, event: ControllerEvent) -> tuple[Outcome | None,
                                                                            Command | None]:
        out = await self.propose(event)
        if out is None:
            return None, cmd.response(ResponseCode.CONTROLLER_NOT_LEADER,
                                      "the change did not commit (no controller majority)")
        if out.code != ResponseCode.SUCCESS:
            return out, cmd.response(out.code, out.remark)
        return out, None

    def _metadata(self, cmd: Command) -> Command:
        h = GetMetaDataResponseHeader(
            group=CONTROLLER_GROUP, controller_leader_id=self.raft.leader_raft_address(),
            controller_leader_address=self.raft.leader_remoting_address(),
            is_leader=self.ready and self.raft.is_leader(), peers=self.raft.peers())
        return cmd.response(ResponseCode.SUCCESS, ext=to_ext(h))

    def _master_ext(self, g: GroupView | None) -> GetReplicaInfoResponseHeader:
        if g is None or g.master_broker_id is None:
            return GetReplicaInfoResponseHeader(master_epoch=0 if g is None else g.master_epoch)
        return GetReplicaInfoResponseHeader(master_broker_id=g.master_broker_id,
                                            master_address=g.master_address,
                                            master_epoch=g.master_epoch)

    async def _heartbeat(self, cmd: Command, conn: int) -> Command:
        """BROKER_HEARTBEAT: record liveness; a master's renews its lease. The answer carries
        the group's master (GetReplicaInfoResponseHeader fields, a txmq addition)."""
        h = from_ext(cmd.ext, BrokerHeartbeatRequestHeader)
        if h.broker_id is None:
            return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, "brokerId is null")
        now = self.clock()
        self.table.heartbeat(BrokerLive(
            h.broker_name, h.broker_id, h.broker_addr, now, h.heartbeat_timeout_mills or 0,
            h.epoch or 0, h.max_offset or 0, h.confirm_offset or 0, h.election_priority or 0, conn))
        g = self.raft.group(h.broker_name)
        if g is not None and g.master_broker_id == h.broker_id:
            self.table.grant_lease(h.broker_name, now)
        return cmd.response(ResponseCode.SUCCESS, ext=to_ext(self._master_ext(g)))

    async def _next_id(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, GetNextBrokerIdRequestHeader)
        g = self.raft.group(h.broker_name)
        nxt = FIRST_BROKER_CONTROLLER_ID if g is None else g.next_broker_id
        return cmd.response(ResponseCode.SUCCESS, ext=to_ext(GetNextBrokerIdResponseHeader(
            cluster_name=h.cluster_name, broker_name=h.broker_name, next_broker_id=nxt)))

    async def _apply_id(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, ApplyBrokerIdRequestHeader)
        _, err = await self._outcome(cmd, ApplyBrokerId(
            h.cluster_name, h.broker_name, h.applied_broker_id, h.register_check_code))
        return err or cmd.response(ResponseCode.SUCCESS, ext=to_ext(ApplyBrokerIdResponseHeader(
            cluster_name=h.cluster_name, broker_name=h.broker_name)))

    async def _register(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, RegisterBrokerToControllerRequestHeader)
        out, err = await self._outcome(cmd, RegisterBroker(
            h.cluster_name, h.broker_name, h.broker_id, h.broker_address))
        if err is not None or out is None:
            return err or cmd.response(ResponseCode.SYSTEM_ERROR)
        g = out.group
        m = self._master_ext(g)
        if g is not None and g.master_broker_id is not None and not self.table.is_alive(
                g.broker_name, g.master_broker_id, self.clock()):
            m = GetReplicaInfoResponseHeader(master_epoch=g.master_epoch)  # master not alive
        resp = RegisterBrokerToControllerResponseHeader(
            cluster_name=h.cluster_name, broker_name=h.broker_name,
            master_broker_id=m.master_broker_id, master_address=m.master_address,
            master_epoch=m.master_epoch,
            sync_state_set_epoch=None if g is None else g.sync_state_set_epoch)
        return cmd.response(ResponseCode.SUCCESS, ext=to_ext(resp), body=_sss(g))

    async def _replica_info(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, GetReplicaInfoRequestHeader)
        g = self.raft.group(h.broker_name)
        if g is None:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                                f"broker-set {h.broker_name} does not exist")
        return cmd.response(ResponseCode.SUCCESS, ext=to_ext(self._master_ext(g)), body=_sss(g))

    async def _alter(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, AlterSyncStateSetRequestHeader)
        body = decode_controller_body(cmd.body, SyncStateSet)
        alive = self.table.alive_ids(h.broker_name, self.clock())
        out, err = await self._outcome(cmd, AlterSyncStateSet(
            h.broker_name, h.master_broker_id, h.master_epoch, frozenset(body.sync_state_set),
            body.sync_state_set_epoch, alive))
        if err is not None or out is None or out.group is None:
            return err or cmd.response(ResponseCode.SYSTEM_ERROR)
        epoch = out.group.sync_state_set_epoch
        return cmd.response(ResponseCode.SUCCESS, ext=to_ext(AlterSyncStateSetResponseHeader(
            new_sync_state_set_epoch=epoch)), body=_sss(out.group))

    async def _elect(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, ElectMasterRequestHeader)
        g = self.raft.group(h.broker_name)
        if g is None:
            return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                f"broker-set {h.broker_name} does not exist")
        now = self.clock()
        candidates = self.table.candidates(h.broker_name, now)
        if g.master_epoch == 0 and h.broker_id not in {c.broker_id for c in candidates}:
            candidates = (*candidates, Candidate(h.broker_id, 0, 0, 0))
        out = await self.elect(g, ElectMaster(h.broker_name, h.broker_id, candidates,
                                              h.designate_elect), now)
        if out is None:
            return cmd.response(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                                "the old master's lease has not expired, or no controller majority")
        og = out.group
        header = ElectMasterResponseHeader(
            master_broker_id=None if og is None else og.master_broker_id,
            master_address=None if og is None else og.master_address,
            master_epoch=None if og is None else og.master_epoch,
            sync_state_set_epoch=None if og is None else og.sync_state_set_epoch)
        body = ElectMasterResponseBody(
            broker_member_group=None if og is None else BrokerMemberGroup(
                cluster=og.cluster_name, broker_name=og.broker_name, broker_addrs=og.brokers),
            sync_state_set=[] if og is None else sorted(og.sync_state_set))
        return cmd.response(out.code, out.remark or None, to_ext(header),
                            encode_controller_body(body))

    async def elect(self, g: GroupView, event: ElectMaster, now: int) -> Outcome | None:
        """Propose an election unless it could replace a master whose lease may still run
        (then None); notify the group when a new master was elected."""
        master = g.master_broker_id
        replaces = master is not None and (
            not self.table.is_alive(g.broker_name, master, now)
            or (event.designate and event.requester != master))
        if replaces and not self.table.may_replace_master(g.broker_name, now):
            return None
        out = await self.propose(event)
        if out is not None and out.changed_master and out.group is not None:
            self.table.master_changed(g.broker_name)
            log.info("elected broker %d master of %s, epoch %d", out.group.master_broker_id,
                     g.broker_name, out.group.master_epoch)
            self.notify(out.group)
        return out

    async def _sync_state_data(self, cmd: Command, conn: int) -> Command:
        """CONTROLLER_GET_SYNC_STATE_DATA: body = JSON list of brokerNames (unknown ones are
        left out of the answer)."""
        try:
            names = msgspec.json.decode(cmd.body or b"[]", type=list[str])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedHeader(f"bad brokerName list: {exc}") from exc
        now, table = self.clock(), {}
        for name in names:
            g = self.raft.group(name)
            if g is None:
                continue
            ids = [ReplicaIdentity(broker_name=name, broker_id=i, broker_address=a,
                                   alive=self.table.is_alive(name, i, now))
                   for i, a in sorted(g.brokers.items())]
            table[name] = ReplicasInfo(
                master_broker_id=g.master_broker_id, master_address=g.master_address,
                master_epoch=g.master_epoch, sync_state_set_epoch=g.sync_state_set_epoch,
                in_sync_replicas=[r for r in ids if r.broker_id in g.sync_state_set],
                not_in_sync_replicas=[r for r in ids if r.broker_id not in g.sync_state_set])
        body = encode_controller_body(BrokerReplicasInfo(replicas_info_table=table))
        return cmd.response(ResponseCode.SUCCESS, body=body)

    async def _clean(self, cmd: Command, conn: int) -> Command:
        h = from_ext(cmd.ext, CleanControllerBrokerDataRequestHeader)
        ids: frozenset[int] | None = None
        if h.broker_controller_ids_to_clean:
            try:
                ids = frozenset(int(x) for x in h.broker_controller_ids_to_clean.split(";") if x)
            except ValueError:
                return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                    f"bad broker ids {h.broker_controller_ids_to_clean!r}")
        alive = self.table.alive_ids(h.broker_name, self.clock())
        if not h.is_clean_living_broker and (alive if ids is None else alive & ids):
            return cmd.response(ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                                f"brokers {sorted(alive)} of {h.broker_name} are alive")
        _, err = await self._outcome(cmd, CleanBrokerData(h.broker_name, ids))
        return err or cmd.response(ResponseCode.SUCCESS)

    async def check_group(self, g: GroupView) -> None:
        """The leader's scan of one group: elect when its master is gone (after its lease), or
        when it has none and a SyncStateSet member is alive again."""
        if g.master_epoch == 0:
            return  # the first election is a broker's request
        now = self.clock()
        if g.master_broker_id is not None and self.table.is_alive(
                g.broker_name, g.master_broker_id, now):
            return
        candidates = self.table.candidates(g.broker_name, now)
        if g.master_broker_id is None and not any(
                c.broker_id in g.sync_state_set for c in candidates):
            return  # nothing to do; proposing would only grow the log
        await self.elect(g, ElectMaster(g.broker_name, -1, candidates), now)

