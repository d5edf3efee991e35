"""The controller's request handlers over an in-memory replicated state and a hand-driven clock:
leases hold back elections, a new leader waits, a follower or an unready leader refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import msgspec

from txmq.controller import (
    ApplyBrokerId,
    ControllerEvent,
    ControllerRaft,
    ControllerService,
    ControllerState,
    ElectMaster,
    GroupView,
    HeartbeatTable,
    Outcome,
    RegisterBroker,
)
from txmq.errors import ResponseCode
from txmq.protocol import (
    AlterSyncStateSetRequestHeader,
    BrokerHeartbeatRequestHeader,
    Command,
    ElectMasterRequestHeader,
    RequestCode,
    SyncStateSet,
    encode_controller_body,
    to_ext,
)

B = "broker-a"
LEASE = 3000


class MemoryRaft:
    """The part of ControllerRaft the service uses, applying events at once."""

    def __init__(self) -> None:
        self.state = ControllerState()
        self.leader = True

    def is_leader(self) -> bool:
        return self.leader

    def leader_raft_address(self) -> str:
        return "r:1"

    def leader_remoting_address(self) -> str:
        return "c:1"

    def peers(self) -> str:
        return "r:1"

    def group(self, name: str) -> GroupView | None:
        return self.state.group(name)

    def groups(self) -> list[GroupView]:
        return self.state.groups()

    def propose(self, event: ControllerEvent, done: Callable[[Outcome | None, int], Any]) -> None:
        done(self.state.apply(event), 0)


class Clock:
    def __init__(self) -> None:
        self.ms = 100_000

    def __call__(self) -> int:
        return self.ms


def setup() -> tuple[ControllerService, MemoryRaft, Clock, list[GroupView]]:
    raft, clock = MemoryRaft(), Clock()
    notified: list[GroupView] = []
    for i in (1, 2):
        raft.state.apply(ApplyBrokerId("c", B, i, "k"))
        raft.state.apply(RegisterBroker("c", B, i, f"h:{i}"))
    service = ControllerService(cast(ControllerRaft, raft), HeartbeatTable(3000, LEASE),
                                notified.append, clock)
    service.ready = True
    return service, raft, clock, notified


def req(code: int, header: msgspec.Struct | None = None, body: bytes = b"") -> Command:
    return Command(code, 1, ext={} if header is None else to_ext(header), body=body)


def heartbeat(bid: int) -> Command:
    return req(RequestCode.BROKER_HEARTBEAT, BrokerHeartbeatRequestHeader(
        cluster_name="c", broker_addr=f"h:{bid}", broker_name=B, broker_id=bid, epoch=1,
        max_offset=10))


def run(service: ControllerService, cmd: Command, conn: int = 0) -> Command:
    resp = asyncio.run(service.handle(cmd, conn))
    assert resp is not None
    return resp


def master_of_two(service: ControllerService, raft: MemoryRaft) -> None:
    """Broker 1 master (epoch 1), SyncStateSet {1, 2}, both heartbeating (conn 1 and 2)."""
    assert run(service, heartbeat(1), 1).code == ResponseCode.SUCCESS
    assert run(service, heartbeat(2), 2).code == ResponseCode.SUCCESS
    r = run(service, req(RequestCode.CONTROLLER_ELECT_MASTER, ElectMasterRequestHeader(
        cluster_name="c", broker_name=B, broker_id=1)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = run(service, req(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                         AlterSyncStateSetRequestHeader(broker_name=B, master_broker_id=1,
                                                        master_epoch=1),
                         encode_controller_body(SyncStateSet(sync_state_set=[1, 2],
                                                             sync_state_set_epoch=1))))
    assert r.code == ResponseCode.SUCCESS, r.remark


def test_no_election_before_the_masters_lease_ends() -> None:
    service, raft, clock, notified = setup()
    master_of_two(service, raft)
    assert [g.master_epoch for g in notified] == [1]  # the first election was pushed too
    notified.clear()
    assert run(service, heartbeat(1), 1).ext["masterBrokerId"] == "1"  # lease to now + 3 s
    granted = clock.ms
    service.table.channel_closed(1)  # the master's connection closes
    clock.ms = granted + LEASE - 1
    g = raft.group(B)
    assert g is not None
    asyncio.run(service.check_group(g))
    assert raft.group(B) == g and notified == []  # not yet: its lease may still run
    r = run(service, req(RequestCode.CONTROLLER_ELECT_MASTER, ElectMasterRequestHeader(
        cluster_name="c", broker_name=B, broker_id=2)))
    assert r.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED
    clock.ms = granted + LEASE
    run(service, heartbeat(2), 2)
    asyncio.run(service.check_group(g))
    after = raft.group(B)
    assert after is not None and (after.master_broker_id, after.master_epoch) == (2, 2)
    assert notified == [after]


def test_a_new_leader_waits_a_lease_and_the_old_leaders_step_down_time() -> None:
    service, raft, clock, _ = setup()
    master_of_two(service, raft)
    service.table = HeartbeatTable(3000, LEASE)
    service.table.became_leader(clock.ms, extra_ms=2000)
    run(service, heartbeat(2), 2)  # broker 1 never heartbeats this leader
    g = raft.group(B)
    assert g is not None
    clock.ms += LEASE + 1999
    run(service, heartbeat(2), 2)
    asyncio.run(service.check_group(g))
    assert raft.group(B) == g
    clock.ms += 1
    asyncio.run(service.check_group(g))
    after = raft.group(B)
    assert after is not None and after.master_broker_id == 2


def test_followers_and_unready_leaders_refuse_but_answer_metadata() -> None:
    service, raft, _, _ = setup()
    service.ready = False
    r = run(service, heartbeat(1))
    assert r.code == ResponseCode.CONTROLLER_NOT_LEADER and "c:1" in (r.remark or "")
    meta = run(service, req(RequestCode.CONTROLLER_GET_METADATA_INFO))
    assert meta.code == ResponseCode.SUCCESS and meta.ext["isLeader"] == "false"
    service.ready, raft.leader = True, False
    assert run(service, heartbeat(1)).code == ResponseCode.CONTROLLER_NOT_LEADER
    raft.leader = True
    assert run(service, req(RequestCode.GET_BROKER_HA_STATUS)).code == (
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
    assert run(service, req(RequestCode.CONTROLLER_ELECT_MASTER)).code == (
        ResponseCode.CONTROLLER_INVALID_REQUEST)
    assert asyncio.run(service.handle(Command(RequestCode.BROKER_HEARTBEAT, 1, flag=2,
                                              ext=heartbeat(1).ext), 0)) is None  # one-way


def test_elect_event_is_what_the_leader_saw() -> None:
    service, raft, clock, _ = setup()
    master_of_two(service, raft)
    seen: list[ControllerEvent] = []
    propose = raft.propose

    def spy(event: ControllerEvent, done: Callable[[Outcome | None, int], Any]) -> None:
        seen.append(event)
        propose(event, done)

    raft.propose = spy  # type: ignore[method-assign]
    service.table.channel_closed(1)
    clock.ms += 10 * LEASE
    run(service, heartbeat(2), 2)
    g = raft.group(B)
    assert g is not None
    asyncio.run(service.check_group(g))
    assert isinstance(seen[0], ElectMaster) and seen[0].requester == -1
    assert [c.broker_id for c in seen[0].candidates] == [2]
