"""The broker's controller client (sans-IO): id negotiation, registration, election, leases, role
changes only on newer epochs, SyncStateSet updates; answers are hand-made controller commands."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from txmq.broker._replicas import (
    BecomeMaster,
    BecomeSlave,
    BrokerMeta,
    BrokerStatus,
    Fence,
    ReplicasConfig,
    ReplicasCore,
    Request,
    SaveMeta,
    SetLease,
    SetSyncStateSet,
    decode_broker_meta,
    encode_broker_meta,
)
from txmq.errors import CorruptRecord, ResponseCode
from txmq.protocol import (
    AlterSyncStateSetResponseHeader,
    Command,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    RequestCode,
    SyncStateSet,
    decode_controller_body,
    encode_controller_body,
    to_ext,
)

CFG = ReplicasConfig("c", "broker-a", "h:10911", ("c1:9878", "c2:9878"), lease_ms=3000)
IDLE = BrokerStatus()


def answer(code: int = 0, header: msgspec.Struct | None = None, body: bytes = b"") -> Command:
    return Command(code, ext={} if header is None else to_ext(header), body=body)


def only_request(actions: Sequence[object], code: int) -> Request:
    reqs = [a for a in actions if isinstance(a, Request) and a.code == code]
    assert len(reqs) == 1, actions
    return reqs[0]


def sss(ids: list[int], epoch: int) -> bytes:
    return encode_controller_body(SyncStateSet(sync_state_set=ids, sync_state_set_epoch=epoch))


def running(meta: BrokerMeta | None = None) -> ReplicasCore:
    """A core that found leader c2 and registered as broker 1 of a group without a master."""
    core = ReplicasCore(CFG, meta or BrokerMeta("c", "broker-a", 1, "k"), "new")
    req = only_request(core.tick(0, IDLE), RequestCode.CONTROLLER_GET_METADATA_INFO)
    core.on_response(req, answer(0, GetMetaDataResponseHeader(
        controller_leader_address="c2:9878")), 1)
    req = only_request(core.tick(2, IDLE), RequestCode.CONTROLLER_REGISTER_BROKER)
    assert core.on_response(req, answer(0, RegisterBrokerToControllerResponseHeader(
        master_epoch=0)), 3) == []
    return core


def test_broker_meta_file_is_crc_checked() -> None:
    meta = BrokerMeta("c", "broker-a", 3, "code")
    data = encode_broker_meta(meta)
    assert decode_broker_meta(data) == meta
    for bad in (data[:3], data[:-1] + b"x", b"\0\0\0\0{}"):
        with pytest.raises(CorruptRecord):
            decode_broker_meta(bad)


def test_discovery_asks_each_controller_then_negotiates_an_id() -> None:
    core = ReplicasCore(CFG, None, "code-1")
    first = only_request(core.tick(0, IDLE), RequestCode.CONTROLLER_GET_METADATA_INFO)
    assert first.addr == "c1:9878" and core.tick(0, IDLE) == []  # one probe at a time
    core.on_response(first, None, 5)  # c1 is down
    second = only_request(core.tick(5, IDLE), RequestCode.CONTROLLER_GET_METADATA_INFO)
    assert second.addr == "c2:9878"
    core.on_response(second, answer(0, GetMetaDataResponseHeader(
        controller_leader_address="c2:9878", is_leader=True)), 6)
    assert core.leader == "c2:9878"
    req = only_request(core.tick(7, IDLE), RequestCode.CONTROLLER_GET_NEXT_BROKER_ID)
    assert req.addr is None  # to the leader
    core.on_response(req, answer(0, GetNextBrokerIdResponseHeader(next_broker_id=2)), 8)
    req = only_request(core.tick(9, IDLE), RequestCode.CONTROLLER_APPLY_BROKER_ID)
    assert req.ext["appliedBrokerId"] == "2" and req.ext["registerCheckCode"] == "code-1"
    out = core.on_response(req, answer(0), 10)
    assert out == [SaveMeta(encode_broker_meta(BrokerMeta("c", "broker-a", 2, "code-1")))]
    req = only_request(core.tick(11, IDLE), RequestCode.CONTROLLER_REGISTER_BROKER)
    assert req.ext["brokerAddress"] == "h:10911" and req.ext["brokerId"] == "2"


def test_no_master_elects_itself_becomes_master_and_renews_its_lease() -> None:
    core = running()
    actions = core.tick(10, BrokerStatus(max_phy_offset=100, last_epoch=0))
    hb = only_request(actions, RequestCode.BROKER_HEARTBEAT)
    assert hb.ext["maxOffset"] == "100" and hb.ext["brokerId"] == "1"
    elect = only_request(actions, RequestCode.CONTROLLER_ELECT_MASTER)
    body = encode_controller_body(ElectMasterResponseBody(sync_state_set=[1]))
    out = core.on_response(elect, answer(0, ElectMasterResponseHeader(
        master_broker_id=1, master_address="h:10911", master_epoch=1, sync_state_set_epoch=1),
        body), 20)
    assert out == [BecomeMaster(1, frozenset({1}), 1)]
    # its heartbeat answered before becoming master gives no lease; the next one does
    assert core.on_response(hb, answer(0, GetReplicaInfoResponseHeader(master_epoch=0)), 21) == []
    hb = only_request(core.tick(22, IDLE), RequestCode.BROKER_HEARTBEAT)
    out = core.on_response(hb, answer(0, GetReplicaInfoResponseHeader(
        master_broker_id=1, master_address="h:10911", master_epoch=1)), 900)
    assert out == [SetLease(22 + 3000)]  # from when it was sent, not received


def test_only_a_newer_epoch_changes_the_role() -> None:
    core = running()
    notify = Command(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext=to_ext(
        NotifyBrokerRoleChangedRequestHeader(master_address="h:2", master_epoch=4,
                                             sync_state_set_epoch=5, master_broker_id=2)),
        body=sss([2], 5))
    assert core.on_notify(notify) == [BecomeSlave(4, 2, "h:2")]
    assert core.on_notify(notify) == []  # same epoch: nothing
    older = Command(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext=to_ext(
        NotifyBrokerRoleChangedRequestHeader(master_address="h:1", master_epoch=3,
                                             sync_state_set_epoch=9, master_broker_id=1)))
    assert core.on_notify(older) == []
    assert core.master_broker_id == 2 and not core.is_master
    # no ELECT while a master is known
    assert not [a for a in core.tick(5000, IDLE)
                if isinstance(a, Request) and a.code == RequestCode.CONTROLLER_ELECT_MASTER]


def test_a_deposed_master_fences_and_asks_for_an_election() -> None:
    core = running()
    notify = Command(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext=to_ext(
        NotifyBrokerRoleChangedRequestHeader(master_address="h:10911", master_epoch=2,
                                             sync_state_set_epoch=2, master_broker_id=1)),
        body=sss([1], 2))
    assert core.on_notify(notify) == [BecomeMaster(2, frozenset({1}), 2)]
    hb = only_request(core.tick(10, IDLE), RequestCode.BROKER_HEARTBEAT)
    out = core.on_response(hb, answer(0, GetReplicaInfoResponseHeader(master_epoch=2)), 11)
    assert out == [Fence()] and not core.is_master
    assert only_request(core.tick(2000, IDLE), RequestCode.CONTROLLER_ELECT_MASTER)


def test_master_alters_the_sync_state_set_to_its_caught_up_slaves() -> None:
    core = running()
    core.on_notify(Command(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext=to_ext(
        NotifyBrokerRoleChangedRequestHeader(master_address="h:10911", master_epoch=1,
                                             sync_state_set_epoch=1, master_broker_id=1)),
        body=sss([1], 1)))
    status = BrokerStatus(in_sync_slaves=frozenset({2, 3}))
    actions = core.tick(10, status)
    alter = only_request(actions, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
    poll = only_request(actions, RequestCode.CONTROLLER_GET_REPLICA_INFO)
    assert alter.ext == {"brokerName": "broker-a", "masterBrokerId": "1", "masterEpoch": "1"}
    assert decode_controller_body(alter.body, SyncStateSet) == SyncStateSet(
        sync_state_set=[1, 2, 3], sync_state_set_epoch=1)
    out = core.on_response(alter, answer(0, AlterSyncStateSetResponseHeader(
        new_sync_state_set_epoch=2)), 11)
    assert out == [SetSyncStateSet(frozenset({1, 2, 3}), 2)]
    assert core.on_response(poll, answer(0, GetReplicaInfoResponseHeader(
        master_broker_id=1, master_address="h:10911", master_epoch=1), sss([1, 2, 3], 2)), 12) == []
    assert not [a for a in core.tick(1500, status) if isinstance(a, Request)
                and a.code == RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET]
    # a fenced answer makes it poll the group at once
    shrink = BrokerStatus(in_sync_slaves=frozenset({2}))
    alter = only_request(core.tick(2000, shrink), RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
    assert core.on_response(alter, answer(
        ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH), 2001) == []
    poll = only_request(core.tick(2002, shrink), RequestCode.CONTROLLER_GET_REPLICA_INFO)
    # the group's newer set arrives with the poll
    assert core.on_response(poll, answer(0, GetReplicaInfoResponseHeader(
        master_broker_id=1, master_address="h:10911", master_epoch=1), sss([1, 2], 3)), 2003) == [
        SetSyncStateSet(frozenset({1, 2}), 3)]


def test_not_leader_or_a_lost_connection_rediscovers() -> None:
    core = running()
    hb = only_request(core.tick(10, IDLE), RequestCode.BROKER_HEARTBEAT)
    core.on_response(hb, answer(ResponseCode.CONTROLLER_NOT_LEADER), 11)
    assert core.leader is None
    only_request(core.tick(12, IDLE), RequestCode.CONTROLLER_GET_METADATA_INFO)
    core2 = running()
    core2.on_disconnected()
    assert core2.leader is None


def test_a_forgotten_broker_claims_its_id_again() -> None:
    core = ReplicasCore(CFG, BrokerMeta("c", "broker-a", 4, "mine"), "unused")
    req = only_request(core.tick(0, IDLE), RequestCode.CONTROLLER_GET_METADATA_INFO)
    core.on_response(req, answer(0, GetMetaDataResponseHeader(controller_leader_address="c1")), 1)
    req = only_request(core.tick(2, IDLE), RequestCode.CONTROLLER_REGISTER_BROKER)
    core.on_response(req, answer(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST), 3)
    req = only_request(core.tick(4, IDLE), RequestCode.CONTROLLER_APPLY_BROKER_ID)
    assert req.ext["appliedBrokerId"] == "4" and req.ext["registerCheckCode"] == "mine"


def test_garbage_answers_change_nothing() -> None:
    core = running()
    actions = core.tick(10, IDLE)
    hb = only_request(actions, RequestCode.BROKER_HEARTBEAT)
    assert core.on_response(hb, Command(0, ext={"masterEpoch": "x"}), 11) == []
    info = only_request(actions, RequestCode.CONTROLLER_GET_REPLICA_INFO)
    assert core.on_response(info, Command(0, ext={"masterEpoch": "1"}, body=b"{"), 12) == []
    assert core.master_epoch == 0


def test_an_id_taken_meanwhile_is_asked_for_again() -> None:
    core = ReplicasCore(CFG, None, "code")
    req = only_request(core.tick(0, IDLE), RequestCode.CONTROLLER_GET_METADATA_INFO)
    core.on_response(req, answer(0, GetMetaDataResponseHeader(controller_leader_address="c1")), 1)
    req = only_request(core.tick(2, IDLE), RequestCode.CONTROLLER_GET_NEXT_BROKER_ID)
    core.on_response(req, answer(0, GetNextBrokerIdResponseHeader(next_broker_id=2)), 3)
    req = only_request(core.tick(4, IDLE), RequestCode.CONTROLLER_APPLY_BROKER_ID)
    assert core.on_response(req, answer(ResponseCode.CONTROLLER_BROKER_ID_INVALID), 5) == []
    req = only_request(core.tick(6, IDLE), RequestCode.CONTROLLER_GET_NEXT_BROKER_ID)
    core.on_response(req, answer(0, GetNextBrokerIdResponseHeader(next_broker_id=3)), 7)
    req = only_request(core.tick(8, IDLE), RequestCode.CONTROLLER_APPLY_BROKER_ID)
    assert req.ext["appliedBrokerId"] == "3"
    assert core.meta is None  # nothing written before the controller agreed
