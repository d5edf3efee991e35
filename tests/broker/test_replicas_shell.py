"""The replicas manager against a real ``txmq controller`` process over TCP, with fake brokers
(RoleTarget): self-election, slave, SyncStateSet growth, leases, and failover when the master's
manager stops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.broker._replicas import ReplicasConfig
from txmq.broker._replicas_shell import ReplicasManager, load_broker_meta
from txmq.testing import ControllerProcess, free_port


class FakeBroker:
    """A RoleTarget that records what it is told."""

    def __init__(self) -> None:
        self.role = "fenced"
        self.epoch = 0
        self.lease = 0
        self.sync_state_set: frozenset[int] = frozenset()
        self.caught_up: frozenset[int] = frozenset()
        self.master: tuple[int, str] | None = None

    def max_phy_offset(self) -> int:
        return 100

    def confirm_offset(self) -> int:
        return 100

    def last_epoch(self) -> int:
        return self.epoch

    async def become_master(self, master_epoch: int, sync_state_set: frozenset[int],
                            sync_state_set_epoch: int) -> None:
        self.role, self.epoch, self.sync_state_set = "master", master_epoch, sync_state_set

    async def become_slave(self, master_epoch: int, master_broker_id: int,
                           master_addr: str) -> None:
        self.role, self.epoch, self.master = "slave", master_epoch, (master_broker_id, master_addr)

    def set_sync_state_set(self, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None:
        self.sync_state_set = sync_state_set

    def in_sync_slaves(self, now_ms: int) -> frozenset[int]:
        return self.caught_up

    def set_lease(self, expires_mono_ms: int) -> None:
        self.lease = expires_mono_ms

    def fence(self) -> None:
        self.role = "fenced"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    p = ControllerProcess(tmp_path / "ctl", "127.0.0.1", 0, f"127.0.0.1:{free_port()}", [])
    try:
        p.start()
        yield p
    finally:
        p.kill()


async def until(pred: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def manager(ctl: ControllerProcess, store: Path, port: int, fake: FakeBroker) -> ReplicasManager:
    store.mkdir(parents=True, exist_ok=True)
    cfg = ReplicasConfig("c", "broker-a", f"127.0.0.1:{port}", (ctl.addr,))
    return ReplicasManager(cfg, fake, store)


def test_election_sync_state_set_and_failover(controller: ControllerProcess,
                                              tmp_path: Path) -> None:
    async def main() -> None:
        b1, b2 = FakeBroker(), FakeBroker()
        m1 = manager(controller, tmp_path / "b1", 1, b1)
        m2 = manager(controller, tmp_path / "b2", 2, b2)
        await m1.start()
        await until(lambda: b1.role == "master" and b1.lease > time.monotonic() * 1000)
        assert b1.epoch == 1
        await m2.start()
        await until(lambda: b2.role == "slave")
        id1 = load_broker_meta(tmp_path / "b1")
        id2 = load_broker_meta(tmp_path / "b2")
        assert id1 is not None and id2 is not None and (id1.broker_id, id2.broker_id) == (1, 2)
        assert b2.master == (1, "127.0.0.1:1")
        b1.caught_up = frozenset({2})
        await until(lambda: b1.sync_state_set == {1, 2})

        await m1.close()  # the master's manager stops: its connection closes
        t0 = time.monotonic()
        await until(lambda: b2.role == "master" and b2.lease > time.monotonic() * 1000)
        print(f"broker 2 master with a lease {time.monotonic() - t0:.1f} s after broker 1 left")
        assert b2.epoch == 2
        await m2.close()

    asyncio.run(main())


class _FlakySlave(FakeBroker):
    """become_slave fails the first time (the master's port did not answer 906)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def become_slave(self, master_epoch: int, master_broker_id: int,
                           master_addr: str) -> None:
        self.attempts += 1
        if self.attempts == 1:
            from txmq.errors import ConnectTimeout
            raise ConnectTimeout(f"cannot connect to {master_addr}: no answer in 3 s")
        await super().become_slave(master_epoch, master_broker_id, master_addr)


def test_a_failed_switch_to_slave_is_tried_again_in_the_same_epoch(tmp_path: Path) -> None:
    """The failover chaos run: a slave whose switch failed once stayed fenced for the whole epoch
    (the core applies a role once per epoch), never rejoined the SyncStateSet, and a master kill
    then had nobody to elect. The shell now queues the switch again after ROLE_RETRY_MS."""
    from types import SimpleNamespace

    from txmq.broker._replicas import BecomeSlave
    from txmq.broker._replicas_shell import ROLE_RETRY_MS

    fake = _FlakySlave()
    m = ReplicasManager(ReplicasConfig("c", "broker-a", "127.0.0.1:1", ("127.0.0.1:2",)), fake,
                        tmp_path)
    m.core = SimpleNamespace(is_master=False, master_epoch=5, master_broker_id=1)  # type: ignore[assignment]

    async def main() -> None:
        worker = asyncio.create_task(m._act_loop())
        m._actions.put_nowait(BecomeSlave(5, 1, "10.0.0.1:10911"))
        await asyncio.sleep(0.1)
        assert fake.role == "fenced" and fake.attempts == 1
        await asyncio.sleep(ROLE_RETRY_MS / 1000 + 0.3)
        assert fake.role == "slave" and fake.attempts == 2 and fake.master == (1, "10.0.0.1:10911")
        m.core.master_epoch = 6  # type: ignore[union-attr]
        fake.attempts = 0
        m._actions.put_nowait(BecomeSlave(5, 1, "10.0.0.1:10911"))  # fails; epoch 6 came since
        await asyncio.sleep(ROLE_RETRY_MS / 1000 + 0.3)
        assert fake.attempts == 1, "a superseded switch is not retried"
        worker.cancel()
        await m.close()
    asyncio.run(main())


def _read_loops() -> int:
    """AsyncConnection connections open in this process: their protocol objects that were
    connected and are not lost (a connection left open and unreferenced is still held by its
    transport, which the loop holds; a failed attempt's object never connected)."""
    import gc

    return sum(1 for o in gc.get_objects()
               if type(o).__name__ == "_Wire" and type(o).__module__ == "txmq.client._connection"
               and o.transport is not None and not o.lost.done())


def test_reconnecting_to_the_controller_leaves_no_connection_behind(
        controller: ControllerProcess, tmp_path: Path) -> None:
    """After the controller comes back, the heartbeat and the poll of one tick both need the kept
    connection: each opened its own, one was left open and unreferenced, and the garbage
    collector later reported its reader task ("Task was destroyed but it is pending!", seen in
    the failover chaos run's broker logs; connections have no reader task since, and such a
    connection would stay open). Now one connection serves both, and nothing is left."""
    import gc

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported: list[str] = []
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx["message"]))
        fake = FakeBroker()
        m = manager(controller, tmp_path / "b1", 1, fake)
        await m.start()
        await until(lambda: fake.role == "master")
        for _ in range(2):
            controller.kill()
            await until(lambda: m.core is not None and m.core.leader is None)  # noticed it
            controller.start()
            since = time.monotonic() * 1000
            await until(lambda s=since: fake.lease > s + 1000, 30)  # heartbeats answered again
        # the leader found again (metadata poll): the heartbeats go over the kept connection
        await until(lambda: m.core is not None and m.core.leader is not None
                    and _read_loops() >= 1, 30)
        gc.collect()
        await asyncio.sleep(0.1)
        assert reported == []
        assert _read_loops() == 1, "one kept connection to the controller, no other"
        await m.close()
        assert _read_loops() == 0

    asyncio.run(main())
