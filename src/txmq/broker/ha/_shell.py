"""The asyncio shell of replication (issue #25): a master's HA listener, a slave's HA client, and
the SYNC_MASTER wait. The protocol is :mod:`txmq.protocol._ha`; the decisions are
:mod:`txmq.broker.ha._core`'s.

- :class:`HaMaster` serves each connected slave from the offset it reports, with flushed bytes of
  the commit log (``Store.read_log``) in frames of at most ``HA_TRANSFER_BATCH_BYTES``, and a
  heartbeat after ``HA_SEND_HEARTBEAT_INTERVAL_MS`` idle (RocketMQ ``HAConnection``).
- :class:`HaSlave` connects to its master, appends what it receives with
  ``Store.append_replica`` (each record's CRC checked first), fsyncs, and reports its durable end;
  it reconnects with a doubling back-off up to ``HA_RECONNECT_INTERVAL_MS`` (RocketMQ
  ``DefaultHAClient``).
- :class:`SyncWait` holds a SYNC_MASTER's durable replies until ``need`` slaves acknowledged them,
  answers FLUSH_SLAVE_TIMEOUT after ``sync_flush_timeout_ms``, or SLAVE_NOT_AVAILABLE at once when
  no slave is within ``ha_max_gap_not_in_sync`` (RocketMQ 4.9.7 ``CommitLog.submitReplicaRequest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from itertools import count
from typing import NamedTuple

import msgspec

from txmq import limits
from txmq.broker._actions import Reply
from txmq.broker._broker import Broker
from txmq.broker._config import BrokerConfig
from txmq.broker.acl import AclGuard, Action, Need, Resource, ResourceType
from txmq.broker.ha._core import AckTable, ReplicaWait, SlaveCore
from txmq.errors import HaProtocolError, ProtocolError, ResponseCode, StoreError
from txmq.protocol import (
    HA_AUTO_MASTER_HANDSHAKE,
    HA_AUTO_SLAVE_HANDSHAKE,
    HA_CHALLENGE,
    HA_NONCE_BYTES,
    AutoHandshake,
    HaClientRuntimeInfo,
    HaConnectionRuntimeInfo,
    HaHello,
    HaRuntimeInfo,
    HelloDecoder,
    RegisterBrokerResponseHeader,
    ReportDecoder,
    decode_challenge,
    decode_master_handshake_body,
    decode_master_handshake_head,
    decode_slave_handshake,
    encode_auto_transfer,
    encode_challenge,
    encode_heartbeat,
    encode_hello,
    encode_master_handshake,
    encode_slave_handshake,
    encode_transfer,
    ha_hello_fields,
    parse_address,
)
from txmq.store import Store

__all__ = ["Authenticate", "AutoSwitchMaster", "AutoSwitchSlave", "HaCredentials", "HaMaster",
           "HaSlave", "Replication", "SyncWait"]

log = logging.getLogger("txmq.broker.ha")

_READ_BYTES = 1024 * 1024
"""Bytes one socket read of the HA stream takes (RocketMQ's master reads reports into 1 MiB)."""


HA_HANDSHAKE_TIMEOUT_MS = 3_000
"""Longest either side waits for the other's handshake frame (txmq's: RocketMQ has no handshake;
the connect timeout's order of magnitude, ``limits.CONNECT_TIMEOUT_MS``)."""

Authenticate = Callable[[HaHello, bytes, str], "str | None"]
"""A master's check of a slave's hello: (hello, the connection's nonce, the peer's IP) → None to
admit it, or why it is refused."""


def _log_end(task: asyncio.Task[None]) -> None:
    """A controller-mode HA client that ended other than by cancellation: say why."""
    if not task.cancelled() and task.exception() is not None:
        log.error("HA client stopped: %r", task.exception(), exc_info=task.exception())


class AutoSwitchMaster(NamedTuple):
    """A controller-mode master's side of the AutoSwitch protocol."""

    handshake: Callable[[], AutoHandshake]
    """The handshake reply: log end, master epoch, epoch entries."""
    frame: Callable[[int], tuple[int, int, int, int]]
    """For a commit log offset: (epoch, epoch start, epoch end, confirm offset)."""


class AutoSwitchSlave(NamedTuple):
    """A controller-mode slave's side of the AutoSwitch protocol."""

    broker_id: int
    on_handshake: Callable[[AutoHandshake], Awaitable[None]]
    """Truncates to the consistent point with the master's epochs."""
    last_epoch: Callable[[], int]
    on_epochs: Callable[[list[tuple[int, int]]], None]
    """Appends ``(epoch, start)`` entries met in transfer frames to the epoch file."""


class HaCredentials(msgspec.Struct, frozen=True):
    """What a slave signs its HA hello with: its group and id, an ACL account of the master."""

    broker_name: str
    broker_id: int
    access_key: str
    secret_key: str


def _mono_ms() -> int:
    return int(time.monotonic() * 1000)


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _addr(peer: object) -> str:
    """``host:port`` of a socket's peername (a tuple), or its text."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class HaMaster:
    """A master's HA listener on ``host:port`` (0: a free port; :attr:`port` once started).

    Args:
        store: the commit log to ship (its flushed part).
        on_ack: called after a slave's acknowledged offset moved or a slave left.
        authenticate: with ACL on, the check of each slave's hello (the connection opens with the
            handshake of :mod:`txmq.protocol._ha`); None: RocketMQ's plain protocol.
    """

    def __init__(self, store: Store, host: str, port: int, on_ack: Callable[[], None],
                 authenticate: Authenticate | None = None, *, acks: AckTable | None = None,
                 auto_switch: AutoSwitchMaster | None = None) -> None:
        self.store, self.host, self.port = store, host, port
        self.acks = acks if acks is not None else AckTable()
        self._auto = auto_switch
        """Controller mode: the handshake reply (end, epoch, epoch entries) of the AutoSwitch
        protocol (:mod:`txmq.protocol._ha_auto`); None: the plain protocol."""
        self.links: dict[int, HaConnectionRuntimeInfo] = {}
        """Connected slaves that passed the handshake: address, hello, where shipping began."""
        self._on_ack, self._authenticate = on_ack, authenticate
        self._ids = count(1)
        self._wake: dict[int, asyncio.Event] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[object]] = set()

    async def start(self) -> None:
        """Listen. Raises OSError when the port cannot be bound."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("HA listener on %s:%d", self.host, self.port)

    def notify(self) -> None:
        """More of the commit log is flushed: wake every slave's transfer loop."""
        for ev in self._wake.values():
            ev.set()

    async def close(self) -> None:
        """Stop listening and end every slave's connection (its handler and tasks finish here,
        not after the event loop is gone)."""
        if self._server is not None:
            self._server.close()
            for w in list(self._writers.values()):
                w.close()
            if self._handlers:  # (closed sockets end them; a cancelled handler would be
                # reported by asyncio's own client_connected_cb callback on Python 3.11)
                await asyncio.wait(list(self._handlers), timeout=limits.HA_IDLE_WAIT_MS / 1000)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), limits.HA_IDLE_WAIT_MS / 1000)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = next(self._ids)
        peer = writer.get_extra_info("peername")
        if len(self._wake) >= limits.HA_SLAVES_MAX:
            log.warning("HA: refusing slave %s: HA_SLAVES_MAX (%d) connected", peer,
                        limits.HA_SLAVES_MAX)
            writer.close()
            return
        self._wake[link] = asyncio.Event()
        self._writers[link] = writer
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
            me.add_done_callback(self._handlers.discard)
        decoder = ReportDecoder(auto=self._auto is not None)
        tasks: set[asyncio.Task[None]] = set()
        try:
            hello, rest = await self._handshake(reader, writer, peer)
            slave_id = hello.broker_id if hello else -1
            if self._auto is not None:
                slave_id, rest = await self._auto_handshake(reader, writer, rest)
            decoder.feed(rest)
            start = await self._first_report(reader, decoder)
            log.info("HA: slave %s connected, reports offset %d", peer, start)
            self.links[link] = HaConnectionRuntimeInfo(
                addr=_addr(peer), slave_ack_offset=start, diff=0, in_sync=False,
                transfer_from_where=start, broker_name=hello.broker_name if hello else "",
                broker_id=slave_id)
            self._ack(link, start)
            tasks = {asyncio.create_task(self._read_reports(link, reader, decoder)),
                     asyncio.create_task(self._transfer(link, writer, start))}
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # raises why the slave left (a stalled drain is cancelled below)
        except (OSError, ProtocolError, StoreError, TimeoutError, ConnectionError) as exc:
            log.warning("HA: slave %s dropped: %s", peer, exc)
        finally:
            for t in tasks:
                t.cancel()
            # (retrieves every task's end: no "exception was never retrieved" / "destroyed but
            # pending" when both ended, or when close() cancelled this handler)
            await asyncio.gather(*tasks, return_exceptions=True)
            self._wake.pop(link, None)
            self._writers.pop(link, None)
            self.links.pop(link, None)
            self.acks.gone(link)
            self._on_ack()
            writer.close()

    async def _auto_handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              pre: bytes) -> tuple[int, bytes]:
        """Controller mode: read the slave's AutoSwitch handshake (after ``pre``, bytes already
        read), answer with this master's end, epoch and epoch entries. Returns the slave's broker
        id and the bytes read past its handshake. Raises HaProtocolError, ConnectionError,
        TimeoutError."""
        buf, n = bytearray(pre), HA_AUTO_SLAVE_HANDSHAKE.size
        async with asyncio.timeout(HA_HANDSHAKE_TIMEOUT_MS / 1000):
            while len(buf) < n:
                data = await reader.read(_READ_BYTES)
                if not data:
                    raise ConnectionError("closed during the AutoSwitch HA handshake")
                buf += data
            slave_id = decode_slave_handshake(bytes(buf[:n]))
            assert self._auto is not None
            writer.write(encode_master_handshake(self._auto.handshake()))
            await writer.drain()
        return slave_id, bytes(buf[n:])

    def acked_by_brokers(self, broker_ids: frozenset[int]) -> int:
        """The highest offset every slave of ``broker_ids`` acknowledged: -1 when one is not
        connected (RocketMQ ``AutoSwitchHAService.computeConfirmOffset`` waits for it too)."""
        by_id = {info.broker_id: self.acks.acks.get(link, -1) for link, info in self.links.items()}
        return min((by_id.get(i, -1) for i in broker_ids), default=2**63 - 1)

    def caught_up_brokers(self, now_ms: int, max_lag_ms: int) -> frozenset[int]:
        """Broker ids of the connected slaves that caught up with this master within
        ``max_lag_ms`` of ``now_ms`` (monotonic ms; :meth:`AckTable.caught_up`; RocketMQ
        ``maybeShrinkSyncStateSet``, ``haMaxTimeSlaveNotCatchup``): a slave that connected behind
        joins only once it has caught up."""
        end = self.store.write_offset
        return frozenset(info.broker_id for link, info in self.links.items()
                         if info.broker_id > 0 and self.acks.caught_up(link, end, now_ms, max_lag_ms))

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         peer: object) -> tuple[HaHello | None, bytes]:
        """With ACL on: challenge the peer, read and check its hello; returns it and the bytes
        read after it. Raises ProtocolError when it is missing, malformed or refused, so no report
        of that peer ever counts (RocketMQ issue #3015). Without ACL: None, nothing on the wire."""
        if self._authenticate is None:
            return None, b""
        nonce = secrets.token_bytes(HA_NONCE_BYTES)
        writer.write(encode_challenge(nonce))
        hello_dec, hello = HelloDecoder(), None
        async with asyncio.timeout(HA_HANDSHAKE_TIMEOUT_MS / 1000):
            await writer.drain()
            while hello is None:
                data = await reader.read(_READ_BYTES)
                if not data:
                    raise ConnectionError("closed during the HA handshake")
                hello = hello_dec.feed(data)
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        why = self._authenticate(hello, nonce, ip)
        if why is not None:
            raise HaProtocolError(f"HA handshake refused ({hello.broker_name}/{hello.broker_id}, "
                                  f"access key {hello.access_key!r}): {why}")
        return hello, bytes(hello_dec.rest)

    async def _first_report(self, reader: asyncio.StreamReader, decoder: ReportDecoder) -> int:
        """The slave's first report: where to ship from. Raises StoreError when this log cannot
        serve it (the slave is ahead of the master, or needs bytes retention deleted)."""
        while decoder.last < 0:
            data = await asyncio.wait_for(reader.read(_READ_BYTES),
                                          limits.HA_HOUSEKEEPING_INTERVAL_MS / 1000)
            if not data:
                raise ConnectionError("closed before its first report")
            decoder.feed(data)
        start = decoder.last
        if start > self.store.write_offset:
            raise StoreError(f"slave is at {start}, past this master's end "
                             f"{self.store.write_offset}: its log is not this master's")
        if start < self.store.min_offset:
            raise StoreError(f"slave is at {start}, below this master's first offset "
                             f"{self.store.min_offset} (retention deleted what it lacks)")
        return start

    def _ack(self, link: int, offset: int) -> None:
        self.acks.report(link, offset, self.store.write_offset, _mono_ms())
        self._on_ack()

    def connections(self, max_gap: int) -> list[HaConnectionRuntimeInfo]:
        """Each connected slave now: its ack, the bytes and time it lags (``max_gap``:
        ``ha_max_gap_not_in_sync``, the in-sync bound)."""
        end, now, out = self.store.write_offset, _mono_ms(), []
        for link, info in self.links.items():
            ack = self.acks.acks.get(link, info.transfer_from_where)
            out.append(msgspec.structs.replace(
                info, slave_ack_offset=ack, diff=end - ack, in_sync=end - ack < max_gap,
                lag_ms=self.acks.lag_ms(link, end, now)))
        return out

    def _send_frame(self, writer: asyncio.StreamWriter, at: int, stop: int) -> int:
        """Write one transfer frame of the log from ``at`` (below ``stop``); returns its size.
        Controller mode: the frame carries its epoch and ends at the epoch's end."""
        if self._auto is None:
            data = self.store.read_log(at, min(limits.HA_TRANSFER_BATCH_BYTES, stop - at))
            writer.write(encode_transfer(at, data))
            return len(data)
        epoch, start, epoch_end, confirm = self._auto.frame(at)
        data = self.store.read_log(at, min(limits.HA_TRANSFER_BATCH_BYTES, stop - at,
                                           epoch_end - at))
        writer.write(encode_auto_transfer(at, data, epoch, start, confirm))
        return len(data)

    async def _read_reports(self, link: int, reader: asyncio.StreamReader,
                            decoder: ReportDecoder) -> None:
        while True:
            data = await asyncio.wait_for(reader.read(_READ_BYTES),
                                          limits.HA_HOUSEKEEPING_INTERVAL_MS / 1000)
            if not data:
                raise ConnectionError("slave closed the HA connection")
            if decoder.feed(data):
                self._ack(link, decoder.last)

    async def _transfer(self, link: int, writer: asyncio.StreamWriter, at: int) -> None:
        """Ship from ``at`` for ever (cancelled when the slave goes)."""
        wake, last_write = self._wake[link], _mono_ms()
        sent_confirm = -1
        while True:
            end = self.store.flushed_offset
            if at < end:  # frames of up to 32 KiB, up to _READ_BYTES of them before a drain
                stop = min(end, at + _READ_BYTES)
                while at < stop:
                    at += self._send_frame(writer, at, stop)
            elif self._auto is not None and (
                    (frame := self._auto.frame(at))[3] > sent_confirm
                    or _mono_ms() - last_write >= limits.HA_SEND_HEARTBEAT_INTERVAL_MS):
                # (controller mode: a risen confirm offset goes out at once, so that the slave's
                # readers see what the SyncStateSet now holds)
                epoch, start, _, sent_confirm = frame
                writer.write(encode_auto_transfer(at, b"", epoch, start, sent_confirm))
            elif _mono_ms() - last_write >= limits.HA_SEND_HEARTBEAT_INTERVAL_MS:
                writer.write(encode_heartbeat(at))
            else:
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), limits.HA_IDLE_WAIT_MS / 1000)
                continue
            last_write = _mono_ms()
            self.acks.transferred(link, end, last_write)
            await writer.drain()


class HaSlave:
    """A slave's HA client.

    Args:
        store: the slave's store (appended only through ``append_replica``).
        master: the master's HA address ``host:port`` ("" until the name server names it)
        flush: fsyncs the store (the server's flusher thread); returns the flushed offset.
        on_append: called after each append with the ``(topic, queue id)`` s it appended to (the
            server wakes the pulls held on them once the bytes are flushed).
        credentials: what it answers a master's challenge with (ACL on at the master); None:
            RocketMQ's plain protocol.
    """

    def __init__(self, store: Store, master: str, flush: Callable[[], Awaitable[int]],
                 on_append: Callable[[set[tuple[str, int]]], None],
                 credentials: HaCredentials | None = None,
                 auto_switch: AutoSwitchSlave | None = None,
                 ) -> None:
        self.store, self.master = store, master
        self.auto_switch = auto_switch
        """Controller mode: this slave's broker id, and what to do with the master's handshake
        reply before the first report (truncate to the consistent point)."""
        self._flush, self._on_append = flush, on_append
        self.credentials = credentials
        self.confirm = -1
        """Controller mode: the highest confirm offset the master sent (-1: none yet)."""
        self.on_confirm: Callable[[], None] = lambda: None
        """Called when :attr:`confirm` rose."""
        self.connected = False
        self._last_report = 0
        self.last_read_ms = 0
        """Wall clock (ms since the epoch) of the last bytes from the master; 0: never."""
        self.last_write_ms = 0
        """Wall clock of the last report sent; 0: never."""

    def runtime_info(self) -> HaClientRuntimeInfo:
        """The link now (RocketMQ ``HAClientRuntimeInfo``)."""
        return HaClientRuntimeInfo(master_addr=self.master, max_offset=self.store.write_offset,
                                   last_read_timestamp=self.last_read_ms,
                                   last_write_timestamp=self.last_write_ms,
                                   activated=self.connected)

    async def run(self) -> None:
        """Replicate for ever: connect, follow, reconnect after a failure with back-off."""
        delay = limits.HA_RECONNECT_MIN_MS
        while True:
            if not self.master:  # not known yet (the name server tells it at registration)
                await asyncio.sleep(limits.HA_RECONNECT_INTERVAL_MS / 1000)
                continue
            got = await self._session_guarded()
            delay = limits.HA_RECONNECT_MIN_MS if got else min(2 * delay,
                                                                limits.HA_RECONNECT_INTERVAL_MS)
            await asyncio.sleep(delay / 1000)

    async def _session_guarded(self) -> bool:
        """One connection; True when it received anything (the back-off starts again)."""
        host, port = parse_address(self.master)
        got = [False]
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                host, port, limit=_READ_BYTES), limits.CONNECT_TIMEOUT_MS / 1000)
        except (OSError, TimeoutError) as exc:
            log.info("HA: cannot reach master %s: %s", self.master, exc)
            return False
        try:
            await self._session(reader, writer, got)
        except (OSError, ProtocolError, StoreError, TimeoutError, ConnectionError) as exc:
            log.warning("HA: connection to master %s lost: %s", self.master, exc)
        finally:
            self.connected = False
            writer.close()
        return got[0]

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       got: list[bool]) -> None:
        """Follow the master on one connection. Appends go on while an fsync runs (group commit:
        one fsync covers whatever arrived during the previous one); a report names only durable
        bytes, sent as each fsync ends (:meth:`_flush_and_report`)."""
        if self.credentials is not None:
            await self._answer_challenge(reader, writer, self.credentials)
        auto = self.auto_switch
        if auto is not None:
            await self._auto_handshake(reader, writer, auto.broker_id, auto.on_handshake)
        core = SlaveCore(self.store.write_offset, auto.last_epoch() if auto is not None else None)
        writer.write(core.hello())
        self.connected, self._last_report, self.last_write_ms = True, _mono_ms(), _wall_ms()
        log.info("HA: following master %s from offset %d", self.master, self.store.write_offset)
        flushing: asyncio.Task[None] | None = None
        try:
            while True:
                data = await asyncio.wait_for(reader.read(_READ_BYTES),
                                              limits.HA_HOUSEKEEPING_INTERVAL_MS / 1000)
                if not data:
                    raise ConnectionError("master closed the HA connection")
                got[0], self.last_read_ms = True, _wall_ms()
                pieces = core.feed(data)
                if core.new_epochs and auto is not None:
                    auto.on_epochs(core.new_epochs)
                if core.confirm > self.confirm:
                    self.confirm = core.confirm
                    self.on_confirm()
                touched: set[tuple[str, int]] = set()
                for offset, chunk in pieces:
                    self.store.append_replica(offset, chunk, touched)
                if pieces:
                    self._on_append(touched)
                    if flushing is not None and flushing.done():
                        flushing.result()  # raises why the last flush failed
                        flushing = None
                    if flushing is None:
                        flushing = asyncio.create_task(self._flush_and_report(writer, core))
                elif _mono_ms() - self._last_report >= limits.HA_REPORT_INTERVAL_MS:
                    writer.write(core.report(self.store.flushed_offset))
                    self._last_report, self.last_write_ms = _mono_ms(), _wall_ms()
                    await writer.drain()
        finally:
            if flushing is not None:
                flushing.cancel()
                await asyncio.gather(flushing, return_exceptions=True)

    async def _flush_and_report(self, writer: asyncio.StreamWriter, core: SlaveCore) -> None:
        """fsync and report the durable end, again while more was appended meanwhile. (An 8-byte
        report needs no drain: the read loop drains with its heartbeat reports.)"""
        while True:
            end = await self._flush()
            writer.write(core.report(end))
            self._last_report, self.last_write_ms = _mono_ms(), _wall_ms()
            if self.store.write_offset <= end:
                return

    @staticmethod
    async def _auto_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              broker_id: int, on_reply: Callable[[AutoHandshake], Awaitable[None]],
                              ) -> None:
        """Send the AutoSwitch handshake, read the master's reply, hand it to ``on_reply``.
        Raises HaProtocolError, ConnectionError, TimeoutError."""
        writer.write(encode_slave_handshake(broker_id))
        try:
            async with asyncio.timeout(HA_HANDSHAKE_TIMEOUT_MS / 1000):
                size, max_offset, epoch = decode_master_handshake_head(
                    await reader.readexactly(HA_AUTO_MASTER_HANDSHAKE.size))
                body = await reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("master closed the HA connection during the handshake") from exc
        await on_reply(AutoHandshake(max_offset, epoch, decode_master_handshake_body(body)))

    @staticmethod
    async def _answer_challenge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                cred: HaCredentials) -> None:
        """Read the master's challenge and send the signed hello. Raises HaProtocolError /
        TimeoutError when no challenge comes (the master has ACL off: drop the credentials)."""
        try:
            async with asyncio.timeout(HA_HANDSHAKE_TIMEOUT_MS / 1000):
                nonce = decode_challenge(await reader.readexactly(HA_CHALLENGE.size))
        except TimeoutError as exc:
            raise HaProtocolError("the master sent no HA challenge: is ACL off there? (this "
                                  "slave has ha_access_key set)") from exc
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("master closed the HA connection before its challenge") from exc
        writer.write(encode_hello(cred.broker_name, cred.broker_id, cred.access_key,
                                  cred.secret_key, nonce))


class SyncWait:
    """A SYNC_MASTER's replies that wait for ``need`` slave acknowledgements.

    Args:
        acks: the HA listener's acknowledgement table.
        need: slave acknowledgements a reply waits for (``in_sync_replicas - 1``).
        timeout_ms: ``sync_flush_timeout_ms``; max_gap: ``ha_max_gap_not_in_sync`` (bytes).
        deliver: writes a reply and accounts for it (the server's).
    """

    def __init__(self, acks: AckTable, need: int, timeout_ms: int, max_gap: int,
                 deliver: Callable[[Reply, int, float], None],
                 target: Callable[[], int] | None = None) -> None:
        self.acks, self.need, self.max_gap = acks, need, max_gap
        self._deliver = deliver
        self._target = target
        """Controller mode: the offset every SyncStateSet member acknowledged (replaces ``need``
        and the ``max_gap`` check; RocketMQ ``allAckInSyncStateSet``)."""
        self.waiting: ReplicaWait[tuple[Reply, int, float]] = ReplicaWait(timeout_ms)

    def park(self, reply: Reply, code: int, t0: float) -> bool:
        """Keep a durable reply until it is replicated (True); False: write it now, as it is
        or turned into SLAVE_NOT_AVAILABLE when no slave is in sync."""
        if reply.durable_offset <= 0 or reply.command.code != ResponseCode.SUCCESS or (
                self.need <= 0 and self._target is None):
            return False
        end = reply.durable_offset
        if end <= self._acked():
            return False
        if self._target is None and not self.acks.in_sync(end, self.max_gap):
            reply.command = msgspec.structs.replace(reply.command,
                                                    code=ResponseCode.SLAVE_NOT_AVAILABLE)
            return False
        self.waiting.park(end, (reply, code, t0), _mono_ms())
        return True

    def acked(self) -> None:
        """Slaves acknowledged more: write what is now replicated."""
        for reply, code, t0 in self.waiting.release(self._acked()):
            self._deliver(reply, code, t0)

    def _acked(self) -> int:
        return self._target() if self._target is not None else self.acks.acked_by(self.need)

    async def run(self) -> None:
        """Answer FLUSH_SLAVE_TIMEOUT to replies that waited ``timeout_ms`` (checked every
        ``HA_IDLE_WAIT_MS``)."""
        while True:
            await asyncio.sleep(limits.HA_IDLE_WAIT_MS / 1000)
            for reply, code, t0 in self.waiting.expired(_mono_ms()):
                reply.command = msgspec.structs.replace(reply.command,
                                                        code=ResponseCode.FLUSH_SLAVE_TIMEOUT)
                self._deliver(reply, code, t0)


class Replication:
    """What the broker server runs for its role: the HA listener and the SYNC_MASTER wait on a
    master, the HA client on a slave (docs/replication.md).

    Args:
        config: the broker's (role, ports, replicas, timeouts, ``ha_access_key``).
        broker: the broker core; its ``ha_status`` is set to :meth:`runtime_info`.
        deliver: writes a held reply and accounts for it (the server's).
        flush: fsyncs the store on the flusher's thread; returns the flushed offset.
        on_append: called after a slave appended replicated bytes, with the queues appended to.
        acl: the broker's ACL check (None: ACL off). With it, a master's HA listener admits only
            slaves whose hello is signed by a user allowed All on ``Cluster:<cluster name>``
            (a Super user, or a policy entry, which may name the slaves' source IPs).
    """

    def __init__(self, config: BrokerConfig, broker: Broker,
                 deliver: Callable[[Reply, int, float], None],
                 flush: Callable[[], Awaitable[int]],
                 on_append: Callable[[set[tuple[str, int]]], None],
                 acl: AclGuard | None = None) -> None:
        self.config, self.store, self.acl = config, broker.store, acl
        self.role = broker.role
        broker.ha_status = self.runtime_info
        broker.ha_addr = lambda: self.ha_addr
        broker.ha_told = self.told
        self.master: HaMaster | None = None
        self.slave: HaSlave | None = None
        self.sync: SyncWait | None = None
        self.master_addr = ""
        """A slave's master's remoting address, from the name server."""
        self._deliver, self._flush, self._on_append = deliver, flush, on_append
        self.acks = AckTable()
        """Controller mode: the acknowledgements of whichever HA listener runs (master)."""
        self._ha_port = 0
        self._slave_task: asyncio.Task[None] | None = None
        self.on_confirm: Callable[[], None] = lambda: None
        """Called when the confirm offset may have moved (an ack on a master, a frame on a
        slave, a role or SyncStateSet change): the server raises the store's read limit
        (:meth:`read_limit`) and wakes the pulls held on what became visible."""

    @property
    def ha_addr(self) -> str:
        """``host:port`` of the HA listener ("" when there is none)."""
        return f"{self.config.host}:{self.master.port}" if self.master is not None else ""

    async def start(self, broker_port: int) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """Start listening (a master) and return the timer tasks to run (name, body)."""
        c = self.config
        if c.enable_controller_mode:  # no role yet: the controller names it (RoleSwitch)
            self._ha_port = c.ha_listen_port or (broker_port + 1 if c.port else 0)
            self.sync = SyncWait(self.acks, 0, c.sync_flush_timeout_ms, c.ha_max_gap_not_in_sync,
                                 self._deliver, target=self.sss_acked)
            return [("ha-sync", self.sync.run)]
        if c.broker_role == "SLAVE":
            if not c.ha_master_address and not c.namesrv_addr:
                log.warning("SLAVE %s/%d has neither ha_master_address nor namesrv_addr: it does "
                            "not replicate", c.broker_name, c.broker_id)
                return []
            cred = (HaCredentials(c.broker_name, c.broker_id, c.ha_access_key, c.ha_secret_key)
                    if c.ha_access_key else None)
            self.slave = HaSlave(self.store, c.ha_master_address, self._flush, self._on_append,
                                 cred)
            return [("ha-slave", self.slave.run)]
        if c.ha_listen_port < 0:
            return []
        port = c.ha_listen_port or (broker_port + 1 if c.port else 0)
        master = HaMaster(self.store, c.host, port, self._acked,
                          None if self.acl is None else self.authenticate)
        try:
            await master.start()
        except OSError as exc:  # the broker still serves; a SYNC_MASTER answers SLAVE_NOT_AVAILABLE
            log.error("HA listener not started on %s:%d: %s", c.host, port, exc)
        else:
            self.master = master
        if c.broker_role != "SYNC_MASTER":
            return []
        need = (c.in_sync_replicas or c.total_replicas) - 1
        self.sync = SyncWait(master.acks, need, c.sync_flush_timeout_ms, c.ha_max_gap_not_in_sync,
                             self._deliver)
        return [("ha-sync", self.sync.run)]

    # -- controller mode: role changes (RoleSwitch) -----------------------------------------------
    async def start_master(self, auto: AutoSwitchMaster) -> None:
        """Become the group's master: stop following, serve slaves (AutoSwitch handshake with
        ``auto``) on the HA port (the first one bound is kept)."""
        await self.stop_slave()
        c = self.config
        if self.master is not None or c.ha_listen_port < 0:
            return
        master = HaMaster(self.store, c.host, self._ha_port, self._acked,
                          None if self.acl is None else self.authenticate, acks=self.acks,
                          auto_switch=auto)
        try:
            await master.start()
        except OSError as exc:  # sends wait for the SyncStateSet and time out
            log.error("HA listener not started on %s:%d: %s", c.host, self._ha_port, exc)
            return
        self._ha_port, self.master = master.port, master

    async def stop_master(self) -> None:
        """Stop serving slaves (their acknowledgements are forgotten)."""
        if self.master is not None:
            master, self.master = self.master, None
            await master.close()
        self.acks.clear()

    def start_slave(self, ha_addr: str, auto: AutoSwitchSlave) -> None:
        """Follow the master at HA address ``ha_addr`` (AutoSwitch protocol: ``auto``)."""
        c = self.config
        cred = (HaCredentials(c.broker_name, auto.broker_id, c.ha_access_key, c.ha_secret_key)
                if c.ha_access_key else None)
        self.slave = HaSlave(self.store, ha_addr, self._flush, self._on_append, cred,
                             auto_switch=auto)
        self.slave.on_confirm = lambda: self.on_confirm()
        self._slave_task = asyncio.create_task(self.slave.run(), name="ha-slave")
        self._slave_task.add_done_callback(_log_end)

    async def stop_slave(self) -> None:
        if self._slave_task is not None:
            self._slave_task.cancel()
            await asyncio.gather(self._slave_task, return_exceptions=True)
            self._slave_task = None
        self.slave = None

    def sss_acked(self) -> int:
        """The offset the SyncStateSet's slaves all acknowledged (``all_ack_in_sync_state_set``),
        or that ``min_in_sync_replicas - 1`` slaves did; -1 when this broker is no master."""
        r, c = self.role, self.config
        if r.slave or self.master is None:
            return -1 if r.sync_state_set - {r.controller_id} else 2**63 - 1
        if not c.all_ack_in_sync_state_set:
            return self.acks.acked_by(c.min_in_sync_replicas - 1)
        return self.master.acked_by_brokers(r.sync_state_set - {r.controller_id})

    def read_limit(self) -> int | None:
        """What readers may see (:meth:`Store.set_read_limit`): None but in controller mode,
        where it is the confirm offset: on a master, what every other SyncStateSet member
        acknowledged (whatever ``all_ack_in_sync_state_set`` says of sends: any member may be
        the next master), on a slave the confirm offset its master last sent (RocketMQ
        ``AutoSwitchHAService.computeConfirmOffset``, ``readUnCommitted`` false). 0 while it
        is unknown (the store keeps the highest limit it was given)."""
        if not self.config.enable_controller_mode:
            return None
        r = self.role
        if r.slave:
            return max(0, self.slave.confirm) if self.slave is not None else 0
        others = r.sync_state_set - {r.controller_id}
        if not others:
            return self.store.flushed_offset
        acked = self.master.acked_by_brokers(others) if self.master is not None else -1
        return min(self.store.flushed_offset, max(0, acked))

    def told(self, ha_addr: str, master_addr: str) -> None:
        """EXCHANGE_BROKER_HA_INFO with ``masterHaAddress``: a slave follows it."""
        if self.slave is not None and ha_addr:
            self.slave.master = ha_addr
            self.master_addr = master_addr or self.master_addr

    def registered(self, answer: RegisterBrokerResponseHeader) -> None:
        """A name server's REGISTER_BROKER answer: a slave without ``ha_master_address`` follows
        the ``haServerAddr`` it names, and names ``masterAddr`` when it refuses an end
        (RocketMQ ``updateMasterHAServerAddrPeriodically``)."""
        if self.slave is None or self.config.enable_controller_mode:  # (the controller names it)
            return
        if answer.master_addr:
            self.master_addr = answer.master_addr
        if answer.ha_server_addr and not self.config.ha_master_address \
                and answer.ha_server_addr != self.slave.master:
            log.info("HA: the name server names master %s (HA %s)", answer.master_addr,
                     answer.ha_server_addr)
            self.slave.master = answer.ha_server_addr

    def authenticate(self, hello: HaHello, nonce: bytes, peer_ip: str) -> str | None:
        """Why a slave's hello is refused, or None: it must name this group and a slave id, and
        be signed by a user allowed All on ``Cluster:<cluster name>``."""
        c = self.config
        if hello.broker_name != c.broker_name:
            return f"broker name {hello.broker_name!r} is not this group's {c.broker_name!r}"
        if hello.broker_id <= 0:
            return f"broker id {hello.broker_id} is not a slave's (> 0)"
        assert self.acl is not None
        need = Need(Resource(ResourceType.CLUSTER, c.broker_cluster_name), (Action.ALL,))
        refusal = self.acl.check_fields(ha_hello_fields(hello, nonce), peer_ip, [need])
        return None if refusal is None else refusal.reason

    def runtime_info(self, now_ms: int) -> HaRuntimeInfo:
        """The broker's replication state (GET_BROKER_HA_STATUS; ``now_ms`` is unused: lags are
        measured on the monotonic clock)."""
        c = self.config
        conns = (self.master.connections(c.ha_max_gap_not_in_sync)
                 if self.master is not None else [])
        return HaRuntimeInfo(
            master=not self.role.slave, master_commit_log_max_offset=self.store.write_offset,
            in_sync_slave_nums=sum(x.in_sync for x in conns), ha_connection_info=conns,
            ha_client_runtime_info=(self.slave.runtime_info() if self.slave is not None
                                    else HaClientRuntimeInfo()),
            broker_name=c.broker_name, broker_id=self.role.broker_id, broker_role=self.role.role)

    def _acked(self) -> None:
        if self.sync is not None:
            self.sync.acked()
        if self.config.enable_controller_mode:
            self.on_confirm()
            if self.master is not None:
                self.master.notify()  # (the slaves learn the new confirm offset at once)

    def park(self, reply: Reply, code: int, t0: float) -> bool:
        """A durable reply: True when it waits for slaves (SYNC_MASTER), False to write it now."""
        return self.sync is not None and not self.role.slave and self.sync.park(reply, code, t0)

    def notify(self) -> None:
        """The flusher made more of the log durable: ship it."""
        if self.master is not None:
            self.master.notify()

    async def close(self) -> None:
        await self.stop_slave()
        if self.master is not None:
            await self.master.close()
