"""The broker's registrar against a real name server process: a role change's registration that
overlaps the periodic one (the failover run's 100 s outage: "read() called while another
coroutine is already waiting" failed the new master's BecomeMaster, and its route stayed old)
and a registration a name server missed is sent again at the next check, not in 30 s."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from txmq.broker._registrar import Registrar
from txmq.client import AsyncConnection
from txmq.client._route import decode_topic_route
from txmq.errors import ResponseCode
from txmq.namesrv import BrokerRegistration
from txmq.protocol import GetRouteInfoRequestHeader, RequestCode, to_ext
from txmq.testing import NamesrvProcess, free_port


def _registrar(ns_addr: str, broker_addr: str) -> Registrar:
    reg = BrokerRegistration("broker-x", broker_addr, broker_id=1)
    return Registrar(ns_addr, reg, lambda: {"t": 4}, lambda: int(time.time() * 1000))


async def _master_of(ns_addr: str) -> str:
    """The master address the name server's route of topic "t" names for broker-x ("": none)."""
    conn = AsyncConnection(ns_addr, timeout_ms=5_000)
    await conn.connect()
    try:
        r = await conn.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                               to_ext(GetRouteInfoRequestHeader(topic="t")))
        if r.code != ResponseCode.SUCCESS:
            return ""
        return decode_topic_route(r.body or b"", "t").brokers.get("broker-x", {}).get(0, "")
    finally:
        await conn.close()


def test_overlapping_registrations_share_the_connection(tmp_path: Path) -> None:
    ns = NamesrvProcess(tmp_path / "ns")
    ns.start()
    try:
        async def main() -> str:
            r = _registrar(ns.addr, f"127.0.0.1:{free_port()}")
            try:
                # the periodic registration and a role change's, at once, many times
                for epoch in range(1, 6):
                    await asyncio.gather(r.register(r._table()), r.reregister(0, epoch))
                return await _master_of(ns.addr)
            finally:
                for link in r.links:
                    await link.close()
        assert asyncio.run(main()).startswith("127.0.0.1:")
    finally:
        ns.stop()


def test_a_missed_registration_goes_out_again_at_the_next_check(tmp_path: Path) -> None:
    ns = NamesrvProcess(tmp_path / "ns")
    ns.start()

    async def main() -> str:
        r = _registrar(ns.addr, f"127.0.0.1:{free_port()}")
        await r.register(r._table())  # registered as a slave (id 1)
        runner = asyncio.create_task(r.run())
        try:
            await asyncio.to_thread(ns.stop)  # (its port is kept for the restart below)
            await r.reregister(0, 7)  # became master; the name server is down: missed
            await asyncio.to_thread(ns.start)
            deadline = time.monotonic() + 10  # (30 s would be the periodic registration)
            while time.monotonic() < deadline:
                if m := await _master_of(ns.addr):
                    return m
                await asyncio.sleep(0.2)
            return ""
        finally:
            runner.cancel()
            for link in r.links:
                await link.close()
    try:
        assert asyncio.run(main()).startswith("127.0.0.1:")
    finally:
        ns.stop()
