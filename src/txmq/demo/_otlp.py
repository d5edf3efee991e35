"""The demo processes' span export (extra ``otlp``: opentelemetry-sdk and the OTLP exporter's
protobuf encoder): OTLP JSON lines appended to one file that every process of the run shares.

Imported only by :func:`txmq.demo.traces.start_tracing`, so the demo runs (untraced) without the
extra.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from txmq.demo._faults import Fault, fault_of

__all__ = ["TRACE_EXPORT_DELAY_MS", "OrderSampler", "OtlpJsonLinesExporter", "encode_line",
           "install"]

log = logging.getLogger("txmq.demo.traces")

TRACE_EXPORT_DELAY_MS: Final = 500
"""Longest a finished span waits for its batch's export (the SDK's ``OTEL_BSP_SCHEDULE_DELAY``
default is 5,000 ms): a producer the demo SIGKILLs loses at most this much of its spans."""
_ID_FIELDS: Final = ("traceId", "spanId", "parentSpanId")


def encode_line(spans: Sequence[ReadableSpan]) -> bytes:
    """``spans`` as one OTLP JSON line: an ``ExportTraceServiceRequest`` built by the OTLP
    exporter's encoder, printed by protobuf's JSON printer in the OTLP/JSON encoding (OTLP
    specification, "JSON Protobuf Encoding": lowerCamelCase field names, enums as integers,
    64-bit integers as strings, and trace and span ids in hex, where protobuf's printer writes
    base64)."""
    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource in doc.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _hex_ids(obj: dict[str, Any]) -> None:
    for k in _ID_FIELDS:
        if k in obj:
            obj[k] = base64.b64decode(obj[k]).hex()


class OtlpJsonLinesExporter(SpanExporter):
    """Appends each batch of spans to ``path`` as one OTLP JSON line (:func:`encode_line`), in
    one ``write`` on a file opened with ``O_APPEND``: the processes of a run share the file
    without interleaving their lines (Linux appends each ``write`` of a regular file whole). A
    failed write is logged and reported as a failed export. Raises OSError when the file cannot
    be opened."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._fd is None or not spans:
            return SpanExportResult.FAILURE if self._fd is None else SpanExportResult.SUCCESS
        data = memoryview(encode_line(spans))
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as exc:
            log.warning("writing %d spans to %s failed: %s", len(spans), self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class OrderSampler(Sampler):
    """Head sampling of the demo's orders: the root span of an order (attribute
    ``order_key_attribute``) is sampled when its key is a multiple of ``every[its fault]``
    (1 for a fault not named: always); any other root span is sampled. Children follow their
    parent (``ParentBased``), in every process, through the ``traceparent`` flags."""

    def __init__(self, order_key_attribute: str, every: Mapping[Fault, int]) -> None:
        self.attribute, self.every = order_key_attribute, dict(every)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        key = (attributes or {}).get(self.attribute)
        keep = not isinstance(key, int) or key % self.every.get(fault_of(key), 1) == 0
        return SamplingResult(Decision.RECORD_AND_SAMPLE if keep else Decision.DROP, attributes)

    def get_description(self) -> str:
        return "OrderSampler(" + ", ".join(f"{f.value} 1/{n}" for f, n in self.every.items()) + ")"


def install(path: Path, service_name: str, order_key_attribute: str,
            every: Mapping[Fault, int]) -> TracerProvider:
    """Make an SDK tracer provider exporting to ``path`` (service ``service_name``, order
    sampling) the global one; returns it (shut it down to flush)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                              sampler=ParentBased(OrderSampler(order_key_attribute, every)))
    provider.add_span_processor(BatchSpanProcessor(OtlpJsonLinesExporter(path),
                                                   schedule_delay_millis=TRACE_EXPORT_DELAY_MS))
    trace.set_tracer_provider(provider)
    return provider
