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
3. (``--trace``, the default) The cost of the broker's record of transactions' lives
   (docs/tracing.md): three broker processes, the record off (``transaction_trace_max = 0``), on
   (the default) and on with the OTLP export to a file (``otlp_file``), every message carrying a
   fresh W3C ``traceparent``; ``--rounds`` alternating runs of transactional sends (awaited end)
   on each, medians of the rates and of the broker's CPU time per transaction, as ratios to off.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import secrets
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
from txmq.serving import new_event_loop
from txmq.testing import BrokerHarness, BrokerProcess, process_cpu_s

__all__ = ["bench_check_rounds", "bench_send_vs_tx", "tx"]

BODY = b"x" * 1024


class _EmptyLocalTransaction:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def _drive(send: Any, n: int, in_flight: int, *, traced: bool = False) -> float:
    """Send ``n`` messages with ``in_flight`` outstanding (``traced``: each with a fresh W3C
    ``traceparent``); returns messages per second."""
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            props = {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
                     } if traced else {}
            await send(Message(topic="bench", body=BODY, properties=props))

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


_TRACE_KINDS = ("off", "on", "otlp")


async def _trace_runs(brokers: dict[str, BrokerProcess], n: int, in_flight: int, producers: int,
                      rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Alternating runs of ``n`` traced transactions on each broker: (rates, broker CPU µs per
    transaction), per kind."""
    clients = {k: [AsyncTransactionProducer("bench-tx", b.endpoints, _EmptyLocalTransaction())
                   for _ in range(producers)] for k, b in brokers.items()}
    for ps in clients.values():
        for p in ps:
            await p.start()
    per = n // producers
    rates: dict[str, list[float]] = {k: [] for k in brokers}
    cpu: dict[str, list[float]] = {k: [] for k in brokers}
    try:
        for ps in clients.values():  # warm-up
            await asyncio.gather(*(_drive(p.send_message_in_transaction, 200, in_flight, traced=True)
                                   for p in ps))
        for _ in range(rounds):
            for k, ps in clients.items():
                proc = brokers[k].proc
                pid = proc.pid if proc is not None else 0
                c0, t0 = process_cpu_s(pid), time.perf_counter()
                await asyncio.gather(*(_drive(p.send_message_in_transaction, per, in_flight,
                                              traced=True) for p in ps))
                rates[k].append(per * producers / (time.perf_counter() - t0))
                cpu[k].append((process_cpu_s(pid) - c0) / (per * producers) * 1e6)
    finally:
        for ps in clients.values():
            for p in ps:
                await p.shutdown()
    return rates, cpu


def bench_trace_cost(n: int = 20_000, in_flight: int = 32, producers: int = 4,
                     rounds: int = 3) -> dict[str, Any]:
    """Transactional send with the broker's record of lives off, on, and on with the OTLP file
    export (see the module docstring, part 3); medians and ratios to off, and the spans the
    export wrote."""
    with tempfile.TemporaryDirectory(prefix="txmq-bench-trace-") as d:
        spans = Path(d) / "spans.jsonl"
        extra: dict[str, dict[str, Any]] = {"off": {"transaction_trace_max": 0}, "on": {},
                 "otlp": {"otlp_file": str(spans)}}
        brokers = {k: BrokerProcess(Path(d) / k, {"topics": {"bench": 8}, **extra[k]})
                   for k in _TRACE_KINDS}
        loop = new_event_loop()
        try:
            for b in brokers.values():
                b.start()
            rates, cpu = loop.run_until_complete(_trace_runs(brokers, n, in_flight, producers,
                                                             rounds))
        finally:
            loop.close()
            for b in brokers.values():
                b.stop()  # (the export flushes its queue at the stop)
        written = sum(line.count('"spanId"') for line in spans.read_text().splitlines()) \
            if spans.exists() else 0
    rate = {k: statistics.median(v) for k, v in rates.items()}
    us = {k: statistics.median(v) for k, v in cpu.items()}
    return {"trace_tx_per_s": {k: round(v, 1) for k, v in rate.items()},
            "trace_broker_cpu_us_per_tx": {k: round(v, 1) for k, v in us.items()},
            "trace_on_to_off_ratio": round(rate["on"] / rate["off"], 3),
            "trace_otlp_to_off_ratio": round(rate["otlp"] / rate["off"], 3),
            "trace_on_to_off_broker_cpu": round(us["on"] / us["off"], 3),
            "trace_otlp_to_off_broker_cpu": round(us["otlp"] / us["off"], 3),
            "trace_otlp_spans_written": written, "trace_rounds": rounds,
            "trace_runs_tx_per_s": {k: [round(x) for x in v] for k, v in rates.items()}}


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
       max_pending: Annotated[int, typer.Option(help="Largest pending count.")] = 100_000,
       trace: Annotated[bool, typer.Option(
           "--trace/--no-trace", help="Also the cost of the broker's record of transactions' "
           "lives: off, on, on with OTLP export to a file.")] = True) -> None:
    """Plain vs transactional send, check-round cost vs pending and settled history, and the cost
    of the broker's record of transactions' lives."""
    logging.disable(logging.WARNING)
    console = Console()
    figures: dict[str, Any] = bench_send_vs_tx(messages, in_flight, producers, rounds)
    if trace:
        figures |= bench_trace_cost(messages, in_flight, producers, rounds)
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
    for k in ("trace_tx_per_s", "trace_broker_cpu_us_per_tx", "trace_on_to_off_ratio",
              "trace_otlp_to_off_ratio", "trace_on_to_off_broker_cpu",
              "trace_otlp_to_off_broker_cpu", "trace_otlp_spans_written"):
        if k in figures:
            table.add_row(k, str(figures[k]))
    console.print(table)
    print(json.dumps(figures))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")

