"""Routes keyed by master epoch (issue #26 item 4, txmq extension ``masterEpoch`` on
REGISTER_BROKER): the sans-IO core keeps, per broker group, the id-0 entry of the newest master."""

from __future__ import annotations

import logging

import pytest

from txmq.namesrv import BrokerRegistration, NameServerCore
from txmq.protocol import (
    Command,
    GetRouteInfoRequestHeader,
    RegisterBrokerResponseHeader,
    RequestCode,
    decode_route,
    from_ext,
    to_ext,
)

A = "127.0.0.1:10911"
B = "127.0.0.1:10921"
C = "127.0.0.1:10931"


def reg(addr: str, epoch: int | None, broker_id: int = 0) -> BrokerRegistration:
    r = BrokerRegistration("g", addr, broker_id=broker_id, ha_server_addr=addr + "1")
    r.master_epoch = epoch
    return r


def register(core: NameServerCore, r: BrokerRegistration, now: int = 0,
             conn: object = None) -> RegisterBrokerResponseHeader:
    resp = core.handle(r.register({"t": 4}, now), now, conn)
    assert resp is not None and resp.code == 0, resp
    return from_ext(resp.ext, RegisterBrokerResponseHeader)


def addrs(core: NameServerCore, topic: str = "t") -> dict[int, str]:
    resp = core.handle(Command(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1,
                               ext=to_ext(GetRouteInfoRequestHeader(topic=topic))), 0)
    assert resp is not None and resp.code == 0
    (bd,) = decode_route(resp.body).broker_datas
    return dict(bd.broker_addrs)


def test_the_register_header_carries_the_epoch_only_when_set() -> None:
    assert "masterEpoch" not in reg(A, None).register({"t": 1}, 0).ext
    assert reg(A, 7).register({"t": 1}, 0).ext["masterEpoch"] == "7"


def test_a_newer_epoch_takes_id_0_at_once_and_the_old_master_comes_back_as_a_slave() -> None:
    core = NameServerCore()
    register(core, reg(A, 1))
    register(core, reg(B, 1, broker_id=1))
    assert addrs(core) == {0: A, 1: B}
    register(core, reg(B, 2))  # B elected: its id-0 registration moves the route at once
    assert addrs(core) == {0: B}
    assert ("DefaultCluster", A) not in core.broker_live
    slave = register(core, reg(A, 2, broker_id=2))
    assert slave.master_addr == B and slave.ha_server_addr == B + "1"
    assert addrs(core) == {0: B, 2: A}


def test_a_stale_master_is_answered_but_does_not_take_id_0(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    core = NameServerCore()
    register(core, reg(A, 1))
    register(core, reg(B, 2))
    with caplog.at_level(logging.WARNING, "txmq.namesrv"):
        for now in range(3):  # the isolated old master keeps re-registering
            answer = register(core, reg(A, 1), now)
            assert answer.master_addr == B, "it learns who the master is"
    assert addrs(core) == {0: B}
    assert len([r for r in caplog.records if "stale master" in r.message]) == 1, "logged once"


def test_a_stale_master_is_refused_even_after_the_new_master_left() -> None:
    """The epoch outlives the registration: a partitioned old master whose route expired does not
    win the group back by registering first."""
    core = NameServerCore()
    register(core, reg(A, 1), conn="a")
    register(core, reg(B, 2), conn="b")
    core.connection_closed("b")
    assert core.route("t") is None  # the group is gone until a master registers
    answer = register(core, reg(A, 1))
    assert answer.master_addr is None
    assert core.route("t") is None, "the stale master did not take the group back"
    assert "g" not in core.cluster_info().broker_addr_table
    register(core, reg(C, 3))
    assert addrs(core) == {0: C}


def test_same_master_re_registering_keeps_its_entry_and_equal_epochs_do_not_evict() -> None:
    core = NameServerCore()
    register(core, reg(A, 4))
    register(core, reg(A, 4), 10)
    assert addrs(core) == {0: A}
    assert core.master_epoch["g"] == (4, A)


def test_classic_registrations_are_unchanged() -> None:
    """Without masterEpoch the last id-0 registration wins, as in RocketMQ."""
    core = NameServerCore()
    register(core, reg(A, None))
    register(core, reg(B, None))
    assert addrs(core) == {0: B}
    assert core.master_epoch == {}


def test_a_classic_master_replacing_an_epoch_master_resets_the_epochs() -> None:
    core = NameServerCore()
    register(core, reg(A, 5))
    register(core, reg(B, None))
    assert addrs(core) == {0: B} and "g" not in core.master_epoch
    register(core, reg(A, 1))  # a fresh controller-mode group starts over from epoch 1
    assert addrs(core) == {0: A}


def test_a_role_change_makes_the_next_registration_due_at_once_with_the_new_id_and_epoch() -> None:
    r = reg(A, 1, broker_id=1)
    r.register({"t": 1}, 0)
    assert not r.due(1_000)
    r.set_role(1, 1)
    assert not r.due(1_000), "the same role: nothing to tell"
    r.set_role(0, 2)
    assert r.due(1_000)
    ext = r.register({"t": 1}, 1_000).ext
    assert (ext["brokerId"], ext["masterEpoch"]) == ("0", "2")
    assert not r.due(1_001)
