"""Drain a backlog: txmq's pull consumer against NATS JetStream's pull consumer, in one run.

Each side first holds ``--messages`` messages of ``--body`` bytes (txmq: a SYNC_FLUSH broker
process, a topic of ``--queues`` queues; NATS: the server at ``--nats`` (the machine's JetStream),
a file-storage stream). Then, ``--rounds`` times, alternating (txmq, NATS, txmq, NATS, …), a new
consumer drains everything and the wall time is taken:

- txmq: ``--queues`` concurrent pullers (one per queue, one connection), ``pull`` of ``--batch``
  messages decoded into ``MessageExt`` (the SDK's decoder), the consumer offset committed after
  each pull (RocketMQ's pull consumer model: offsets, no per-message ack);
- NATS: a new durable pull consumer (explicit ack), ``--queues`` concurrent fetchers of ``--batch``
  messages each acknowledging every message (``msg.ack()``, JetStream's model).

The figure is messages per second per side (median of the rounds) and their ratio.

    uv run --locked python benchmarks/drain_vs_nats.py [--messages 20000] [--rounds 3] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
from pull_cpu import fill  # benchmarks/ is on sys.path when a script there runs

from txmq.client import AsyncPullConsumer
from txmq.testing import BrokerProcess

_TOPIC = "bench-drain"
_STREAM, _SUBJECT = "TXMQ_BENCH_DRAIN", "txmq.bench.drain"
_IN_FLIGHT = 64
_FETCH_TIMEOUT_S = 0.1
"""A fetch that finds fewer messages returns after this (the drain's tail, not its body)."""


async def _drain_txmq(endpoints: str, queues: int, batch: int, group: str) -> int:
    c = AsyncPullConsumer(endpoints, group)
    await c.start()

    async def queue(qid: int) -> int:
        offset, got = 0, 0
        while True:
            r = await c.pull(_TOPIC, qid, offset, batch)
            if not r.messages:
                return got
            got += len(r.messages)
            offset = r.next_begin_offset
            await c.commit_offset(_TOPIC, qid, offset)

    try:
        return sum(await asyncio.gather(*(queue(q) for q in range(queues))))
    finally:
        await c.shutdown()


async def _fill_nats(url: str, n: int, body: bytes) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):  # absent: nothing to delete
            await js.delete_stream(_STREAM)
        await js.add_stream(StreamConfig(name=_STREAM, subjects=[_SUBJECT],
                                         storage=StorageType.FILE))
        sem = asyncio.Semaphore(_IN_FLIGHT)

        async def one() -> None:
            async with sem:
                await js.publish(_SUBJECT, body)

        await asyncio.gather(*(one() for _ in range(n)))
    finally:
        await nc.close()


async def _drain_nats(url: str, n: int, fetchers: int, batch: int, durable: str) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_consumer(_STREAM, ConsumerConfig(durable_name=durable,
                                                  ack_policy=AckPolicy.EXPLICIT))
    subs = [await js.pull_subscribe(_SUBJECT, durable=durable, stream=_STREAM)
            for _ in range(fetchers)]
    got = 0

    async def fetcher(sub: Any) -> None:
        nonlocal got
        while got < n:
            try:
                msgs = await sub.fetch(batch, timeout=_FETCH_TIMEOUT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            for m in msgs:
                await m.ack()
            got += len(msgs)

    try:
        await asyncio.gather(*(fetcher(sub) for sub in subs))
        await nc.flush()
        return got
    finally:
        await js.delete_consumer(_STREAM, durable)
        await nc.close()


def _timed(coro_fn: Callable[..., Coroutine[Any, Any, int]], *args: Any) -> tuple[int, float]:
    """``asyncio.run(coro_fn(*args))`` → (its count, wall seconds)."""
    t0 = time.perf_counter()
    n = asyncio.run(coro_fn(*args))
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    body = b"x" * args.body
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        broker = BrokerProcess(Path(d), {"topics": {_TOPIC: args.queues}})
        broker.start()
        try:
            asyncio.run(fill(broker.endpoints, args.messages, body, _IN_FLIGHT, _TOPIC))
            asyncio.run(_fill_nats(args.nats, args.messages, body))
            for i in range(args.rounds):
                nt, wt = _timed(_drain_txmq, broker.endpoints, args.queues, args.batch, f"g{i}")
                nn, wn = _timed(_drain_nats, args.nats, args.messages, args.queues, args.batch,
                                f"d{i}")
                assert nt == args.messages and nn >= args.messages, (nt, nn)
                rows.append({"txmq_msgs_per_s": nt / wt, "nats_msgs_per_s": nn / wn,
                             "ratio": (nt / wt) / (nn / wn)})
        finally:
            broker.stop()
    out = {"messages": args.messages, "body": args.body, "queues": args.queues,
           "batch": args.batch, "rounds": rows,
           "median_txmq_msgs_per_s": statistics.median(r["txmq_msgs_per_s"] for r in rows),
           "median_nats_msgs_per_s": statistics.median(r["nats_msgs_per_s"] for r in rows),
           "median_ratio": statistics.median(r["ratio"] for r in rows)}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
