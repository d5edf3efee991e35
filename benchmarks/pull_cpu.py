"""Broker CPU per pulled message: a broker process (SYNC_FLUSH) holds ``--messages`` messages of
``--body`` bytes in a topic of ``--queues`` queues (sent round robin, so the queues' records
interleave in the commit log); raw pulls of ``--batch`` messages (no decoding on the client)
read every queue from offset 0, ``--rounds`` times with a new group each round. The broker's CPU
time (every thread's ``/proc/<pid>/task/*/schedstat``) over the pulls, divided by the messages pulled, is the
figure; the pulls' wall time gives messages per second.

    uv run --locked python benchmarks/pull_cpu.py [--messages 20000] [--batch 256] [--json F]

Runs against whichever txmq is installed (a build of another commit: run it from that worktree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from txmq.client import AsyncProducer, AsyncPullConsumer, Message
from txmq.testing import BrokerProcess

_TOPIC = "bench-pull"


def _cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (``/proc/<pid>/task/*/schedstat``: ns resolution,
    where ``/proc/<pid>/stat`` counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e9


def _user_sys_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` (``/proc/<pid>/stat``, 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def fill(endpoints: str, n: int, body: bytes, in_flight: int = 64, topic: str = _TOPIC) -> None:
    """Send ``n`` messages of ``body`` to ``topic`` (round robin over its queues), ``in_flight``
    outstanding at once. Also used by ``drain_vs_nats.py``."""
    p = AsyncProducer("bench-fill", endpoints)
    await p.start()
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await p.send(Message(topic=topic, body=body, keys=str(i)))

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await p.shutdown()


async def _drain(endpoints: str, queues: int, batch: int, group: str) -> int:
    c = AsyncPullConsumer(endpoints, group)
    await c.start()
    got = 0
    try:
        for qid in range(queues):
            offset = 0
            while True:
                r = await c.pull_raw(_TOPIC, qid, offset, batch)
                if r.next_begin_offset == offset or not r.body:
                    break
                got += r.next_begin_offset - offset
                offset = r.next_begin_offset
    finally:
        await c.shutdown()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        broker = BrokerProcess(Path(d), {"topics": {_TOPIC: args.queues}})
        broker.start()
        try:
            asyncio.run(fill(broker.endpoints, args.messages, b"x" * args.body))
            assert broker.proc is not None
            rows = []
            us0 = _user_sys_s(broker.proc.pid)
            for i in range(args.rounds):
                cpu0, t0 = _cpu_s(broker.proc.pid), time.perf_counter()
                n = asyncio.run(_drain(broker.endpoints, args.queues, args.batch, f"g{i}"))
                wall, cpu = time.perf_counter() - t0, _cpu_s(broker.proc.pid) - cpu0
                assert n == args.messages, (n, args.messages)
                rows.append({"cpu_us_per_msg": cpu / n * 1e6, "msgs_per_s": n / wall})
            us1 = _user_sys_s(broker.proc.pid)
            total = args.rounds * args.messages
            split = {"user_us_per_msg": (us1[0] - us0[0]) / total * 1e6,
                     "sys_us_per_msg": (us1[1] - us0[1]) / total * 1e6}
        finally:
            broker.stop()
    out = {"messages": args.messages, "body": args.body, "queues": args.queues,
           "batch": args.batch, "rounds": rows, **split,
           "median_cpu_us_per_msg": statistics.median(r["cpu_us_per_msg"] for r in rows),
           "median_msgs_per_s": statistics.median(r["msgs_per_s"] for r in rows)}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
