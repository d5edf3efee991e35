"""Controller mode's runtime roles (issue #26), driven through the RoleTarget the controller client
uses, on two real brokers in one process over TCP on 127.0.0.1 (no controller needed): a switch
master -> slave -> master keeps the logs byte-identical, a fenced master refuses sends and ends,
a diverged slave truncates to the consistent point, EXCHANGE_BROKER_HA_INFO answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from txmq.broker import BrokerConfig
from txmq.broker._roles import RoleTarget
from txmq.broker.ha import RoleSwitch, exchange_ha_info
from txmq.broker.server import BrokerServer
from txmq.client import AsyncConnection, AsyncProducer, Message
from txmq.errors import RemoteError, ResponseCode
from txmq.protocol import EndTransactionRequestHeader, RequestCode, to_ext
from txmq.store import read_commit_log

A, B = 1, 2  # controller broker ids


def _config(root: Path, name: str) -> BrokerConfig:
    return BrokerConfig(port=0, host="127.0.0.1", data_dir=str(root / name), topics={"t": 2},
                        enable_controller_mode=True, controller_addr="127.0.0.1:1",
                        sync_flush_timeout_ms=2000).validate()


@asynccontextmanager
async def _brokers(root: Path) -> AsyncIterator[tuple[BrokerServer, BrokerServer]]:
    a, b = BrokerServer(_config(root, "a")), BrokerServer(_config(root, "b"))
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def _roles(s: BrokerServer, broker_id: int) -> RoleSwitch:
    assert s.roles is not None
    s.roles.set_controller_id(broker_id)
    return s.roles


def _lease(r: RoleSwitch) -> None:
    r.set_lease(int(time.monotonic() * 1000) + 60_000)


async def _send(s: BrokerServer, n: int, tag: str) -> None:
    p = AsyncProducer("pg", endpoints=f"127.0.0.1:{s.port}", retry_times_when_send_failed=0)
    await p.start()
    try:
        for i in range(n):
            await p.send(Message(topic="t", body=f"{tag}{i}".encode() * 30), queue_id=i % 2)
    finally:
        await p.shutdown()


async def _until(cond: object, what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _same_logs(a: BrokerServer, b: BrokerServer) -> bool:
    return (a.store.flushed_offset == b.store.flushed_offset
            and read_commit_log(Path(a.config.data_dir)) == read_commit_log(Path(b.config.data_dir)))


def test_switch_master_slave_master_keeps_logs_identical(tmp_path: Path) -> None:
    async def main() -> None:
        async with _brokers(tmp_path) as (a, b):
            ra, rb = _roles(a, A), _roles(b, B)
            target: RoleTarget = ra  # (type-checks as the controller client's interface)
            assert target.last_epoch() == 0
            await ra.become_master(1, frozenset({A, B}), 1)
            _lease(ra)
            await rb.become_slave(1, A, f"127.0.0.1:{a.port}")
            await _until(lambda: B in ra.in_sync_slaves(int(time.monotonic() * 1000)),
                         "B connected to A")
            await _send(a, 20, "one")  # SYNC: each acknowledged by B too
            assert rb.max_phy_offset() == ra.max_phy_offset() == ra.confirm_offset()
            # failover: B becomes master of epoch 2, A its slave
            ra.fence()
            await rb.become_master(2, frozenset({B}), 2)
            _lease(rb)
            await ra.become_slave(2, B, f"127.0.0.1:{b.port}")
            rb.set_sync_state_set(frozenset({A, B}), 3)
            await _send(b, 20, "two")
            # and back: A master of epoch 3
            await ra.become_master(3, frozenset({A}), 4)
            _lease(ra)
            await rb.become_slave(3, A, f"127.0.0.1:{a.port}")
            await _send(a, 5, "three")
            await _until(lambda: _same_logs(a, b), "B caught up with A")
            assert a.store.epochs.cache.pairs() == b.store.epochs.cache.pairs()
            assert [e for e, _ in a.store.epochs.cache.pairs()] == [1, 2, 3]
            assert ra.last_epoch() == 3 and not a.broker.role.slave and b.broker.role.slave

    asyncio.run(main())


def test_a_fenced_master_refuses_sends_and_ends(tmp_path: Path) -> None:
    async def main() -> None:
        async with _brokers(tmp_path) as (a, _b):
            ra = _roles(a, A)
            with pytest.raises(RemoteError, match="fenced"):  # no role yet: fenced
                await _send(a, 1, "x")
            await ra.become_master(1, frozenset({A}), 1)
            _lease(ra)
            await _send(a, 3, "ok")
            ra.set_lease(int(time.monotonic() * 1000) - 1)  # the lease ran out
            with pytest.raises(RemoteError, match="fenced: lease expired") as err:
                await _send(a, 1, "late")
            assert err.value.response_code == ResponseCode.SERVICE_NOT_AVAILABLE
            conn = AsyncConnection(f"127.0.0.1:{a.port}")
            await conn.connect()
            end = to_ext(EndTransactionRequestHeader(
                producer_group="pg", tran_state_table_offset=0, commit_log_offset=0,
                commit_or_rollback=8, from_transaction_check=False, msg_id="x"))
            got = await conn.request(RequestCode.END_TRANSACTION, end)
            assert (got.code, got.remark) == (ResponseCode.SERVICE_NOT_AVAILABLE,
                                              "fenced: lease expired")
            await conn.close()
            _lease(ra)
            ra.set_sync_state_set(frozenset({A}), 2)
            a.broker.role.min_in_sync_replicas = 2  # SyncStateSet below min_in_sync_replicas
            with pytest.raises(RemoteError, match="in-sync replicas not enough"):
                await _send(a, 1, "few")

    asyncio.run(main())


def test_a_diverged_slave_truncates_to_the_consistent_point(tmp_path: Path) -> None:
    async def main() -> None:
        async with _brokers(tmp_path) as (a, b):
            ra, rb = _roles(a, A), _roles(b, B)
            await ra.become_master(1, frozenset({A, B}), 1)
            _lease(ra)
            await rb.become_slave(1, A, f"127.0.0.1:{a.port}")
            await _until(lambda: B in ra.in_sync_slaves(int(time.monotonic() * 1000)), "B in")
            await _send(a, 10, "shared")
            shared_end = a.store.flushed_offset
            # A is cut off: B becomes master of epoch 2 while A, still master in its own eyes
            # (its lease not yet over), stores sends that nobody acknowledges
            await rb.become_master(2, frozenset({B}), 2)
            _lease(rb)
            ra.set_sync_state_set(frozenset({A}), 2)
            await _send(a, 5, "lost")  # acknowledged by A alone (its SyncStateSet is {A})
            await _send(b, 7, "kept")
            assert a.store.flushed_offset > shared_end
            await ra.become_slave(2, B, f"127.0.0.1:{b.port}")
            await _until(lambda: _same_logs(a, b), "A truncated and caught up with B")
            assert b"lost0" not in read_commit_log(Path(a.config.data_dir))
            assert any((Path(a.config.data_dir) / "quarantine").rglob("*"))  # the cut is kept

    asyncio.run(main())


def test_exchange_ha_info_names_the_ha_listener(tmp_path: Path) -> None:
    async def main() -> None:
        async with _brokers(tmp_path) as (a, _b):
            ra = _roles(a, A)
            info = await exchange_ha_info(f"127.0.0.1:{a.port}")
            assert info.master_ha_address is None  # no role: no HA listener
            await ra.become_master(1, frozenset({A}), 1)
            info = await exchange_ha_info(f"127.0.0.1:{a.port}")
            assert info.master_ha_address == a._repl.ha_addr != ""
            assert info.master_address == a.broker.store_host
            assert info.master_flush_offset == a.store.flushed_offset

    asyncio.run(main())


def test_a_controller_mode_broker_process_starts_fenced(tmp_path: Path) -> None:
    from txmq.client import Producer
    from txmq.testing import run_broker

    with run_broker(tmp_path, enable_controller_mode=True, controller_addr="127.0.0.1:1",
                    topics={"t": 1}) as bp:
        p = Producer("pg", endpoints=bp.endpoints, retry_times_when_send_failed=0)
        p.start()
        try:
            with pytest.raises(RemoteError, match="fenced: no role"):
                p.send(Message(topic="t", body=b"x"))
        finally:
            p.shutdown()


def test_a_sync_send_waits_for_every_sync_state_set_member(tmp_path: Path) -> None:
    async def main() -> None:
        async with _brokers(tmp_path) as (a, _b):
            ra = _roles(a, A)
            await ra.become_master(1, frozenset({A, B}), 1)  # B never connects
            _lease(ra)
            t0 = time.monotonic()
            sending = asyncio.create_task(_send(a, 1, "wait"))
            await asyncio.sleep(0.3)
            assert not sending.done()  # held for B's acknowledgement
            ra.set_sync_state_set(frozenset({A}), 2)  # the controller shrank the set
            await asyncio.wait_for(sending, 1.5)  # released at once, not at the 2 s timeout
            assert time.monotonic() - t0 < 1.8
            assert ra.confirm_offset() == ra.max_phy_offset() > 0

    asyncio.run(main())


def test_a_restarted_master_of_the_same_epoch_keeps_its_epoch_entry(tmp_path: Path) -> None:
    async def main() -> None:
        a = BrokerServer(_config(tmp_path, "a"))
        await a.start()
        try:
            ra = _roles(a, A)
            await ra.become_master(1, frozenset({A}), 1)
            _lease(ra)
            await _send(a, 3, "before")
        finally:
            await a.close()
        a = BrokerServer(_config(tmp_path, "a"))
        await a.start()
        try:
            ra = _roles(a, A)
            assert a.broker.role.master_epoch == 1 and a.broker.role.fenced
            await ra.become_slave(0, B, "127.0.0.1:1")  # older than what it saw: ignored
            await ra.become_master(1, frozenset({A}), 1)  # the controller: still master, epoch 1
            assert a.store.epochs.cache.pairs() == [(1, 0)]  # not restarted at the log's end
            _lease(ra)
            await _send(a, 1, "after")
        finally:
            await a.close()

    asyncio.run(main())
