"""The broker's asyncio shell: sockets, timers, group-commit fsync, store upkeep, long-polling.

Everything stateful and testable lives in :class:`~txmq.broker.Broker` and the store; this module
moves bytes, keeps time and runs blocking disk work in one thread:

- **Group commit** (``SYNC_FLUSH``, the default): a reply that needs durability waits until the
  store's ``flushed_offset`` passes its record. One flusher thread (:mod:`txmq.broker._committer`)
  fsyncs while the loop keeps appending, so every send that arrived during one fsync shares the
  next one, which starts at once; each group's replies go out from one loop callback.
  ``ASYNC_FLUSH`` answers at once and fsyncs every ``flush_interval_ms`` (RocketMQ
  ``flushIntervalCommitLog``): a machine crash can lose the last interval's acknowledged sends.
- **Store upkeep**: a checkpoint (consume queues and index to disk) every
  ``FLUSH_INTERVAL_CONSUME_QUEUE_MS``, disk usage every ``DISK_CHECK_INTERVAL_MS``, retention every
  ``CLEAN_RESOURCE_INTERVAL_MS`` with retention hooks saying what consumer groups, pending
  transactions and delay queues still need (and afterwards the transaction outcomes and discarded
  transactions retention made moot are forgotten: ``Broker.after_retention``).
- **State files off the loop**: every ``CONSUMER_OFFSET_FLUSH_INTERVAL_MS`` the consumer offsets,
  delay progress and transaction index snapshot are copied on the loop and encoded, written and
  fsynced by a writer thread of their own (:meth:`BrokerServer.save_state`), one save at a time.
- **Back-pressure**: a connection with ``REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX`` replies waiting for
  fsync, or with ``WRITE_BUFFER_HIGH_BYTES`` of unsent replies, is not read from until they go.
- **Timers never die**: each part of the ticker, upkeep and flusher runs guarded (a failure is
  logged, rate-limited, and counted in ``broker.health``); a task that ends anyway is restarted by
  a supervisor. Each part's last successful tick is the health check (``txmq broker status``).
- **The gRPC door** (``grpc_port``; :mod:`txmq.broker.grpc`): a grpc.aio server on this loop over the
  same broker. Its clients have connection ids the door owns: replies and check-backs for them go
  to the door, and a long-polling receive is woken with the held pulls.
- **TLS** (the ``[tls]`` table; :mod:`txmq.broker._tls`): with ``server_mode`` permissive or
  enforcing, a :class:`TlsListener` accepts instead of ``asyncio.start_server`` and hands each
  connection, TLS or plaintext by its first byte, to the same :meth:`BrokerServer._serve`.
- **Resources** (``limits.CONNECTIONS_MAX`` and the following): at most ``max_connections``
  connections (one more is answered SYSTEM_BUSY and closed), so the store keeps descriptors for its
  files. Should accept still fail at the descriptor limit, asyncio's loop retries it every second
  (logged once per ``ACCEPT_ERROR_LOG_INTERVAL_MS``) and uvloop's (libuv) accepts and closes the
  waiting connections; either way the broker serves again once descriptors are free. Partial
  frames and unsent replies share one
  ``buffer_budget_bytes`` (:class:`~txmq.broker._budget.BufferBudget`), and a connection silent for
  ``channel_idle_max_ms`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import msgspec

from txmq import limits
from txmq.broker._actions import Action, Close, Hold, Reply, SendTo
from txmq.broker._broker import Broker
from txmq.broker._budget import BufferBudget
from txmq.broker._committer import GroupCommitter
from txmq.broker._config import BrokerConfig
from txmq.broker._registrar import Registrar
from txmq.broker._replicas import ReplicasConfig
from txmq.broker._replicas_shell import ReplicasManager
from txmq.broker._server_setup import END, ip_of, max_connections, now_ms, request_runs, store_config
from txmq.broker._tls import TlsListener
from txmq.broker.acl import AccountsWatcher, AclGuard, source_ip
from txmq.broker.ha import Replication, RoleSwitch
from txmq.errors import ConfigError, ProtocolError, ResponseCode, StoreError
from txmq.namesrv import BrokerRegistration
from txmq.protocol import (
    FLAG_RESPONSE,
    Command,
    FrameDecoder,
    RegisterBrokerResponseHeader,
    encode_command,
)
from txmq.serving import serve_until_signal, write_port_file
from txmq.store import FileStore, Store, is_delete_hour

__all__ = ["BrokerServer", "run_server", "store_config"]

log = logging.getLogger("txmq.broker.server")
_READ_BYTES = 256 * 1024


def _yield_gil() -> None:
    """Let other threads (the event loop) take the GIL now (the writer thread calls it between
    chunks of an encode)."""
    time.sleep(0)


def _held_since(h: Hold, now_ms: int) -> tuple[int, float, bool]:
    """``_apply``'s timing arguments for a held (long-polling) pull answered at ``now_ms``."""
    return h.request.code, time.perf_counter() - max(0, now_ms - h.held_at_ms) / 1000, True


class _Conn:
    """Per-connection state the resource checks use."""

    __slots__ = ("seen", "waiting", "writer")

    def __init__(self, writer: asyncio.StreamWriter, now: float) -> None:
        self.writer = writer
        self.seen = now
        """Coarse monotonic time (s) of the last bytes received or replies sent."""
        self.waiting = False
        """Not read from by the broker's choice (budget), so not idle."""


class BrokerServer:
    """Serve one :class:`Broker` over TCP.

    Args:
        config: broker configuration (listen address, data dir, flush mode, timings).
        store: the store to use; a :class:`FileStore` in ``config.data_dir`` when omitted.
    """

    def __init__(self, config: BrokerConfig, store: Store | None = None) -> None:
        self.config = config
        t0 = time.monotonic()
        self.store = store if store is not None else FileStore(config.data_dir, store_config(config))
        self.broker = Broker(config, self.store, now_ms())
        log.info("store and broker state recovered in %.0f ms", (time.monotonic() - t0) * 1000)
        self._sync = (config.flush_disk_type == "SYNC_FLUSH" or config.broker_role == "SYNC_MASTER"
                      or config.enable_controller_mode)
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._ids = count(1)
        self._waiting: deque[tuple[int, Reply, int, float]] = deque()
        """Replies waiting for fsync: (durable offset, reply, request code, arrival time)."""
        self._answered = self.broker.traffic.answered
        self._waiting_per_conn: dict[int, int] = {}
        self._resume: dict[int, asyncio.Event] = {}
        self._out: dict[int, list[bytes]] = {}
        self._out_bytes: dict[int, int] = {}
        self._out_scheduled = False
        self._holds: dict[tuple[str, int], list[Hold]] = {}
        self._committer: GroupCommitter | None = None  # group commit's thread (``_flusher``)
        self._touched: deque[tuple[int, set[tuple[str, int]]]] = deque()
        """Queues touched past a flush: (write offset, keys), woken again once it is durable."""
        self._checkpoint_pool = ThreadPoolExecutor(1, thread_name_prefix="txmq-checkpoint")
        self._meta_pool = ThreadPoolExecutor(1, thread_name_prefix="txmq-meta")
        """The writer of offsets, delay progress and the transaction snapshot (:meth:`save_state`):
        not the flusher's thread, so a large snapshot never holds back a group commit."""
        self._saving: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._registrar: Registrar | None = None
        self._server: asyncio.base_events.Server | TlsListener | None = None
        self.port = 0
        self._conns: dict[int, _Conn] = {}
        self._clock_s = 0.0  # coarse monotonic clock, set by _reaper
        self._budget = BufferBudget(config.buffer_budget_bytes, self._unsent_bytes)
        self._refused = 0
        self._refusing = 0
        self._grpc: Any = None  # txmq.broker.grpc.GrpcDoor when grpc_port is set
        self._accept_errors = 0
        self._accept_logged_s = float("-inf")
        self._acl_watch = AccountsWatcher(Path(config.acl_file)) if config.acl_enable else None
        self.acl = (AclGuard(self._acl_watch.accounts, config.broker_cluster_name,
                             half_topic=self.broker.tx.half_topic)
                    if self._acl_watch is not None else None)
        """The ACL check of both doors (docs/security.md); None when ``acl_enable`` is off."""
        self._acl_refused = 0
        self._register_retention_hooks()
        self._repl = Replication(config, self.broker, self._deliver,
                                 lambda: asyncio.to_thread(self.store.flush), self._kick, self.acl)
        """Master-slave replication for the broker's role (txmq.broker.ha, docs/replication.md)."""
        self._repl.on_confirm = self._advance_visible
        self.store.set_read_limit(self._repl.read_limit())
        self._registering = False
        self.roles: RoleSwitch | None = None
        """Controller mode: what the controller client drives (a RoleTarget), once started."""
        self.replicas: ReplicasManager | None = None
        """Controller mode: the controller client driving :attr:`roles` (started by start())."""
        self._otlp: Any = None
        """The OTLP export of transactions' lives (``txmq.broker._otlp``) when configured."""
        if config.otlp_endpoint or config.otlp_file:  # (raises MissingExtra without ``otlp``)
            from txmq.broker._otlp import OtlpExport

            self._otlp = self.broker.tx_traces.listener = OtlpExport(config)
        if config.enable_controller_mode:
            if not isinstance(self.store, FileStore):
                raise ConfigError("controller mode needs the file store (epoch file, truncation)")
            self.roles = RoleSwitch(self.broker, self.store, self._repl,
                                    lambda: asyncio.to_thread(self.store.flush), self._reregister)

    async def start(self) -> None:
        """Listen and start the flusher, the ticker and store upkeep."""
        loop = asyncio.get_running_loop()
        self._clock_s = loop.time()
        self._chain_exception_handler(loop)
        # reads take at most _READ_BYTES, so the StreamReader needs no larger buffer: it stops
        # reading the socket past twice its limit (the default, the frame size, let every
        # connection buffer 32 MiB)
        if self.config.tls.enabled:  # the first byte says TLS or plaintext (broker._tls)
            tls = TlsListener(self.config.tls, self._serve, _READ_BYTES)
            self._server = await tls.start(self.config.host, self.config.port)
        else:
            self._server = await asyncio.start_server(self._serve, self.config.host,
                                                      self.config.port, limit=_READ_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        if not self.config.store.store_host:
            self.broker.set_store_host(f"{ip_of(self.config.host)}:{self.port}")  # port 0: known
        timers: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("flusher", self._flusher), ("ticker", self._ticker), ("upkeep", self._upkeep),
            ("reaper", self._reaper)]
        timers += await self._repl.start(self.port)
        if self.config.namesrv_addr:
            c = self.config
            reg = BrokerRegistration(c.broker_name, self.broker.store_host,
                                     cluster=c.broker_cluster_name, broker_id=c.broker_id,
                                     ha_server_addr=self._repl.ha_addr,
                                     auto_create_topic_enable=c.auto_create_topic_enable)
            self._registrar = Registrar(c.namesrv_addr, reg, self.broker.topics.snapshot,
                                        now_ms, self._registered)
            if not c.enable_controller_mode:  # (else it registers once it has a role)
                timers.append(("registrar", self._registrar.run))
        self._tasks = [asyncio.create_task(self._supervised(name, body)) for name, body in timers]
        await self._start_replicas()
        if self.config.grpc_port:  # the gRPC door (issue 13): same broker, its own port
            from txmq.broker.grpc import GrpcDoor

            self._grpc = GrpcDoor(self.broker, self.config.host, self.config.grpc_port,
                                  ip_of(self.config.host), self._apply, now_ms, acl=self.acl,
                                  tls=self.config.tls)
            await self._grpc.start()
        if self.config.metrics_port:
            from txmq.broker._metrics import start_metrics

            start_metrics(self.broker, self.config.metrics_port, self.config.tls)
        log.info("txmq broker listening on %s:%d (data %s, %s, TLS %s)", self.config.host,
                 self.port, self.config.data_dir, self.config.flush_disk_type,
                 self.config.tls.server_mode)
        self._warn_open_without_acl()
        fd_cap = max_connections(msgspec.structs.replace(self.config, max_connections=0))
        if self.config.max_connections > fd_cap:
            log.warning("max_connections %d is above %d, the file-descriptor limit less the "
                        "store's reserve: at the limit new connections are reset and writes that "
                        "need a new file are refused", self.config.max_connections, fd_cap)

    def _warn_open_without_acl(self) -> None:
        """Bound beyond loopback with ACL off: anyone who reaches the port may do everything."""
        host = self.config.host
        if self.acl is None and host not in ("127.0.0.1", "localhost", "::1"):
            msg = (f"WARNING: the broker listens on {host} with ACL off: anyone who can reach the "
                   f"port may send, consume, reset offsets and settle transactions. Set acl_enable "
                   f"and acl_file (docs/security.md), or bind 127.0.0.1.")
            log.warning("%s", msg)
            print(msg, file=sys.stderr, flush=True)

    def _admit(self, conn: int, cmds: list[Command]) -> list[Command]:
        """The requests of ``cmds`` the ACL admits; the others are answered NO_PERMISSION (a
        one-way request is dropped) and never reach the broker. Refusals are logged (the first,
        then every 1000th, with the count)."""
        assert self.acl is not None
        ip = source_ip(self.broker.peer(conn))
        admitted = []
        for cmd in cmds:
            refusal = None if cmd.is_response else self.acl.check_remoting(cmd, ip)
            if refusal is None:
                admitted.append(cmd)
                continue
            self._acl_refused += 1
            if self._acl_refused == 1 or self._acl_refused % 1000 == 0:  # not a log flood
                log.warning("ACL refused request code %d from %s: %s (%d refused so far)",
                            cmd.code, ip, refusal.reason, self._acl_refused)
            if not cmd.is_oneway:
                self._write(conn, self.acl.refuse_remoting(cmd, refusal))
        return admitted

    def _reload_acl(self) -> None:
        """Swap in the accounts file's users and policies if it changed (a bad file is logged
        and the old ones stay)."""
        if self._acl_watch is not None and self.acl is not None:
            accounts = self._acl_watch.poll()
            if accounts is not None:
                self.acl.accounts = accounts

    async def close(self) -> None:
        """Stop listening, unregister from name servers, flush, persist offsets and close the
        store."""
        if self._server is not None:
            self._server.close()
        if self.replicas is not None:
            await self.replicas.close()
        await self._repl.close()
        if self._grpc is not None:
            await self._grpc.stop()
        if self._registrar is not None:
            await self._registrar.unregister()
        for t in self._tasks:
            t.cancel()
        if self._saving is not None:  # (the writer thread finishes it: shutdown waits below)
            self._saving.cancel()
        for w in list(self._writers.values()):
            w.close()
        if self._committer is not None:
            self._committer.stop()  # (a flush under way completes first)
        self._checkpoint_pool.shutdown(wait=True)
        self._meta_pool.shutdown(wait=True)  # a save under way completes first
        self.broker.persist_offsets()
        self.store.close()
        if self._otlp is not None:  # export what is queued (off the loop: it may wait on HTTP)
            await asyncio.to_thread(self._otlp.shutdown)

    # -- connections ------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= (cap := max_connections(self.config)):
            await self._refuse(reader, writer, cap)
            return
        conn = next(self._ids)
        self._writers[conn] = writer
        self._conns[conn] = state = _Conn(writer, self._clock_s)
        held = 0  # bytes of the budget this connection holds for its partial frame
        peer = writer.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.broker.connection_opened(conn, f"{peer[0]}:{peer[1]}")
        writer.transport.set_write_buffer_limits(high=limits.WRITE_BUFFER_HIGH_BYTES)
        decoder = FrameDecoder()
        try:
            while data := await reader.read(_READ_BYTES):
                t0 = time.perf_counter()  # the requests' arrival (rocketmq_rpc_latency)
                try:
                    cmds = decoder.feed(data)
                except ProtocolError as exc:
                    log.warning("connection %d: %s; closing", conn, exc)
                    bad = Command(code=ResponseCode.SYSTEM_ERROR, flag=FLAG_RESPONSE,
                                  remark=str(exc))
                    writer.write(encode_command(bad))
                    break
                for run in request_runs(cmds):
                    # checked just before it is handled (an end of a transaction is authorized
                    # against its half message, which an earlier request may have stored)
                    if self.acl is not None and not (run := self._admit(conn, run)):
                        continue
                    if run[0].code == END and not run[0].is_response:  # ends that came together
                        self._apply(self.broker.handle_ends(conn, run, now_ms()), END, t0)
                    elif len(run) > 1:  # SEND_MESSAGE requests that came together: one append
                        self._apply(self.broker.handle_sends(conn, run, now_ms()), run[0].code, t0)
                    elif not run[0].is_response:
                        self._apply(self.broker.handle(conn, run[0], now_ms()), run[0].code, t0)
                        if self._out_bytes.get(conn, 0) > limits.WRITE_BUFFER_HIGH_BYTES:
                            self._send_out()  # a chunk of requests with big replies (pulls)
                            await writer.drain()
                state.seen = self._clock_s
                if held or decoder.buffered > limits.FRAME_UNRESERVED_BYTES_MAX:
                    held = await self._reserve(state, decoder, held)
                await self._backpressure(conn, writer)
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # no traceback per connection (a log flood): one line, then close
            log.error("connection %d: unexpected %s: %s; closing", conn, type(exc).__name__, exc)
        finally:
            self._writers.pop(conn, None)
            self._conns.pop(conn, None)
            if held:
                self._budget.release(held)
            self._resume.pop(conn, None)
            self._apply(self.broker.connection_closed(conn))
            with contextlib.suppress(Exception):
                writer.close()

    async def _reserve(self, state: _Conn, decoder: FrameDecoder, held: int) -> int:
        """Hold as much of the buffer budget as the partial frame declares (nothing for a small
        one), waiting while the budget is spent; return the bytes held."""
        want = decoder.frame_bytes if decoder.buffered > limits.FRAME_UNRESERVED_BYTES_MAX else 0
        if want == held:
            return held
        if held:
            self._budget.release(held)
        if want:
            state.waiting = True
            try:
                await self._budget.acquire(want)
            finally:
                state.waiting = False
                state.seen = self._clock_s
        return want

    def _unsent_bytes(self) -> int:
        """Replies queued or in transport buffers, over all connections (the budget's slow path)."""
        n = sum(self._out_bytes.values())
        for w in self._writers.values():
            n += w.transport.get_write_buffer_size()
        return n

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      cap: int) -> None:
        """Answer a connection over the cap with SYSTEM_BUSY and close it: the reply to its first
        request if one comes within ``CONNECTION_REFUSE_WAIT_MS`` (so the client sees the error;
        at most ``CONNECTIONS_REFUSING_MAX`` wait at once), else an unsolicited response
        (opaque 0)."""
        self._refused += 1
        if self._refused == 1 or self._refused % 1000 == 0:
            log.warning("refusing connection: too many connections (%d); %d refused so far",
                        cap, self._refused)
        opaque = 0
        if self._refusing < limits.CONNECTIONS_REFUSING_MAX:
            self._refusing += 1
            try:
                with contextlib.suppress(Exception):
                    data = await asyncio.wait_for(reader.read(_READ_BYTES),
                                                  limits.CONNECTION_REFUSE_WAIT_MS / 1000)
                    cmds = FrameDecoder().feed(data)
                    opaque = cmds[0].opaque if cmds else 0
            finally:
                self._refusing -= 1
        busy = Command(code=ResponseCode.SYSTEM_BUSY, flag=FLAG_RESPONSE, opaque=opaque,
                       remark=f"too many connections ({cap})")
        with contextlib.suppress(Exception):
            writer.write(encode_command(busy))
            writer.close()
            await writer.wait_closed()

    def _chain_exception_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        """Log asyncio's accept failures at the fd limit once per ``ACCEPT_ERROR_LOG_INTERVAL_MS``
        instead of once a second with a traceback; pass every other error on."""
        previous = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("message") != "socket.accept() out of system resource":
                if previous is not None:
                    previous(loop, context)
                else:
                    loop.default_exception_handler(context)
                return
            self._accept_errors += 1
            now = loop.time()
            if (now - self._accept_logged_s) * 1000 >= limits.ACCEPT_ERROR_LOG_INTERVAL_MS:
                self._accept_logged_s = now
                log.error("cannot accept connections: %s (%d failures); retrying every second. "
                          "Raise the file-descriptor limit or lower max_connections",
                          context.get("exception"), self._accept_errors)

        loop.set_exception_handler(handler)

    async def _reaper(self) -> None:
        """Keep the coarse clock, re-check budget waiters (replies drain without a release) and
        close connections idle for ``channel_idle_max_ms``."""
        loop = asyncio.get_running_loop()
        idle_s = self.config.channel_idle_max_ms / 1000
        step_s = min(limits.SCHEDULE_TICK_MS / 1000, idle_s / 4) if idle_s else 0.1
        while True:
            await asyncio.sleep(step_s)
            self._clock_s = now = loop.time()
            self._budget.grant()
            if idle_s:
                self._close_idle(now - idle_s)
            self.broker.health.ok("reaper", now_ms())

    def _close_idle(self, before_s: float) -> None:
        stale = [c for c, st in self._conns.items() if st.seen < before_s and not st.waiting
                 and c not in self._resume and c not in self._out]
        if not stale:
            return
        holding = {h.conn for hs in self._holds.values() for h in hs}
        for conn in stale:
            if conn in holding:
                continue
            log.info("closing connection %d: no traffic for %d ms (channel_idle_max_ms)", conn,
                     self.config.channel_idle_max_ms)
            self._conns[conn].writer.transport.abort()
            self._conns[conn].seen = float("inf")  # closing: not again

    async def _backpressure(self, conn: int, writer: asyncio.StreamWriter) -> None:
        """Stop reading a connection while too many of its replies wait for fsync or the peer."""
        if self._waiting_per_conn.get(conn, 0) >= limits.REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX:
            ev = self._resume[conn] = asyncio.Event()
            await ev.wait()
        await writer.drain()

    def _write(self, conn: int, cmd: Command) -> None:
        """Queue a frame; everything queued in one turn of the loop goes out in one write per
        connection (one syscall instead of one per reply)."""
        if self._grpc is not None and self._grpc.owns(conn):  # a gRPC client: the door writes it
            self._grpc.deliver(conn, cmd)
            return
        if conn not in self._writers:
            return
        try:
            frame = encode_command(cmd)
        except ProtocolError as exc:  # e.g. a response too large for a frame
            log.error("cannot encode reply on connection %d: %s", conn, exc)
            frame = encode_command(cmd.response(ResponseCode.SYSTEM_ERROR, str(exc)))
        queued = self._out.get(conn)
        if queued is None:
            self._out[conn] = [frame]
            self._out_bytes[conn] = len(frame)
        else:
            queued.append(frame)
            self._out_bytes[conn] += len(frame)
        if not self._out_scheduled:
            self._out_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_out)

    def _send_out(self) -> None:
        self._out_scheduled = False
        out, self._out, self._out_bytes = self._out, {}, {}
        for conn, frames in out.items():
            w = self._writers.get(conn)
            if w is not None and not w.is_closing():
                w.write(b"".join(frames))
                self._conns[conn].seen = self._clock_s  # a reply is traffic too (Netty's all-idle)

    def _apply(self, actions: list[Action], code: int = 0, t0: float = 0.0,
               long_polling: bool = False) -> None:
        """Carry out the broker's actions. ``code``: the request they answer (0: none, or not
        timed), which arrived at ``t0`` (``time.perf_counter``): each reply's latency is counted
        when it is written (``broker.traffic.answered``)."""
        for a in actions:
            if isinstance(a, Reply):
                if self._sync and a.durable_offset > self.store.flushed_offset:
                    self._waiting.append((a.durable_offset, a, code, t0))
                    self._waiting_per_conn[a.conn] = self._waiting_per_conn.get(a.conn, 0) + 1
                elif self._repl.park(a, code, t0):  # durable already: a SYNC_MASTER still waits
                    self._waiting_per_conn[a.conn] = self._waiting_per_conn.get(a.conn, 0) + 1
                else:
                    self._write(a.conn, a.command)
                    if code:
                        self._answered(code, a.command.code, (time.perf_counter() - t0) * 1000,
                                       long_polling)
            elif isinstance(a, SendTo):
                self._write(a.conn, a.command)
            elif isinstance(a, Hold):
                self._holds.setdefault((a.topic, a.queue_id), []).append(a)
            elif isinstance(a, Close):
                w = self._writers.get(a.conn)
                if w is not None:
                    w.close()
        if self._committer is not None and self.store.write_offset > self.store.flushed_offset:
            self._committer.kick()

    # -- supervision ------------------------------------------------------------------------------
    async def _supervised(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run timer task ``body`` for ever: if it ends or raises anyway (its parts are guarded
        one by one), log at error, count it (``health.restarts``) and start it again after
        ``TIMER_TASK_RESTART_DELAY_MS``. Only cancellation (shutdown) stops it."""
        while True:
            try:
                await body()
                log.error("timer task %s ended; restarting it", name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer task %s died; restarting it", name)
            self.broker.health.restarted(name)
            await asyncio.sleep(limits.TIMER_TASK_RESTART_DELAY_MS / 1000)

    # -- group commit -----------------------------------------------------------------------------
    async def _flusher(self) -> None:
        """Keep group commit's thread (:class:`GroupCommitter`, which calls :meth:`_flushed` and
        :meth:`_flush_failed` on the loop) running: start it again should it die."""
        committer = self._committer
        if committer is None:
            committer = self._committer = GroupCommitter(
                asyncio.get_running_loop(), self.store.flush, self._flushed, self._flush_failed,
                0.0 if self._sync else self.config.flush_interval_ms / 1000)
        while not committer.stopped:
            if not committer.alive:
                if committer.started:
                    self.broker.health.restarted("flusher")
                committer.start()
                committer.kick()  # (after a restart, whatever was left waiting is flushed)
            await asyncio.sleep(limits.FLUSHER_IDLE_TICK_MS / 1000)

    def _flushed(self, flushed: int) -> None:
        """On the loop, once per flush: send the replies now durable; wake the held pulls of the
        queues appended to since the last flush now (a pull finding nothing durable is held
        again) and again once a flush passes the write offset seen here."""
        if self._committer is None or self._committer.stopped:
            return
        self._release(flushed)
        self._repl.notify()
        keys = self.broker.take_touched()
        visible = self._raise_read_limit()
        if keys and self.store.write_offset > visible:
            self._touched.append((self.store.write_offset, keys))
        self._wake(self._visible_keys(visible, keys))
        self.broker.health.ok("flusher", now_ms())

    def _raise_read_limit(self) -> int:
        """Controller mode: raise the store's read limit to the confirm offset; the offset
        below which readers see records now."""
        if (limit := self._repl.read_limit()) is not None:
            self.store.set_read_limit(limit)
        return self.store.visible_offset

    def _visible_keys(self, visible: int, keys: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """``keys`` and the queues appended to below ``visible`` since they were recorded."""
        wake = set(keys)
        touched = self._touched
        while touched and touched[0][0] <= visible:
            wake |= touched.popleft()[1]
        return wake

    def _advance_visible(self) -> None:
        """The confirm offset may have moved (:attr:`Replication.on_confirm`): wake the pulls
        held on queues whose appends became visible."""
        if self._touched:
            self._wake(self._visible_keys(self._raise_read_limit(), set()))
        else:
            self._raise_read_limit()

    def _flush_failed(self, exc: Exception) -> None:
        """On the loop: the flush raised; after a failed fsync (StoreError) nothing waiting is
        durable, so every waiting request gets an error."""
        if self._committer is None or self._committer.stopped:
            return
        self.broker.health.failed("flusher", now_ms(), exc)
        if isinstance(exc, StoreError):
            self._fail_waiting(str(exc))
            self._touched.clear()
            self._wake(self.broker.take_touched())

    def _release(self, flushed: int) -> None:
        """Send the replies whose records are now durable; resume paused connections. Their
        latencies are counted once per run of replies to requests that arrived together."""
        now = time.perf_counter()
        code = resp = n = 0
        since = 0.0
        while self._waiting and self._waiting[0][0] <= flushed:
            _, reply, c, t0 = self._waiting.popleft()
            if self._repl.park(reply, c, t0):  # a SYNC_MASTER's: sent once slaves have it
                continue
            self._write(reply.conn, reply.command)
            self._one_less(reply.conn)
            r = reply.command.code
            if c == code and t0 == since and r == resp:
                n += 1
                continue
            if n and code:
                self._answered(code, resp, (now - since) * 1000, False, n)
            code, since, resp, n = c, t0, r, 1
        if n and code:
            self._answered(code, resp, (now - since) * 1000, False, n)

    def _kick(self, touched: set[tuple[str, int]]) -> None:
        self.broker.touch(touched)  # a slave appended: its held pulls wake once it is flushed
        if self._committer is not None:  # (a slave appended: checkpoints follow the flushes)
            self._committer.kick()

    async def _start_replicas(self) -> None:
        """Controller mode: start the replicas manager (the controller client) on :attr:`roles`;
        it tells the broker its controller id and hands it the controllers' role pushes."""
        if self.roles is None or not self.config.controller_addr:
            return
        c = self.config
        rc = ReplicasConfig(cluster_name=c.broker_cluster_name, broker_name=c.broker_name,
                            broker_addr=self.broker.store_host,
                            controller_addrs=tuple(c.controller_addresses()),
                            heartbeat_interval_ms=c.broker_heartbeat_interval_ms,
                            lease_ms=c.controller_lease_ms,
                            heartbeat_timeout_ms=c.controller_heartbeat_timeout_ms,
                            election_priority=c.broker_election_priority)
        manager = self.replicas = ReplicasManager(rc, self.roles, Path(c.data_dir))
        self.roles.controller_id = lambda: (manager.core.broker_id if manager.core is not None
                                            and manager.core.broker_id is not None else -1)
        self.broker.role_notified = manager.on_notify
        await manager.start()

    async def _reregister(self, broker_id: int, master_epoch: int | None) -> None:
        """Controller mode: a role change registers with the name servers at once, as
        ``broker_id`` with ``masterEpoch``; the first one starts the periodic registration."""
        if self._registrar is None:
            return
        self._registrar.reg.ha_server_addr = self._repl.ha_addr
        await self._registrar.reregister(broker_id, master_epoch)
        if not self._registering:
            self._registering = True
            self._tasks.append(asyncio.create_task(
                self._supervised("registrar", self._registrar.run), name="registrar"))

    def _registered(self, answer: RegisterBrokerResponseHeader) -> None:
        self._repl.registered(answer)  # a slave learns its master from the name server
        self.broker.master_addr = self._repl.master_addr

    def _deliver(self, reply: Reply, code: int, t0: float) -> None:
        """Write a reply the SYNC_MASTER wait held, and account for it."""
        self._write(reply.conn, reply.command)
        self._one_less(reply.conn)
        if code:
            self._answered(code, reply.command.code, (time.perf_counter() - t0) * 1000, False)

    def _one_less(self, conn: int) -> None:
        n = self._waiting_per_conn.get(conn, 1) - 1
        if n:
            self._waiting_per_conn[conn] = n
        else:
            self._waiting_per_conn.pop(conn, None)
        ev = self._resume.get(conn)
        if ev is not None and n < limits.REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX // 2:
            ev.set()
            del self._resume[conn]

    def _fail_waiting(self, remark: str) -> None:
        """fsync failed: nothing waiting is durable, so every waiting request gets an error."""
        log.critical("fsync failed: %s; %d waiting requests answered SYSTEM_ERROR", remark,
                     len(self._waiting))
        now = time.perf_counter()
        while self._waiting:
            _, reply, code, t0 = self._waiting.popleft()
            self._write(reply.conn, Command(code=ResponseCode.SYSTEM_ERROR, remark=remark,
                                            opaque=reply.command.opaque, flag=FLAG_RESPONSE,
                                            serialize_type=reply.command.serialize_type))
            if code:
                self._answered(code, ResponseCode.SYSTEM_ERROR, (now - t0) * 1000)
            self._one_less(reply.conn)

    def _wake(self, keys: set[tuple[str, int]]) -> None:
        if self._grpc is not None:
            self._grpc.wake(keys)
        now = now_ms()
        for key in keys:
            for h in self._holds.pop(key, []):
                if h.conn in self._writers:
                    self._apply(self.broker.handle(h.conn, h.request, now), *_held_since(h, now))

    # -- timers -----------------------------------------------------------------------------------
    async def _ticker(self) -> None:
        """Every ``SCHEDULE_TICK_MS``: the broker's tick (delay queues, client expiry, check-back;
        each part guarded in :meth:`Broker.tick`), held pulls past their deadline, and every
        ``CONSUMER_OFFSET_FLUSH_INTERVAL_MS`` the consumer offsets, each guarded on its own."""
        health = self.broker.health
        last_persist = last_acl = now_ms()
        while True:
            await asyncio.sleep(limits.SCHEDULE_TICK_MS / 1000)
            now = now_ms()
            if self._acl_watch is not None and now - last_acl >= limits.ACL_RELOAD_POLL_MS:
                last_acl = now
                try:
                    self._reload_acl()
                except Exception:  # never stops the ticker; the old policies stay
                    log.exception("ACL file reload failed")
            self._apply(self.broker.tick(now))
            health.run("holds", now, partial(self._expire_holds, now))
            if now - last_persist >= limits.CONSUMER_OFFSET_FLUSH_INTERVAL_MS and (
                    self._saving is None or self._saving.done()):  # one save at a time
                last_persist = now
                self._saving = asyncio.create_task(self.save_state())

    async def save_state(self) -> None:
        """Save consumer offsets, delay progress and the transaction index snapshot without
        blocking the event loop: they are copied here (:meth:`Broker.prepare_persist`: dict
        copies, no encoding) and encoded, written and fsynced on the writer thread, which yields
        the GIL between chunks of a large encode. The ``offsets`` timer's health records it."""
        loop = asyncio.get_running_loop()
        try:
            step = self.broker.prepare_persist(pause=_yield_gil)
            await loop.run_in_executor(self._meta_pool, step)
        except Exception as exc:  # (the step logs its own failures and never raises)
            self.broker.health.failed("offsets", now_ms(), exc)
        else:
            self.broker.health.ok("offsets", now_ms())

    async def _upkeep(self) -> None:
        """Checkpoints, disk checks and retention, each on its own period, each guarded."""
        loop = asyncio.get_running_loop()
        health = self.broker.health
        step_ms = min(limits.FLUSH_INTERVAL_CONSUME_QUEUE_MS, limits.DISK_CHECK_INTERVAL_MS)
        last_clean = now_ms()
        while True:
            await asyncio.sleep(step_ms / 1000)
            now = now_ms()
            health.run("disk", now, self.store.check_disk)
            try:
                await loop.run_in_executor(self._checkpoint_pool, self.store.checkpoint())
            except Exception as exc:  # retried next step
                health.failed("checkpoint", now_ms(), exc)
            else:
                health.ok("checkpoint", now_ms())
            now = now_ms()
            if now - last_clean >= limits.CLEAN_RESOURCE_INTERVAL_MS:
                last_clean = now
                hour = time.localtime(now / 1000).tm_hour
                delete_hour = is_delete_hour(self.store.config.delete_when, hour)
                health.run("retention", now, partial(self._clean, now, delete_hour))

    def _clean(self, now: int, delete_hour: bool) -> None:
        """One retention round, then what it made moot in the broker's state goes too."""
        report = self.store.clean(now, delete_hour=delete_hour)
        self.broker.after_retention(report.min_offset)

    def _expire_holds(self, now: int) -> None:
        for key in list(self._holds):
            keep = []
            for h in self._holds[key]:
                if h.conn not in self._writers:
                    continue
                if h.deadline_ms <= now:
                    self._apply(self.broker.expire_hold(h.conn, h.request), *_held_since(h, now))
                else:
                    keep.append(h)
            if keep:
                self._holds[key] = keep
            else:
                del self._holds[key]

    # -- retention hooks --------------------------------------------------------------------------
    def _register_retention_hooks(self) -> None:
        """Tell the store what must outlive retention: records a consumer group has not consumed,
        pending half messages, and messages waiting in delay queues (``Broker.retention_floor_*``)."""
        broker, store = self.broker, self.store
        store.set_retention_hook("consumer groups", broker.retention_floor_consumers)
        store.set_retention_hook("pending transactions", broker.retention_floor_transactions)
        store.set_retention_hook("delay queues", broker.retention_floor_delays)


async def run_server(config: BrokerConfig, ready: asyncio.Event | None = None,
                     port_file: str | None = None, store: Store | None = None) -> None:
    """Run a broker until cancelled or sent SIGINT/SIGTERM (``store`` as for BrokerServer)."""
    server = BrokerServer(config, store)
    await server.start()
    if port_file:
        write_port_file(port_file, server.port)
    print(f"txmq broker listening on {config.host}:{server.port}", flush=True)
    await serve_until_signal(server.close, ready)
