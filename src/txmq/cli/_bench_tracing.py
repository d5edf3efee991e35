"""``txmq bench tracing``: what OpenTelemetry tracing costs the SDK (issue #28).

One broker process (SYNC_FLUSH) on loopback; the clients in this process, on one event loop. Three
modes, each a :class:`~txmq.tracing.Tracing` given to the clients:

- ``off``: ``tracing=False``;
- ``noop``: OpenTelemetry's API with its no-op tracer provider (``opentelemetry-api`` installed and
  imported, no SDK configured): no span, trace context passed on only when one is current;
- ``sdk``: the OpenTelemetry SDK's ``TracerProvider`` with a ``BatchSpanProcessor`` (its default
  queue and batch sizes) exporting to a file of JSON lines (``ConsoleSpanExporter``).

Per round, for each mode in turn (rounds interleave the modes, so drifting load on a shared machine
hits all three alike, and rotate their order, so none always follows another):

1. send: ``--messages`` messages of ``--body-bytes`` through one asyncio producer with
   ``--in-flight`` requests outstanding → msgs/s (``sdk``: until its spans are exported, the
   batch processor flushed);
2. consume: a new consumer group of a push consumer (a plain listener on its thread pool, the
   default) reads ``--messages`` messages, sent once before the rounds with trace context in their
   properties, from the first offset → msgs/s from its first listener call to its last (``sdk``:
   to the flush);

and then, side by side, ``off`` and ``noop`` at the same time (two producers sending, then two new
consumer groups reading; who starts first alternates by round): both see the same load on the
machine, so their ratio (``*_noop_to_off_side_by_side``, the median over the rounds) is the
steadiest figure for the no-op goal. (``sdk`` is not run side by side: its CPU would slow its twin
down and hide its own cost.)

The other ratios to ``off`` are the medians of each round's ratio (a round's runs are seconds
apart, so the machine's drifting load mostly cancels); the rates are medians over the rounds; this
process's CPU time per message is read around each run (``time.process_time``, every thread: the
exporter's too).

Before the rounds, the tracing calls alone are timed in this process, with no broker and no I/O:
a send's span (``Tracing.send_span``, fresh properties) and a listener call's span
(``Tracing.process_span``, properties carrying trace context), each with the attributes the SDK
gives one message, ``--calls`` times per mode (and ``sdk_unexported``: the SDK's batch processor
with an exporter that drops every batch, the cost of making spans without writing them) → µs per
call, a figure the machine's noise does not hide.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq.client import AsyncProducer, AsyncPushConsumer, ConsumeStatus, Message, MessageExt
from txmq.errors import TxmqError
from txmq.extras import require_extra
from txmq.serving import new_event_loop
from txmq.testing import BrokerProcess
from txmq.tracing import (
    MESSAGING_CLIENT_ID,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_PARTITION_ID,
    MESSAGING_MESSAGE_ID,
    MESSAGING_ROCKETMQ_MESSAGE_KEYS,
    MESSAGING_ROCKETMQ_MESSAGE_TYPE,
    Tracing,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["MODES", "bench_tracing", "tracing"]

MODES = ("off", "noop", "sdk")
_SEND_TOPIC, _CONSUME_TOPIC = "bench-trace-send", "bench-trace-consume"
SEND = "send"
_DRAIN_TIMEOUT_S = 120.0
"""Longest a consume run may take before the bench gives up (s)."""


def _tracings(spans_file: IO[str]) -> tuple[dict[str, Tracing], list[TracerProvider]]:
    """The modes' settings, and the SDK providers (the exporting one first) to shut down."""
    require_extra("otlp", "txmq bench tracing", "opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.trace import NoOpTracerProvider

    class _Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(
        out=spans_file, formatter=lambda span: span.to_json(indent=None) + "\n")))
    unexported = TracerProvider()
    unexported.add_span_processor(BatchSpanProcessor(_Dropped()))
    return ({"off": Tracing(enabled=False), "noop": Tracing(tracer_provider=NoOpTracerProvider()),
             "sdk": Tracing(tracer_provider=provider),
             "sdk_unexported": Tracing(tracer_provider=unexported)}, [provider, unexported])


def _call_costs(modes: dict[str, Tracing], calls: int) -> dict[str, dict[str, float]]:
    """µs per send span and per process span of each mode: :class:`Tracing`'s calls alone, with
    the attributes the SDK gives a send and a listener call of one message."""
    carried: dict[str, str] = {"UNIQ_KEY": "0" * 32}
    with modes["sdk"].send_span(SEND, _SEND_TOPIC, [carried]):
        pass
    send_attrs = {MESSAGING_CLIENT_ID: "bench", MESSAGING_MESSAGE_ID: "0" * 32,
                  MESSAGING_ROCKETMQ_MESSAGE_TYPE: "normal", MESSAGING_ROCKETMQ_MESSAGE_KEYS: ["k"]}
    process_attrs = {**send_attrs, MESSAGING_CONSUMER_GROUP_NAME: "bench",
                     MESSAGING_DESTINATION_PARTITION_ID: "1"}
    out: dict[str, dict[str, float]] = {}
    for m in (*MODES, "sdk_unexported"):
        tracing = modes[m]
        props = [{"UNIQ_KEY": "0" * 32} for _ in range(calls)]
        t0 = time.perf_counter()
        for p in props:
            with tracing.send_span(SEND, _SEND_TOPIC, [p], attributes=send_attrs):
                pass
        t1 = time.perf_counter()
        for _ in range(calls):
            with tracing.process_span("process", _SEND_TOPIC, [carried], attributes=process_attrs,
                                      ambient=False):
                pass
        t2 = time.perf_counter()
        out[m] = {"send_span_us": round((t1 - t0) / calls * 1e6, 2),
                  "process_span_us": round((t2 - t1) / calls * 1e6, 2)}
    return out


async def _send_run(p: AsyncProducer, topic: str, n: int, in_flight: int, body: bytes,
                    flush: Callable[[], object] = lambda: None) -> float:
    """Send ``n`` messages with ``in_flight`` outstanding, then ``flush()``; msgs/s."""
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await p.send(Message(topic=topic, body=body, keys=str(i)))

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    flush()
    return n / (time.perf_counter() - t0)


async def _consume_run(endpoints: str, group: str, n: int, tracing: Tracing,
                       flush: Callable[[], object] | None = None) -> float:
    """A new group reads ``n`` messages of the consume topic from its first offset; msgs/s from
    the first listener call to the last, or to the end of ``flush()`` (the group's start is left
    out)."""
    lock, done = threading.Lock(), threading.Event()
    calls: list[int] = []  # [count, first ns, last ns]

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        now = time.perf_counter_ns()
        with lock:
            if not calls:
                calls.extend((0, now, now))
            calls[0] += len(msgs)
            calls[2] = now
            if calls[0] >= n:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = AsyncPushConsumer(group, endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                          tracing=tracing)
    c.subscribe(_CONSUME_TOPIC)
    await c.start()
    try:
        if not await asyncio.to_thread(done.wait, _DRAIN_TIMEOUT_S):
            raise TxmqError(f"group {group} consumed {calls[0] if calls else 0} of {n} messages "
                            f"in {_DRAIN_TIMEOUT_S:.0f} s")
        end = calls[2]
        if flush is not None:
            flush()
            end = time.perf_counter_ns()
    finally:
        await c.shutdown()
    return (calls[0] - 1) / max(1e-9, (end - calls[1]) / 1e9)


async def _rounds(endpoints: str, modes: dict[str, Tracing], flush: Callable[[], object],
                  messages: int, rounds: int, in_flight: int,
                  body: bytes) -> dict[str, dict[str, list[float]]]:
    keys = ("send", "consume", "send_cpu_us", "consume_cpu_us", "send_side", "consume_side")
    runs: dict[str, dict[str, list[float]]] = {k: {m: [] for m in MODES} for k in keys}
    producers = {m: AsyncProducer(f"bench-trace-{m}", endpoints, tracing=modes[m]) for m in MODES}
    for p in producers.values():
        await p.start()
    try:
        await _send_run(producers["sdk"], _CONSUME_TOPIC, messages, in_flight, body)  # traced input
        for p in producers.values():
            await _send_run(p, _SEND_TOPIC, min(messages, 1000), in_flight, body)  # warm-up
        flush()
        tag = f"{os.getpid()}-{int(time.time())}"
        for r in range(rounds):
            for m in MODES[r % 3:] + MODES[:r % 3]:
                await _one_mode(runs, endpoints, producers[m], modes[m], m,
                                flush if m == "sdk" else None, f"bench-{m}-{r}-{tag}",
                                messages, in_flight, body)
            order = ("off", "noop") if r % 2 == 0 else ("noop", "off")
            await _side_by_side(runs, endpoints, producers, modes, order, f"{r}-{tag}", messages,
                                in_flight, body)
    finally:
        for p in producers.values():
            await p.shutdown()
    return runs


async def _one_mode(runs: dict[str, dict[str, list[float]]], endpoints: str, p: AsyncProducer,
                    tracing: Tracing, m: str, flush: Callable[[], object] | None, group: str,
                    messages: int, in_flight: int, body: bytes) -> None:
    """One mode's send run and consume run, alone on the machine's share of this process."""
    gc.collect()
    c0 = time.process_time()
    runs["send"][m].append(await _send_run(p, _SEND_TOPIC, messages, in_flight, body,
                                           flush or (lambda: None)))
    runs["send_cpu_us"][m].append((time.process_time() - c0) / messages * 1e6)
    gc.collect()
    c0 = time.process_time()
    runs["consume"][m].append(await _consume_run(endpoints, group, messages, tracing, flush))
    runs["consume_cpu_us"][m].append((time.process_time() - c0) / messages * 1e6)


async def _side_by_side(runs: dict[str, dict[str, list[float]]], endpoints: str,
                        producers: dict[str, AsyncProducer], modes: dict[str, Tracing],
                        order: tuple[str, ...], tag: str, messages: int, in_flight: int,
                        body: bytes) -> None:
    """``off`` and ``noop`` at the same time (two producers, then two consumer groups), so both
    see the same machine; ``order`` (alternated by round) is who starts first."""
    gc.collect()
    rates = await asyncio.gather(*(_send_run(producers[m], _SEND_TOPIC, messages, in_flight, body)
                                   for m in order))
    for m, rate in zip(order, rates, strict=True):
        runs["send_side"][m].append(rate)
    gc.collect()
    rates = await asyncio.gather(*(_consume_run(endpoints, f"bench-side-{m}-{tag}", messages,
                                                modes[m]) for m in order))
    for m, rate in zip(order, rates, strict=True):
        runs["consume_side"][m].append(rate)


def _figures(runs: dict[str, dict[str, list[float]]], calls: dict[str, dict[str, float]],
             spans_exported: int, messages: int, rounds: int) -> dict[str, Any]:
    fig: dict[str, Any] = {f"{kind}_{m}_us": calls[m][f"{kind}_us"]
                           for kind in ("send_span", "process_span") for m in calls}
    for kind in ("send", "consume"):
        med = {m: statistics.median(runs[kind][m]) for m in MODES}
        cpu = {m: statistics.median(runs[f"{kind}_cpu_us"][m]) for m in MODES}
        for m in MODES:
            fig[f"{kind}_{m}_msgs_per_s"] = round(med[m])
            fig[f"{kind}_{m}_client_cpu_us_per_msg"] = round(cpu[m], 1)
        for m in ("noop", "sdk"):
            paired = [x / o for x, o in zip(runs[kind][m], runs[kind]["off"], strict=True)]
            fig[f"{kind}_{m}_to_off"] = round(statistics.median(paired), 3)
            fig[f"{kind}_{m}_to_off_of_medians"] = round(med[m] / med["off"], 3)
        side = [n / o for n, o in zip(runs[f"{kind}_side"]["noop"], runs[f"{kind}_side"]["off"],
                                      strict=True)]
        fig[f"{kind}_noop_to_off_side_by_side"] = round(statistics.median(side), 3)
        fig[f"{kind}_noop_to_off_side_by_side_runs"] = [round(x, 3) for x in side]
    fig["runs_msgs_per_s"] = {k: {m: [round(v) for v in vs] for m, vs in runs[k].items()}
                              for k in ("send", "consume")}
    fig.update({"spans_exported": spans_exported, "messages": messages, "rounds": rounds})
    return fig


def bench_tracing(endpoints: str, work_dir: Path, messages: int = 10_000, rounds: int = 9,
                  in_flight: int = 64, body_bytes: int = 256,
                  calls: int = 20_000) -> dict[str, Any]:
    """Run the rounds against the broker at ``endpoints`` (topics ``bench-trace-send`` and
    ``bench-trace-consume`` must exist); returns the figures (rates in msgs/s, CPU in µs per
    message, ratios to ``off``). Raises MissingExtra without the OpenTelemetry SDK (``otlp``)."""
    spans_path = work_dir / "spans.jsonl"
    with open(spans_path, "w") as spans_file:
        modes, providers = _tracings(spans_file)
        provider = providers[0]
        costs = _call_costs(modes, calls)
        provider.force_flush()
        loop = new_event_loop()
        try:
            runs = loop.run_until_complete(_rounds(endpoints, modes, provider.force_flush,
                                                   messages, rounds, in_flight, b"x" * body_bytes))
        finally:
            loop.close()
            for p in providers:
                p.shutdown()  # flushes what the batch processor still holds
    with open(spans_path) as f:
        exported = sum(1 for _ in f)
    return _figures(runs, costs, exported, messages, rounds)


def tracing(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    messages: Annotated[int, typer.Option(help="Messages per send run and per consume run.")] = 10_000,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds; each runs every mode once.")] = 9,
    in_flight: Annotated[int, typer.Option(help="Sends outstanding.")] = 64,
    body_bytes: Annotated[int, typer.Option(help="Message body size.")] = 256,
    calls: Annotated[int, typer.Option(help="Timed tracing calls per mode (no broker).")] = 20_000,
) -> None:
    """Send and consume throughput with tracing off, with OpenTelemetry's no-op provider, and with
    the SDK's batch exporter to a file: medians of interleaved rounds, as ratios to off."""
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="txmq-bench-") as tmp:
        bp = BrokerProcess(Path(tmp) / "broker", {"topics": {_SEND_TOPIC: 4, _CONSUME_TOPIC: 4}})
        bp.start()
        try:
            fig = bench_tracing(bp.endpoints, Path(tmp), messages, rounds, in_flight, body_bytes,
                                calls)
        except TxmqError as exc:
            Console(stderr=True).print(f"[red]bench failed:[/red] {exc}")
            raise typer.Exit(1) from exc
        finally:
            bp.stop()
    table = Table("measure", *MODES, "noop / off", "sdk / off", title="txmq bench tracing")
    for kind in ("send", "consume"):
        table.add_row(f"{kind} msgs/s", *(f"{fig[f'{kind}_{m}_msgs_per_s']:,}" for m in MODES),
                      str(fig[f"{kind}_noop_to_off"]), str(fig[f"{kind}_sdk_to_off"]))
        table.add_row(f"{kind} client CPU µs/msg",
                      *(str(fig[f"{kind}_{m}_client_cpu_us_per_msg"]) for m in MODES), "", "")
        table.add_row(f"{kind}, off and noop side by side", "", "", "",
                      str(fig[f"{kind}_noop_to_off_side_by_side"]), "")
    for kind in ("send_span", "process_span"):
        table.add_row(f"{kind} call µs (no broker)", *(str(fig[f"{kind}_{m}_us"]) for m in MODES),
                      "", f"unexported: {fig[f'{kind}_sdk_unexported_us']}")
    Console().print(table)
    print(json.dumps(fig))
    if json_path is not None:
        json_path.write_text(json.dumps(fig, indent=2) + "\n")
