"""The sans-IO cores of replication (txmq.broker.ha._core) and the role rules of BrokerConfig."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.broker import Broker, BrokerConfig
from txmq.broker.acl import Accounts, AclGuard, Action, PolicyEntry, Resource, User, UserType
from txmq.broker.ha import AckTable, Replication, ReplicaWait, SlaveCore
from txmq.errors import ConfigError, HaProtocolError
from txmq.protocol import HelloDecoder, encode_heartbeat, encode_hello, encode_report, encode_transfer
from txmq.store import MemoryStore


def records(sizes: list[int]) -> bytes:
    """Fake records: a 4-byte size then filler (SlaveCore only reads the size)."""
    return b"".join(n.to_bytes(4, "big") + bytes([i % 256]) * (n - 4) for i, n in enumerate(sizes))


@settings(deadline=None)  # a 1-byte frame feeds byte by byte: > 200 ms on a loaded machine
@given(st.lists(st.integers(8, 3000), min_size=1, max_size=40), st.integers(1, 32 * 1024))
def test_slave_core_joins_frames_into_whole_records(sizes: list[int], frame: int) -> None:
    data = records(sizes)
    core = SlaveCore(1000)
    assert core.hello() == encode_report(1000)
    got = []
    for at in range(0, len(data), frame):
        got += core.feed(encode_transfer(1000 + at, data[at : at + frame]))
        got += core.feed(encode_heartbeat(1000 + min(at + frame, len(data))))
    assert b"".join(c for _, c in got) == data
    offsets = [o for o, _ in got]
    assert offsets[0] == 1000 and all(o > p for p, o in itertools.pairwise(offsets))


def test_slave_core_refuses_a_record_size_out_of_bounds_and_a_gap() -> None:
    with pytest.raises(HaProtocolError, match="declares size 3"):
        SlaveCore(0).feed(encode_transfer(0, (3).to_bytes(4, "big") + b"xxxx"))
    with pytest.raises(HaProtocolError, match="expects 0"):
        SlaveCore(0).feed(encode_transfer(8, records([8])))


def test_ack_table_counts_slaves_and_the_gap() -> None:
    t = AckTable()
    assert t.acked_by(1) == -1 and not t.in_sync(100, 50)
    t.report(1, 500)
    t.report(2, 300)
    assert (t.acked_by(1), t.acked_by(2), t.acked_by(3)) == (500, 300, -1)
    assert t.in_sync(540, 50) and not t.in_sync(560, 50)
    t.gone(1)
    assert t.acked_by(1) == 300


def test_replica_wait_releases_in_order_and_expires_at_the_deadline() -> None:
    w: ReplicaWait[str] = ReplicaWait(timeout_ms=100)
    w.park(10, "a", now_ms=0)
    w.park(20, "b", now_ms=50)
    assert w.release(15) == ["a"] and len(w) == 1
    assert w.expired(149) == [] and w.expired(150) == ["b"]


@pytest.mark.parametrize(("cfg", "why"), [
    ({"broker_role": "SLAVE"}, "broker_id must be > 0"),
    ({"broker_role": "SYNC_MASTER", "broker_id": 2}, "must be 0"),
    ({"ha_master_address": "nohost"}, "ha_master_address"),
    ({"in_sync_replicas": 3, "total_replicas": 2}, "in_sync_replicas"),
    ({"ha_listen_port": -2}, "ha_listen_port"),
])
def test_role_rules_of_the_config(cfg: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        BrokerConfig(**cfg).validate()  # type: ignore[arg-type]


def test_ack_table_measures_lag_from_the_last_catch_up() -> None:
    t = AckTable()
    t.report(1, 100, end=500, now_ms=1_000)  # connects behind: lag counts from the connection
    assert t.lag_ms(1, 500, 1_250) == 250
    t.report(1, 500, end=500, now_ms=2_000)  # caught up
    assert t.lag_ms(1, 500, 2_100) == 0
    t.report(1, 600, end=900, now_ms=3_000)  # behind again: counts from 2 000
    assert t.lag_ms(1, 900, 3_500) == 1_500 and t.lag_ms(1, 600, 3_500) == 0
    t.gone(1)
    assert t.lag_ms(1, 900, 4_000) == 0 and not t.caught_up_ms



def test_ack_table_a_slave_that_connects_behind_is_not_caught_up_until_it_catches_up() -> None:
    # the unsafe old rule: the first report of a new link counted as a catch-up, so a slave far
    # behind joined the SyncStateSet at once and could be elected without acked messages
    t = AckTable()
    t.report(1, 100, end=500, now_ms=1_000)
    assert not t.caught_up(1, 500, 1_001, max_lag_ms=15_000)
    assert t.lag_ms(1, 500, 1_250) == 250  # (the runtime info still counts from the connection)
    t.transferred(1, 500, now_ms=1_100)
    t.report(1, 400, end=500, now_ms=1_200)  # not yet at the end sent at 1 100
    assert not t.caught_up(1, 500, 1_200, max_lag_ms=15_000)
    t.report(1, 500, end=700, now_ms=1_300)  # reached it, while the master wrote on
    assert t.caught_up(1, 700, 1_300, max_lag_ms=15_000) and t.caught_up_ms[1] == 1_100


def test_ack_table_a_slave_that_keeps_up_under_load_stays_caught_up() -> None:
    # the master writes between every transfer and report: the report never equals the end
    # now, but reaches the end of each transfer (RocketMQ lastMasterMaxOffset)
    t = AckTable()
    t.report(1, 0, end=0, now_ms=0)
    for i in range(1, 40):
        t.transferred(1, i * 100, now_ms=i * 1_000)
        t.report(1, i * 100, end=i * 100 + 50, now_ms=i * 1_000 + 5)
    assert t.caught_up(1, 4_000, 39_500, max_lag_ms=15_000)
    t.transferred(1, 4_100, now_ms=39_600)  # a report trails the next transfer by a frame:
    t.transferred(1, 4_200, now_ms=39_700)
    t.report(1, 4_100, end=4_300, now_ms=39_800)  # caught up as of the transfer it covers
    assert t.caught_up_ms[1] == 39_600
    t.transferred(1, 4_300, now_ms=40_000)  # it stops acknowledging: out after the grace
    assert t.caught_up(1, 4_300, 54_599, max_lag_ms=15_000)
    assert not t.caught_up(1, 4_300, 54_600, max_lag_ms=15_000)
    t.gone(1)
    assert not t.caught_up(1, 4_300, 54_600, max_lag_ms=15_000) and not t.sent


def _replication() -> tuple[Replication, Broker]:
    users = {"repl": User("repl", "repl-sk", UserType.NORMAL,
                          (PolicyEntry(Resource.parse("Cluster:DefaultCluster"), (Action.ALL,)),)),
             "reader": User("reader", "reader-sk")}
    config = BrokerConfig(broker_role="SYNC_MASTER").validate()
    broker = Broker(config, MemoryStore(), 0)
    rep = Replication(config, broker, lambda *a: None, lambda: asyncio.sleep(0, 0),
                      lambda: None, AclGuard(Accounts(users), "DefaultCluster"))
    return rep, broker


@pytest.mark.parametrize(("name", "broker_id", "ak", "sk", "nonce", "why"), [
    ("broker-a", 1, "repl", "repl-sk", b"n" * 16, None),
    ("broker-b", 1, "repl", "repl-sk", b"n" * 16, "not this group's"),
    ("broker-a", 0, "repl", "repl-sk", b"n" * 16, "not a slave's"),
    ("broker-a", 1, "repl", "other", b"n" * 16, "signature check failed"),
    ("broker-a", 1, "repl", "repl-sk", b"m" * 16, "signature check failed"),  # replayed
    ("broker-a", 1, "reader", "reader-sk", b"n" * 16, "no policy allowing All on Cluster"),
])
def test_the_master_admits_a_hello_of_its_group_signed_by_a_granted_account(
        name: str, broker_id: int, ak: str, sk: str, nonce: bytes, why: str | None) -> None:
    rep, broker = _replication()
    hello = HelloDecoder().feed(encode_hello(name, broker_id, ak, sk, nonce))
    assert hello is not None
    got = rep.authenticate(hello, b"n" * 16, "10.0.0.2")
    assert got is None if why is None else why in (got or "")
    assert broker.ha_status is not None and broker.ha_status(0).broker_role == "SYNC_MASTER"


def test_a_controller_mode_slave_records_new_epochs_and_refuses_older_ones() -> None:
    from txmq.errors import HaProtocolError
    from txmq.protocol import encode_auto_transfer

    core = SlaveCore(0, last_epoch=1)
    rec = b"\0\0\0\x08\0\0\0\0"  # one 8-byte "record" (size field, magic)
    assert core.feed(encode_auto_transfer(0, rec, 1, 0, 0)) == [(0, rec)] and core.new_epochs == []
    assert core.feed(encode_auto_transfer(8, rec, 3, 8, 8)) == [(8, rec)]
    assert core.new_epochs == [(3, 8)] and core.confirm == 8 and core.last_epoch == 3
    with pytest.raises(HaProtocolError, match="older than"):
        core.feed(encode_auto_transfer(16, rec, 2, 16, 8))
    assert len(core.report(16)) == 12


def test_a_controller_mode_master_never_ships_a_frame_across_two_epochs(tmp_path: object) -> None:
    from pathlib import Path

    from txmq.broker.ha import HaMaster
    from txmq.broker.ha._shell import AutoSwitchMaster
    from txmq.protocol import AutoHandshake, HaTransfer, TransferDecoder
    from txmq.store import EpochCache, FileStore, Record

    store = FileStore(Path(str(tmp_path)))
    store.append([Record(topic="t", queue_id=0, body=b"x" * 100) for _ in range(5)])
    cut = store.write_offset
    store.append([Record(topic="t", queue_id=0, body=b"y" * 100) for _ in range(5)])
    store.flush()
    epochs = EpochCache([(1, 0), (2, cut)])

    def frame(at: int) -> tuple[int, int, int, int]:
        e = epochs.find_by_offset(at)
        assert e is not None
        return e.epoch, e.start_offset, e.end_offset, at

    master = HaMaster(store, "127.0.0.1", 0, lambda: None, auto_switch=AutoSwitchMaster(
        lambda: AutoHandshake(store.write_offset, 2, epochs.pairs()), frame))

    class Sink:
        data = b""

        def write(self, b: bytes) -> None:
            self.data += b

    sink, at = Sink(), 0
    while at < store.write_offset:
        at += master._send_frame(sink, at, store.write_offset)  # type: ignore[arg-type]
    frames = [f for f in TransferDecoder(0, auto=True).feed(sink.data) if isinstance(f, HaTransfer)]
    assert [(f.offset, f.epoch, f.epoch_start) for f in frames] == [(0, 1, 0), (cut, 2, cut)]
    store.close()
