"""Helpers of the tracing tests: finished spans by name, and spans written to a file by another
process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def spans(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """Finished spans by name (the last of a name wins)."""
    return {s.name: s for s in exporter.get_finished_spans()}


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """Every finished span called ``name``, in the order they ended."""
    return [s for s in exporter.get_finished_spans() if s.name == name]


def span_record(s: ReadableSpan) -> dict[str, Any]:
    """A span as JSON-able fields (ids as hex), to pass between processes."""
    ctx = s.get_span_context()
    return {"name": s.name, "kind": s.kind.name, "trace_id": f"{ctx.trace_id:032x}",
            "span_id": f"{ctx.span_id:016x}",
            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
            "links": [f"{link.context.span_id:016x}" for link in s.links],
            "attributes": dict(s.attributes or {}), "status": s.status.status_code.name}


def read_records(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(path.read_text())
    return records
