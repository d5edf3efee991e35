"""``txmq bench consume``: end-to-end latency at a fixed send rate, and consume vs send throughput.

One broker process (SYNC_FLUSH) on loopback, the producer in this process and the push consumer in
a child process (as two services would be; each has its own interpreter lock). The listener is a
plain function on the consumer's thread pool, the default path. Both processes stamp times with
``time.monotonic_ns`` (``CLOCK_MONOTONIC``, one clock for the whole machine on Linux).

1. send: ``--messages`` messages as fast as one producer with ``--in-flight`` requests outstanding
   can store them → ``send_msgs_per_s``;
2. consume: a new group reads those messages from the first offset → ``consume_msgs_per_s`` (from
   the consumer's start to its last listener call);
3. latency: for ``--duration`` seconds, send at ``--rate`` (default: half of 1.) to a consumer that
   is already waiting; a message's latency runs from the producer seeing its send acknowledged to
   the listener being called with it → ``e2e_latency_ms_p50/p99/max`` at ``rate_msgs_per_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq.client import AsyncProducer, ConsumeStatus, Message, MessageExt, PushConsumer
from txmq.errors import TxmqError
from txmq.serving import new_event_loop
from txmq.testing import BrokerProcess

__all__ = ["bench_consume", "consume", "percentile"]

_LOAD_TOPIC, _LAT_TOPIC = "bench-load", "bench-lat"
_WARMUP_S = 1.0
_DRAIN_TIMEOUT_S = 60.0


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 < p ≤ 100) of an ascending list; 0.0 when it is empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(p / 100 * len(sorted_values) + 0.4999)))
    return sorted_values[rank - 1]


# -- the consumer process ---------------------------------------------------------------------------
def _consumer_main(endpoints: str, group: str, topic: str, from_first: bool, out: str) -> None:
    """Consume until SIGTERM, appending ``<msg id> <monotonic ns>`` per message to ``out``; writes
    ``out.ready`` with the start time once subscribed."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        now = time.monotonic_ns()
        line = "".join(f"{m.msg_id} {now}\n" for m in msgs).encode()
        with lock:
            os.write(fd, line)
        return ConsumeStatus.CONSUME_SUCCESS

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    t0 = time.monotonic_ns()
    c = PushConsumer(group, endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET"
                     if from_first else "CONSUME_FROM_LAST_OFFSET")
    c.subscribe(topic)
    c.start()
    Path(out + ".ready").write_text(str(t0))
    stop.wait()
    c.shutdown()


class _ConsumerProcess:
    def __init__(self, endpoints: str, group: str, topic: str, from_first: bool, out: Path) -> None:
        self.out = out
        code = ("import sys; from txmq.cli._bench_consume import _consumer_main; "
                "_consumer_main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == '1', sys.argv[5])")
        self.proc = subprocess.Popen([sys.executable, "-c", code, endpoints, group, topic,
                                      "1" if from_first else "0", str(out)])
        ready = Path(str(out) + ".ready")
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise TxmqError("the bench consumer process did not start")
            time.sleep(0.02)
        self.started_ns = int(ready.read_text())

    def seen(self) -> dict[str, int]:
        """Message id → first listener call (monotonic ns)."""
        out: dict[str, int] = {}
        if self.out.exists():
            for line in self.out.read_text().splitlines():
                mid, _, ns = line.partition(" ")
                if ns:
                    out.setdefault(mid, int(ns))
        return out

    def wait_for(self, ids: set[str] | int) -> dict[str, int]:
        """Poll until every id (or that many messages) was seen, or the drain timeout."""
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while True:
            seen = self.seen()
            done = len(seen) >= ids if isinstance(ids, int) else ids <= seen.keys()
            if done or time.monotonic() > deadline:
                return seen
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- the producer side ------------------------------------------------------------------------------
async def _send_max(endpoints: str, n: int, in_flight: int, body: bytes) -> float:
    p = AsyncProducer("bench-consume", endpoints)
    await p.start()
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await p.send(Message(topic=_LOAD_TOPIC, body=body, keys=str(i)))

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t0)
    finally:
        await p.shutdown()


async def _send_at_rate(endpoints: str, rate: float, seconds: float, body: bytes) -> dict[str, int]:
    """Send at ``rate`` msgs/s for ``seconds``; returns msg id → acknowledgement (monotonic ns)."""
    p = AsyncProducer("bench-consume", endpoints)
    await p.start()
    acks: dict[str, int] = {}
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        r = await p.send(Message(topic=_LAT_TOPIC, body=body, keys=str(i)))
        acks[r.msg_id] = time.monotonic_ns()

    try:
        t0 = time.monotonic()
        for i in range(int(rate * seconds)):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.create_task(one(i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return acks
    finally:
        await p.shutdown()


def bench_consume(endpoints: str, work_dir: Path, messages: int = 20_000, duration_s: float = 10.0,
                  rate: float = 0.0, in_flight: int = 64, body_bytes: int = 256) -> dict[str, Any]:
    """Run the three phases against the broker at ``endpoints`` (topics ``bench-load`` and
    ``bench-lat`` must exist); returns the figures (latencies in ms, rates in msgs/s)."""
    body = b"x" * body_bytes
    run = f"{os.getpid()}-{int(time.time())}"
    loop = new_event_loop()
    try:
        send_rate = loop.run_until_complete(_send_max(endpoints, messages, in_flight, body))
        c = _ConsumerProcess(endpoints, f"bench-load-{run}", _LOAD_TOPIC, True, work_dir / "load.log")
        try:
            seen = c.wait_for(messages)
        finally:
            c.stop()
        last = max(seen.values(), default=c.started_ns)
        consume_rate = len(seen) / max(1e-9, (last - c.started_ns) / 1e9)
        rate = rate or round(send_rate / 2)
        c = _ConsumerProcess(endpoints, f"bench-lat-{run}", _LAT_TOPIC, False, work_dir / "lat.log")
        try:
            loop.run_until_complete(_send_at_rate(endpoints, rate, _WARMUP_S, body))
            acks = loop.run_until_complete(_send_at_rate(endpoints, rate, duration_s, body))
            at = c.wait_for(set(acks))
        finally:
            c.stop()
    finally:
        loop.close()
    raw = [at[i] - t for i, t in acks.items() if i in at]
    e2e = sorted(max(0, d) / 1e6 for d in raw)  # < 0: the listener ran before the producer saw the ack
    return {
        "send_msgs_per_s": round(send_rate), "consume_msgs_per_s": round(consume_rate),
        "consume_vs_send": round(consume_rate / send_rate, 2), "rate_msgs_per_s": rate,
        "e2e_latency_ms_p50": round(percentile(e2e, 50), 3),
        "e2e_latency_ms_p99": round(percentile(e2e, 99), 3),
        "e2e_latency_ms_max": round(e2e[-1] if e2e else 0.0, 3),
        "latency_samples": len(e2e), "latency_lost": len(acks) - len(e2e),
        "consumed_before_ack_seen": sum(d < 0 for d in raw),
        "consumed_in_consume_phase": len(seen), "messages": messages, "body_bytes": body_bytes,
        "in_flight": in_flight,
    }


def consume(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    messages: Annotated[int, typer.Option(help="Messages of the send and consume phases.")] = 20_000,
    duration: Annotated[float, typer.Option(help="Seconds of the fixed-rate latency phase.")] = 10.0,
    rate: Annotated[float, typer.Option(help="Latency-phase rate, msgs/s (0: half the send rate).")] = 0.0,
    in_flight: Annotated[int, typer.Option(help="Sends outstanding in the send phase.")] = 64,
    body_bytes: Annotated[int, typer.Option(help="Message body size.")] = 256,
    endpoints: Annotated[str | None, typer.Option(help="Use this broker instead of starting one "
                                                       "(needs topics bench-load and bench-lat).")] = None,
) -> None:
    """End-to-end latency (send ack → listener call) at a fixed rate; consume vs send throughput."""
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="txmq-bench-") as tmp:
        bp = None
        if endpoints is None:
            bp = BrokerProcess(Path(tmp) / "broker", {"topics": {_LOAD_TOPIC: 4, _LAT_TOPIC: 4}})
            bp.start()
            endpoints = bp.endpoints
        try:
            fig = bench_consume(endpoints, Path(tmp), messages, duration, rate, in_flight, body_bytes)
        except TxmqError as exc:
            Console(stderr=True).print(f"[red]bench failed:[/red] {exc}")
            raise typer.Exit(1) from exc
        finally:
            if bp is not None:
                bp.stop()
    table = Table("measure", "value", title="txmq bench consume")
    for k, v in fig.items():
        table.add_row(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))
    Console().print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(fig, indent=2) + "\n")
