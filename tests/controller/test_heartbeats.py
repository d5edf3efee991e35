"""The leader's liveness table and master leases (monotonic ms from the test)."""

from __future__ import annotations

from txmq.controller import BrokerLive, Candidate, HeartbeatTable

B = "broker-a"


def live(i: int, now: int, conn: int = 1, timeout: int = 0, epoch: int = 1) -> BrokerLive:
    return BrokerLive(B, i, f"h:{i}", now, timeout, epoch=epoch, max_offset=10 * i, conn=conn)


def test_silence_and_closed_channels_make_brokers_inactive() -> None:
    t = HeartbeatTable(timeout_ms=3000, lease_ms=3000)
    t.heartbeat(live(1, 0, conn=1))
    t.heartbeat(live(2, 0, conn=2, timeout=10_000))
    assert t.alive_ids(B, 3000) == {1, 2}
    assert t.alive_ids(B, 3001) == {2}
    assert [b.broker_id for b in t.scan(3001)] == [1]
    assert t.scan(3002) == []
    assert t.candidates(B, 3001) == (Candidate(2, 1, 20, 0),)
    assert [b.broker_id for b in t.channel_closed(2)] == [2]
    assert t.alive_ids(B, 3001) == frozenset()


def test_no_master_replaced_within_its_lease_or_one_lease_after_leadership() -> None:
    t = HeartbeatTable(timeout_ms=3000, lease_ms=3000)
    t.became_leader(now_ms=1000)
    assert not t.may_replace_master(B, 3999)
    assert t.may_replace_master(B, 4000)
    t.grant_lease(B, received_ms=5000)
    t.grant_lease(B, received_ms=4000)  # an older heartbeat never shortens the lease
    assert t.lease_end_ms(B) == 8000
    assert not t.may_replace_master(B, 7999)
    assert t.may_replace_master(B, 8000)
    assert t.may_replace_master("broker-b", 4000)
    t.master_changed(B)
    assert t.may_replace_master(B, 4000)
