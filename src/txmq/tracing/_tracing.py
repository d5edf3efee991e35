"""W3C trace context in message properties, and messaging spans, over the optional
``opentelemetry-api``.

Nothing here imports OpenTelemetry: :func:`_api` loads :mod:`._otel` once ``opentelemetry.trace``
has been imported by the application (or by its SDK or auto-instrumentation). Until then, and
without ``opentelemetry-api`` installed, every helper does nothing and adds no property.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Final

from txmq.errors import RemoteError, ResponseCode, TxmqError
from txmq.tracing._semconv import (
    MESSAGING_DESTINATION_NAME,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
    OPERATION_PROCESS,
    OPERATION_RECEIVE,
    OPERATION_SEND,
    OPERATION_SETTLE,
    ROCKETMQ,
    SCHEMA_URL,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from txmq.tracing._otel import Kind, Otel

__all__ = [
    "TRACEPARENT",
    "TRACER_NAME",
    "TRACESTATE",
    "TRACE_LINKS_MAX",
    "Attributes",
    "Tracing",
    "available",
    "error_type",
    "set_error",
]

TRACEPARENT: Final = "traceparent"
"""The W3C Trace Context header a message carries as a user property (RocketMQ 5's clients carry
trace context the same way: as message properties)."""
TRACESTATE: Final = "tracestate"
"""W3C Trace Context's vendor state, beside :data:`TRACEPARENT` when there is one."""
TRACE_LINKS_MAX: Final = 128
"""Links to message creation contexts per receive, process or settle span, at most: the
OpenTelemetry SDK's default span link limit (``OTEL_SPAN_LINK_COUNT_LIMIT``, 128), which would drop
the rest anyway."""
TRACER_NAME: Final = "txmq"
"""The instrumentation scope of txmq's spans."""

Attributes = Mapping[str, "AttributeValue"]
"""Span attributes: name → str, bool, int, float or a sequence of one of them."""

_NULL: Final = contextlib.nullcontext(None)
_loaded: list[Otel] = []


def _api() -> Otel | None:
    """The OpenTelemetry calls, once ``opentelemetry.trace`` is imported; else None."""
    if _loaded:
        return _loaded[0]
    if "opentelemetry.trace" not in sys.modules:
        return None
    from txmq.tracing._otel import OTEL

    _loaded.append(OTEL)
    return OTEL


def available() -> bool:
    """Whether ``opentelemetry-api`` is installed (``pip install 'txmq[tracing]'``). Imports
    nothing."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ModuleNotFoundError:
        return False


def error_type(exc: BaseException) -> str:
    """``error.type`` of a failed operation: the broker's response code name for a
    :class:`~txmq.errors.RemoteError` (``TOPIC_NOT_EXIST``, ``SYSTEM_BUSY``, as the RocketMQ
    conventions' examples), a txmq error's stable ``code``, else the exception's class name
    (with its module, unless a builtin)."""
    if isinstance(exc, RemoteError):
        try:
            return ResponseCode(exc.response_code).name
        except ValueError:
            return str(exc.response_code)
    if isinstance(exc, TxmqError):
        return exc.code
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def set_error(span: Span | None, error_type: str, description: str = "") -> None:
    """Mark ``span`` failed without an exception (e.g. a listener's ``RECONSUME_LATER``): status
    ERROR and ``error.type``. Nothing for None (tracing off)."""
    api = _api()
    if span is not None and api is not None:
        api.set_error(span, error_type, description)


def _name(operation_name: str, destination: str | None) -> str:
    """``{messaging.operation.name} {destination}`` (messaging-spans.md, "Span name")."""
    return f"{operation_name} {destination}" if destination else operation_name


def _attributes(system: str, operation_type: str, operation_name: str, destination: str | None,
                extra: Attributes | None) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {MESSAGING_SYSTEM: system,
                                        MESSAGING_OPERATION_TYPE: operation_type,
                                        MESSAGING_OPERATION_NAME: operation_name}
    if destination:
        attrs[MESSAGING_DESTINATION_NAME] = destination
    if extra:
        attrs.update(extra)
    return attrs


class Tracing:
    """Where a client's spans go, or that it makes none (``tracing=`` of every producer and
    consumer: True is ``Tracing()``, False is ``Tracing(enabled=False)``).

    Spans are made only when OpenTelemetry is in use: ``opentelemetry-api`` imported by the
    application and a tracer provider set (given here, or the global one, e.g. the SDK's
    ``TracerProvider`` through ``trace.set_tracer_provider``). With the API's own no-op or proxy
    provider no span is made, but a message still carries the current trace context when there is
    a valid one (context passes through a service that only propagates). With ``enabled=False``,
    or without ``opentelemetry-api`` installed, nothing is traced and no property is added.

    Args:
        tracer_provider: the provider of txmq's tracer (instrumentation scope ``txmq``); None:
            the global one, looked up at each operation (so one set later counts).
        enabled: False: no span, no property, no context read.
        parent_from_message: a process span of a single message with no span current takes the
            message's creation context as its parent (same trace as the producer), besides the
            link the conventions ask for; False: it starts a new trace, linked (messaging-spans.md,
            "Message creation context as parent of Process span").
    """

    __slots__ = ("_cached", "_provider", "enabled", "parent_from_message")

    def __init__(self, tracer_provider: TracerProvider | None = None, *, enabled: bool = True,
                 parent_from_message: bool = True) -> None:
        self._provider = tracer_provider
        self.enabled = enabled
        self.parent_from_message = parent_from_message
        self._cached: tuple[TracerProvider, Tracer | None] | None = None

    @classmethod
    def of(cls, tracing: Tracing | bool) -> Tracing:
        """A client's ``tracing=`` argument as a :class:`Tracing`: True → the default
        (global provider), False → off."""
        if isinstance(tracing, Tracing):
            return tracing
        return DEFAULT if tracing else OFF

    def tracer(self) -> Tracer | None:
        """The tracer spans are made with, or None when none would be recorded (off, OpenTelemetry
        not imported, or the API's no-op / proxy provider)."""
        if not self.enabled:
            return None
        api = _api()
        if api is None:
            return None
        provider = self._provider or api.global_provider()
        cached = self._cached
        if cached is not None and cached[0] is provider:
            return cached[1]
        tracer = None if api.is_noop(provider) else provider.get_tracer(
            TRACER_NAME, _version(), schema_url=SCHEMA_URL)
        self._cached = (provider, tracer)  # the global provider is set once: a new one misses
        return tracer

    @property
    def propagates(self) -> bool:
        """Whether trace context is read and written: enabled, and OpenTelemetry imported."""
        return self.enabled and _api() is not None

    @property
    def active(self) -> bool:
        """Whether spans are made now (:meth:`tracer` is not None)."""
        return self.tracer() is not None

    def current_context_valid(self) -> bool:
        """Whether the current context holds a valid span context (there is a trace to pass
        on); False when off or OpenTelemetry is not in use."""
        api = _api() if self.enabled else None
        return api is not None and api.valid(None)

    # -- propagation ------------------------------------------------------------------------------
    def inject(self, properties: MutableMapping[str, str], context: Context | None = None) -> bool:
        """Write the trace context of ``context`` (None: the current one) into ``properties``
        (``traceparent``, ``tracestate``, through the global propagator ``opentelemetry.propagate``)
        unless they carry one already (a message's creation context is set once). True when
        written; False when off, not in use, already there, or no valid span context."""
        api = _api() if self.enabled else None
        if api is None or not api.valid(context) or api.extract(properties) is not None:
            return False
        return api.inject(properties, context)

    def extract(self, properties: Mapping[str, str]) -> Context | None:
        """The creation context ``properties`` carry (through the global propagator), or None
        (none valid, off, or OpenTelemetry not in use)."""
        api = _api() if self.enabled else None
        return None if api is None else api.extract(properties)

    # -- spans ------------------------------------------------------------------------------------
    def send_span(self, operation_name: str, destination: str | None,
                  messages: Sequence[MutableMapping[str, str]], *, system: str = ROCKETMQ,
                  attributes: Attributes | None = None, operation_type: str = OPERATION_SEND,
                  ambient: bool = True) -> AbstractContextManager[Span | None]:
        """A send span, current in the ``with`` block (messaging-spans.md, "Producer spans").

        Each of ``messages`` (their properties, written in place) that carries no creation context
        gets the span's: the span is then a PRODUCER span; when every message carries one
        already (set by the application, or captured earlier as the outbox does at ``put``), it is
        left unchanged and the span is a CLIENT span. The span links to each creation context
        that was there before. Its parent is the current span; with ``ambient=False`` (a send in
        no caller's scope, as the outbox relay's) it is, for one message with a creation context
        and ``parent_from_message``, that context (the send joins the message's trace), else
        none. When spans are not made, the current trace context is still injected (if valid).
        Yields the span, or None. An exception leaving the block marks it failed
        (:func:`error_type`) and goes on.
        """
        tracer = self.tracer()
        if tracer is None:
            for props in messages:
                self.inject(props)
            return _NULL
        api = _api()
        assert api is not None
        existing = [api.extract(props) for props in messages]
        links = [api.link(c) for c in existing[:TRACE_LINKS_MAX] if c is not None]
        kind: Kind = "client" if messages and all(c is not None for c in existing) else "producer"
        parent = None
        if not ambient:
            parent = existing[0] if (self.parent_from_message and len(messages) == 1
                                     and existing[0] is not None) else api.root()
        span = api.start(tracer, _name(operation_name, destination), kind,
                         _attributes(system, operation_type, operation_name, destination,
                                     attributes), parent, links)
        ctx = api.context_of(span)
        for props, had in zip(messages, existing, strict=True):
            if had is None:
                api.inject(props, ctx)
        return api.scope(span, error_type)

    def process_span(self, operation_name: str, destination: str | None,
                     messages: Sequence[Mapping[str, str]], *, system: str = ROCKETMQ,
                     attributes: Attributes | None = None, ambient: bool = True,
                     operation_type: str = OPERATION_PROCESS
                     ) -> AbstractContextManager[Span | None]:
        """A CONSUMER span of processing ``messages`` (their properties), current in the block,
        linked to each message's creation context.

        Its parent: the current span when there is one and ``ambient`` (processing in the scope
        of another span, as the conventions recommend); else, for one message with a creation
        context and ``parent_from_message``, that context (the consumer joins the producer's
        trace); else none (a new trace). A push consumer passes ``ambient=False``: its listener
        calls are in no caller's scope. Yields the span, or None.
        """
        return self._consumer_side("consumer", operation_type, operation_name, destination,
                                   messages, system, attributes, ambient)

    def settle_span(self, operation_name: str, destination: str | None,
                    messages: Sequence[Mapping[str, str]] = (), *, system: str = ROCKETMQ,
                    attributes: Attributes | None = None, ambient: bool = True
                    ) -> AbstractContextManager[Span | None]:
        """A CLIENT span of settling ``messages`` (a retry, a move to a dead-letter queue, a
        transaction's end), current in the block; parent and links as :meth:`process_span`."""
        return self._consumer_side("client", OPERATION_SETTLE, operation_name, destination,
                                   messages, system, attributes, ambient)

    def receive_span(self, operation_name: str, destination: str | None,
                     messages: Sequence[Mapping[str, str]], start_time_ns: int, *,
                     system: str = ROCKETMQ, attributes: Attributes | None = None) -> None:
        """Record a CLIENT receive span that began at ``start_time_ns`` (``time.time_ns()``) and
        ends now, child of the current span, linked to each message's creation context (a
        pull-based receive: recorded once it returned messages)."""
        tracer = self.tracer()
        if tracer is None:
            return
        api = _api()
        assert api is not None
        span = api.start(tracer, _name(operation_name, destination), "client",
                         _attributes(system, OPERATION_RECEIVE, operation_name, destination,
                                     attributes), None, self._links(api, messages), start_time_ns)
        span.end()

    def internal_span(self, name: str, attributes: Attributes | None = None
                      ) -> AbstractContextManager[Span | None]:
        """An INTERNAL span (e.g. a local transaction), child of the current span, current in
        the block. Yields the span, or None."""
        tracer = self.tracer()
        if tracer is None:
            return _NULL
        api = _api()
        assert api is not None
        return api.scope(api.start(tracer, name, "internal", dict(attributes or {}), None),
                         error_type)

    def _consumer_side(self, kind: Kind, operation_type: str, operation_name: str,
                       destination: str | None, messages: Sequence[Mapping[str, str]],
                       system: str, attributes: Attributes | None,
                       ambient: bool) -> AbstractContextManager[Span | None]:
        tracer = self.tracer()
        if tracer is None:
            return _NULL
        api = _api()
        assert api is not None
        contexts = [api.extract(props) for props in messages[:TRACE_LINKS_MAX]]
        links = [api.link(c) for c in contexts if c is not None]
        if ambient and api.valid(None):
            parent = None
        elif self.parent_from_message and len(messages) == 1 and contexts[0] is not None:
            parent = contexts[0]
        else:
            parent = api.root()
        span = api.start(tracer, _name(operation_name, destination), kind,
                         _attributes(system, operation_type, operation_name, destination,
                                     attributes), parent, links)
        return api.scope(span, error_type)

    @staticmethod
    def _links(api: Otel, messages: Sequence[Mapping[str, str]]) -> list[Link]:
        out = []
        for props in messages[:TRACE_LINKS_MAX]:
            ctx = api.extract(props)
            if ctx is not None:
                out.append(api.link(ctx))
        return out


DEFAULT: Final = Tracing()
"""``tracing=True``: the global tracer provider."""
OFF: Final = Tracing(enabled=False)
"""``tracing=False``."""

_VERSION: list[str] = []


def _version() -> str:
    if not _VERSION:
        from importlib.metadata import PackageNotFoundError, version

        try:
            _VERSION.append(version("txmq"))
        except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
            _VERSION.append("")
    return _VERSION[0]

