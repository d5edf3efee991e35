"""Fixtures of the tracing tests: an OpenTelemetry SDK tracer provider whose spans go to an
in-memory exporter, and a :class:`txmq.tracing.Tracing` over it (no global provider is set)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from txmq.tracing import Tracing


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    yield p
    p.shutdown()


@pytest.fixture
def tracing(provider: TracerProvider) -> Tracing:
    return Tracing(tracer_provider=provider)

