"""``txmq.tracing`` without a broker: propagation through message properties, the span helpers'
kinds, parents and links (OpenTelemetry messaging conventions), errors, and what happens when
OpenTelemetry is off, not in use or not imported. Spans go to the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from tracing_helpers import spans

import txmq.tracing as tr
from txmq.errors import RemoteError, ResponseCode
from txmq.tracing import TRACEPARENT, Tracing

REMOTE = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
                     trace_flags=TraceFlags(TraceFlags.SAMPLED))
REMOTE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_send_span_is_the_creation_context_it_writes_into_the_message(
        tracing: Tracing, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    props: dict[str, str] = {"KEYS": "k"}
    with provider.get_tracer("app").start_as_current_span("business") as business, \
            tracing.send_span("send", "orders", [props]) as span:
        assert span is not None and trace.get_current_span() is span
    s = spans(exporter)["send orders"]
    assert s.kind is SpanKind.PRODUCER
    assert s.parent is not None and s.parent.span_id == business.get_span_context().span_id
    assert dict(s.attributes or {}) == {"messaging.system": "rocketmq",
                                        "messaging.operation.type": "send",
                                        "messaging.operation.name": "send",
                                        "messaging.destination.name": "orders"}
    ctx = s.get_span_context()
    assert props[TRACEPARENT] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert props["KEYS"] == "k"


def test_a_message_with_a_creation_context_keeps_it_and_the_send_span_links_to_it(
        tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    props = {TRACEPARENT: REMOTE_PARENT}
    with tracing.send_span("publish", "q", [props], system="rabbitmq"):
        pass
    s = spans(exporter)["publish q"]
    assert s.kind is SpanKind.CLIENT  # not the creation context (messaging-spans.md, "Span kind")
    assert props == {TRACEPARENT: REMOTE_PARENT}
    assert [link.context.span_id for link in s.links] == [REMOTE.span_id]
    assert (s.attributes or {})["messaging.system"] == "rabbitmq"


def test_a_process_span_of_one_message_continues_its_trace_unless_in_another_span(
        tracing: Tracing, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    props = {TRACEPARENT: REMOTE_PARENT}
    with tracing.process_span("process", "orders", [props], ambient=False):
        pass
    with provider.get_tracer("app").start_as_current_span("http request") as ambient:
        with tracing.process_span("apply", "orders", [props]):
            pass
        with tracing.process_span("ignored ambient", None, [props], ambient=False):
            pass
    s = spans(exporter)
    alone, inside, ignored = s["process orders"], s["apply orders"], s["ignored ambient"]
    assert alone.kind is SpanKind.CONSUMER
    assert alone.parent is not None and alone.parent.span_id == REMOTE.span_id
    assert alone.context.trace_id == REMOTE.trace_id
    assert inside.parent is not None and inside.parent.span_id == ambient.get_span_context().span_id
    assert ignored.parent is not None and ignored.parent.span_id == REMOTE.span_id
    for span in (alone, inside, ignored):
        assert [link.context.span_id for link in span.links] == [REMOTE.span_id]


def test_a_batch_or_parent_from_message_false_starts_a_new_linked_trace(
        provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    with Tracing(tracer_provider=provider).process_span(
            "process", "orders", [{TRACEPARENT: REMOTE_PARENT}, {TRACEPARENT: other}, {}]):
        pass
    with Tracing(tracer_provider=provider, parent_from_message=False).process_span(
            "single", None, [{TRACEPARENT: REMOTE_PARENT}]):
        pass
    batch, single = spans(exporter)["process orders"], spans(exporter)["single"]
    assert batch.parent is None and batch.kind is SpanKind.CONSUMER
    assert [link.context.span_id for link in batch.links] == [REMOTE.span_id, 0x2222222222222222]
    assert single.parent is None and single.context.trace_id != REMOTE.trace_id
    assert [link.context.span_id for link in single.links] == [REMOTE.span_id]


def test_links_stop_at_the_limit(tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    many = [{TRACEPARENT: f"00-{i + 1:032x}-{i + 1:016x}-01"} for i in range(tr.TRACE_LINKS_MAX + 5)]
    with tracing.process_span("process", "t", many, ambient=False):
        pass
    tracing.receive_span("poll", "t", many, time.time_ns())
    s = spans(exporter)
    assert s["process t"].parent is None
    assert len(s["process t"].links) == len(s["poll t"].links) == tr.TRACE_LINKS_MAX


def test_a_receive_span_starts_when_asked_and_links_each_message(
        tracing: Tracing, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    started = time.time_ns() - 5_000_000
    with provider.get_tracer("app").start_as_current_span("job") as job:
        tracing.receive_span("poll", "orders", [{TRACEPARENT: REMOTE_PARENT}, {}], started,
                             attributes={tr.MESSAGING_BATCH_MESSAGE_COUNT: 2})
    s = spans(exporter)["poll orders"]
    assert s.kind is SpanKind.CLIENT and s.start_time == started
    assert s.parent is not None and s.parent.span_id == job.get_span_context().span_id
    assert [link.context.span_id for link in s.links] == [REMOTE.span_id]
    assert (s.attributes or {})["messaging.operation.type"] == "receive"


def test_an_exception_marks_the_span_failed_and_goes_on(
        tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    with pytest.raises(RemoteError), tracing.settle_span("end_transaction", "orders"):
        raise RemoteError.of(ResponseCode.TOPIC_NOT_EXIST, "no route")
    with pytest.raises(ValueError, match="bad"), tracing.internal_span("local"):
        raise ValueError("bad")
    s = spans(exporter)
    assert s["end_transaction orders"].status.status_code is StatusCode.ERROR
    assert (s["end_transaction orders"].attributes or {})["error.type"] == "TOPIC_NOT_EXIST"
    assert (s["local"].attributes or {})["error.type"] == "ValueError"
    assert trace.get_current_span() is trace.INVALID_SPAN  # every scope was left


def test_set_error_marks_a_span_without_an_exception(
        tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    with tracing.process_span("process", "t", [], ambient=False) as span:
        tr.set_error(span, "RECONSUME_LATER", "listener returned RECONSUME_LATER")
    tr.set_error(None, "ignored")
    s = spans(exporter)["process t"]
    assert s.status.status_code is StatusCode.ERROR
    assert s.status.description == "listener returned RECONSUME_LATER"


def test_extract_reads_only_the_message_never_the_current_span(
        tracing: Tracing, provider: TracerProvider) -> None:
    with provider.get_tracer("app").start_as_current_span("current"):
        assert tracing.extract({}) is None
        assert tracing.extract({TRACEPARENT: "garbage"}) is None
        ctx = tracing.extract({TRACEPARENT: REMOTE_PARENT})
    assert ctx is not None and trace.get_current_span(ctx).get_span_context() == REMOTE


def test_off_means_no_span_and_no_property(provider: TracerProvider,
                                           exporter: InMemorySpanExporter) -> None:
    off = Tracing(tracer_provider=provider, enabled=False)
    props: dict[str, str] = {}
    with provider.get_tracer("app").start_as_current_span("business"):
        with off.send_span("send", "t", [props]) as span:
            assert span is None
        assert not off.inject(props) and off.extract({TRACEPARENT: REMOTE_PARENT}) is None
    assert props == {}
    assert [s.name for s in exporter.get_finished_spans()] == ["business"]
    assert Tracing.of(False).enabled is False and Tracing.of(True).enabled is True
    assert Tracing.of(off) is off


def test_the_api_alone_makes_no_span_but_passes_a_valid_context_on() -> None:
    api_only = Tracing(tracer_provider=trace.NoOpTracerProvider())
    assert not api_only.active and api_only.propagates
    with trace.use_span(NonRecordingSpan(REMOTE)):
        props: dict[str, str] = {}
        with api_only.send_span("send", "t", [props]) as span:
            assert span is None
        assert props[TRACEPARENT] == REMOTE_PARENT
    empty: dict[str, str] = {}
    with api_only.send_span("send", "t", [empty]):
        pass
    assert empty == {}  # no valid context: nothing written


def test_error_type_names() -> None:
    assert tr.error_type(RemoteError.of(ResponseCode.SYSTEM_BUSY, "")) == "SYSTEM_BUSY"
    assert tr.error_type(RemoteError(99_999, "")) == "99999"
    assert tr.error_type(KeyError("x")) == "KeyError"
    assert tr.error_type(subprocess.TimeoutExpired("x", 1)) == "subprocess.TimeoutExpired"


def test_nothing_is_imported_or_written_until_the_application_imports_opentelemetry() -> None:
    code = textwrap.dedent("""
        import sys
        import txmq.client, txmq.tracing
        t = txmq.tracing.Tracing()
        props = {}
        with t.send_span("send", "t", [props]) as span:
            assert span is None
        assert not t.propagates and not t.active and props == {}
        assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported"
        assert txmq.tracing.available()
        import opentelemetry.trace
        assert t.propagates and not t.active  # the API's proxy provider: no span
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
