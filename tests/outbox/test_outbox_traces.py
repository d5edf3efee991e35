"""The local message table's leg of one trace (issue #28): a business span's trace runs through
``put_message``, the relay's send, the consumer's delivery, the inbox's apply, the ROLLBACK event,
the downstream relay and the upstream compensation, and a compensation that keeps failing ends in
a dead-letter span of the same trace: over a real txmq broker process, real RabbitMQ and real NATS
JetStream, on SQLite and PostgreSQL. Spans go to the OpenTelemetry SDK's in-memory exporter
(``Tracing(tracer_provider=...)``, no global provider)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from outbox_helpers import (
    TRANSPORT_URLS,
    TXMQ_CONSUMER,
    FakeClock,
    RecordingSender,
    events,
    fresh_tables,
    make_relay,
    names,
    server_engine,
)
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from txmq import outbox
from txmq.client import Message
from txmq.outbox import (
    AsyncCommitListener,
    AsyncRelay,
    CommitListener,
    InboxEvent,
    OutboxMetrics,
    OutboxTables,
    RejectEvent,
    Relay,
    RelayConfig,
    RollbackListener,
    Transport,
    open_async_transport,
    open_transport,
    put_message,
)
from txmq.testing import BrokerProcess, wait_until
from txmq.tracing import TRACEPARENT, Tracing

FAST = RelayConfig(period_ms=20, batch_size=20, backoff_base_ms=50, backoff_max_ms=200)
SYSTEM = {"txmq": "rocketmq", "rabbitmq": "rabbitmq", "nats": "nats"}
"""A transport's ``messaging.system``."""


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


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str, trace_id: int) -> ReadableSpan:
    """The one finished span called ``name`` in trace ``trace_id``."""
    got = [s for s in named(exporter, name) if s.context.trace_id == trace_id]
    assert len(got) == 1, (name, [s.name for s in exporter.get_finished_spans()])
    return got[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def links_of(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]


def attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def traced_transport(kind: str, tracing: Tracing, request: pytest.FixtureRequest) -> Transport:
    """A connected transport of ``kind`` whose own spans (the SDK's over txmq, the publish and
    delivery spans over RabbitMQ and NATS) go to ``tracing``; a server that is down fails."""
    if kind == "txmq":
        broker: BrokerProcess = request.getfixturevalue("txmq_broker")
        return open_transport(f"txmq://{broker.endpoints}", consumer_kw=TXMQ_CONSUMER, tracing=tracing)
    t = open_transport(TRANSPORT_URLS[kind], retry_delay_ms=50, tracing=tracing)
    try:
        t.connect()
    except Exception as exc:
        t.close()
        pytest.fail(f"{kind} at {TRANSPORT_URLS[kind]} is not reachable ({exc}); run .ci/services")
    return t


def wire_span_name(kind: str, topic: str) -> str:
    """The transport's own span of publishing to ``topic``."""
    return {"txmq": f"send {topic}", "rabbitmq": f"publish {topic}",
            "nats": f"publish txmq.outbox.{topic}"}[kind]


def dead_letter_span_name(kind: str, group: str, topic: str) -> str:
    return {"txmq": f"dead_letter %DLQ%{group}", "rabbitmq": f"dead_letter {topic}.{group}.dlq",
            "nats": f"dead_letter txmq.dlq.{topic}.{group}"}[kind]


class Shop:
    """Upstream orders, downstream ledger (rejects ``bad`` and ``worse``), upstream compensation
    (fails for ``worse``, which then goes to the dead-letter queue), over one transport, with
    every relay and listener traced."""

    def __init__(self, engine: sa.Engine, t: Transport, tracing: Tracing, stack: ExitStack) -> None:
        self.engine, self.t, self.tracing, self.stack = engine, t, tracing, stack
        self.up, self.down = fresh_tables(engine, "u"), fresh_tables(engine, "d")
        stack.callback(outbox.drop_tables, engine, self.up)
        stack.callback(outbox.drop_tables, engine, self.down)
        self.topic, self.rollback_topic = names()
        self.tag = self.topic.rsplit("-", 1)[1]
        t.ensure_topic(self.topic)
        t.ensure_topic(self.rollback_topic)
        self.metrics = OutboxMetrics(CollectorRegistry())
        self.lock = threading.Lock()
        self.booked, self.compensated = Counter[str](), Counter[str]()

    def book(self, conn: sa.Connection, ev: InboxEvent) -> None:
        if ev.biz_key in ("bad", "worse"):
            raise RejectEvent(f"the ledger refuses order {ev.biz_key}")
        with self.lock:
            self.booked[ev.biz_key] += 1

    def cancel(self, conn: sa.Connection, ev: InboxEvent) -> None:
        with self.lock:
            self.compensated[ev.biz_key] += 1
        if ev.biz_key == "worse":
            raise RuntimeError("order worse cannot be cancelled")

    def relay(self, tables: OutboxTables) -> Relay:
        r = Relay(self.engine, self.t, tables=tables, config=FAST, metrics=self.metrics,
                  tracing=self.tracing)
        r.start()
        self.stack.callback(r.stop)
        return r

    def start_listeners(self, down_relay: Relay) -> None:
        ledger = CommitListener(self.engine, self.book, tables=self.down, metrics=self.metrics,
                                max_reconsume_times=2, on_rollback=down_relay.wake,
                                tracing=self.tracing)
        comp = RollbackListener(self.engine, self.cancel, tables=self.up, metrics=self.metrics,
                                tracing=self.tracing)
        for s in (ledger.subscribe(self.t, self.ledger_group, self.topic, max_reconsume_times=4),
                  comp.subscribe(self.t, self.comp_group, self.rollback_topic, max_reconsume_times=2)):
            s.start()
            self.stack.callback(s.shutdown)

    @property
    def ledger_group(self) -> str:
        return f"ledger-{self.tag}"

    @property
    def comp_group(self) -> str:
        return f"comp-{self.tag}"

    def place(self, tracer: trace.Tracer, key: str) -> int:
        """Put order ``key`` in a business span of its own; returns the span's id."""
        with tracer.start_as_current_span(f"place order {key}") as business, \
                self.engine.begin() as conn:
            put_message(conn, Message(topic=self.topic, body=f"order {key}".encode()), "ORDER_CREATED",
                        key, "shop", tables=self.up, tracing=self.tracing)
        return business.get_span_context().span_id


@pytest.mark.parametrize(("kind", "db"), [("txmq", "sqlite"), ("rabbitmq", "sqlite"), ("nats", "sqlite"),
                                          ("txmq", "postgresql"), ("nats", "postgresql")])
@pytest.mark.timeout(120)
def test_one_trace_from_the_business_span_through_relay_inbox_rollback_and_compensation(
        kind: str, db: str, tmp_path: Path, request: pytest.FixtureRequest, provider: TracerProvider,
        exporter: InMemorySpanExporter, tracing: Tracing) -> None:
    engine = (outbox.create_sqlite_engine(tmp_path / "shop.db") if db == "sqlite"
              else server_engine(db, pool_size=10))
    with ExitStack() as stack:
        stack.callback(engine.dispose)
        t = traced_transport(kind, tracing, request)
        stack.callback(t.close)
        shop = Shop(engine, t, tracing, stack)
        tracer = provider.get_tracer("shop")
        business = {k: shop.place(tracer, k) for k in ("bad", "worse", "ok")}  # before the relay:
        down_relay = shop.relay(shop.down)                                # one batch of 3 rows
        shop.start_listeners(down_relay)
        shop.relay(shop.up)
        wait_until(lambda: len(t.dead_letters(shop.comp_group, shop.rollback_topic)) == 1, 60)
        wait_until(lambda: shop.compensated["bad"] == 1 and shop.booked["ok"] == 1, 30)
        wait_until(lambda: len(named(exporter, f"compensate {shop.rollback_topic}")) >= 4, 10)
    system = SYSTEM[kind]
    spans = exporter.get_finished_spans()
    roots = {s.context.trace_id: s for s in spans if s.name.startswith("place order")}
    trace_of = {k: next(tid for tid, s in roots.items() if s.context.span_id == sid)
                for k, sid in business.items()}
    bad = trace_of["bad"]

    # upstream: put_message in the business span; the relay's send of the row joins its trace
    put = one(exporter, f"put_message {shop.topic}", bad)
    assert put.kind is SpanKind.INTERNAL and parent_of(put) == business["bad"]
    assert attrs(put)["txmq.outbox.biz_key"] == "bad"
    assert attrs(put)["txmq.outbox.table"] == shop.up.outbox.name
    relay = one(exporter, f"relay {shop.topic}", bad)
    assert relay.kind is SpanKind.CLIENT and parent_of(relay) == put.context.span_id
    assert links_of(relay) == [put.context.span_id]
    ra = attrs(relay)
    assert ra["messaging.system"] == system and ra["messaging.destination.name"] == shop.topic
    assert ra["messaging.operation.type"] == "send" and ra["messaging.operation.name"] == "relay"
    assert ra["messaging.message.id"] == attrs(put)["messaging.message.id"]
    assert isinstance(ra["txmq.outbox.parked_ms"], int) and ra["txmq.outbox.parked_ms"] >= 0
    assert ra["txmq.outbox.attempt"] == 1
    # the three rows went in one batch: its wire span is in none of their traces, linked to all
    (wire,) = [s for s in named(exporter, wire_span_name(kind, shop.topic)) if len(s.links) == 3]
    assert wire.parent is None and wire.context.trace_id not in trace_of.values()
    assert sorted(links_of(wire)) == sorted(one(exporter, f"put_message {shop.topic}", tid).context.span_id
                                            for tid in trace_of.values())

    # downstream: the delivery, and the inbox's apply that gives up and writes the ROLLBACK event
    process = one(exporter, f"process {shop.topic}", bad)
    assert process.kind is SpanKind.CONSUMER and parent_of(process) == put.context.span_id
    assert attrs(process)["messaging.system"] == system
    apply = one(exporter, f"apply {shop.topic}", bad)
    assert apply.kind is SpanKind.CONSUMER and parent_of(apply) == process.context.span_id
    assert attrs(apply)["txmq.inbox.outcome"] == "rollback"
    assert apply.status.status_code is StatusCode.ERROR
    assert attrs(apply)["error.type"] == "txmq.outbox._inbox_core.RejectEvent"
    rb_put = one(exporter, f"put_message {shop.rollback_topic}", bad)
    assert parent_of(rb_put) == apply.context.span_id
    assert attrs(rb_put)["txmq.outbox.tx_type"] == "ROLLBACK"
    assert attrs(rb_put)["txmq.outbox.origin_event_id"] == attrs(put)["messaging.message.id"]

    # the ROLLBACK event: the downstream relay; the wire span is its child when the row was alone
    # in its batch, else (both rollbacks in one batch) in a trace of its own, linked to both
    rb_relay = one(exporter, f"relay {shop.rollback_topic}", bad)
    assert parent_of(rb_relay) == rb_put.context.span_id
    (rb_wire,) = [s for s in named(exporter, wire_span_name(kind, shop.rollback_topic))
                  if rb_put.context.span_id in links_of(s)]
    alone = len(rb_wire.links) == 1
    assert parent_of(rb_wire) == (rb_relay.context.span_id if alone else None)
    assert rb_wire.kind is SpanKind.CLIENT

    # upstream again: the compensation, in the same trace
    rb_process = one(exporter, f"process {shop.rollback_topic}", bad)
    assert parent_of(rb_process) == rb_put.context.span_id
    comp = one(exporter, f"compensate {shop.rollback_topic}", bad)
    assert parent_of(comp) == rb_process.context.span_id
    assert attrs(comp)["txmq.inbox.outcome"] == "applied" and comp.status.status_code is StatusCode.UNSET

    # a compensation that keeps failing: three tries, then the dead-letter queue, same trace
    worse = trace_of["worse"]
    tries = [s for s in named(exporter, f"compensate {shop.rollback_topic}") if s.context.trace_id == worse]
    assert len(tries) == 3 and {attrs(s)["txmq.inbox.outcome"] for s in tries} == {"retry"}
    assert {attrs(s)["error.type"] for s in tries} == {"RuntimeError"}
    dlq = one(exporter, dead_letter_span_name(kind, shop.comp_group, shop.rollback_topic), worse)
    assert dlq.kind is SpanKind.CLIENT and attrs(dlq)["messaging.operation.type"] == "settle"
    assert parent_of(dlq) == one(exporter, f"put_message {shop.rollback_topic}", worse).context.span_id

    # the good order: booked in its own trace
    ok_apply = one(exporter, f"apply {shop.topic}", trace_of["ok"])
    assert attrs(ok_apply)["txmq.inbox.outcome"] == "applied"
    assert not [s for s in spans if s.context.trace_id == trace_of["ok"] and "rollback" in s.name]


@pytest.mark.timeout(60)
def test_the_async_relay_and_inbox_trace_on_nats(tmp_path: Path, provider: TracerProvider,
                                                 exporter: InMemorySpanExporter, tracing: Tracing) -> None:
    engine = outbox.create_sqlite_engine(tmp_path / "aio.db")
    up, down = fresh_tables(engine, "u"), fresh_tables(engine, "d")
    engine.dispose()
    topic, _ = names()
    booked = Counter[str]()

    async def book(conn: AsyncConnection, ev: InboxEvent) -> None:
        booked[ev.biz_key] += 1

    async def main() -> dict[str, int]:
        aengine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'aio.db'}")
        t = open_async_transport(TRANSPORT_URLS["nats"], retry_delay_ms=50, tracing=tracing)
        await t.ensure_topic(topic)
        inbox = AsyncCommitListener(aengine, book, tables=down, tracing=tracing)
        sub = inbox.subscribe(t, f"ledger-{topic}", topic)
        await sub.start()
        businesses = {}
        for key in ("a", "b"):
            with provider.get_tracer("shop").start_as_current_span(f"order {key}") as span:
                async with aengine.begin() as conn:
                    await put_message(conn, Message(topic=topic, body=key.encode()), "ORDER_CREATED", key,
                                      "shop", tables=up, tracing=tracing)
            businesses[key] = span.get_span_context().trace_id
        relay = AsyncRelay(aengine, t, tables=up, config=FAST, tracing=tracing)
        async with relay:
            deadline = time.monotonic() + 20
            while len(named(exporter, f"apply {topic}")) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        await sub.shutdown()
        await t.close()
        await aengine.dispose()
        return businesses

    businesses = asyncio.run(main())
    assert booked == {"a": 1, "b": 1}
    for tid in businesses.values():
        put = one(exporter, f"put_message {topic}", tid)
        relay = one(exporter, f"relay {topic}", tid)
        assert parent_of(relay) == put.context.span_id and attrs(relay)["messaging.system"] == "nats"
        process = one(exporter, f"process {topic}", tid)
        assert parent_of(process) == put.context.span_id
        assert parent_of(one(exporter, f"apply {topic}", tid)) == process.context.span_id
    (wire,) = named(exporter, f"publish txmq.outbox.{topic}")
    assert wire.parent is None and len(wire.links) == 2  # one batch of both rows, in neither trace
    assert attrs(wire)["messaging.batch.message_count"] == 2


# -- without brokers: the row, the relay's span, a failed send -----------------------------------------
def stored_properties(engine: sa.Engine, tables: OutboxTables) -> list[dict[str, str]]:
    return [json.loads(r.properties) for r in events(engine, tables)]


def test_put_message_captures_the_trace_context_in_the_row(tmp_path: Path, provider: TracerProvider,
                                                           exporter: InMemorySpanExporter,
                                                           tracing: Tracing) -> None:
    engine = outbox.create_sqlite_engine(tmp_path / "o.db")
    tables = fresh_tables(engine)
    shared = {"app": "1"}
    with provider.get_tracer("shop").start_as_current_span("checkout"), engine.begin() as conn:
        put_message(conn, Message(topic="t", body=b"1", properties=shared), "CREATED", "k1", "shop",
                    tables=tables, tracing=tracing)
        put_message(conn, Message(topic="t", body=b"2"), "CREATED", "k2", "shop", tables=tables,
                    tracing=False)
    with engine.begin() as conn:  # no current span: the put span starts the event's trace
        put_message(conn, Message(topic="t", body=b"3"), "CREATED", "k3", "shop", tables=tables,
                    tracing=tracing)
    first, second, third = stored_properties(engine, tables)
    checkout = named(exporter, "checkout")[0].context
    put1, put3 = named(exporter, "put_message t")
    assert put1.context.trace_id == checkout.trace_id and parent_of(put1) == checkout.span_id
    assert put3.parent is None
    for props, span in ((first, put1), (third, put3)):
        ctx = span.get_span_context()
        assert props[TRACEPARENT] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert first == {"app": "1", TRACEPARENT: first[TRACEPARENT]}
    assert shared == {"app": "1"}  # the caller's dict is not written
    assert second == {}  # tracing=False
    engine.dispose()


def test_with_the_api_alone_put_message_still_passes_the_current_context_on(tmp_path: Path) -> None:
    """No SDK provider (the API's proxy): no span is made, but a valid current context (here a
    remote one, as a service that only propagates has) still goes into the row."""
    engine = outbox.create_sqlite_engine(tmp_path / "o.db")
    tables = fresh_tables(engine)
    remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(remote)), engine.begin() as conn:
        put_message(conn, Message(topic="t", body=b"1"), "CREATED", "k", "shop", tables=tables)
    (props,) = stored_properties(engine, tables)
    assert props == {TRACEPARENT: f"00-{0x1234:032x}-{0x5678:016x}-01"}
    engine.dispose()


def test_the_relay_span_says_how_long_the_row_was_parked_and_marks_a_failed_send(
        tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter,
        tracing: Tracing) -> None:
    engine = outbox.create_sqlite_engine(tmp_path / "o.db")
    tables = fresh_tables(engine)
    clock = FakeClock()
    with provider.get_tracer("shop").start_as_current_span("checkout") as business, \
            engine.begin() as conn:
        put_message(conn, Message(topic="t", body=b"1"), "CREATED", "k", "shop", tables=tables,
                    now_ms=clock.ms, tracing=tracing)
    sender = RecordingSender()
    sender.fail = ConnectionError("broker gone")
    relay = make_relay(engine, tables, sender, OutboxMetrics(CollectorRegistry()), clock)
    relay.tracing = tracing
    clock.advance(2.5)
    assert relay.run_once().failed == 1
    clock.advance(60)
    sender.fail = None
    assert relay.run_once().sent == 1
    first, second = named(exporter, "relay t")
    tid = business.get_span_context().trace_id
    assert first.context.trace_id == second.context.trace_id == tid
    assert (attrs(first)["txmq.outbox.parked_ms"], attrs(first)["txmq.outbox.attempt"]) == (2500, 1)
    assert first.status.status_code is StatusCode.ERROR and attrs(first)["error.type"] == "ConnectionError"
    assert (attrs(second)["txmq.outbox.parked_ms"], attrs(second)["txmq.outbox.attempt"]) == (62500, 2)
    assert second.status.status_code is StatusCode.UNSET
    assert attrs(second)["messaging.system"] == "rocketmq"  # a sender that is not a transport
    (msg,) = sender.sent
    assert msg.properties[TRACEPARENT] == stored_properties(engine, tables)[0][TRACEPARENT]
    engine.dispose()


def test_tracing_off_writes_no_context_and_makes_no_span(tmp_path: Path, provider: TracerProvider,
                                                         exporter: InMemorySpanExporter) -> None:
    engine = outbox.create_sqlite_engine(tmp_path / "o.db")
    tables = fresh_tables(engine)
    off = Tracing(tracer_provider=provider, enabled=False)
    with provider.get_tracer("shop").start_as_current_span("checkout"), engine.begin() as conn:
        put_message(conn, Message(topic="t", body=b"1"), "CREATED", "k", "shop", tables=tables,
                    tracing=off)
    sender = RecordingSender()
    relay = Relay(engine, sender, tables=tables, tracing=off)
    assert relay.run_once().sent == 1
    assert stored_properties(engine, tables) == [{}] and TRACEPARENT not in sender.sent[0].properties
    assert [s.name for s in exporter.get_finished_spans()] == ["checkout"]
    engine.dispose()

