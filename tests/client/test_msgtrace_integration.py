"""txmq's clients with ``enable_msg_trace``, against real broker processes: the RocketMQ message trace
records they write to the trace topic (Pub, EndTransaction from the producer and from a check-back
answer, SubBefore / SubAfter per delivery with its retry times), found by message id through the
broker's key index and decoded; a trace that cannot be sent never fails a send."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.client import (
    Admin,
    AsyncProducer,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from txmq.errors import ConfigError
from txmq.protocol import (
    RMQ_SYS_TRACE_TOPIC,
    EndTransactionRecord,
    PubRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceMessageType,
    TraceRecord,
    decode_trace_records,
)
from txmq.testing import BrokerProcess, run_broker, wait_until

FAST = {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300,
        "message_delay_level": " ".join(["100ms"] * 18)}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"t": 2, "my-trace": 1}, trace_topic_enable=True,
                    **FAST) as b:
        yield b


def records(endpoints: str, msg_id: str, topic: str = RMQ_SYS_TRACE_TOPIC) -> list[TraceRecord]:
    """The records about ``msg_id`` in ``topic``: QUERY_MESSAGE by the id key, then decode."""
    with Admin(endpoints) as a:
        try:
            found = a.query_messages(topic, msg_id)
        except Exception:
            return []
    out = [r for m in found for r in decode_trace_records(m.body) if r.msg_id == msg_id]
    return sorted(out, key=lambda r: (r.timestamp_ms, r.type != "SubBefore"))


class Listener:
    """Commits ``commit-*``, says UNKNOWN for ``unknown-*`` (then commits at check-back)."""

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        if msg.keys.startswith("unknown"):
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def test_producer_transaction_producer_and_consumer_write_their_records(broker: BrokerProcess) -> None:
    ep = broker.endpoints
    with Producer("trace-pg", ep, enable_msg_trace=True) as p:
        plain = p.send(Message(topic="t", body=b"plain", tags="A", keys="plain-1 order-9"))
        tracer = p._a.msg_trace
    assert tracer is not None and tracer.messages_sent >= 1 and tracer.send_failures == 0
    with TransactionProducer("trace-tg", ep, Listener(), enable_msg_trace=True) as tp:
        committed = tp.send_message_in_transaction(Message(topic="t", body=b"c", keys="commit-1"))
        unknown = tp.send_message_in_transaction(Message(topic="t", body=b"u", keys="unknown-1"))
        wait_until(lambda: tp._a.checks_answered >= 1, 20)
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            n = seen[msgs[0].msg_id] = seen.get(msgs[0].msg_id, 0) + 1
        first_plain = msgs[0].msg_id == plain.msg_id and n == 1
        return ConsumeStatus.RECONSUME_LATER if first_plain else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("trace-cg", ep, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     suspend_ms=300, consume_message_batch_max_size=1, enable_msg_trace=True)
    c.subscribe("t")
    c.start()
    try:
        wait_until(lambda: seen.get(plain.msg_id, 0) >= 2 and len(seen) >= 3, 30)
    finally:
        c.shutdown()  # sends the records it holds

    pub, *subs = records(ep, plain.msg_id)
    assert isinstance(pub, PubRecord)
    assert (pub.group_name, pub.topic, pub.tags, pub.keys, pub.msg_type, pub.success) == (
        "trace-pg", "t", "A", "plain-1 order-9", TraceMessageType.Normal_Msg, True)
    assert pub.store_host == ep and pub.offset_msg_id == plain.offset_msg_id and pub.cost_time_ms >= 0
    assert [(type(r).__name__, getattr(r, "retry_times", None), getattr(r, "success", None))
            for r in subs] == [("SubBeforeRecord", 0, None), ("SubAfterRecord", None, False),
                               ("SubBeforeRecord", 1, None), ("SubAfterRecord", None, True)]
    assert all(r.group_name == "trace-cg" for r in subs)
    first_after = subs[1]
    assert isinstance(first_after, SubAfterRecord) and first_after.context_code == 4  # FAILED

    half, end, *rest = records(ep, committed.msg_id)
    assert isinstance(half, PubRecord) and half.msg_type is TraceMessageType.Trans_Msg_Half
    assert isinstance(end, EndTransactionRecord)
    assert (end.transaction_state, end.from_transaction_check, end.group_name, end.keys) == (
        "COMMIT_MESSAGE", False, "trace-tg", "commit-1")
    assert [type(r) for r in rest] == [SubBeforeRecord, SubAfterRecord]

    ends = [r for r in records(ep, unknown.msg_id) if isinstance(r, EndTransactionRecord)]
    assert [(e.transaction_state, e.from_transaction_check) for e in ends][:2] == [
        ("UNKNOW", False), ("COMMIT_MESSAGE", True)]  # the producer, then its check-back answer


def test_a_trace_that_cannot_be_sent_never_fails_a_send(tmp_path: Path) -> None:
    # a broker without the trace topic (trace_topic_enable off, RocketMQ's default, no auto-create)
    with run_broker(tmp_path / "b", topics={"t": 1}) as b, \
            Producer("untraced", b.endpoints, enable_msg_trace=True) as p:
        sent = [p.send(Message(topic="t", body=b"x")) for _ in range(12)]
        tracer = p._a.msg_trace
        assert tracer is not None
        wait_until(lambda: tracer.send_failures >= 1, 10)  # the full batch was tried at once
    assert len(sent) == 12 and tracer.messages_sent == 0


def test_custom_trace_topic_with_the_asyncio_producer(broker: BrokerProcess) -> None:
    async def run() -> str:
        p = AsyncProducer("custom-pg", broker.endpoints, enable_msg_trace=True,
                          custom_trace_topic="my-trace")
        await p.start()
        try:
            return (await p.send(Message(topic="t", body=b"x", keys="k"))).msg_id
        finally:
            await p.shutdown()

    msg_id = asyncio.run(run())
    [pub] = records(broker.endpoints, msg_id, "my-trace")
    assert isinstance(pub, PubRecord) and pub.group_name == "custom-pg"
    assert records(broker.endpoints, msg_id) == []
    with pytest.raises(ConfigError, match="custom_trace_topic"):
        Producer("p", broker.endpoints, enable_msg_trace=True, custom_trace_topic="no/such")
