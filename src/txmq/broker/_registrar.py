"""The broker's asyncio shell toward name servers: register, re-register, unregister.

A broker started with ``namesrv_addr`` sends REGISTER_BROKER to every name server at start, every
``REGISTER_NAME_SERVER_PERIOD_MS`` (RocketMQ BrokerConfig ``registerNameServerPeriod``) and within
``NAMESRV_REGISTER_CHECK_MS`` of a topic being created, and UNREGISTER_BROKER at shutdown. The
requests themselves are :class:`~txmq.namesrv.BrokerRegistration`'s (sans-IO).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from itertools import count

from txmq import limits
from txmq.errors import ProtocolError, ResponseCode
from txmq.namesrv import BrokerRegistration
from txmq.protocol import (
    Command,
    FrameDecoder,
    RegisterBrokerResponseHeader,
    RequestCode,
    encode_command,
    from_ext,
    is_broker_topic,
    parse_address,
)

__all__ = ["Registrar"]

log = logging.getLogger("txmq.broker")
_READ_BYTES = 64 * 1024


class _Link:
    """One kept-open connection to a name server: a name server forgets a broker whose
    registration connection closes (RocketMQ ``BrokerHousekeepingService.onChannelClose``)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.decoder = FrameDecoder()
        self._lock = asyncio.Lock()

    async def call(self, cmd: Command) -> Command:
        """Send ``cmd`` and read its answer, connecting first if needed; calls run one at a time
        (the periodic registration and a role change's may overlap). Raises OSError,
        TimeoutError, ProtocolError (the link is closed then; the next call reconnects)."""
        async with self._lock:
            return await self._call(cmd)

    async def _call(self, cmd: Command) -> Command:
        try:
            async with asyncio.timeout(limits.REQUEST_TIMEOUT_MS / 1000):
                if self.writer is None or self.writer.is_closing():
                    host, port = parse_address(self.addr)
                    self.reader, self.writer = await asyncio.open_connection(host, port)
                    self.decoder = FrameDecoder()
                assert self.reader is not None
                self.writer.write(encode_command(cmd))
                while True:
                    for got in self.decoder.feed(await self._read()):
                        if got.opaque == cmd.opaque and got.is_response:
                            return got
        except BaseException:
            await self.close()
            raise

    async def _read(self) -> bytes:
        assert self.reader is not None
        data = await self.reader.read(_READ_BYTES)
        if not data:
            raise ConnectionError("name server closed the connection")
        return data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


class Registrar:
    """Keeps this broker registered with the name servers of ``namesrv_addr``, over one open
    connection to each.

    Args:
        namesrv_addr: ``host:port`` of each name server, separated by ``;``.
        registration: the sans-IO request builder for this broker.
        topics: the broker's topic table now (``{topic: queue count}``); txmq's own system topics
            are left out, retry and DLQ topics go in (consumers look their routes up).
        clock_ms: wall clock, ms.
        on_registered: called with each REGISTER_BROKER answer (a slave learns its master's
            ``masterAddr`` and ``haServerAddr`` from it, RocketMQ ``handleRegisterBrokerResult``).
    """

    def __init__(self, namesrv_addr: str, registration: BrokerRegistration,
                 topics: Callable[[], dict[str, int]], clock_ms: Callable[[], int],
                 on_registered: Callable[[RegisterBrokerResponseHeader], None] | None = None) -> None:
        self._on_registered = on_registered
        self.links = [_Link(a.strip()) for a in namesrv_addr.split(";") if a.strip()]
        self.reg = registration
        self._topics = topics
        self._clock = clock_ms
        self._opaque = count(1)
        self._sent: dict[str, int] | None = None

    def _table(self) -> dict[str, int]:
        return {t: n for t, n in self._topics().items() if not is_broker_topic(t)}

    async def run(self) -> None:
        """Register now and keep registering (a supervised timer task of the broker)."""
        while True:
            table = self._table()
            if table != self._sent or self.reg.due(self._clock()):
                await self.register(table)
            await asyncio.sleep(limits.NAMESRV_REGISTER_CHECK_MS / 1000)

    async def register(self, table: dict[str, int]) -> None:
        cmd = self.reg.register(table, self._clock())
        ok = [await self._call(link, cmd) for link in self.links]
        # (a name server that missed it gets it again at the next check, not in 30 s: after a
        # role change clients find the new master only through the name server)
        self._sent = table if all(ok) else None

    async def reregister(self, broker_id: int, master_epoch: int | None) -> None:
        """Register at once as ``broker_id`` (0 after becoming master) with ``master_epoch``
        (controller mode's role change; RocketMQ ``ReplicasManager`` calls
        ``registerBrokerAll`` so)."""
        self.reg.set_role(broker_id, master_epoch)
        await self.register(self._table())

    async def unregister(self) -> None:
        """Tell every name server this broker is going (best effort, at shutdown)."""
        cmd = self.reg.unregister()
        for link in self.links:
            await self._call(link, cmd)
            await link.close()

    async def _call(self, link: _Link, cmd: Command) -> bool:
        """One request; True when answered SUCCESS. Never raises."""
        cmd.opaque = next(self._opaque)
        try:
            got = await link.call(cmd)
        except (OSError, TimeoutError, ValueError, ProtocolError) as exc:
            log.warning("name server %s unreachable for code %d: %s", link.addr, cmd.code, exc)
            return False
        if got.code != ResponseCode.SUCCESS:
            log.warning("name server %s refused code %d: %s", link.addr, cmd.code, got.remark)
            return False
        if self._on_registered is not None and cmd.code == RequestCode.REGISTER_BROKER:
            try:
                self._on_registered(from_ext(got.ext, RegisterBrokerResponseHeader))
            except ProtocolError as exc:
                log.warning("name server %s: register answer unreadable: %s", link.addr, exc)
        return True
