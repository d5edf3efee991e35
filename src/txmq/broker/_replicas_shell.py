"""The replicas manager's asyncio shell: connections to the controllers, the timer, the broker id
file, and the actions of :class:`~txmq.broker._replicas.ReplicasCore` performed on a
:class:`~txmq.broker._roles.RoleTarget` in the order the core gave them.

The broker's remoting server hands NOTIFY_BROKER_ROLE_CHANGED (1008) requests to
:meth:`ReplicasManager.on_notify` (wiring in broker/server.py is the lead's). The heartbeat
connection to the controller leader stays open, so the controller sees a crashed broker's
connection close at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from txmq.broker._replicas import (
    BROKER_META_FILE,
    Action,
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
)
from txmq.broker._roles import RoleTarget
from txmq.errors import CorruptRecord, MalformedHeader, TransportError
from txmq.protocol import Command, RequestCode
from txmq.store import write_durably

if TYPE_CHECKING:
    from txmq.client import AsyncConnection

__all__ = ["CONTROLLER_REQUEST_TIMEOUT_MS", "HEARTBEAT_TIMEOUT_MS", "ROLE_RETRY_MS", "TICK_MS",
           "ReplicasManager",
           "load_broker_meta"]

log = logging.getLogger("txmq.broker.replicas")

TICK_MS = 200
"""The manager's timer: how late a due heartbeat or poll may leave (heartbeats are every 1 s)."""
HEARTBEAT_TIMEOUT_MS = 1_000
"""A heartbeat unanswered this long failed (RocketMQ ``BrokerConfig.sendHeartbeatTimeoutMillis``)."""
CONTROLLER_REQUEST_TIMEOUT_MS = 3_000
"""Any other controller request (RocketMQ's controller client default, 3 s)."""
ROLE_RETRY_MS = 1_000
"""A role switch to slave that failed (the master's remoting port did not answer its HA address
query, EXCHANGE_BROKER_HA_INFO) is tried again this long after (txmq). The core applies a role
once per epoch, so without the retry the broker stayed fenced and never replicated in that epoch,
and its group had no in-sync replica to fail over to (found by the failover chaos run)."""


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def load_broker_meta(store_dir: Path) -> BrokerMeta | None:
    """``<store_dir>/.broker.meta``, None when absent. Raises CorruptRecord."""
    try:
        data = (store_dir / BROKER_META_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return decode_broker_meta(data)


class ReplicasManager:
    """Drive ``target`` from the controllers (see the module docstring).

    Args:
        config: names, addresses, controllers, timings.
        target: the broker.
        store_dir: where ``.broker.meta`` lives.
        clock: monotonic milliseconds (``time.monotonic``, the clock of leases).

    Raises:
        CorruptRecord: from :meth:`start`, when ``.broker.meta`` is damaged (the broker must not
            guess its id).
    """

    def __init__(self, config: ReplicasConfig, target: RoleTarget, store_dir: Path,
                 clock: Callable[[], int] = _monotonic_ms) -> None:
        self.config, self.target, self.store_dir, self.clock = config, target, store_dir, clock
        self.core: ReplicasCore | None = None
        self._conn: AsyncConnection | None = None
        self._actions: asyncio.Queue[Action] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._connecting = asyncio.Lock()
        """Held while the kept connection to the leader is replaced (:meth:`_connection`)."""

    async def start(self) -> None:
        """Fence the broker, read its id file, start the timer and the action worker."""
        self.target.fence()
        meta = load_broker_meta(self.store_dir)
        if meta is not None and (meta.broker_name, meta.cluster_name) != (
                self.config.broker_name, self.config.cluster_name):
            raise CorruptRecord(f"{BROKER_META_FILE} is of {meta.cluster_name}/"
                                f"{meta.broker_name}, not this broker's group")
        self.core = ReplicasCore(self.config, meta, secrets.token_hex(16))
        for coro in (self._tick_loop(), self._act_loop()):
            task = asyncio.create_task(coro)
            self._tasks.add(task)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._conn is not None:
            await self._conn.close()

    def on_notify(self, cmd: Command) -> None:
        """A NOTIFY_BROKER_ROLE_CHANGED request (never raises on its content). One that changes
        the role is logged ("role change pushed by the controller"): with ACL on, only a signed
        push gets here (docs/security.md)."""
        if self.core is None:
            return
        try:
            actions = self.core.on_notify(cmd)
        except MalformedHeader as exc:
            log.warning("bad role change notification: %s", exc)
            return
        if any(isinstance(a, BecomeMaster | BecomeSlave | Fence) for a in actions):
            log.info("role change pushed by the controller: master %s, epoch %d",
                     self.core.master_broker_id, self.core.master_epoch)
        self._queue(actions)

    def _queue(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Request):
                task = asyncio.create_task(self._send(a))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                self._actions.put_nowait(a)

    def _status(self, now: int) -> BrokerStatus:
        t = self.target
        in_sync = t.in_sync_slaves(now) if self.core is not None and self.core.is_master else (
            frozenset())
        return BrokerStatus(t.max_phy_offset(), t.confirm_offset(), t.last_epoch(), in_sync)

    async def _tick_loop(self) -> None:
        assert self.core is not None
        while True:
            try:
                now = self.clock()
                self._queue(self.core.tick(now, self._status(now)))
            except Exception:  # a bug must not stop the heartbeats
                log.exception("replicas manager tick failed")
            await asyncio.sleep(TICK_MS / 1000)

    async def _send(self, req: Request) -> None:
        assert self.core is not None
        timeout_ms = (HEARTBEAT_TIMEOUT_MS if req.code == RequestCode.BROKER_HEARTBEAT
                      else CONTROLLER_REQUEST_TIMEOUT_MS)
        resp: Command | None = None
        try:
            conn = await self._connection(req.addr)
            try:
                resp = await conn.request(req.code, req.ext, req.body, timeout_ms / 1000)
            finally:
                if req.addr is not None:
                    await conn.close()
        except (TransportError, OSError) as exc:
            log.info("controller request %d failed: %s", req.code, exc)
        self._queue(self.core.on_response(req, resp, self.clock()))

    async def _connection(self, addr: str | None) -> AsyncConnection:
        """A one-off connection to ``addr``, or the kept one to the leader.

        The kept one is replaced under a lock: the requests of one tick (a heartbeat and a poll)
        ask for it at once, and each used to open its own when it was gone, so that one was left
        open and unreferenced (its reader task reported "Task was destroyed but it is pending!"
        when the garbage collector found it) and the other request failed "not connected"."""
        from txmq.client import AsyncConnection  # here: a broker without a controller needs no client

        assert self.core is not None
        if addr is not None:
            conn = AsyncConnection(addr, connect_timeout_ms=CONTROLLER_REQUEST_TIMEOUT_MS)
            await conn.connect()
            return conn
        async with self._connecting:
            leader = self.core.leader
            if leader is None:
                raise OSError("no controller leader known")
            old = self._conn
            if old is not None and old.addr == leader and not old.closed:
                return old
            self._conn = None
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.close()
            conn = AsyncConnection(leader, connect_timeout_ms=CONTROLLER_REQUEST_TIMEOUT_MS)
            await conn.connect()
            self._conn = conn
            return conn

    async def _act_loop(self) -> None:
        while True:
            action = await self._actions.get()
            try:
                await self._act(action)
            except Exception:  # the broker's failure to switch must not stop later actions
                log.exception("role action %s failed", action)
                self.target.fence()
                if isinstance(action, BecomeSlave):
                    self._retry_later(action)

    def _retry_later(self, a: BecomeSlave) -> None:
        """Queue ``a`` again after ROLE_RETRY_MS unless the role changed meanwhile."""
        async def retry() -> None:
            await asyncio.sleep(ROLE_RETRY_MS / 1000)
            core = self.core
            if (core is not None and not core.is_master and core.master_epoch == a.master_epoch
                    and core.master_broker_id == a.master_broker_id):
                self._actions.put_nowait(a)
        task = asyncio.create_task(retry())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _act(self, a: Action) -> None:
        t = self.target
        if isinstance(a, BecomeMaster):
            log.info("becoming master, epoch %d", a.master_epoch)
            await t.become_master(a.master_epoch, a.sync_state_set, a.sync_state_set_epoch)
        elif isinstance(a, BecomeSlave):
            log.info("becoming slave of %d (%s), epoch %d", a.master_broker_id, a.master_addr,
                     a.master_epoch)
            await t.become_slave(a.master_epoch, a.master_broker_id, a.master_addr)
        elif isinstance(a, SetSyncStateSet):
            t.set_sync_state_set(a.sync_state_set, a.sync_state_set_epoch)
        elif isinstance(a, SetLease):
            t.set_lease(a.expires_mono_ms)
        elif isinstance(a, Fence):
            log.warning("fenced: the controller names no master in this broker's epoch")
            t.fence()
        elif isinstance(a, SaveMeta):
            write_durably(self.store_dir / BROKER_META_FILE, a.data)
