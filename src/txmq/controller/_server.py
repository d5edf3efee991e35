"""The controller's asyncio shell: the remoting server, the Raft replica, the leader's scan and the
role-change pushes around :class:`~txmq.controller.ControllerService`.

- Each connection feeds a :class:`~txmq.protocol.FrameDecoder`; its requests are answered
  concurrently (matched by opaque), so a heartbeat never waits behind a change being committed.
  A frame that cannot be trusted closes the connection; nothing a peer sends stops the controller.
  A connection closing makes the brokers that heartbeat on it inactive at once (RocketMQ
  ``DefaultBrokerHeartbeatManager.onBrokerChannelClose``); if one was a master, its group is
  checked as soon as its lease has run out.
- Every ``SCAN_INTERVAL_MS`` the leader expires silent brokers and checks every group
  (RocketMQ ``ControllerManager.scanInactiveMasterAndTriggerReelect``).
- After an election it pushes NOTIFY_BROKER_ROLE_CHANGED (1008, one-way) to the group's live
  brokers' remoting addresses (RocketMQ ``ControllerManager.notifyBrokerRoleChanged``), signed
  with ``access_key`` / ``secret_key`` when given, as RocketMQ's ``AclClientRPCHook`` signs a
  request: a broker with ACL on admits it only from an account allowed All on its cluster
  (docs/security.md). RocketMQ's controller sends it unsigned.
- pysyncobj's thread reaches the loop only through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from itertools import count
from pathlib import Path
from typing import Any

from txmq import limits
from txmq.controller._heartbeats import HeartbeatTable
from txmq.controller._raft import LEADER_FALLBACK_MS, ControllerRaft
from txmq.controller._service import ControllerService, monotonic_ms
from txmq.controller._state import GroupView
from txmq.errors import ProtocolError
from txmq.protocol import (
    FLAG_ONEWAY,
    Command,
    FrameDecoder,
    NotifyBrokerRoleChangedRequestHeader,
    RequestCode,
    SyncStateSet,
    encode_command,
    encode_controller_body,
    parse_address,
    sign_remoting,
    to_ext,
)
from txmq.serving import serve_until_signal, write_port_file

__all__ = ["CONTROLLER_HEARTBEAT_TIMEOUT_MS", "CONTROLLER_LEASE_MS", "CONTROLLER_PORT",
           "SCAN_INTERVAL_MS", "ControllerServer", "run_controller"]

log = logging.getLogger("txmq.controller")
_READ_BYTES = 64 * 1024

CONTROLLER_PORT = 9878
"""Default remoting port (RocketMQ's controller examples listen on 9878)."""
SCAN_INTERVAL_MS = 1_000
"""The leader's inactive-broker scan (RocketMQ ``ControllerConfig.scanNotActiveBrokerInterval``
5 s; 1 s here because failover must finish within 5 s, and a scan is a walk over a small dict)."""
CONTROLLER_HEARTBEAT_TIMEOUT_MS = 3_000
"""A broker silent this long is inactive, unless its heartbeat names another timeout (txmq
``controller_heartbeat_timeout_ms``; RocketMQ ``controllerHeartBeatTimeoutMills`` 10 s)."""
CONTROLLER_LEASE_MS = 3_000
"""A master's write lease, counted from each answered heartbeat (txmq ``controller_lease_ms``)."""
NOTIFY_TIMEOUT_MS = 1_000
"""How long a role-change push may take to connect and write (brokers also poll)."""
REQUESTS_IN_FLIGHT_MAX = 64
"""Requests of one connection answered at once; beyond it the connection is not read (a broker has
a handful in flight)."""
PUBLISH_INTERVAL_MS = 1_000
"""How often a controller checks that its remoting address is published in the Raft state."""


class ControllerServer:
    """A controller listening on ``host:port`` (port 0 picks a free one; see :attr:`port`), one
    replica of the Raft group ``raft_address`` + ``raft_peers``.

    Args:
        store_dir: Raft journal and snapshot (None: in memory only).
        heartbeat_timeout_ms, lease_ms: see :data:`CONTROLLER_HEARTBEAT_TIMEOUT_MS`,
            :data:`CONTROLLER_LEASE_MS`.
        access_key, secret_key: the ACL account the role-change pushes are signed with (brokers
            with ACL on need it allowed All on ``Cluster:<their cluster>``); "": unsigned.
    """

    def __init__(self, host: str, port: int, raft_address: str, raft_peers: list[str],
                 store_dir: Path | None, *,
                 heartbeat_timeout_ms: int = CONTROLLER_HEARTBEAT_TIMEOUT_MS,
                 lease_ms: int = CONTROLLER_LEASE_MS, scan_interval_ms: int = SCAN_INTERVAL_MS,
                 idle_max_ms: int = limits.CHANNEL_IDLE_MAX_MS, access_key: str = "",
                 secret_key: str = "") -> None:
        if bool(access_key) != bool(secret_key):
            raise ValueError("access_key and secret_key go together")
        self.host, self.port = host, port
        self._access_key, self._secret_key = access_key, secret_key
        self.raft_address, self.raft_peers, self.store_dir = raft_address, raft_peers, store_dir
        self._timeout_ms, self._lease_ms = heartbeat_timeout_ms, lease_ms
        self._scan_s, self._idle_s = scan_interval_ms / 1000, idle_max_ms / 1000
        self._ids = count(1)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.service: ControllerService | None = None
        self.raft: ControllerRaft | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> int:
        """Bind, start the Raft replica and the timers; returns the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.store_dir is not None:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        self.raft = ControllerRaft(
            self.raft_address, self.raft_peers, self.store_dir,
            lambda leader: loop.call_soon_threadsafe(self._on_role, leader))
        self.service = ControllerService(self.raft, HeartbeatTable(self._timeout_ms,
                                                                   self._lease_ms), self._notify)
        for coro in (self._scan_loop(), self._publish_loop()):
            self._spawn(coro)
        log.info("controller listening on %s, raft %s, peers %s; role-change pushes %s",
                 self.addr, self.raft_address, ",".join(self.raft_peers),
                 f"signed by {self._access_key}" if self._access_key else "unsigned")
        return self.port

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop accepting, end the timers and connections, stop the Raft replica."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self.raft is not None:
            self.raft.close()

    def _on_role(self, leader: bool) -> None:
        assert self.service is not None
        log.info("raft role: %s", "leader" if leader else "not leader")
        table = HeartbeatTable(self._timeout_ms, self._lease_ms)
        self.service.ready = False
        if leader:  # wait out the grants of any predecessor (docs/controller.md, Leases)
            table.became_leader(monotonic_ms(), extra_ms=LEADER_FALLBACK_MS)
            self._spawn(self._barrier())
        self.service.table = table

    async def _barrier(self) -> None:
        """Commit one entry of this leader's term (its address), so that every entry committed
        before it is applied here; only then does this leader answer requests (a state that
        lags could name an old master and renew its lease)."""
        assert self.service is not None and self.raft is not None
        loop = asyncio.get_running_loop()
        while self.raft.is_leader() and not self.service.ready:
            done: asyncio.Future[int] = loop.create_future()

            def settle(err: int, fut: asyncio.Future[int] = done) -> None:
                if not fut.done():
                    fut.set_result(err)

            self.raft.publish(self.addr, lambda _r, err: loop.call_soon_threadsafe(settle, err))
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(done, PUBLISH_INTERVAL_MS / 1000) == 0:
                    self.service.ready = self.raft.is_leader()
                    return

    async def _scan_loop(self) -> None:
        assert self.service is not None and self.raft is not None
        while True:
            await asyncio.sleep(self._scan_s)
            if not self.raft.is_leader():
                continue
            try:
                for b in self.service.table.scan(monotonic_ms()):
                    log.info("broker %s/%d inactive (silent)", b.broker_name, b.broker_id)
                for g in self.raft.groups():
                    await self.service.check_group(g)
            except Exception:  # a bug in the scan must not end the timer
                log.exception("inactive broker scan failed")

    async def _publish_loop(self) -> None:
        assert self.raft is not None
        raft = self.raft
        while True:
            if raft.published_address() != self.addr and raft.leader_raft_address() is not None:
                raft.publish(self.addr, lambda _r, _e: None)
            await asyncio.sleep(PUBLISH_INTERVAL_MS / 1000)

    async def _check_after_lease(self, broker_name: str) -> None:
        assert self.service is not None and self.raft is not None
        delay_ms = self.service.table.lease_end_ms(broker_name) - monotonic_ms()
        await asyncio.sleep(max(0, delay_ms) / 1000)
        g = self.raft.group(broker_name)
        if g is not None and self.raft.is_leader():
            await self.service.check_group(g)

    def _notify(self, g: GroupView) -> None:
        assert self.service is not None
        now = monotonic_ms()
        for bid, addr in g.brokers.items():
            if addr and self.service.table.is_alive(g.broker_name, bid, now):
                self._spawn(self._push(addr, g))

    async def _push(self, addr: str, g: GroupView) -> None:
        header = NotifyBrokerRoleChangedRequestHeader(
            master_address=g.master_address, master_epoch=g.master_epoch,
            sync_state_set_epoch=g.sync_state_set_epoch, master_broker_id=g.master_broker_id)
        body = encode_controller_body(SyncStateSet(sync_state_set=sorted(g.sync_state_set),
                                                   sync_state_set_epoch=g.sync_state_set_epoch))
        ext = to_ext(header)
        if self._access_key:
            ext = sign_remoting(ext, body, self._access_key, self._secret_key)
        cmd = Command(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, 0, FLAG_ONEWAY, ext=ext, body=body)
        try:
            host, port = parse_address(addr)
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                               NOTIFY_TIMEOUT_MS / 1000)
            writer.write(encode_command(cmd))
            await asyncio.wait_for(writer.drain(), NOTIFY_TIMEOUT_MS / 1000)
            writer.close()
        except (OSError, TimeoutError, ProtocolError) as exc:
            log.info("role change push to %s failed: %s (it will poll)", addr, exc)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        try:
            await self._read_loop(conn, reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connection_closed(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _connection_closed(self, conn: int) -> None:
        if self.service is None or self.raft is None or not self.raft.is_leader():
            return
        for b in self.service.table.channel_closed(conn):
            log.info("broker %s/%d inactive (channel closed)", b.broker_name, b.broker_id)
            g = self.raft.group(b.broker_name)
            if g is not None and g.master_broker_id == b.broker_id:
                self._spawn(self._check_after_lease(b.broker_name))

    async def _read_loop(self, conn: int, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        assert self.service is not None
        decoder = FrameDecoder()
        pending: set[asyncio.Task[None]] = set()
        while True:
            await writer.drain()
            while len(pending) >= REQUESTS_IN_FLIGHT_MAX:  # stop reading until some finish
                await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            try:
                data = await asyncio.wait_for(reader.read(_READ_BYTES), self._idle_s)
            except TimeoutError:
                return
            if not data:
                return
            try:
                commands = decoder.feed(data)
            except ProtocolError as exc:
                log.warning("closing connection %d: %s", conn, exc)
                return
            for cmd in commands:
                if not cmd.is_response:  # concurrently: a heartbeat never waits for a commit
                    task = asyncio.create_task(self._answer(cmd, conn, writer))
                    pending.add(task)
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    task.add_done_callback(pending.discard)

    async def _answer(self, cmd: Command, conn: int, writer: asyncio.StreamWriter) -> None:
        assert self.service is not None
        try:
            reply = await self.service.handle(cmd, conn)
        except Exception as exc:  # a bug must cost one request, not the controller
            log.exception("request %d failed", cmd.code)
            reply = None if cmd.is_oneway else cmd.response(1, repr(exc))
        if reply is not None and not writer.is_closing():
            writer.write(encode_command(reply))


async def run_controller(host: str, port: int, raft_address: str, raft_peers: list[str],
                         store_dir: Path, port_file: str | None = None, *, access_key: str = "",
                         secret_key: str = "") -> None:
    """Serve until SIGINT or SIGTERM; write the bound port to ``port_file`` (default
    ``<store_dir>/controller.port``). ``access_key`` / ``secret_key`` sign the role-change
    pushes (:class:`ControllerServer`)."""
    server = ControllerServer(host, port, raft_address, raft_peers, store_dir,
                              access_key=access_key, secret_key=secret_key)
    bound = await server.start()
    write_port_file(port_file or str(store_dir / "controller.port"), bound)
    await serve_until_signal(server.close)
