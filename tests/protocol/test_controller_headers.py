"""The controller protocol's headers and bodies: round trips with RocketMQ's wire names, bad input
raises MalformedHeader."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.errors import MalformedHeader, ResponseCode
from txmq.protocol import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerMemberGroup,
    CleanControllerBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RequestCode,
    SyncStateSet,
    decode_controller_body,
    encode_controller_body,
    from_ext,
    to_ext,
)

longs = st.integers(-(2**63), 2**63 - 1)
names = st.text(min_size=1, max_size=20)


def test_codes_are_rocketmqs() -> None:
    requests = {c.name: int(c) for c in RequestCode}
    responses = {c.name: int(c) for c in ResponseCode}
    assert requests["CONTROLLER_ALTER_SYNC_STATE_SET"] == 1001
    assert requests["CONTROLLER_APPLY_BROKER_ID"] == 1013
    assert requests["NOTIFY_BROKER_ROLE_CHANGED"] == 1008
    assert requests["CLEAN_BROKER_DATA"] == 1011
    assert responses["CONTROLLER_FENCED_MASTER_EPOCH"] == 2000
    assert responses["CONTROLLER_NOT_LEADER"] == 2007
    assert responses["CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS"] == 2016


def test_wire_names() -> None:
    ext = to_ext(AlterSyncStateSetRequestHeader(broker_name="b", master_broker_id=1,
                                                master_epoch=3))
    assert ext == {"brokerName": "b", "masterBrokerId": "1", "masterEpoch": "3"}
    meta = to_ext(GetMetaDataResponseHeader(controller_leader_address="h:1", is_leader=True))
    assert meta == {"controllerLeaderAddress": "h:1", "isLeader": "true"}
    clean = to_ext(CleanControllerBrokerDataRequestHeader(broker_name="b"))
    assert clean["isCleanLivingBroker"] == "false"


@given(names, names, longs, st.booleans())
def test_elect_round_trip(cluster: str, broker: str, bid: int, designate: bool) -> None:
    h = ElectMasterRequestHeader(cluster_name=cluster, broker_name=broker, broker_id=bid,
                                 designate_elect=designate)
    assert from_ext(to_ext(h), ElectMasterRequestHeader) == h


@given(longs, longs, st.none() | names, st.none() | longs)
def test_notify_round_trip(epoch: int, sss_epoch: int, addr: str | None, mid: int | None) -> None:
    h = NotifyBrokerRoleChangedRequestHeader(master_address=addr, master_epoch=epoch,
                                             sync_state_set_epoch=sss_epoch, master_broker_id=mid)
    assert from_ext(to_ext(h), NotifyBrokerRoleChangedRequestHeader) == h


def test_response_header_optional_fields() -> None:
    h = ElectMasterResponseHeader(master_broker_id=2, master_address="a:1", master_epoch=4,
                                  sync_state_set_epoch=5)
    assert from_ext(to_ext(h), ElectMasterResponseHeader) == h
    assert from_ext({}, ElectMasterResponseHeader) == ElectMasterResponseHeader()


@pytest.mark.parametrize(("ext", "cls"), [
    ({"clusterName": "c", "brokerName": "b", "brokerId": "x", "brokerAddress": "a"},
     RegisterBrokerToControllerRequestHeader),
    ({"clusterName": "c", "brokerName": "b", "registerCheckCode": "k"}, ApplyBrokerIdRequestHeader),
    ({"brokerName": "b", "masterBrokerId": "1", "masterEpoch": str(2**63)},
     AlterSyncStateSetRequestHeader),
    ({"brokerName": "b", "designateElect": "maybe"}, ElectMasterRequestHeader),
])
def test_bad_headers_raise(ext: dict[str, str], cls: type[msgspec.Struct]) -> None:
    with pytest.raises(MalformedHeader):
        from_ext(ext, cls)


@given(st.lists(st.integers(0, 2**40), max_size=5), st.integers(0, 2**31))
def test_sync_state_set_round_trip(ids: list[int], epoch: int) -> None:
    body = SyncStateSet(sync_state_set=ids, sync_state_set_epoch=epoch)
    assert decode_controller_body(encode_controller_body(body), SyncStateSet) == body


def test_elect_body_has_bare_int_keys_like_fastjson() -> None:
    body = ElectMasterResponseBody(
        broker_member_group=BrokerMemberGroup(cluster="c", broker_name="b",
                                              broker_addrs={1: "h:1", 2: "h:2"}),
        sync_state_set=[1])
    raw = encode_controller_body(body)
    assert b'{1:"h:1",2:"h:2"}' in raw
    assert decode_controller_body(raw, ElectMasterResponseBody) == body


@pytest.mark.parametrize("raw", [b"", b"{", b'{"syncStateSet":"x"}', b"[1]", b"\xff"])
def test_bad_bodies_raise(raw: bytes) -> None:
    with pytest.raises(MalformedHeader):
        decode_controller_body(raw, SyncStateSet)
