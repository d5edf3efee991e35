"""The RocketMQ C++ client (core 2.1.0) with message trace on, against a txmq broker with
``trace_topic_enable``: its trace records appear in the console's message trace.

What the C++ core writes (read from ``apache/rocketmq-client-cpp`` ``src/trace``, and seen here):
producers, with the C API's ``SetProducerMessageTrace`` (the Python wrapper does not expose it; the
scenario script calls it through ``ctypes``), a ``Pub`` per sync send, to
``rmq_sys_TRACE_DATA_<region>`` where region is the send response's ``MSG_REGION`` (the broker's
``region_id``, ``DefaultRegion``); the transaction producer a ``Pub`` of the half, and no
``EndTransaction`` (the C++ core has no end-transaction trace hook); push consumers (trace is always
on in the scenarios: the core crashes shutting down a consumer with trace off) a ``SubBefore`` and a
6-field ``SubAfter`` per message to ``rmq_sys_TRACE_DATA_<region>``, region the message's
``MSG_REGION`` property (which the broker adds with ``trace_topic_enable``; else ``DEFAULT_REGION``),
the SubAfter without time or group: the console takes them from its SubBefore.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rocketmq_cpp_helpers import DELAY_LEVELS, FAST_TX, CppFactory

from txmq.console import ConsoleConfig, create_app
from txmq.testing import BrokerProcess, run_broker

pytestmark = pytest.mark.slow


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """This module's broker (the ``cpp`` fixture's): trace topics created at start."""
    with run_broker(tmp_path / "broker", topics={"cpp-trace": 4}, trace_topic_enable=True,
                    message_delay_level=DELAY_LEVELS, **FAST_TX) as b:
        yield b


def console_msg_trace(endpoints: str, *msg_ids: str) -> dict[str, dict[str, Any]]:
    """``GET /api/messages/{id}/msg-trace`` of each id, from the console app over ``endpoints``."""
    async def run() -> dict[str, dict[str, Any]]:
        app = create_app(ConsoleConfig(brokers=[endpoints]))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://console") as client:
            out = {}
            for m in msg_ids:
                r = await client.get(f"/api/messages/{m}/msg-trace")
                assert r.status_code == 200, r.text
                out[m] = r.json()
            page = await client.get(f"/messages/{msg_ids[0]}")
            assert page.status_code == 200 and 'data-type="Pub"' in page.text
            return out
    return asyncio.run(run())


def test_cpp_producer_and_consumer_trace_records_appear_in_the_console(
        cpp: CppFactory, broker: BrokerProcess) -> None:
    producer = cpp("produce", "--topic", "cpp-trace", "--group", "CppTraceProducers", "--count", "2",
                   "--prefix", "traced", "--trace", "--linger", "2")
    sent = {e["key"]: e["msg_id"] for e in producer.ok() if e["event"] == "sent"}
    tx = cpp("transact", "--topic", "cpp-trace", "--group", "CppTraceTx", "--plan", "commit",
             "--prefix", "traced-tx", "--trace", "--linger", "2")
    sent |= {e["key"]: e["msg_id"] for e in tx.ok() if e["event"] == "sent"}
    consumer = cpp("consume", "--topic", "cpp-trace", "--group", "CppTraceConsumers", "--expect", "3",
                   "--later", "traced-1", "--later-times", "1", "--idle", "3")
    assert sorted({e["key"] for e in consumer.ok() if e["event"] == "received"}) == [
        "traced-0", "traced-1", "traced-tx-0"]

    pages = console_msg_trace(broker.endpoints, *sent.values())
    plain = pages[sent["traced-0"]]
    assert [r["type"] for r in plain["records"]] == ["Pub", "SubBefore", "SubAfter"], plain
    pub, before, after = plain["records"]
    assert (pub["group"], pub["success"], pub["msg_type"], pub["keys"], pub["tags"]) == (
        "CppTraceProducers", True, "Normal_Msg", "traced-0", "cpp")
    assert pub["store_host"] == broker.endpoints and pub["cost_ms"] >= 0
    assert pub["client_host"].startswith("127.0.0.1:")  # the trace message's born host
    assert pub["region_id"] == "DefaultRegion" and pub["trace_topic"] == "rmq_sys_TRACE_DATA_DefaultRegion"
    assert (before["group"], before["retry_times"], before["region_id"], before["trace_topic"]) == (
        "CppTraceConsumers", 0, "DefaultRegion", "rmq_sys_TRACE_DATA_DefaultRegion")
    assert (after["group"], after["success"], after["retry_times"]) == ("CppTraceConsumers", True, 0)
    assert after["time_ms"] >= before["time_ms"] > 0
    assert plain["errors"] == []

    retried = pages[sent["traced-1"]]
    subs = [(r["type"], r["retry_times"], r["success"]) for r in retried["records"][1:]]
    assert subs == [("SubBefore", 0, None), ("SubAfter", 0, False),
                    ("SubBefore", 1, None), ("SubAfter", 1, True)], retried

    half = pages[sent["traced-tx-0"]]
    assert [(r["type"], r["group"], r["msg_type"]) for r in half["records"] if r["type"] == "Pub"] == [
        ("Pub", "CppTraceTx", "Trans_Msg_Half")]
    assert "EndTransaction" not in {r["type"] for r in half["records"]}  # the C++ core writes none
