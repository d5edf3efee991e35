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
from txmq.protocol import Command, FrameDecoder, encode_command, is_broker_topic

__all__ = ["Registrar"]

log = logging.getLogger("txmq.broker")
_READ_BYTES = 64 * 1024


class Registrar:
    """Keeps this broker registered with the name servers of ``namesrv_addr``.

    Args:
        namesrv_addr: ``host:port`` of each name server, separated by ``;``.
        registration: the sans-IO request builder for this broker.
        topics: the broker's topic table now (``{topic: queue count}``); txmq's own system topics
            are left out, retry and DLQ topics go in (consumers look their routes up).
        clock_ms: wall clock, ms.
    """

    def __init__(self, namesrv_addr: str, registration: BrokerRegistration,
                 topics: Callable[[], dict[str, int]], clock_ms: Callable[[], int]) -> None:
        self.addrs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        self.reg = registration
        self._topics = topics
        self._clock = clock_ms
        self._opaque = count(1)
        self._sent: dict[str, int] | None = None

    def _table(self) -> dict[str, int]:
        """The topics registered: the broker's own, plus a topic named after the broker and one
        after its cluster, as every RocketMQ broker registers (``TopicConfigManager``:
        ``brokerTopicEnable`` / ``clusterTopicEnable``); a name server refuses a broker's first
        registration when it holds one topic only (``RouteInfoManager.registerBroker``)."""
        table = {t: n for t, n in self._topics().items() if not is_broker_topic(t)}
        table.setdefault(self.reg.broker_name, 1)
        table.setdefault(self.reg.cluster, 1)
        return table

    async def run(self) -> None:
        """Register now and keep registering (a supervised timer task of the broker)."""
        while True:
            table = self._table()
            if table != self._sent or self.reg.due(self._clock()):
                await self.register(table)
            await asyncio.sleep(limits.NAMESRV_REGISTER_CHECK_MS / 1000)

    async def register(self, table: dict[str, int]) -> None:
        cmd = self.reg.register(table, self._clock())
        ok = [await self._call(addr, cmd) for addr in self.addrs]
        if all(ok):
            self._sent = table

    async def unregister(self) -> None:
        """Tell every name server this broker is going (best effort, at shutdown)."""
        cmd = self.reg.unregister()
        for addr in self.addrs:
            await self._call(addr, cmd)

    async def _call(self, addr: str, cmd: Command) -> bool:
        """One request on a fresh connection; True when answered SUCCESS. Never raises."""
        host, _, port = addr.rpartition(":")
        cmd.opaque = next(self._opaque)
        writer = None
        try:
            async with asyncio.timeout(limits.REQUEST_TIMEOUT_MS / 1000):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(encode_command(cmd))
                decoder, got = FrameDecoder(), []
                while not got:
                    data = await reader.read(_READ_BYTES)
                    if not data:
                        raise ConnectionError("closed before answering")
                    got = decoder.feed(data)
            if got[0].code != ResponseCode.SUCCESS:
                log.warning("name server %s refused code %d: %s", addr, cmd.code, got[0].remark)
                return False
            return True
        except (OSError, TimeoutError, ValueError, ProtocolError) as exc:
            log.warning("name server %s unreachable for code %d: %s", addr, cmd.code, exc)
            return False
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
