"""The Spark source's executor code without Spark: CPU per row of reading a topic with
``read_queue_range`` (pulls, decoding into Arrow batches, regrouping), and the broker's CPU.

    uv run --locked python benchmarks/source_read.py [--rows 200000] [--rounds 3] [--json F]

Starts a broker (``txmq.testing.BrokerProcess``), loads topic ``src`` (4 queues) with ``--rows``
messages of a 256-byte body and ``KEYS`` = the message's number (as ``txmq bench spark`` does),
then reads every queue in full ``--rounds`` times, one queue after the other, in this process.
Per round: wall time, this process's CPU (``time.process_time``: every thread, so the client's
event loop and the prefetching thread too) and the broker's (``/proc/<pid>/stat``), each per row;
the lowest of the rounds counts. Run it from another checkout to compare builds
(``cd ../base && uv run --locked python ../hc/benchmarks/source_read.py``): it only uses what
today's main has.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from txmq.client import AsyncProducer, Message, PullConsumer

try:
    from txmq.serving import new_event_loop
except ImportError:  # a build before it moved there (these scripts also run against older checkouts)
    from txmq.client._sync import new_event_loop  # type: ignore[attr-defined,no-redef]
from txmq.spark._source import QueueRange, read_queue_range
from txmq.testing import BrokerProcess, process_cpu_s

_QUEUES = 4


async def _fill(endpoints: str, rows: int) -> None:
    p = AsyncProducer("bench-source-read", endpoints)
    await p.start()
    try:
        for i in range(0, rows, 512):
            await p.send_batch([Message(topic="src", body=b"x" * 256, keys=str(i + j))
                                for j in range(min(512, rows - i))])
    finally:
        await p.shutdown()


def _round(endpoints: str, ends: dict[int, int], broker_pid: int) -> dict[str, float]:
    rows = sum(ends.values())
    wall, cpu, broker = time.perf_counter(), time.process_time(), process_cpu_s(broker_pid)
    got = 0
    for q, end in ends.items():
        part = QueueRange(endpoints, "bench-source-read", "src", q, 0, end)
        got += sum(b.num_rows for b in read_queue_range(part))
    if got != rows:
        raise RuntimeError(f"read {got} rows of {rows}")
    return {"wall_us_per_row": (time.perf_counter() - wall) / rows * 1e6,
            "reader_cpu_us_per_row": (time.process_time() - cpu) / rows * 1e6,
            "broker_cpu_us_per_row": (process_cpu_s(broker_pid) - broker) / rows * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="txmq-source-read-") as d:
        bp = BrokerProcess(Path(d) / "broker", {"topics": {"src": _QUEUES}})
        bp.start()
        try:
            loop = new_event_loop()
            loop.run_until_complete(_fill(bp.endpoints, args.rows))
            loop.close()
            c = PullConsumer(endpoints=bp.endpoints, consumer_group="bench-source-read")
            c.start()
            ends = {q: c.max_offset("src", q) for q in c.queue_ids("src")}
            c.shutdown()
            assert bp.proc is not None
            rounds = [_round(bp.endpoints, ends, bp.proc.pid) for _ in range(args.rounds)]
        finally:
            bp.stop()
    best = {k: round(min(r[k] for r in rounds), 2) for k in rounds[0]}
    out = {"rows": args.rows, "best": best,
           "rounds": [{k: round(v, 2) for k, v in r.items()} for r in rounds]}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
