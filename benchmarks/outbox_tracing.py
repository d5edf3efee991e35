"""What tracing costs the outbox relay (issue #28): events/s of one relay draining committed
outbox events to a real txmq broker process, in one run, the modes interleaved round by round:

* ``off``: ``tracing=False``;
* ``noop``: OpenTelemetry's no-op tracer provider (the trace context carried through, no span);
* ``sdk-discard``: the SDK's batch span processor, its exporter dropping every batch (the spans'
  own cost);
* ``sdk-file``: the same exporting to a file as OTLP JSON lines (the demo's exporter,
  ``txmq.demo._otlp.OtlpJsonLinesExporter``: the OTLP encoder and protobuf's JSON printer).

Each round and mode: ``--events`` 1 KiB events put (in transactions of 500; with tracing on, each
row carries a sampled trace context, as under a traced business span), then one relay (default
``RelayConfig``, its own ``Producer`` traced the same way) started and timed until every event is
marked sent; with the SDK, until its spans are exported too (``force_flush``). Prints each mode's
median events/s, its ratio to tracing off, the median over rounds of its ratio to the same
round's ``off``, and this process's CPU time per event (the relay's side: steadier than
throughput on a busy machine), as a table and as JSON::

    uv run --locked python benchmarks/outbox_tracing.py [--events 5000] [--rounds 5] [--db sqlite|URL]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, NoOpTracerProvider, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from txmq import outbox as ob
from txmq.client import Message, Producer
from txmq.demo._otlp import OtlpJsonLinesExporter
from txmq.demo.traces import read_spans
from txmq.testing import run_broker
from txmq.tracing import Tracing

BODY = b"x" * 1024
TOPIC = "bench-tracing"
PUT_TX_ROWS = 500
MODES = ("off", "noop", "sdk-discard", "sdk-file")
QUEUE_SPANS_MAX = 65_536
"""The batch processor's queue: room for a whole round's spans (the SDK's default, 2,048, would
drop most of them, and with them their export's cost)."""
_PARENT = SpanContext(0x5EED << 64 | 1, 0xBEEF, is_remote=True, trace_flags=TraceFlags(1))
"""The sampled trace context the rows carry when tracing is on."""


def _prefill(engine: sa.Engine, tables: ob.OutboxTables, n: int, traced: bool) -> None:
    put_tracing = Tracing(tracer_provider=NoOpTracerProvider()) if traced else Tracing(enabled=False)
    scope: AbstractContextManager[object] = (trace.use_span(NonRecordingSpan(_PARENT)) if traced
                                             else nullcontext())
    with scope:
        for start in range(0, n, PUT_TX_ROWS):
            with engine.begin() as conn:
                for i in range(start, min(n, start + PUT_TX_ROWS)):
                    ob.put_message(conn, Message(topic=TOPIC, body=BODY), "BENCH", str(i), "bench",
                                   tables=tables, tracing=put_tracing)


@contextmanager
def _mode(name: str, trace_file: Path) -> Iterator[tuple[Tracing, Callable[[], None]]]:
    """The mode's Tracing, and what to wait for after the drain (the SDK's export)."""
    if name == "off":
        yield Tracing(enabled=False), lambda: None
        return
    if name == "noop":
        yield Tracing(tracer_provider=NoOpTracerProvider()), lambda: None
        return
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-relay"}))
    exporter = OtlpJsonLinesExporter(trace_file) if name == "sdk-file" else _Discard()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=QUEUE_SPANS_MAX))
    try:
        yield Tracing(tracer_provider=provider), lambda: provider.force_flush()
    finally:
        provider.shutdown()


class _Discard(SpanExporter):
    """Drops every batch: the spans are made and batched, never encoded."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def drain_rate(engine: sa.Engine, endpoints: str, n: int, mode: str,
               trace_file: Path) -> tuple[float, float]:
    """``(events/s, CPU µs/event)`` of one relay moving ``n`` prefilled events to
    PRODUCE_PROCESSED in ``mode``: the CPU time of this process (the relay's thread, the
    producer's event loop, the span processor's thread; not the broker's)."""
    tables = ob.make_tables(f"bench{uuid.uuid4().hex[:8]}_")
    ob.init_db(engine, tables)
    metrics = ob.OutboxMetrics(CollectorRegistry())
    try:
        _prefill(engine, tables, n, mode != "off")
        with _mode(mode, trace_file) as (tracing, flush), \
                Producer(f"bench-tracing-{mode}", endpoints, tracing=tracing) as producer:
            producer.send(Message(topic=TOPIC, body=b""))  # connect and learn the route first
            relay = ob.Relay(engine, producer, tables=tables, metrics=metrics, tracing=tracing)
            t0, cpu0 = time.perf_counter(), time.process_time()
            relay.start()
            while (metrics.registry.get_sample_value("txmq_outbox_events_sent_total",
                                                     {"table": tables.outbox.name}) or 0) < n:
                time.sleep(0.002)
            flush()
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            relay.stop()
        return n / elapsed, cpu / n * 1e6
    finally:
        ob.drop_tables(engine, tables)


def run(events: int, rounds: int, db: str, console: Console) -> dict[str, Any]:
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="txmq-bench-tracing-") as tmp, \
            run_broker(Path(tmp) / "broker", topics={TOPIC: 4}) as broker:
        engine = (ob.create_sqlite_engine(Path(tmp) / "bench.db") if db == "sqlite"
                  else sa.create_engine(db, pool_size=4))
        trace_file = Path(tmp) / "spans.jsonl"
        for r in range(rounds):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]  # rotate who goes first
            for mode in order:
                rate, us = drain_rate(engine, broker.endpoints, events, mode, trace_file)
                rates[mode].append(rate)
                cpu[mode].append(us)
                console.print(f"round {r + 1} {mode}: {rate:,.0f} events/s, {us:,.0f} µs CPU/event")
        spans = sum(1 for _ in read_spans([trace_file]))
        engine.dispose()
    med = {m: statistics.median(v) for m, v in rates.items()}
    paired = {m: statistics.median(x / o for x, o in zip(v, rates["off"], strict=True))
              for m, v in rates.items()}
    return {"events": events, "rounds": rounds, "db": db.split("://")[0],
            "events_per_s_median": {m: round(v, 1) for m, v in med.items()},
            "events_per_s": {m: [round(x, 1) for x in v] for m, v in rates.items()},
            "ratio_to_off": {m: round(v / med["off"], 3) for m, v in med.items()},
            "ratio_to_off_same_round_median": {m: round(v, 3) for m, v in paired.items()},
            "cpu_us_per_event_median": {m: round(statistics.median(v), 1) for m, v in cpu.items()},
            "cpu_ratio_to_off": {m: round(statistics.median(v) / statistics.median(cpu["off"]), 3)
                                 for m, v in cpu.items()},
            "spans_exported": spans,
            "spans_expected": rounds * (1 + events + math.ceil(events / ob.RelayConfig().batch_size))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--db", default="sqlite", help="sqlite (a temporary file) or a SQLAlchemy URL")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args()
    console = Console()
    out = run(a.events, a.rounds, a.db, console)
    table = Table("tracing", "events/s (median)", "÷ off (medians)", "÷ off (median of rounds)",
                  "CPU µs/event", "CPU ÷ off",
                  title=f"one relay, {a.events:,} events of 1 KiB, {a.rounds} interleaved rounds, "
                        f"{out['db']}")
    for m in MODES:
        table.add_row(m, f"{out['events_per_s_median'][m]:,.0f}", f"{out['ratio_to_off'][m]:.3f}",
                      f"{out['ratio_to_off_same_round_median'][m]:.3f}",
                      f"{out['cpu_us_per_event_median'][m]:,.0f}", f"{out['cpu_ratio_to_off'][m]:.2f}")
    console.print(table)
    console.print(f"spans in the file: {out['spans_exported']:,} of {out['spans_expected']:,} (a relay "
                  f"span per event, the producer's send span per batch and its first send)")
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
