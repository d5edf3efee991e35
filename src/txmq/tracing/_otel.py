"""The part of :mod:`txmq.tracing` that calls ``opentelemetry-api``. :mod:`._tracing` imports it
only once ``opentelemetry.trace`` is imported (the application uses OpenTelemetry), so a process
that does not use OpenTelemetry never pays for importing it (about 60 ms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from types import TracebackType
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

from txmq.tracing._semconv import ERROR_TYPE

__all__ = ["OTEL", "Kind", "Otel", "PropertiesGetter", "PropertiesSetter", "SpanScope"]

Kind = Literal["producer", "consumer", "client", "server", "internal"]

_KINDS: dict[str, SpanKind] = {"producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER,
                               "client": SpanKind.CLIENT, "server": SpanKind.SERVER,
                               "internal": SpanKind.INTERNAL}


class PropertiesSetter(Setter[MutableMapping[str, str]]):
    """Writes a propagator's fields (``traceparent``, ``tracestate``, ``baggage`` …) as message
    properties."""

    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier[key] = value


class PropertiesGetter(Getter[Mapping[str, str]]):
    """Reads a propagator's fields from message properties."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_SETTER = PropertiesSetter()
_GETTER = PropertiesGetter()


class SpanScope:
    """Makes a started span the current one for a ``with`` block and ends it after. An
    :class:`Exception` leaving the block marks the span failed (status ERROR, ``error.type``);
    the exception goes on."""

    __slots__ = ("_error_type", "_token", "span")

    def __init__(self, span: Span, error_type: Callable[[BaseException], str]) -> None:
        self.span = span
        self._error_type = error_type
        self._token: object = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if isinstance(exc, Exception):
                OTEL.set_error(self.span, self._error_type(exc), str(exc))
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self.span.end()


class Otel:
    """OpenTelemetry API calls, in one place (one instance, :data:`OTEL`)."""

    def __init__(self) -> None:
        self._fields: tuple[object, frozenset[str]] = (None, frozenset())

    @staticmethod
    def global_provider() -> TracerProvider:
        return trace.get_tracer_provider()

    @staticmethod
    def is_noop(provider: TracerProvider) -> bool:
        """The API's own providers: the proxy used until an SDK provider is set, and the no-op
        one. Their spans record nothing, so txmq makes none."""
        return isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)

    @staticmethod
    def valid(ctx: Context | None) -> bool:
        """Whether ``ctx`` (None: the current context) holds a valid span context."""
        if ctx is None:
            ctx = otel_context.get_current()
            if not ctx:
                return False  # an empty context (the usual case outside any span)
        return trace.get_current_span(ctx).get_span_context().is_valid

    def inject(self, carrier: MutableMapping[str, str], ctx: Context | None) -> bool:
        """Write ``ctx``'s (None: the current) trace context into ``carrier`` through the global
        propagator; False (nothing written) when it holds no valid span context."""
        if not self.valid(ctx):
            return False
        propagate.inject(carrier, ctx, setter=_SETTER)
        return True

    def extract(self, carrier: Mapping[str, str]) -> Context | None:
        """The context ``carrier`` carries (through the global propagator), or None when it
        carries no valid span context. Read over an empty context, so the current span never
        passes for a message's."""
        textmap = propagate.get_global_textmap()
        if self._fields[0] is not textmap:
            self._fields = (textmap, frozenset(textmap.fields))
        if self._fields[1].isdisjoint(carrier):
            return None  # none of the propagator's fields: nothing to read (the usual case)
        ctx = textmap.extract(carrier, Context(), getter=_GETTER)
        return ctx if self.valid(ctx) else None

    @staticmethod
    def link(ctx: Context) -> Link:
        return Link(trace.get_current_span(ctx).get_span_context())

    @staticmethod
    def start(tracer: Tracer, name: str, kind: Kind, attributes: Mapping[str, AttributeValue],
              parent: Context | None, links: Sequence[Link] = (),
              start_ns: int | None = None) -> Span:
        """Start a span (``parent`` None: the current context; an empty Context: a root)."""
        return tracer.start_span(name, parent, _KINDS[kind], attributes, links, start_ns,
                                 record_exception=False, set_status_on_exception=False)

    @staticmethod
    def context_of(span: Span) -> Context:
        """A context whose current span is ``span`` (to inject, or to start children in)."""
        return trace.set_span_in_context(span)

    @staticmethod
    def scope(span: Span, error_type: Callable[[BaseException], str]) -> SpanScope:
        return SpanScope(span, error_type)

    @staticmethod
    def root() -> Context:
        """A context with no span: a span started in it is a root."""
        return Context()

    @staticmethod
    def set_error(span: Span, error_type: str, description: str = "") -> None:
        """Mark ``span`` failed: status ERROR with ``description``, and ``error.type``."""
        span.set_attribute(ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR, description or error_type))


OTEL = Otel()
