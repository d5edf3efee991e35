"""``txmq bench tx``: the price of a transaction, and the cost of a check-back round.

1. Plain send vs transactional send (half + empty local transaction + commit) of 1 KiB messages,
   synchronous flush, the same number of requests in flight, against one real broker process;
   ``--rounds`` alternating runs of each kind, medians reported (one run lasts about a second, and
   load from other work on a shared machine drifts). The commit's end is awaited (txmq's
   END_TRANSACTION_BATCH) or one-way (``oneway_end``: one END_TRANSACTION per transaction); the
   broker's CPU time per message of each kind is read from ``/proc/<pid>/stat`` around each run.
2. One check-back round that checks every pending half message, with {1k, 10k, 100k} pending and
   {0, 1M} settled transactions in the index, on the sans-IO broker (MemoryStore): the round must not
   depend on settled history and must write no bytes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq.broker.transaction import Outcome
from txmq.client import AsyncProducer, AsyncTransactionProducer, LocalTransactionState, Message
from txmq.client._sync import new_event_loop
from txmq.testing import BrokerHarness, BrokerProcess, process_cpu_s

__all__ = ["bench_check_rounds", "bench_send_vs_tx", "tx"]

BODY = b"x" * 1024


class _EmptyLocalTransaction:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def _drive(send: Any, n: int, in_flight: int) -> float:
    """Send ``n`` messages with ``in_flight`` outstanding; returns messages per second."""
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await send(Message(topic="bench", body=BODY))

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - t0)


async def _send_vs_tx(endpoints: str, n: int, in_flight: int, producers: int,
                      rounds: int, broker_pid: int = 0) -> dict[str, Any]:
    plain = [AsyncProducer("bench-plain", endpoints) for _ in range(producers)]
    txp = [AsyncTransactionProducer("bench-tx", endpoints, _EmptyLocalTransaction())
           for _ in range(producers)]
    txo = [AsyncTransactionProducer("bench-tx", endpoints, _EmptyLocalTransaction(), oneway_end=True)
           for _ in range(producers)]
    for p in (*plain, *txp, *txo):
        await p.start()
    per = n // producers
    runs: dict[str, list[float]] = {"plain": [], "tx": [], "oneway": []}
    cpu: dict[str, list[float]] = {"plain": [], "tx": [], "oneway": []}
    try:
        await asyncio.gather(*(_drive(p.send, 200, in_flight) for p in plain))  # warm-up
        for _ in range(rounds):  # alternate, so drifting load on the machine hits all three alike
            for kind, clients, send in (("plain", plain, "send"),
                                        ("tx", txp, "send_message_in_transaction"),
                                        ("oneway", txo, "send_message_in_transaction")):
                c0, t0 = process_cpu_s(broker_pid), time.perf_counter()
                await asyncio.gather(*(_drive(getattr(p, send), per, in_flight) for p in clients))
                runs[kind].append(per * producers / (time.perf_counter() - t0))
                if kind == "oneway":  # the last one-way ends may still be in the broker's hands
                    await asyncio.sleep(0.05)
                cpu[kind].append((process_cpu_s(broker_pid) - c0) / (per * producers) * 1e6)
    finally:
        for p in (*plain, *txp, *txo):
            await p.shutdown()
    return _figures(runs, cpu, rounds)


def _figures(runs: dict[str, list[float]], cpu: dict[str, list[float]],
             rounds: int) -> dict[str, Any]:
    plain_rate, tx_rate, oneway_rate = (statistics.median(runs[k]) for k in ("plain", "tx", "oneway"))
    plain_cpu, tx_cpu, oneway_cpu = (statistics.median(cpu[k]) for k in ("plain", "tx", "oneway"))
    return {"plain_send_msgs_per_s": round(plain_rate, 1), "tx_commit_msgs_per_s": round(tx_rate, 1),
            "tx_to_plain_ratio": round(tx_rate / plain_rate, 3),
            "tx_oneway_end_msgs_per_s": round(oneway_rate, 1),
            "tx_oneway_end_to_plain_ratio": round(oneway_rate / plain_rate, 3),
            "plain_broker_cpu_us": round(plain_cpu, 1), "tx_broker_cpu_us": round(tx_cpu, 1),
            "tx_oneway_end_broker_cpu_us": round(oneway_cpu, 1),
            "oneway_to_batched_end_broker_cpu": round(oneway_cpu / tx_cpu, 3) if tx_cpu else None,
            "rounds": rounds, "runs_msgs_per_s": {k: [round(v) for v in vs] for k, vs in runs.items()},
            "runs_broker_cpu_us": {k: [round(v, 1) for v in vs] for k, vs in cpu.items()}}


def bench_send_vs_tx(n: int = 20_000, in_flight: int = 32, producers: int = 4,
                     rounds: int = 3) -> dict[str, Any]:
    """Plain vs transactional send through a real broker process (SYNC_FLUSH, group commit):
    ``rounds`` alternating runs of ``n`` messages each; the figures are the medians."""
    with tempfile.TemporaryDirectory(prefix="txmq-bench-") as d:
        bp = BrokerProcess(Path(d), {"topics": {"bench": 8}})
        bp.start()
        loop = new_event_loop()
        try:
            pid = bp.proc.pid if bp.proc is not None else 0
            return loop.run_until_complete(_send_vs_tx(bp.endpoints, n, in_flight, producers,
                                                       rounds, pid))
        finally:
            loop.close()
            bp.stop()


def _check_round(pending: int, settled: int) -> dict[str, float]:
    h = BrokerHarness(transaction_checks_in_flight_max=1 << 30)
    h.heartbeat(1, "bench-producer", ["pg"])
    for _ in range(pending):
        h.send(1, "t", b"x" * 64, transactional=True)
    settle = h.broker.tx.index.settled
    for off in range(pending, pending + settled):  # decided history the checker must not pay for
        settle[off] = Outcome.COMMIT
    gc.collect()
    gc.freeze()  # the long-lived index is not garbage; keep the collector out of the timing
    best, before = float("inf"), h.store.write_offset
    try:
        for _ in range(3):  # best of three rounds, each checking every pending half message
            h.now_ms += h.config.transaction_check_interval_ms + h.config.transaction_timeout_ms
            h.heartbeat(1, "bench-producer", ["pg"])
            h.broker.tx._in_flight.clear()  # as if every check had been answered UNKNOWN
            t0 = time.perf_counter()
            sent = h.broker.tx.tick(h.now_ms)
            best = min(best, (time.perf_counter() - t0) * 1000)
            assert len(sent) == pending
    finally:
        gc.unfreeze()
    return {"pending": pending, "settled": settled, "ms": round(best, 2),
            "bytes_written": (h.store.write_offset - before) / 3}


def bench_check_rounds(pendings: tuple[int, ...] = (1_000, 10_000, 100_000),
                       settleds: tuple[int, ...] = (0, 1_000_000)) -> list[dict[str, float]]:
    """One full check-back round per (pending, settled) pair."""
    return [_check_round(p, s) for s in settleds for p in pendings]


def tx(json_path: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
       messages: Annotated[int, typer.Option(help="Messages per send run.")] = 20_000,
       in_flight: Annotated[int, typer.Option(help="Requests in flight per producer.")] = 32,
       producers: Annotated[int, typer.Option(help="Producer clients.")] = 4,
       rounds: Annotated[int, typer.Option(min=1, help="Alternating runs of each kind (median).")] = 3,
       max_pending: Annotated[int, typer.Option(help="Largest pending count.")] = 100_000) -> None:
    """Plain vs transactional send, and check-round cost vs pending and settled history."""
    logging.disable(logging.WARNING)
    console = Console()
    figures: dict[str, Any] = bench_send_vs_tx(messages, in_flight, producers, rounds)
    pendings = tuple(p for p in (1_000, 10_000, 100_000) if p <= max_pending)
    checks = bench_check_rounds(pendings)
    figures["check_round_ms"] = [{k: r[k] for k in ("pending", "settled", "ms")} for r in checks]
    figures["bytes_written_per_check"] = max(r["bytes_written"] / r["pending"] for r in checks)
    ratio = max(r["ms"] for r in checks if r["settled"]) / max(r["ms"] for r in checks if not r["settled"])
    figures["check_round_settled_1m_vs_0_ratio_at_max_pending"] = round(ratio, 3)
    table = Table("measure", "value", title="txmq bench tx (1 KiB, SYNC_FLUSH)")
    for k in ("plain_send_msgs_per_s", "tx_commit_msgs_per_s", "tx_to_plain_ratio",
              "tx_oneway_end_msgs_per_s", "tx_oneway_end_to_plain_ratio", "plain_broker_cpu_us",
              "tx_broker_cpu_us", "tx_oneway_end_broker_cpu_us", "oneway_to_batched_end_broker_cpu",
              "bytes_written_per_check"):
        table.add_row(k, str(figures[k]))
    for r in figures["check_round_ms"]:
        table.add_row(f"check round: {r['pending']:,} pending, {r['settled']:,} settled", f"{r['ms']} ms")
    console.print(table)
    print(json.dumps(figures))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")

