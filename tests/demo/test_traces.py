"""The demo's trace file, without a broker: spans written as OTLP JSON lines by the SDK's batch
processor read back whole (ids in hex, kinds, attributes, status, links, service), lines of two
processes appending to one file never interleave, the order sampler's choices, trees and
summaries, the example trace, and ``txmq trace list / show`` (a Rich tree, an HTML page)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from typer.testing import CliRunner

from txmq.cli import app
from txmq.demo._faults import Fault, fault_of
from txmq.demo._otlp import OrderSampler, OtlpJsonLinesExporter
from txmq.demo.traces import (
    ORDER_KEY,
    TRACE_SAMPLE_EVERY,
    build_tree,
    example_trace,
    parse_line,
    read_spans,
    summarize,
)


def provider_to(path: Path, service: str) -> TracerProvider:
    p = TracerProvider(resource=Resource.create({"service.name": service}))
    p.add_span_processor(SimpleSpanProcessor(OtlpJsonLinesExporter(path)))
    return p


def test_spans_written_as_otlp_json_lines_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    p = provider_to(path, "shop")
    tracer = p.get_tracer("t")
    with tracer.start_as_current_span("place order 7", attributes={ORDER_KEY: 7}) as root, \
            tracer.start_as_current_span("send orders", kind=SpanKind.PRODUCER, attributes={
                "messaging.rocketmq.message.keys": ["7", "x"], "ratio": 0.5, "ok": True}) as send:
        send.set_status(Status(StatusCode.ERROR, "broker busy"))
    with tracer.start_as_current_span("linked", links=[Link(root.get_span_context())]):
        pass
    p.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 3  # one export per span with the simple processor
    doc = json.loads(lines[0])  # the OTLP/JSON encoding: hex ids, integer enums
    raw = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert raw["kind"] == 4 and len(raw["traceId"]) == 32 and len(raw["spanId"]) == 16
    int(raw["traceId"], 16)
    spans = {s.name: s for s in read_spans([path])}
    rc = root.get_span_context()
    r, s, linked = spans["place order 7"], spans["send orders"], spans["linked"]
    assert (r.trace_id, r.span_id, r.parent_id) == (f"{rc.trace_id:032x}", f"{rc.span_id:016x}", "")
    assert s.parent_id == r.span_id and s.kind == "PRODUCER" and r.kind == "INTERNAL"
    assert s.attributes == {"messaging.rocketmq.message.keys": ["7", "x"], "ratio": 0.5, "ok": True}
    assert r.attributes == {ORDER_KEY: 7} and s.service == "shop"
    assert s.error and s.status_message == "broker busy" and not r.error
    assert linked.links == ((r.trace_id, r.span_id),) and linked.trace_id != r.trace_id
    assert s.start_ns >= r.start_ns and s.end_ns <= r.end_ns and s.duration_ns > 0
    assert [x.name for x in read_spans([path], r.trace_id.upper())] == ["send orders", "place order 7"]


def test_two_processes_appending_to_one_file_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    writer = textwrap.dedent(f"""
        from pathlib import Path
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from txmq.demo._otlp import OtlpJsonLinesExporter
        import sys
        p = TracerProvider(resource=Resource.create({{"service.name": sys.argv[1]}}))
        p.add_span_processor(BatchSpanProcessor(OtlpJsonLinesExporter(Path({str(path)!r})),
                                                max_export_batch_size=64, schedule_delay_millis=5))
        t = p.get_tracer("w")
        for i in range(1500):
            with t.start_as_current_span("span " + str(i), attributes={{"pad": "x" * 300}}):
                pass
        p.shutdown()
        """)
    procs = [subprocess.Popen([sys.executable, "-c", writer, f"w{i}"]) for i in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    for line in path.read_text().splitlines():
        parse_line(line)  # raises on a torn or interleaved line
    counts = {t.trace_id: t.services for t in summarize(read_spans([path]))}
    assert len(counts) == 4500
    by_service = [s.service for s in read_spans([path])]
    assert sorted(set(by_service)) == ["w0", "w1", "w2"] and len(by_service) == 4500


def test_a_torn_line_is_skipped_and_the_rest_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "traces.jsonl"
    p = provider_to(path, "s")
    with p.get_tracer("t").start_as_current_span("kept"):
        pass
    p.shutdown()
    with path.open("a") as f:
        f.write('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"ab"')  # killed mid-write
    # (caplog's handler sits on the root logger; a test that ran before may have configured the
    # txmq loggers not to propagate, as the CLI does, so it listens on this logger itself)
    logger = logging.getLogger("txmq.demo.traces")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="txmq.demo.traces"):
            assert [s.name for s in read_spans([path])] == ["kept"]
    finally:
        logger.removeHandler(caplog.handler)
    assert "skipped" in caplog.text
    with pytest.raises(ValueError, match="not an OTLP JSON line"):
        parse_line('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "no ids"}]}]}]}')


def test_the_order_sampler_keeps_every_rare_fault_and_a_share_of_the_rest() -> None:
    sampler = OrderSampler(ORDER_KEY, TRACE_SAMPLE_EVERY)

    def kept(key: int) -> bool:
        r = sampler.should_sample(None, 1, "place order", attributes={ORDER_KEY: key})
        return r.decision is Decision.RECORD_AND_SAMPLE

    keys = range(1, 200_001)
    by_fault: dict[Fault, list[bool]] = {}
    for k in keys:
        by_fault.setdefault(fault_of(k), []).append(kept(k))
    for fault in (Fault.UNKNOWN_REJECT, Fault.CRASH_AFTER_COMMIT, Fault.CRASH_BEFORE_COMMIT):
        assert all(by_fault[fault])
    for fault, every in TRACE_SAMPLE_EVERY.items():
        share = sum(by_fault[fault]) / len(by_fault[fault])
        assert 0.5 / every < share < 1.5 / every, (fault, share)
    assert sampler.should_sample(None, 1, "send").decision is Decision.RECORD_AND_SAMPLE  # no order


def test_unknown_reject_orders_are_a_fifth_of_a_percent() -> None:
    faults = [fault_of(k) for k in range(1, 100_001)]
    assert 0.0015 < faults.count(Fault.UNKNOWN_REJECT) / len(faults) < 0.0025


def write_order_trace(path: Path, key: int, *, check_back: bool, compensated: bool) -> str:
    """One order's trace, as the demo's processes write it (names only), in three services."""
    spans = [provider_to(path, service) for service in ("order-service", "ledger", "comp")]
    tracer = spans[0].get_tracer("t")
    with tracer.start_as_current_span(f"place order {key}", attributes={ORDER_KEY: key}) as root:
        for name in ["send_message_in_transaction orders"] + (
                ["check_transaction_state orders"] if check_back else []):
            with tracer.start_as_current_span(name):
                pass
        with spans[1].get_tracer("t").start_as_current_span("process orders"), \
                spans[1].get_tracer("t").start_as_current_span("apply orders"):
            pass
        if compensated:
            with spans[2].get_tracer("t").start_as_current_span("compensate orders-rollback"):
                pass
    for p in spans:
        p.shutdown()
    return f"{root.get_span_context().trace_id:032x}"


def test_trees_summaries_and_the_example_trace(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    write_order_trace(path, 1, check_back=True, compensated=False)
    write_order_trace(path, 2, check_back=False, compensated=True)
    both = write_order_trace(path, 3, check_back=True, compensated=True)
    assert example_trace([path]) == (both, 3)
    spans = list(read_spans([path], both))
    (root,) = build_tree(spans)
    assert root.span.name == "place order 3"
    assert [c.span.name for c in root.children] == [
        "send_message_in_transaction orders", "check_transaction_state orders", "process orders",
        "compensate orders-rollback"]
    assert [c.span.name for c in root.children[2].children] == ["apply orders"]
    orphans = build_tree([s for s in spans if s.name != "place order 3"])  # the root was lost
    assert [n.span.name for n in orphans] == [c.span.name for c in root.children]
    assert [c.span.name for c in orphans[2].children] == ["apply orders"]
    (summary,) = [t for t in summarize(read_spans([path])) if t.trace_id == both]
    assert (summary.root_name, summary.spans, summary.errors) == ("place order 3", 6, 0)
    assert summary.services == {"order-service", "ledger", "comp"}
    assert example_trace([tmp_path / "traces.jsonl"]) is not None
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert example_trace([empty]) is None


def test_txmq_trace_list_and_show(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    tid = write_order_trace(path, 9, check_back=True, compensated=True)
    write_order_trace(path, 10, check_back=False, compensated=False)
    runner = CliRunner()
    listed = runner.invoke(app, ["trace", "list", str(path)], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and tid in listed.stdout and "place order 10" in listed.stdout
    shown = runner.invoke(app, ["trace", "show", str(path), "--trace-id", tid], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.stdout
    lines = shown.stdout.splitlines()
    assert any("place order 9" in ln for ln in lines)
    (apply_line,) = [ln for ln in lines if "apply orders" in ln]
    (process_line,) = [ln for ln in lines if "process orders" in ln]
    assert apply_line.index("apply") > process_line.index("process")  # nested under it
    page = tmp_path / "trace.html"
    made = runner.invoke(app, ["trace", "show", str(path), "--trace-id", tid, "--html", str(page),
                               "--title", "Order <9>"])
    assert made.exit_code == 0
    html = page.read_text()
    assert "<h1>Order &lt;9&gt;</h1>" in html and html.count('class="bar"') == 6
    assert "compensate orders-rollback" in html and "comp" in html
    missing = runner.invoke(app, ["trace", "show", str(path), "--trace-id", "0" * 32])
    assert missing.exit_code == 1
