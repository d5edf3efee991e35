"""One trace per business transaction, over real broker processes (issue #28): the SDK's spans
from a business span through the half message, the local transaction, the end, the check-back
(answered in another producer process), each delivery, the retry and the dead-letter queue, with
the sync and the asyncio clients; and what ``tracing=False`` leaves out. Spans go to the
OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tracing_helpers import named, read_records, spans

from txmq.client import (
    Admin,
    AsyncTransactionProducer,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)
from txmq.errors import RemoteError
from txmq.testing import BrokerProcess, run_broker, wait_until
from txmq.tracing import TRACEPARENT, Tracing

FAST = {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300,
        "message_delay_level": "100ms 200ms 300ms 400ms 500ms"}
"""Check-backs after 0.3 s; retries after 0.3 s and 0.4 s (levels 3 + reconsume times)."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"orders": 1, "plain": 2}, **FAST) as b:
        yield b


def hexid(span: ReadableSpan) -> str:
    return f"{span.get_span_context().span_id:016x}"


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def consumer(endpoints: str, group: str, listener: Callable[[list[MessageExt]], object],
             tracing: Tracing | bool, **kw: object) -> PushConsumer:
    c = PushConsumer(group, endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     suspend_ms=300, tracing=tracing, **kw)  # type: ignore[arg-type]
    c.subscribe("orders")
    c.start()
    return c


class CommitWithDbSpan:
    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("shop")

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        with self.tracer.start_as_current_span("insert order"):
            return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def test_one_trace_from_the_business_span_through_half_end_delivery_retry_and_dlq(
        broker: BrokerProcess, provider: TracerProvider, exporter: InMemorySpanExporter,
        tracing: Tracing) -> None:
    with provider.get_tracer("shop").start_as_current_span("place order") as business, \
            TransactionProducer("pg", broker.endpoints, CommitWithDbSpan(provider),
                                tracing=tracing) as tp:
        r = tp.send_message_in_transaction(Message(topic="orders", body=b"o-1", keys="ORDER-1",
                                                   tags="new"))
    assert r.outcome == "COMMIT"
    deliveries: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        deliveries.append(msgs[0].reconsume_times)
        return ConsumeStatus.RECONSUME_LATER

    c = consumer(broker.endpoints, "billing", listener, tracing, max_reconsume_times=1)
    try:
        wait_until(lambda: named(exporter, "dead_letter %DLQ%billing"), timeout_s=30)
    finally:
        c.shutdown()
    assert deliveries == [0, 1]

    s = spans(exporter)
    tx = s["send_message_in_transaction orders"]
    half, local = s["send_half orders"], s["execute_local_transaction orders"]
    end = s["end_transaction orders"]
    processes = named(exporter, "process orders")
    retry, dlq = s["retry %RETRY%billing"], s["dead_letter %DLQ%billing"]
    trace_id = business.get_span_context().trace_id
    assert {sp.context.trace_id for sp in exporter.get_finished_spans()} == {trace_id}

    assert tx.kind is SpanKind.PRODUCER and parent_of(tx) == business.get_span_context().span_id
    assert (tx.attributes or {})["messaging.message.id"] == r.msg_id
    assert (tx.attributes or {})["messaging.rocketmq.message.type"] == "transaction"
    assert half.kind is SpanKind.CLIENT and parent_of(half) == tx.context.span_id
    assert [link.context.span_id for link in half.links] == [tx.context.span_id]
    assert local.kind is SpanKind.INTERNAL and parent_of(local) == tx.context.span_id
    assert (local.attributes or {})["messaging.rocketmq.transaction.state"] == "commit"
    assert parent_of(s["insert order"]) == local.context.span_id
    assert end.kind is SpanKind.CLIENT and parent_of(end) == tx.context.span_id
    assert {k: (end.attributes or {})[k] for k in ("messaging.operation.type",
            "messaging.rocketmq.transaction.state", "messaging.rocketmq.transaction.outcome")} == {
        "messaging.operation.type": "settle", "messaging.rocketmq.transaction.state": "commit",
        "messaging.rocketmq.transaction.outcome": "COMMIT"}

    assert [(sp.attributes or {})["messaging.rocketmq.message.reconsume_times"]
            for sp in processes] == [0, 1]
    for sp in processes:  # each delivery: a child of the creation context, linked to it
        assert sp.kind is SpanKind.CONSUMER and parent_of(sp) == tx.context.span_id
        assert [link.context.span_id for link in sp.links] == [tx.context.span_id]
        assert sp.status.status_code is StatusCode.ERROR
        assert (sp.attributes or {})["error.type"] == "RECONSUME_LATER"
        assert (sp.attributes or {})["messaging.consumer.group.name"] == "billing"
        assert (sp.attributes or {})["messaging.rocketmq.message.keys"] == ("ORDER-1",)
    assert parent_of(retry) == parent_of(dlq) == tx.context.span_id
    assert (retry.attributes or {})["messaging.rocketmq.message.reconsume_times"] == 1
    assert (dlq.attributes or {})["messaging.rocketmq.message.reconsume_times"] == 2
    with Admin(broker.endpoints) as admin:  # the dead letter still carries the creation context
        [dead] = admin.dlq_messages("billing")
    assert dead.properties[TRACEPARENT] == traceparent_of(tx)


_CHECKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from txmq.client import LocalTransactionState, TransactionProducer
    from txmq.tracing import Tracing
    from tracing_helpers import span_record

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    class Checker:
        def execute_local_transaction(self, msg, arg):
            raise AssertionError("this producer sends nothing")

        def check_local_transaction(self, msg):
            with provider.get_tracer("shop").start_as_current_span("look up order"):
                return LocalTransactionState.COMMIT_MESSAGE

    out = Path(sys.argv[2])
    with TransactionProducer("pg", sys.argv[1], Checker(), tracing=Tracing(tracer_provider=provider)):
        Path(str(out) + ".ready").touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                s.name.startswith("check_transaction_state") for s in exporter.get_finished_spans()):
            time.sleep(0.05)
    out.write_text(json.dumps([span_record(s) for s in exporter.get_finished_spans()]))
""")


def test_a_check_back_answered_in_another_producer_process_joins_the_trace(
        broker: BrokerProcess, provider: TracerProvider, exporter: InMemorySpanExporter,
        tracing: Tracing, tmp_path: Path) -> None:
    out = tmp_path / "checker-spans.json"
    checker = subprocess.Popen([sys.executable, "-c", _CHECKER, broker.endpoints, str(out),
                                str(Path(__file__).parent)])
    try:
        wait_until(lambda: Path(str(out) + ".ready").exists() or checker.poll() is not None,
                   timeout_s=60)

        class Unknown:
            def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
                return LocalTransactionState.UNKNOWN

            def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
                return LocalTransactionState.UNKNOWN  # the other process decides

        with provider.get_tracer("shop").start_as_current_span("place order") as business, \
                TransactionProducer("pg", broker.endpoints, Unknown(), tracing=tracing) as tp:
            r = tp.send_message_in_transaction(Message(topic="orders", body=b"u", keys="ORDER-2"))
        assert r.outcome == "PENDING"
        assert checker.wait(60) == 0
    finally:
        if checker.poll() is None:
            checker.kill()
    got: list[MessageExt] = []
    c = consumer(broker.endpoints, "ledger", lambda m: got.extend(m) or ConsumeStatus.CONSUME_SUCCESS,
                 tracing)
    try:
        wait_until(lambda: named(exporter, "process orders"), timeout_s=30)
    finally:
        c.shutdown()

    tx = spans(exporter)["send_message_in_transaction orders"]
    trace_id = f"{business.get_span_context().trace_id:032x}"
    remote = {rec["name"]: rec for rec in read_records(out)}
    check = remote["check_transaction_state orders"]
    assert check["kind"] == "CONSUMER" and check["trace_id"] == trace_id
    assert check["parent"] == hexid(tx) and check["links"] == [hexid(tx)]
    assert check["attributes"]["messaging.rocketmq.transaction.check_times"] >= 1
    assert check["attributes"]["messaging.rocketmq.transaction.state"] == "commit"
    assert check["attributes"]["messaging.message.id"] == r.msg_id
    assert remote["look up order"]["parent"] == check["span_id"]
    assert (spans(exporter)["end_transaction orders"].attributes or {})[
        "messaging.rocketmq.transaction.outcome"] == "PENDING"
    process = spans(exporter)["process orders"]
    assert f"{process.context.trace_id:032x}" == trace_id and parent_of(process) == tx.context.span_id
    assert got[0].properties[TRACEPARENT] == traceparent_of(tx)


def test_async_flow_failures_end_their_spans_and_restore_the_context(
        broker: BrokerProcess, provider: TracerProvider, exporter: InMemorySpanExporter,
        tracing: Tracing) -> None:
    class Raises:
        async def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            raise RuntimeError("database down")

        async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK_MESSAGE

    async def run() -> None:
        tp = AsyncTransactionProducer("apg", broker.endpoints, Raises(), tracing=tracing)
        await tp.start()
        try:
            with provider.get_tracer("shop").start_as_current_span("place order") as business:
                r = await tp.send_message_in_transaction(Message(topic="orders", body=b"x"))
                assert r.outcome == "PENDING"
                with pytest.raises(RemoteError):
                    await tp.send_message_in_transaction(Message(topic="no-such-topic", body=b"x"))
                assert trace.get_current_span() is business  # the flow's scopes were left
            deadline = time.monotonic() + 30
            while not named(exporter, "check_transaction_state orders") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await tp.shutdown()

    asyncio.run(run())
    s = spans(exporter)
    tx, local = s["send_message_in_transaction orders"], s["execute_local_transaction orders"]
    assert (local.attributes or {})["error.type"] == "RuntimeError"
    assert (local.attributes or {})["messaging.rocketmq.transaction.state"] == "unknown"
    assert local.status.description == "database down"
    check = s["check_transaction_state orders"]
    assert parent_of(check) == tx.context.span_id
    assert (check.attributes or {})["messaging.rocketmq.transaction.state"] == "rollback"
    failed, failed_half = s["send_message_in_transaction no-such-topic"], s["send_half no-such-topic"]
    for sp in (failed, failed_half):
        assert sp.status.status_code is StatusCode.ERROR
        assert (sp.attributes or {})["error.type"] == "TOPIC_NOT_EXIST"
    assert parent_of(failed_half) == failed.context.span_id
    assert "execute_local_transaction no-such-topic" not in s


def test_plain_and_batch_sends_pull_receives_and_tracing_off(
        broker: BrokerProcess, provider: TracerProvider, exporter: InMemorySpanExporter,
        tracing: Tracing) -> None:
    with provider.get_tracer("shop").start_as_current_span("job") as job:
        with Producer("pp", broker.endpoints, tracing=tracing) as p:
            p.send(Message(topic="plain", body=b"one"), 0)
            p.send_batch([Message(topic="plain", body=b"b1"), Message(topic="plain", body=b"b2")], 1)
        with Producer("pp", broker.endpoints, tracing=False) as off:
            off.send(Message(topic="plain", body=b"untraced"), 0)
        with PullConsumer(broker.endpoints, "reader", tracing=tracing) as pc:
            r0 = pc.pull("plain", 0, 0, 32)
            pc.assign([("plain", 1)])
            pc.seek("plain", 1, 0)
            polled = pc.poll(1000)
    assert [m.body for m in r0.messages] == [b"one", b"untraced"]
    assert TRACEPARENT not in r0.messages[1].properties  # tracing=False: no property
    assert [m.body for m in polled] == [b"b1", b"b2"]

    s = spans(exporter)
    send, batch = named(exporter, "send plain")
    assert send.kind is batch.kind is SpanKind.PRODUCER
    assert parent_of(send) == parent_of(batch) == job.get_span_context().span_id
    assert (batch.attributes or {})["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in (batch.attributes or {})
    assert (send.attributes or {})["messaging.destination.partition.id"] == "0"
    assert r0.messages[0].properties[TRACEPARENT] == traceparent_of(send)
    assert {m.properties[TRACEPARENT] for m in polled} == {traceparent_of(batch)}
    pull, poll = s["pull plain"], s["poll plain"]
    for sp, linked in ((pull, [send]), (poll, [batch, batch])):
        assert sp.kind is SpanKind.CLIENT and parent_of(sp) == job.get_span_context().span_id
        assert [link.context.span_id for link in sp.links] == [x.context.span_id for x in linked]
        assert (sp.attributes or {})["messaging.operation.type"] == "receive"
    assert (pull.attributes or {})["messaging.batch.message_count"] == 2
    assert len(named(exporter, "send plain")) == 2  # nothing from the untraced producer


def test_orderly_consumption_sends_a_poison_message_to_the_dlq_in_its_trace(
        broker: BrokerProcess, exporter: InMemorySpanExporter, tracing: Tracing) -> None:
    with Producer("pp", broker.endpoints, tracing=tracing) as p:
        p.send(Message(topic="orders", body=b"poison"))
    c = consumer(broker.endpoints, "ordered", lambda m: ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
                 tracing, orderly=True, max_reconsume_times=1, suspend_current_queue_time_ms=100)
    try:
        wait_until(lambda: named(exporter, "dead_letter %DLQ%ordered"), timeout_s=30)
    finally:
        c.shutdown()
    send, dlq = spans(exporter)["send orders"], spans(exporter)["dead_letter %DLQ%ordered"]
    assert send.parent is None  # no business span: the send starts the trace
    assert [parent_of(sp) for sp in named(exporter, "process orders")] == [send.context.span_id] * 2
    assert parent_of(dlq) == send.context.span_id
    assert (dlq.attributes or {})["messaging.operation.type"] == "settle"


def test_sync_flow_failures_end_their_spans_and_restore_the_context(
        broker: BrokerProcess, provider: TracerProvider, exporter: InMemorySpanExporter,
        tracing: Tracing) -> None:
    class Raises:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            raise ValueError("constraint violated")

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK_MESSAGE

    with provider.get_tracer("shop").start_as_current_span("place order") as business, \
            TransactionProducer("spg", broker.endpoints, Raises(), tracing=tracing) as tp:
        assert tp.send_message_in_transaction(Message(topic="orders", body=b"x")).outcome == "PENDING"
        with pytest.raises(RemoteError):
            tp.send_message_in_transaction(Message(topic="no-such-topic", body=b"x"))
        assert trace.get_current_span() is business  # the flow's scopes were left
    s = spans(exporter)
    local = s["execute_local_transaction orders"]
    assert (local.attributes or {})["error.type"] == "ValueError"
    assert (s["end_transaction orders"].attributes or {})["messaging.rocketmq.transaction.state"] == "unknown"
    failed = s["send_message_in_transaction no-such-topic"]
    assert failed.status.status_code is StatusCode.ERROR
    assert parent_of(failed) == business.get_span_context().span_id
    assert parent_of(s["send_half no-such-topic"]) == failed.context.span_id
