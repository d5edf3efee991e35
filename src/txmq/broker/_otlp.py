"""The broker's leg of a transaction's trace as OpenTelemetry spans, exported over OTLP (extra
``otlp``: opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http).

:class:`OtlpExport` is the :class:`~txmq.broker.transaction.TraceListener` of the broker's
transaction lives when ``otlp_endpoint`` or ``otlp_file`` is set. For each transaction whose half
message carried a W3C ``traceparent`` it makes spans in that trace, children of the producer's
span the ``traceparent`` names (docs/tracing.md, "The broker's leg"):

- ``half stored`` (SERVER, at the half's store time);
- ``check-back`` (CLIENT), one per check-back, from its sending to its answer (or to when the
  broker stopped waiting: the next check-back, the end, at most
  ``limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS``), with the check count and the answer;
- ``end`` (SERVER when a request settled it, INTERNAL for an operator's decision or a discard),
  with the outcome and who decided; a discard has status ERROR.

Attributes follow OpenTelemetry's messaging semantic conventions (``messaging.system`` rocketmq,
``messaging.destination.name``, ``messaging.rocketmq.client_group``,
``messaging.rocketmq.message.type`` transaction, ``messaging.message.id``, ``messaging.client.id``,
``network.peer.address`` / ``network.peer.port``) and ``txmq.transaction.*`` for what they have no
name for. The producer's sampling decision holds: a ``traceparent`` without the sampled flag gets
no span.

The spans are built on the broker's event loop and handed to a ``BatchSpanProcessor``, whose own
thread exports them: the loop never waits for the network or the file. A full queue drops spans
(the SDK logs it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from txmq.errors import ConfigError, MissingExtra
from txmq.protocol import trace_id_of

_FEATURE = "the broker's OTLP export (otlp_endpoint, otlp_file)"
try:
    from opentelemetry.context import Context
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        TraceState,
        set_span_in_context,
    )
except ModuleNotFoundError as _exc:  # pragma: no cover - the packaging tests run it
    raise MissingExtra("otlp", _FEATURE, _exc.name or "opentelemetry") from _exc

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from txmq.broker._config import BrokerConfig
    from txmq.protocol import TransactionLife, TransactionStep

__all__ = ["OTLP_EXPORT_BATCH_SPANS_MAX", "OTLP_QUEUE_SPANS_MAX", "OTLP_SCHEDULE_DELAY_MS",
           "OtlpExport", "OtlpJsonFileExporter"]

log = logging.getLogger("txmq.broker.otlp")

OTLP_QUEUE_SPANS_MAX = 16_384
"""Spans waiting for export; more are dropped (the SDK's ``OTEL_BSP_MAX_QUEUE_SIZE`` default is
2,048: a broker settling 20,000 traced transactions a second makes 40,000 spans a second)."""
OTLP_SCHEDULE_DELAY_MS = 1_000
"""Longest a span waits before its batch is exported (the SDK's ``OTEL_BSP_SCHEDULE_DELAY``
default is 5,000 ms)."""
OTLP_EXPORT_BATCH_SPANS_MAX = 2_048
"""Spans per export request (the SDK's ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` default is 512)."""
OTLP_EXPORT_TIMEOUT_S = 10.0
"""One OTLP/HTTP request's timeout (the exporter's ``OTEL_EXPORTER_OTLP_TIMEOUT`` default)."""

_NS_PER_MS = 1_000_000
_SPAN_FLAGS_REMOTE_PARENT = 0x300
"""OTLP ``SpanFlags``: ``CONTEXT_HAS_IS_REMOTE`` (0x100) and ``CONTEXT_IS_REMOTE`` (0x200): every
span here has the producer's remote span as parent."""


class OtlpJsonFileExporter(SpanExporter):
    """Append spans to a file as OTLP JSON lines: one ``ExportTraceServiceRequest`` per export,
    in the OTLP/JSON encoding (OTLP specification, "JSON Protobuf Encoding": lowerCamelCase field
    names, trace and span ids in hex, enums as integers, 64-bit integers as strings), as the
    OpenTelemetry Collector's file exporter writes it. The JSON is built from the spans directly
    (the fields of opentelemetry-proto's ``trace.proto`` and ``common.proto``): protobuf's JSON
    printer, which ``encode_spans`` would need, is pure Python and cost the broker about 5 times
    a transaction's CPU time (``txmq bench tx``). Runs on the batch processor's thread. Raises
    ConfigError when the file cannot be opened for appending; a failed write is logged and
    reported as a failed export."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"otlp_file {str(path)[:300]!r} cannot be opened: {exc}") from exc

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._file is None:
            return SpanExportResult.FAILURE
        by_resource: dict[int, tuple[Resource, dict[tuple[str, str], list[dict[str, object]]]]] = {}
        for span in spans:
            _, scopes = by_resource.setdefault(id(span.resource), (span.resource, {}))
            scope = span.instrumentation_scope
            key = (scope.name, scope.version or "") if scope is not None else ("", "")
            scopes.setdefault(key, []).append(_json_span(span))
        doc = {"resourceSpans": [
            {"resource": {"attributes": _json_attributes(res.attributes)},
             "scopeSpans": [{"scope": {"name": name, **({"version": v} if v else {})},
                             "spans": js} for (name, v), js in scopes.items()]}
            for res, scopes in by_resource.values()]}
        try:
            self._file.write(json.dumps(doc, separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError:
            log.exception("writing spans to %s failed", self.path)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _json_value(value: object) -> dict[str, object]:
    """An ``AnyValue`` (common.proto): int64 as a decimal string, as protobuf's JSON mapping."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_json_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _json_attributes(attrs: Mapping[str, object] | None) -> list[dict[str, object]]:
    return [{"key": k, "value": _json_value(v)} for k, v in (attrs or {}).items()]


def _json_span(span: ReadableSpan) -> dict[str, object]:
    """One ``Span`` (trace.proto) in OTLP/JSON: ids in hex, kind and status code as integers
    (``SPAN_KIND_INTERNAL`` is 1: the SDK's ``SpanKind`` value + 1)."""
    ctx = span.get_span_context()
    assert ctx is not None
    out: dict[str, object] = {
        "traceId": format(ctx.trace_id, "032x"), "spanId": format(ctx.span_id, "016x"),
        "name": span.name, "kind": span.kind.value + 1,
        "startTimeUnixNano": str(span.start_time), "endTimeUnixNano": str(span.end_time),
        "attributes": _json_attributes(span.attributes)}
    if span.parent is not None:
        out["parentSpanId"] = format(span.parent.span_id, "016x")
        out["flags"] = _SPAN_FLAGS_REMOTE_PARENT if span.parent.is_remote else 0x100
    if ctx.trace_state:
        out["traceState"] = ctx.trace_state.to_header()
    if span.events:
        out["events"] = [{"name": e.name, "timeUnixNano": str(e.timestamp),
                          "attributes": _json_attributes(e.attributes)} for e in span.events]
    if span.links:
        out["links"] = [{"traceId": format(lk.context.trace_id, "032x"),
                         "spanId": format(lk.context.span_id, "016x"),
                         "attributes": _json_attributes(lk.attributes)} for lk in span.links]
    if span.status.status_code is not StatusCode.UNSET:
        out["status"] = {"code": span.status.status_code.value,
                         **({"message": span.status.description} if span.status.description
                            else {})}
    return out


def _peer(address: str) -> dict[str, AttributeValue]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return {"network.peer.address": address} if address else {}
    return {"network.peer.address": host.strip("[]"), "network.peer.port": int(port)}


class OtlpExport:
    """Spans of transactions' lives, exported to ``config.otlp_endpoint`` (OTLP/HTTP protobuf)
    and/or ``config.otlp_file`` (OTLP JSON lines): a
    :class:`~txmq.broker.transaction.TraceListener`.

    Args:
        config: the broker's; ``broker_name``, ``broker_cluster_name`` and ``broker_id`` name the
            resource (``service.name`` txmq-broker, ``service.instance.id``).
    Raises:
        ConfigError: ``otlp_file`` cannot be opened for appending.
    """

    def __init__(self, config: BrokerConfig) -> None:
        resource = Resource.create({
            "service.name": "txmq-broker",
            "service.instance.id": f"{config.broker_cluster_name}/{config.broker_name}/"
                                   f"{config.broker_id}"})
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporters: list[SpanExporter] = []
        if config.otlp_file:
            exporters.append(OtlpJsonFileExporter(config.otlp_file))
        if config.otlp_endpoint:
            exporters.append(OTLPSpanExporter(endpoint=config.otlp_endpoint,
                                              timeout=OTLP_EXPORT_TIMEOUT_S))
        for exporter in exporters:
            self.provider.add_span_processor(BatchSpanProcessor(
                exporter, max_queue_size=OTLP_QUEUE_SPANS_MAX,
                schedule_delay_millis=OTLP_SCHEDULE_DELAY_MS,
                max_export_batch_size=OTLP_EXPORT_BATCH_SPANS_MAX))
        self.tracer = self.provider.get_tracer("txmq.broker")

    def shutdown(self) -> None:
        """Export what is queued, then stop (blocks up to the exporters' timeouts: call it off
        the event loop)."""
        self.provider.shutdown()

    # -- the TraceListener ------------------------------------------------------------------------
    def half_stored(self, life: TransactionLife) -> None:
        attrs = self._attributes(life, "half stored")
        attrs.update({"messaging.rocketmq.message.type": "transaction",
                      "txmq.transaction.half_offset": life.half_offset,
                      "messaging.client.id": life.client_id, **_peer(life.address)})
        self._span(life, "half stored", SpanKind.SERVER, life.stored_ms, life.stored_ms, attrs)

    def check_closed(self, life: TransactionLife, check: TransactionStep,
                     answer: TransactionStep | None, closed_ms: int) -> None:
        attrs = self._attributes(life, "check-back")
        attrs.update({"txmq.transaction.check_count": check.check_count,
                      "txmq.transaction.producer_client_id": check.client_id,
                      "txmq.transaction.answer": answer.answer if answer else "NONE",
                      **_peer(check.address)})
        if answer is not None:
            attrs["txmq.transaction.answered_by"] = answer.client_id
        self._span(life, "check-back", SpanKind.CLIENT, check.time_ms, closed_ms, attrs)

    def ended(self, life: TransactionLife, end: TransactionStep) -> None:
        attrs = self._attributes(life, "end")
        attrs.update({"txmq.transaction.outcome": end.outcome,
                      "txmq.transaction.decided_by": end.decided_by})
        for key, value in (("messaging.client.id", end.client_id),
                           ("txmq.transaction.operator", end.operator),
                           ("txmq.transaction.reason", end.reason)):
            if value:
                attrs[key] = value
        attrs.update(_peer(end.address))
        status = Status(StatusCode.ERROR, end.reason) if end.outcome == "DISCARD" else None
        self._span(life, "end", SpanKind.SERVER if end.client_id else SpanKind.INTERNAL,
                   end.time_ms, end.time_ms, attrs, status)

    # -- spans ------------------------------------------------------------------------------------
    @staticmethod
    def _attributes(life: TransactionLife, operation: str) -> dict[str, AttributeValue]:
        return {"messaging.system": "rocketmq", "messaging.operation.name": operation,
                "messaging.destination.name": life.topic,
                "messaging.rocketmq.client_group": life.producer_group,
                "messaging.message.id": life.msg_id}

    @staticmethod
    def _parent(life: TransactionLife) -> Context | None:
        """The producer's span the half's ``traceparent`` names, as a context; None when it is
        not a valid one (:func:`txmq.protocol.trace_id_of`) or the producer did not sample it
        (flag ``sampled``, 0x01, clear: the SDK's default parent-based sampler would drop the
        span anyway, after building it). Built from the header's fields (W3C Trace Context
        §3.2) as OpenTelemetry's ``TraceContextTextMapPropagator`` builds it, without its
        regular expressions: a third of the cost."""
        tp = life.traceparent
        if not trace_id_of(tp) or not int(tp[53:55], 16) & TraceFlags.SAMPLED:
            return None
        state = TraceState.from_header([life.tracestate]) if life.tracestate else None
        return set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id=int(tp[3:35], 16), span_id=int(tp[36:52], 16), is_remote=True,
            trace_flags=TraceFlags(int(tp[53:55], 16)), trace_state=state)))

    def _span(self, life: TransactionLife, name: str, kind: SpanKind, start_ms: int, end_ms: int,
              attrs: dict[str, AttributeValue], status: Status | None = None) -> None:
        parent = self._parent(life)
        if parent is None:
            return
        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attrs,
                                      start_time=start_ms * _NS_PER_MS)
        if status is not None:
            span.set_status(status)
        span.end(end_time=max(start_ms, end_ms) * _NS_PER_MS)
