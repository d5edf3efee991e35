"""The console's RocketMQ message trace (``GET /api/messages/{id}/msg-trace`` and the message page's
"Message trace" section) over a real broker with ``trace_topic_enable``: records written by txmq's
SDK (``enable_msg_trace``), and records written as RocketMQ's Java client writes them
(``TraceDataEncoder``) and as the C++ client does (its region topic, its 6-field SubAfter), a
record that does not decode reported beside the others, a custom trace topic."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from txmq.client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from txmq.console import ConsoleConfig
from txmq.protocol import CONTENT_SPLITOR, FIELD_SPLITOR, RMQ_SYS_TRACE_TOPIC
from txmq.testing import BrokerProcess, run_broker, wait_until


@pytest.fixture(scope="module")
def trace_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("trace-broker"), topics={"orders": 2, "my-trace": 1},
                    trace_topic_enable=True, transaction_timeout_ms=300,
                    transaction_check_interval_ms=300,
                    message_delay_level=" ".join(["100ms"] * 18)) as b:
        yield b


@pytest.fixture(scope="module")
def tapi(trace_broker: BrokerProcess, serve_console: Callable[..., Any]) -> Iterator[httpx.Client]:
    with serve_console(ConsoleConfig(brokers=[trace_broker.endpoints])) as s, \
            httpx.Client(base_url=s.url, timeout=30) as client:
        yield client


def java(*fields: str) -> bytes:
    return (CONTENT_SPLITOR.join(fields) + FIELD_SPLITOR).encode()


def write_trace(endpoints: str, topic: str, body: bytes, keys: str) -> None:
    """A trace message as a RocketMQ client's trace producer sends it (keys: ids and keys)."""
    with Producer("_INNER_TRACE_PRODUCER-test", endpoints) as p:
        p.send(Message(topic=topic, body=body, keys=keys))


def msg_trace(api: httpx.Client, msg_id: str, **params: Any) -> dict[str, Any]:
    r = api.get(f"/api/messages/{msg_id}/msg-trace", params=params)
    assert r.status_code == 200, r.text
    page: dict[str, Any] = r.json()
    return page


def kinds(page: dict[str, Any]) -> list[str]:
    return [r["type"] for r in page["records"]]


class Listener:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.ROLLBACK_MESSAGE


def test_sdk_records_show_as_a_timeline(trace_broker: BrokerProcess, tapi: httpx.Client) -> None:
    ep = trace_broker.endpoints
    with Producer("api-pg", ep, enable_msg_trace=True) as p:
        sent = p.send(Message(topic="orders", body=b"o-1", keys="order-1"))
    with TransactionProducer("api-tg", ep, Listener(), enable_msg_trace=True) as tp:
        half = tp.send_message_in_transaction(Message(topic="orders", body=b"o-2", keys="order-2"))
        wait_until(lambda: tp._a.checks_answered >= 1, 20)
    calls: list[str] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            calls.append(msgs[0].msg_id)
            again = calls.count(sent.msg_id) == 1 and msgs[0].msg_id == sent.msg_id
        return ConsumeStatus.RECONSUME_LATER if again else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("api-cg", ep, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET", suspend_ms=300,
                     consume_message_batch_max_size=1, enable_msg_trace=True)
    c.subscribe("orders")
    c.start()
    try:
        wait_until(lambda: calls.count(sent.msg_id) >= 2, 30)
    finally:
        c.shutdown()

    page = msg_trace(tapi, sent.msg_id)
    assert kinds(page) == ["Pub", "SubBefore", "SubAfter", "SubBefore", "SubAfter"]
    pub, b0, a0, b1, a1 = page["records"]
    assert (pub["group"], pub["success"], pub["msg_type"], pub["store_host"]) == (
        "api-pg", True, "Normal_Msg", ep)
    assert pub["client_host"].startswith("127.0.0.1:") and pub["cost_ms"] >= 0
    assert [(r["group"], r["retry_times"]) for r in (b0, a0, b1, a1)] == [
        ("api-cg", 0), ("api-cg", 0), ("api-cg", 1), ("api-cg", 1)]
    assert (a0["success"], a0["consume_result"], a1["success"], a1["consume_result"]) == (
        False, "FAILED", True, "SUCCESS")
    assert any(t.endswith(RMQ_SYS_TRACE_TOPIC) for t in page["topics"]) and page["errors"] == []

    tx = msg_trace(tapi, half.msg_id)
    ends = [(r["transaction_state"], r["by"]) for r in tx["records"] if r["type"] == "EndTransaction"]
    assert kinds(tx)[0] == "Pub" and tx["records"][0]["msg_type"] == "Trans_Msg_Half"
    assert ends[:2] == [("unknown", "producer"), ("rollback", "check-back")]


def test_java_and_cpp_records_with_a_bad_one_and_a_custom_topic(trace_broker: BrokerProcess,
                                                                 tapi: httpx.Client) -> None:
    ep = trace_broker.endpoints
    with Producer("plain", ep) as p:
        m = p.send(Message(topic="orders", body=b"x", keys="java-1")).msg_id
    # as RocketMQ's Java client writes them (TraceDataEncoder.encoderFromContextBean), one trace
    # message of a batch holding another message's record too, and a record that does not decode
    other = "7F0000010B2A18B4AAC25F6E2A0D9999"
    body = b"".join([
        java("Pub", "1700000000100", "DefaultRegion", "java-pg", "orders", m, "null", "java-1",
             "10.0.0.5:10911", "1", "3", "1", "0A00000500002A9F0000000000001A2B", "true"),
        java("Pub", "1700000000101", "DefaultRegion", "java-pg", "orders", other, "null", "null",
             "10.0.0.5:10911", "1", "3", "0", "", "true"),
        java("EndTransaction", "1700000000200", "DefaultRegion", "java-pg", "orders", m, "null",
             "java-1", "10.0.0.5:10911", "2", m, "COMMIT_MESSAGE", "true"),
        java("EndTransaction", "1700000000201", "DefaultRegion", "java-pg", "orders", m, "null",
             "java-1", "10.0.0.5:10911", "7", m, "COMMIT_MESSAGE", "false"),  # msgType 7: bad
    ])
    write_trace(ep, RMQ_SYS_TRACE_TOPIC, body, f"{m} java-1 {other}")
    # as the C++ client writes them: to its region topic, a SubAfter without time or group
    cpp = java("SubBefore", "1700000000300", "DEFAULT_REGION", "cpp-cg", "REQ-1", m, "0", "java-1") + \
        java("SubAfter", "REQ-1", m, "7", "true", "java-1")
    write_trace(ep, "rmq_sys_TRACE_DATA_DEFAULT_REGION", cpp, f"{m} java-1")
    write_trace(ep, "my-trace", java("SubBefore", "1700000000400", "DefaultRegion", "custom-cg", "REQ-2",
                                     m, "3", "java-1"), m)

    page = msg_trace(tapi, m)
    assert kinds(page) == ["Pub", "EndTransaction", "SubBefore", "SubAfter"]
    pub, end, before, after = page["records"]
    assert (pub["group"], pub["msg_type"], pub["tags"], pub["keys"]) == (
        "java-pg", "Trans_Msg_Half", "", "java-1")
    assert (end["transaction_state"], end["by"]) == ("commit", "check-back")
    assert (before["group"], before["trace_topic"]) == ("cpp-cg", "rmq_sys_TRACE_DATA_DEFAULT_REGION")
    # the C++ SubAfter takes its time and group from its SubBefore (same request id)
    assert (after["group"], after["time_ms"], after["cost_ms"], after["retry_times"]) == (
        "cpp-cg", 1700000000307, 7, 0)
    [bad] = page["errors"]
    assert "msgType 7" in bad and RMQ_SYS_TRACE_TOPIC in bad

    custom = msg_trace(tapi, m, trace_topic="my-trace")
    assert [r["group"] for r in custom["records"] if r["trace_topic"] == "my-trace"] == ["custom-cg"]
    assert tapi.get(f"/api/messages/{m}/msg-trace", params={"trace_topic": "no/such"}).status_code == 400

    # the message page shows the section, server-side rendered
    html = tapi.get(f"/messages/{m}").text
    assert 'id="msg-trace-records"' in html
    for kind in ("Pub", "EndTransaction", "SubBefore", "SubAfter"):
        assert f'data-type="{kind}"' in html
    assert "msgType 7" in html


def test_a_message_without_trace_records(trace_broker: BrokerProcess, tapi: httpx.Client) -> None:
    with Producer("plain", trace_broker.endpoints) as p:
        m = p.send(Message(topic="orders", body=b"x")).msg_id
    page = msg_trace(tapi, m)
    assert page["records"] == [] and page["errors"] == []
    assert 'id="msg-trace-empty"' in tapi.get(f"/messages/{m}").text


def test_the_trace_topics_are_system_topics_in_the_topic_list(tapi: httpx.Client) -> None:
    shown = {t["topic"] for t in tapi.get("/api/topics").json()}
    assert "orders" in shown and RMQ_SYS_TRACE_TOPIC not in shown
    every = {t["topic"] for t in tapi.get("/api/topics", params={"system": "true"}).json()}
    assert {RMQ_SYS_TRACE_TOPIC, "rmq_sys_TRACE_DATA_DefaultRegion",
            "rmq_sys_TRACE_DATA_DEFAULT_REGION"} <= every
