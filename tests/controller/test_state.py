"""The controller's replicated state: RocketMQ's election and SyncStateSet rules, and properties over
random event sequences (one master per epoch, epochs only grow, masters come from the SSS)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.controller import (
    AlterSyncStateSet,
    ApplyBrokerId,
    Candidate,
    CleanBrokerData,
    ControllerEvent,
    ControllerState,
    ElectMaster,
    RegisterBroker,
)
from txmq.errors import ResponseCode

B = "broker-a"


def cand(i: int, epoch: int = 0, offset: int = 0, prio: int = 0) -> Candidate:
    return Candidate(i, epoch, offset, prio)


def group_of(n: int) -> ControllerState:
    s = ControllerState()
    for i in range(1, n + 1):
        assert s.apply(ApplyBrokerId("c", B, i, f"code{i}")).code == ResponseCode.SUCCESS
        assert s.apply(RegisterBroker("c", B, i, f"h:{i}")).code == ResponseCode.SUCCESS
    return s


def test_apply_broker_id_rules() -> None:
    s = ControllerState()
    assert s.apply(ApplyBrokerId("c", B, 2, "x")).code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
    assert s.apply(ApplyBrokerId("c", B, 1, "x")).code == ResponseCode.SUCCESS
    assert s.apply(ApplyBrokerId("c", B, 1, "x")).code == ResponseCode.SUCCESS  # same code again
    assert s.apply(ApplyBrokerId("c", B, 1, "y")).code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
    g = s.group(B)
    assert g is not None and g.next_broker_id == 2
    assert s.apply(RegisterBroker("c", B, 5, "h:5")).code == (
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST)


def test_first_election_elects_the_requester_then_policy_order() -> None:
    s = group_of(3)
    out = s.apply(ElectMaster(B, 2, (cand(1), cand(2), cand(3))))
    assert out.code == ResponseCode.SUCCESS and out.changed_master
    assert out.group is not None and out.group.master_broker_id == 2
    assert (out.group.master_epoch, out.group.sync_state_set_epoch) == (1, 1)
    assert out.group.master_address == "h:2"
    # the master adds both slaves to the SyncStateSet
    alter = AlterSyncStateSet(B, 2, 1, frozenset({1, 2, 3}), 1, frozenset({1, 2, 3}))
    assert s.apply(alter).code == ResponseCode.SUCCESS
    # master 2 alive: kept
    assert s.apply(ElectMaster(B, -1, (cand(1), cand(2)))).code == (
        ResponseCode.CONTROLLER_MASTER_STILL_EXIST)
    # master 2 gone: epoch desc, maxOffset desc, priority asc
    out = s.apply(ElectMaster(B, -1, (cand(1, 1, 100, 5), cand(3, 1, 100, 1))))
    assert out.group is not None and out.group.master_broker_id == 3
    assert out.group.master_epoch == 2 and out.group.sync_state_set == frozenset({3})
    assert out.group.sync_state_set_epoch == 3


def test_higher_offset_beats_priority_and_epoch_beats_offset() -> None:
    s = group_of(3)
    s.apply(ElectMaster(B, 1, (cand(1),)))
    s.apply(AlterSyncStateSet(B, 1, 1, frozenset({1, 2, 3}), 1, frozenset({1, 2, 3})))
    out = s.apply(ElectMaster(B, -1, (cand(2, 1, 50, 0), cand(3, 1, 60, 9))))
    assert out.group is not None and out.group.master_broker_id == 3
    s2 = group_of(3)
    s2.apply(ElectMaster(B, 1, (cand(1),)))
    s2.apply(AlterSyncStateSet(B, 1, 1, frozenset({1, 2, 3}), 1, frozenset({1, 2, 3})))
    out = s2.apply(ElectMaster(B, -1, (cand(2, 2, 10, 0), cand(3, 1, 60, 0))))
    assert out.group is not None and out.group.master_broker_id == 2


def test_no_live_sss_member_clears_the_master() -> None:
    s = group_of(2)
    s.apply(ElectMaster(B, 1, (cand(1), cand(2))))
    out = s.apply(ElectMaster(B, -1, (cand(2, 1, 999),)))  # 2 alive but not in the SSS
    assert out.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    assert out.group is not None and out.group.master_broker_id is None
    assert out.group.master_epoch == 1
    out = s.apply(ElectMaster(B, 1, (cand(1), cand(2))))  # the old master returns
    assert out.group is not None and out.group.master_broker_id == 1 and out.group.master_epoch == 2


def test_alter_sync_state_set_fencing() -> None:
    s = group_of(3)
    s.apply(ElectMaster(B, 1, (cand(1),)))
    every = frozenset({1, 2, 3})
    codes = {
        ResponseCode.CONTROLLER_INVALID_MASTER: AlterSyncStateSet(B, 2, 1, every, 1, every),
        ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH: AlterSyncStateSet(B, 1, 0, every, 1, every),
        ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH:
            AlterSyncStateSet(B, 1, 1, every, 0, every),
        ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED:
            AlterSyncStateSet(B, 1, 1, frozenset({2, 3}), 1, every),
        ResponseCode.CONTROLLER_INVALID_REPLICAS:
            AlterSyncStateSet(B, 1, 1, frozenset({1, 9}), 1, frozenset({1, 9})),
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE:
            AlterSyncStateSet(B, 1, 1, every, 1, frozenset({1, 2})),
    }
    for code, event in codes.items():
        assert s.apply(event).code == code, code
    out = s.apply(AlterSyncStateSet(B, 1, 1, every, 1, every))
    assert out.code == ResponseCode.SUCCESS and out.group is not None
    assert out.group.sync_state_set_epoch == 2


def test_clean_and_dump_load() -> None:
    s = group_of(2)
    s.apply(ElectMaster(B, 1, (cand(1),)))
    again = ControllerState.load(s.dump())
    assert again.groups() == s.groups()
    out = s.apply(CleanBrokerData(B, frozenset({1})))
    assert out.group is not None and out.group.master_broker_id is None
    assert s.apply(CleanBrokerData(B)).group is None and s.group(B) is None


# --- properties over random event sequences ---------------------------------------------------

IDS = st.integers(1, 4)
cands = st.lists(st.builds(Candidate, IDS, st.integers(0, 5), st.integers(0, 1000),
                           st.integers(0, 3)), max_size=4, unique_by=lambda c: c.broker_id)
events = st.one_of(
    st.builds(ApplyBrokerId, st.just("c"), st.just(B), IDS, st.sampled_from(["x", "y"])),
    st.builds(RegisterBroker, st.just("c"), st.just(B), IDS, st.just("h")),
    st.builds(AlterSyncStateSet, st.just(B), IDS, st.integers(0, 6),
              st.frozensets(IDS, max_size=4), st.integers(0, 12), st.frozensets(IDS)),
    st.builds(ElectMaster, st.just(B), st.integers(-1, 4), cands.map(tuple), st.booleans()),
    st.builds(CleanBrokerData, st.just(B), st.none() | st.frozensets(IDS, max_size=2)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40))
def test_invariants(seq: list[ControllerEvent]) -> None:
    s = ControllerState()
    masters: dict[int, int] = {}  # master epoch -> the broker elected in it
    last_epoch = last_sss_epoch = 0
    for event in seq:
        before = s.group(B)
        out = s.apply(event)
        g = s.group(B)
        assert out.group == g
        if g is None:  # CLEAN_BROKER_DATA of the whole group starts it over
            masters.clear()
            last_epoch = last_sss_epoch = 0
            continue
        assert g.master_epoch >= last_epoch and g.sync_state_set_epoch >= last_sss_epoch
        last_epoch, last_sss_epoch = g.master_epoch, g.sync_state_set_epoch
        if g.master_broker_id is not None:
            assert masters.setdefault(g.master_epoch, g.master_broker_id) == g.master_broker_id
            assert g.master_broker_id in g.sync_state_set
        if out.changed_master:
            assert isinstance(event, ElectMaster)
            assert g.master_broker_id is not None
            assert g.master_broker_id in {c.broker_id for c in event.candidates}
            if before is not None and before.master_epoch > 0:
                assert g.master_broker_id in before.sync_state_set
        if out.code != ResponseCode.SUCCESS and before is not None and not isinstance(
                event, ElectMaster):
            assert g == before  # a refused event changes nothing
