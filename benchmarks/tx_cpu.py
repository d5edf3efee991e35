"""Broker CPU per transaction: plain send, transaction with the batched end (txmq's
END_TRANSACTION_BATCH, the default) and with the one-way end (``oneway_end=True``, one
END_TRANSACTION per transaction, what an Apache RocketMQ broker needs).

One broker process (SYNC_FLUSH), ``--producers`` clients × ``--in-flight`` requests, 1 KiB
messages, ``--rounds`` alternating runs of ``--messages`` each; the broker's CPU time
(``utime + stime`` of ``/proc/<pid>/stat``) and the clients' (this process's) are read around
every run, and the medians per kind are printed as JSON. Run it in two checkouts to compare
builds (the ratios within one run are what to compare on a shared machine).

Usage::

    uv run --locked python benchmarks/tx_cpu.py [--messages 10000] [--rounds 3] [--profile DIR]

``--profile DIR`` records the broker with ``py-spy`` (when installed) during the last round of
each transactional kind, into ``DIR/<kind>.txt`` (collapsed stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from txmq.client import AsyncProducer, AsyncTransactionProducer, LocalTransactionState, Message

try:
    from txmq.serving import new_event_loop
except ImportError:  # a build before it moved there (these scripts also run against older checkouts)
    from txmq.client._sync import new_event_loop  # type: ignore[attr-defined,no-redef]
from txmq.testing import BrokerProcess

BODY = b"x" * 1024
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


class _Commit:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def cpu_s(pid: int, system: bool = False) -> float:
    """CPU seconds (user + system, or system only) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[12]) + (0 if system else int(fields[11]))) * _TICK_S


async def _drive(send: Any, n: int, in_flight: int) -> None:
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await send(Message(topic="bench", body=BODY))

    await asyncio.gather(*(one() for _ in range(n)))


async def _run(bp: BrokerProcess, args: argparse.Namespace) -> dict[str, Any]:
    ep = bp.endpoints
    kinds: dict[str, tuple[list[Any], str]] = {
        "plain": ([AsyncProducer("bench-plain", ep) for _ in range(args.producers)], "send"),
        "tx_batched_end": ([AsyncTransactionProducer("bench-tx", ep, _Commit())
                            for _ in range(args.producers)], "send_message_in_transaction"),
        "tx_oneway_end": ([AsyncTransactionProducer("bench-tx", ep, _Commit(), oneway_end=True)
                           for _ in range(args.producers)], "send_message_in_transaction"),
    }
    for clients, _ in kinds.values():
        for p in clients:
            await p.start()
    pid = bp.proc.pid if bp.proc is not None else 0
    per = args.messages // args.producers
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    client: dict[str, list[float]] = {k: [] for k in kinds}
    system: dict[str, list[float]] = {k: [] for k in kinds}
    rate: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for clients, send in kinds.values():  # warm-up
            await asyncio.gather(*(_drive(getattr(p, send), 200, args.in_flight) for p in clients))
        for rnd in range(args.rounds):
            for kind, (clients, send) in kinds.items():
                spy = _spy(pid, args.profile, kind) if rnd == args.rounds - 1 else None
                await asyncio.sleep(0.3)  # let the last run's check-backs and timers settle
                c0, t0, p0 = cpu_s(pid), time.perf_counter(), time.process_time()
                s0 = cpu_s(pid, system=True)
                await asyncio.gather(*(_drive(getattr(p, send), per, args.in_flight)
                                       for p in clients))
                await asyncio.sleep(0.05)  # one-way ends: let the broker finish them
                dt, dc = time.perf_counter() - t0, cpu_s(pid) - c0
                system[kind].append((cpu_s(pid, system=True) - s0) / (per * args.producers) * 1e6)
                client[kind].append((time.process_time() - p0) / (per * args.producers) * 1e6)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                    spy.wait()
                cpu[kind].append(dc / (per * args.producers) * 1e6)
                rate[kind].append(per * args.producers / dt)
    finally:
        for clients, _ in kinds.values():
            for p in clients:
                await p.shutdown()
    out: dict[str, Any] = {}
    for kind in kinds:
        out[f"{kind}_broker_cpu_us"] = round(statistics.median(cpu[kind]), 1)
        out[f"{kind}_msgs_per_s"] = round(statistics.median(rate[kind]))
        out[f"{kind}_broker_system_cpu_us"] = round(statistics.median(system[kind]), 1)
        out[f"{kind}_client_cpu_us"] = round(statistics.median(client[kind]), 1)
    out["oneway_over_batched_cpu"] = round(out["tx_oneway_end_broker_cpu_us"]
                                           / out["tx_batched_end_broker_cpu_us"], 3)
    out["runs_cpu_us"] = {k: [round(v, 1) for v in vs] for k, vs in cpu.items()}
    return out


def _spy(pid: int, where: Path | None, kind: str) -> subprocess.Popen[bytes] | None:
    if where is None or shutil.which("py-spy") is None:
        return None
    where.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate",
                             "1000", "--threads", "--output", str(where / f"{kind}.txt"), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=32)
    ap.add_argument("--profile", type=Path, default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="txmq-txcpu-") as d:
        bp = BrokerProcess(Path(d), {"topics": {"bench": 8}})
        bp.start()
        loop = new_event_loop()
        try:
            print(json.dumps(loop.run_until_complete(_run(bp, args))))
        finally:
            loop.close()
            bp.stop()


if __name__ == "__main__":
    main()
