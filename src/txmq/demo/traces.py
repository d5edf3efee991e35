"""The demo's traces (docs/tracing.md, "The demo's trace"): every process of a run (order
service producers, ledgers, the compensator) exports its OpenTelemetry spans as OTLP JSON lines
to one file, ``<run dir>/traces.jsonl``; this module starts that export in a process and reads
such files back (any OTLP JSON lines file: the OpenTelemetry Collector's file exporter writes
the same) as spans, traces and trees, for ``txmq trace`` and the demo's report.

Reading is pure: no OpenTelemetry import. Exporting needs the extra ``otlp``
(opentelemetry-sdk, and the OTLP exporter's encoder); without it a process runs untraced.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from txmq.demo._faults import Fault

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "ORDER_KEY",
    "TRACE_FILE_NAME",
    "TRACE_LINE_MAX_BYTES",
    "TRACE_SAMPLE_EVERY",
    "SpanNode",
    "SpanRecord",
    "TraceSummary",
    "build_tree",
    "example_trace",
    "parse_line",
    "read_spans",
    "start_tracing",
    "summarize",
    "tracing_available",
]

log = logging.getLogger("txmq.demo.traces")

TRACE_FILE_NAME: Final = "traces.jsonl"
"""The run directory's trace file."""
ORDER_KEY: Final = "txmq.demo.order_key"
"""Attribute of an order's root span (``place order <key>``): the TPC-H order key."""
TRACE_SAMPLE_EVERY: Final = {Fault.NONE: 100, Fault.ROLLBACK: 10, Fault.UNKNOWN: 10,
                              Fault.LEDGER_REJECT: 10}
"""Orders traced, 1 in this many by order key, per fault; the rare ones (a producer killed, an
UNKNOWN order the ledger rejects: the traces with every leg) always. Exporting every order's
spans as OTLP JSON costs more CPU than making them (protobuf's JSON printer is pure Python;
docs/benchmarks.md, "The demo's trace")."""
TRACE_LINE_MAX_BYTES: Final = 64 * 1024 * 1024
"""Longest line the reader accepts (one export of at most the SDK's 512 spans is well under a
megabyte); a longer one is skipped as damaged."""
KINDS: Final = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
"""OTLP ``Span.SpanKind`` values, by number."""
_STATUS_ERROR: Final = 2


def tracing_available() -> bool:
    """Whether this environment can export the demo's spans: opentelemetry-sdk and the OTLP
    exporter's encoder (extra ``otlp``) are installed. Imports nothing."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in (
            "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.common"))
    except ModuleNotFoundError:
        return False


def start_tracing(path: Path, service_name: str) -> TracerProvider | None:
    """Export this process's spans to ``path`` (OTLP JSON lines, appended) through an SDK tracer
    provider made global, sampling orders by :data:`TRACE_SAMPLE_EVERY`; returns
    it (``shutdown()`` flushes), or None without the extra ``otlp`` (logged)."""
    try:
        from txmq.demo._otlp import install
    except ModuleNotFoundError as exc:
        log.warning("not tracing: %s is not installed (pip install 'txmq[otlp]')", exc.name)
        return None
    return install(path, service_name, ORDER_KEY, TRACE_SAMPLE_EVERY)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One span of a trace file.

    Attributes:
        trace_id, span_id, parent_id: hex; ``parent_id`` "" for a root.
        kind: ``INTERNAL``, ``SERVER``, ``CLIENT``, ``PRODUCER`` or ``CONSUMER``.
        start_ns, end_ns: ns since the epoch.
        service: the resource's ``service.name``.
        attributes: name → str, int, float, bool or a list of them.
        error: status ERROR; ``status_message`` its description.
        links: ``(trace_id, span_id)`` of each link.
    """

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any]
    error: bool
    status_message: str
    links: tuple[tuple[str, str], ...]

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


def _value(v: dict[str, Any]) -> Any:
    """An OTLP ``AnyValue`` as a Python value (64-bit integers arrive as strings)."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", ())]
    return None


def _attributes(kvs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: _value(kv.get("value", {})) for kv in kvs}


def _span(s: dict[str, Any], service: str) -> SpanRecord:
    kind = int(s.get("kind", 0))
    status = s.get("status", {})
    return SpanRecord(
        trace_id=s["traceId"], span_id=s["spanId"], parent_id=s.get("parentSpanId", ""),
        name=s.get("name", ""), kind=KINDS[kind] if 0 <= kind < len(KINDS) else str(kind),
        start_ns=int(s.get("startTimeUnixNano", 0)), end_ns=int(s.get("endTimeUnixNano", 0)),
        service=service, attributes=_attributes(s.get("attributes", ())),
        error=int(status.get("code", 0)) == _STATUS_ERROR, status_message=status.get("message", ""),
        links=tuple((link["traceId"], link["spanId"]) for link in s.get("links", ())))


def parse_line(line: str | bytes) -> list[SpanRecord]:
    """The spans of one OTLP JSON line (an ``ExportTraceServiceRequest``).

    Raises:
        ValueError: not JSON, or not that shape (a span without ``traceId`` / ``spanId``).
    """
    try:
        doc = json.loads(line)
        out: list[SpanRecord] = []
        for resource in doc.get("resourceSpans", ()):
            attrs = _attributes(resource.get("resource", {}).get("attributes", ()))
            service = str(attrs.get("service.name", ""))
            for scope in resource.get("scopeSpans", ()):
                out.extend(_span(s, service) for s in scope.get("spans", ()))
        return out
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"not an OTLP JSON line: {exc!r}") from None


def read_spans(paths: Sequence[Path], trace_id: str | None = None) -> Iterator[SpanRecord]:
    """Every span of the files ``paths`` (OTLP JSON lines), or of trace ``trace_id`` only. A line
    that does not parse (a process killed mid-write, a line over ``TRACE_LINE_MAX_BYTES``) is
    skipped and logged. Raises OSError for a file that cannot be read."""
    want = trace_id.lower() if trace_id else None
    for path in paths:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if len(line) > TRACE_LINE_MAX_BYTES or (want and want.encode() not in line):
                    if len(line) > TRACE_LINE_MAX_BYTES:
                        log.warning("%s:%d: a line of %d bytes skipped", path, n, len(line))
                    continue
                try:
                    spans = parse_line(line)
                except ValueError as exc:
                    log.warning("%s:%d: skipped: %s", path, n, exc)
                    continue
                yield from (s for s in spans if want is None or s.trace_id == want)


@dataclass
class TraceSummary:
    """One trace of a file: its root span's name (the earliest span without a parent in the
    trace), span count, time range (ns), spans with status ERROR, and services."""

    trace_id: str
    root_name: str = ""
    spans: int = 0
    start_ns: int = 0
    end_ns: int = 0
    errors: int = 0
    services: set[str] = field(default_factory=set)
    _root_start_ns: int = 0

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


def summarize(spans: Iterable[SpanRecord]) -> list[TraceSummary]:
    """A summary per trace, in order of first start."""
    out: dict[str, TraceSummary] = {}
    for s in spans:
        t = out.get(s.trace_id)
        if t is None:
            t = out[s.trace_id] = TraceSummary(s.trace_id, start_ns=s.start_ns, end_ns=s.end_ns)
        t.spans += 1
        t.errors += s.error
        t.services.add(s.service)
        t.start_ns, t.end_ns = min(t.start_ns, s.start_ns), max(t.end_ns, s.end_ns)
        if not s.parent_id and (not t.root_name or s.start_ns < t._root_start_ns):
            t.root_name, t._root_start_ns = s.name, s.start_ns
    return sorted(out.values(), key=lambda t: t.start_ns)


@dataclass
class SpanNode:
    """A span and its children (by start time) in a trace tree."""

    span: SpanRecord
    children: list[SpanNode] = field(default_factory=list)


def build_tree(spans: Iterable[SpanRecord]) -> list[SpanNode]:
    """The trees of one trace's spans: roots are spans without a parent, or whose parent is not
    among ``spans`` (lost with a killed process, or recorded elsewhere); each level by start
    time. A span id seen twice keeps its first record."""
    nodes: dict[str, SpanNode] = {}
    for s in spans:
        nodes.setdefault(s.span_id, SpanNode(s))
    roots: list[SpanNode] = []
    for node in nodes.values():
        parent = nodes.get(node.span.parent_id) if node.span.parent_id else None
        (parent.children if parent is not None else roots).append(node)
    for node in nodes.values():
        node.children.sort(key=lambda n: n.span.start_ns)
    return sorted(roots, key=lambda n: n.span.start_ns)


def example_trace(paths: Sequence[Path]) -> tuple[str, int] | None:
    """``(trace id, order key)`` of an order whose trace holds a check-back and a compensation
    (the demo's ``unknown_reject`` orders: UNKNOWN, committed by a check-back, rejected by the
    ledger, cancelled upstream), the one with the most spans; None when the files hold none."""
    roots: dict[str, int] = {}
    marks: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for s in read_spans(paths):
        counts[s.trace_id] = counts.get(s.trace_id, 0) + 1
        key = s.attributes.get(ORDER_KEY)
        if not s.parent_id and isinstance(key, int):
            roots[s.trace_id] = key
        for mark in ("check_transaction_state ", "compensate "):
            if s.name.startswith(mark):
                marks.setdefault(s.trace_id, set()).add(mark)
    found = [t for t, m in marks.items() if len(m) == 2 and t in roots]
    if not found:
        return None
    best = max(found, key=lambda t: (counts[t], t))
    return best, roots[best]
