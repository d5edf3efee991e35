"""The HA listener's shell (txmq.broker.ha.HaMaster) on a real socket: closing it ends every
slave's connection handler and its tasks while the event loop still runs."""

from __future__ import annotations

import asyncio
from typing import Any

from txmq.broker.ha import HaMaster
from txmq.protocol import encode_report
from txmq.store import MemoryStore


def test_close_ends_every_slave_handler_and_its_tasks() -> None:
    problems: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: problems.append(ctx))
        master = HaMaster(MemoryStore(), "127.0.0.1", 0, lambda: None)
        await master.start()
        slaves = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
            writer.write(encode_report(0))
            await writer.drain()
            slaves.append((reader, writer))
        for _ in range(200):  # both reports read: two links
            if len(master.links) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(master.links) == 2
        before = asyncio.all_tasks()
        await master.close()
        left = [t for t in before if not t.done() and t is not asyncio.current_task()]
        assert left == [], f"tasks still running after close(): {left}"
        assert master.links == {} and master.acks.acked_by(1) <= 0
        for _, writer in slaves:
            writer.close()

    asyncio.run(main())
    assert problems == [], problems
