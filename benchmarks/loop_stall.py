"""How long the broker's event loop stalls while the state files are saved (issue 24 item 5): the
consumer offsets, the delay progress and the transaction index snapshot, with ``--pending`` pending
transactions and ``--offsets`` consumer offsets.

A real :class:`~txmq.broker.server.BrokerServer` over a ``FileStore`` in a temporary directory; a
probe task sleeps 1 ms at a time and records the longest gap between its wake-ups while one save
runs the way the server's timer runs it: ``BrokerServer.save_state`` where it exists (copies on the
loop, encode and write on the writer thread), else ``Broker.persist_offsets`` on the loop (what the
ticker called before). Each round first adds one half, so the snapshot is saved every time; the
median and worst of ``--rounds`` are printed as JSON, with the longest gap of the probe alone over
as long as a save takes (``idle_stall_ms_median``: the machine's own noise). Run it in two
checkouts to compare them::

    uv run --locked python benchmarks/loop_stall.py [--pending 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from txmq.broker import BrokerConfig
from txmq.broker.server import BrokerServer
from txmq.store import FileStore, Record


def _add_halves(server: BrokerServer, n: int, seq: int) -> None:
    b = server.broker
    now = int(time.time() * 1000)
    for i in range(0, n, 1000):
        recs = [b.tx.half_record(Record(topic="t", queue_id=0, body=b"x" * 100, keys="k",
                                        properties={"UNIQ_KEY": f"M{seq + i + j:09d}"},
                                        born_timestamp_ms=now), "pg", "c1")
                for j in range(min(1000, n - i))]
        for r, res in zip(recs, b.append(recs), strict=True):
            b.tx.on_half_stored(r, res)


async def _probe(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def _round(server: BrokerServer, seq: int, idle_s: float = 0.0) -> tuple[float, float]:
    """(longest loop stall, save time) in ms; with ``idle_s`` no save, the probe alone that long
    (the machine's own noise)."""
    _add_halves(server, 1, seq)
    server.broker.set_offset("g", "t", 0, seq)
    stop, gaps = asyncio.Event(), []
    probe = asyncio.create_task(_probe(stop, gaps))
    await asyncio.sleep(0.02)
    gaps.clear()
    t0 = time.perf_counter()
    save = getattr(server, "save_state", None)
    if idle_s:
        await asyncio.sleep(idle_s)
    elif save is not None:
        await save()
    else:
        server.broker.persist_offsets()  # what the ticker did: on the loop
        await asyncio.sleep(0)
    took = time.perf_counter() - t0
    await asyncio.sleep(0.01)
    stop.set()
    await probe
    return max(gaps) * 1000, took * 1000


async def _main(args: argparse.Namespace, data: Path) -> dict[str, object]:
    server = BrokerServer(BrokerConfig(port=0, topics={"t": 4}), FileStore(data))
    _add_halves(server, args.pending, 0)
    for i in range(args.offsets):
        server.broker.set_offset(f"g{i % 100}", "t", i % 4, i)
    await server.start()
    try:
        rounds = [await _round(server, args.pending + r) for r in range(args.rounds)]
        save_s = statistics.median(t for _, t in rounds) / 1000
        idle = [(await _round(server, 2 * args.pending + r, save_s))[0] for r in range(args.rounds)]
    finally:
        await server.close()
    stalls = [s for s, _ in rounds]
    return {"pending": args.pending, "mode": "writer thread" if hasattr(server, "save_state")
            else "on the loop", "loop_stall_ms_median": round(statistics.median(stalls), 1),
            "loop_stall_ms_max": round(max(stalls), 1),
            "save_ms_median": round(statistics.median(t for _, t in rounds), 1),
            "idle_stall_ms_median": round(statistics.median(idle), 1),
            "snapshot_bytes": (data / "meta" / "transactionIndex.snapshot").stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--offsets", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="txmq-stall-") as d:
        print(json.dumps(asyncio.run(_main(args, Path(d)))))


if __name__ == "__main__":
    main()
