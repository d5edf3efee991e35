"""The console's JSON API against a real broker: OpenAPI, overview, topics, groups and offset
resets, outbox, and the answers to bad input (4xx with the reason, nothing changed)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from txmq import limits, outbox
from txmq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from txmq.console import ConsoleConfig, create_app
from txmq.testing import BrokerProcess, run_broker, wait_until

CONTRACT = {
    ("GET", "/api/overview"), ("GET", "/api/topics"), ("GET", "/api/topics/{topic}"),
    ("POST", "/api/topics"), ("PUT", "/api/topics/{topic}"), ("DELETE", "/api/topics/{topic}"),
    ("GET", "/api/groups"), ("GET", "/api/groups/{group}"), ("POST", "/api/groups/{group}/reset-offset"),
    ("GET", "/api/transactions"), ("GET", "/api/transactions/parked"), ("GET", "/api/transactions/{id}"),
    ("POST", "/api/transactions/{id}/resume"), ("POST", "/api/transactions/{id}/commit"),
    ("POST", "/api/transactions/{id}/rollback"), ("GET", "/api/transactions/audit"),
    ("GET", "/api/dlq"), ("GET", "/api/dlq/{group}"), ("GET", "/api/dlq/{group}/{msg_id}"),
    ("POST", "/api/dlq/{group}/resend"), ("GET", "/api/dlq/{group}/export"), ("GET", "/api/messages"),
    ("GET", "/api/messages/{msg_id}"), ("GET", "/api/messages/{msg_id}/msg-trace"), ("GET", "/api/outbox"),
}


def test_the_openapi_document_lists_every_route_of_the_contract(api: httpx.Client) -> None:
    doc = api.get("/api/openapi.json").json()
    routes = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == CONTRACT
    assert api.get("/api/docs").status_code == 200
    # every answer has a schema (the pages and the browser read the same models)
    assert "Overview" in doc["components"]["schemas"] and "MessageTrace" in doc["components"]["schemas"]


def test_overview_reports_the_broker_and_rates_from_the_history(
        api: httpx.Client, console_broker: BrokerProcess, unique: Callable[[str], str],
        create_topic: Callable[..., None]) -> None:
    topic = unique("ov")
    create_topic(api, topic, 2)
    with Producer("ov", console_broker.endpoints) as p:
        def busy() -> bool:
            for _ in range(20):
                p.send(Message(topic=topic, body=b"x"))
            return api.get("/api/overview").json()["in_per_s"] > 0

        wait_until(busy, timeout_s=30)
    ov = api.get("/api/overview").json()
    [b] = ov["brokers"]
    assert b["addr"] == console_broker.endpoints and b["name"] == "broker-a"
    assert b["uptime_ms"] > 0 and b["commitlog_max_offset"] > 0 and b["store_bytes"] > 0
    assert 0 <= b["disk_ratio"] <= 1 and b["version"]
    h = ov["history"]
    assert len(h["t_ms"]) == len(h["in_per_s"]) == len(h["out_per_s"]) == len(h["half_backlog"]) >= 1
    assert h["t_ms"] == sorted(h["t_ms"])


def test_topic_create_list_show_widen_delete(api: httpx.Client, unique: Callable[[str], str]) -> None:
    topic = unique("orders")
    r = api.post("/api/topics", json={"topic": topic, "queues": 3})
    assert (r.status_code, r.json()) == (201, {"topic": topic, "queues": 3})
    [row] = [t for t in api.get("/api/topics").json() if t["topic"] == topic]
    assert row == {"topic": topic, "queues": 3, "perm": 6, "min_offset": 0, "max_offset": 0, "messages": 0}
    detail = api.get(f"/api/topics/{topic}").json()
    assert [q["queue_id"] for q in detail["queues"]] == [0, 1, 2]
    assert detail["route"]["queueDatas"][0]["writeQueueNums"] == 3
    assert api.put(f"/api/topics/{topic}", json={"queues": 5}).json() == {"topic": topic, "queues": 5}
    assert api.delete(f"/api/topics/{topic}").json()["deleted"] is True
    assert api.get(f"/api/topics/{topic}").status_code == 404
    assert topic not in {t["topic"] for t in api.get("/api/topics").json()}


def test_system_topics_are_listed_only_when_asked_for(api: httpx.Client) -> None:
    plain = {t["topic"] for t in api.get("/api/topics").json()}
    every = {t["topic"] for t in api.get("/api/topics", params={"system": "true"}).json()}
    assert "RMQ_SYS_TRANS_HALF_TOPIC" not in plain and "RMQ_SYS_TRANS_HALF_TOPIC" in every
    assert not any(t.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_")) for t in plain)


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"topic": "bad topic!", "queues": 4}, 400, "topic"),
    ({"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queues": 4}, 400, ""),
    ({"topic": "TBW102", "queues": 4}, 400, "default topic"),
    ({"topic": "ok-name", "queues": 0}, 400, "queue count 0"),
    ({"topic": "ok-name", "queues": limits.QUEUE_NUMS_MAX + 1}, 400, "queue count"),
    ({"topic": "ok-name", "queues": "four"}, 400, "queues"),
    ({"queues": 4}, 400, "topic"),
])
def test_bad_topic_creates_are_refused_with_the_reason(api: httpx.Client, body: dict[str, Any], status: int,
                                                       reason: str) -> None:
    r = api.post("/api/topics", json=body)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str) and reason in r.json()["detail"]
    assert "ok-name" not in {t["topic"] for t in api.get("/api/topics").json()}


def test_topic_conflicts_and_shrinking_change_nothing(api: httpx.Client, unique: Callable[[str], str],
                                                      create_topic: Callable[..., None]) -> None:
    topic = unique("t")
    create_topic(api, topic, 4)
    r = api.post("/api/topics", json={"topic": topic, "queues": 8})
    assert r.status_code == 409 and "exists" in r.json()["detail"]
    r = api.put(f"/api/topics/{topic}", json={"queues": 2})
    assert r.status_code == 400 and "cannot shrink" in r.json()["detail"]
    assert len(api.get(f"/api/topics/{topic}").json()["queues"]) == 4
    missing = unique("missing")
    assert api.put(f"/api/topics/{missing}", json={"queues": 4}).status_code == 404
    assert api.delete(f"/api/topics/{missing}").status_code == 404
    assert api.get("/api/topics/bad%20name").status_code == 400


def _consume(endpoints: str, group: str, topic: str, seen: list[MessageExt]) -> PushConsumer:
    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(group, endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(topic)
    c.start()
    return c


def test_groups_lag_and_reset_offset_by_time(api: httpx.Client, console_broker: BrokerProcess,
                                             unique: Callable[[str], str],
                                             create_topic: Callable[..., None]) -> None:
    topic, group = unique("gt"), unique("g")
    create_topic(api, topic, 2)
    with Producer("gp", console_broker.endpoints) as p:
        for i in range(10):
            p.send(Message(topic=topic, body=b"%d" % i, keys=f"k{i}"))
    seen: list[MessageExt] = []
    c = _consume(console_broker.endpoints, group, topic, seen)
    try:
        wait_until(lambda: len(seen) >= 10 and _lag(api, group) == 0)
        [row] = [g for g in api.get("/api/groups").json() if g["group"] == group]
        assert row["model"] == "CLUSTERING" and row["members"] == 1 and row["subscriptions"] == [topic]
        assert row["lag"] == 0 and row["inflight"] == 0
        d = api.get(f"/api/groups/{group}").json()
        assert [m["client_id"] for m in d["members"]] and d["subscriptions"] == [{"topic": topic,
                                                                                 "expression": "*"}]
        queues = [q for q in d["queues"] if q["topic"] == topic]
        assert sum(q["broker_offset"] for q in queues) == 10 and all(q["lag"] == 0 for q in queues)
        wait_until(lambda: len(api.get(f"/api/groups/{group}").json()["lag_history"]["t_ms"]) >= 2)
        # back to the beginning: online members consume everything again
        r = api.post(f"/api/groups/{group}/reset-offset", json={"topic": topic, "timestamp_ms": 0})
        assert r.status_code == 200, r.text
        assert r.json()["group"] == group and sorted(q["queue_id"] for q in r.json()["queues"]) == [0, 1]
        assert all(q["offset"] == 0 for q in r.json()["queues"])
        wait_until(lambda: len(seen) >= 20)
    finally:
        c.shutdown()


def _lag(api: httpx.Client, group: str) -> int | None:
    r = api.get(f"/api/groups/{group}")
    return int(r.json()["lag"]) if r.status_code == 200 else None


def test_bad_offset_resets_are_refused_and_move_nothing(api: httpx.Client, console_broker: BrokerProcess,
                                                        unique: Callable[[str], str],
                                                        create_topic: Callable[..., None]) -> None:
    topic, group = unique("rt"), unique("rg")
    create_topic(api, topic, 1)
    with Producer("rp", console_broker.endpoints) as p:
        for _ in range(3):
            p.send(Message(topic=topic, body=b"x"))
    seen: list[MessageExt] = []
    c = _consume(console_broker.endpoints, group, topic, seen)
    try:
        wait_until(lambda: len(seen) == 3 and _lag(api, group) == 0)
        cases = [(group, {"topic": topic, "timestamp_ms": -5}, 400),
                 (group, {"topic": unique("nope"), "timestamp_ms": 0}, 404),
                 (unique("ghost"), {"topic": topic, "timestamp_ms": 0}, 404),
                 ("bad@group", {"topic": topic, "timestamp_ms": 0}, 400),
                 (group, {"topic": "bad topic", "timestamp_ms": 0}, 400),
                 (group, {"topic": topic}, 400)]
        for g, body, status in cases:
            r = api.post(f"/api/groups/{g}/reset-offset", json=body)
            assert r.status_code == status, (g, body, r.text)
            assert r.json()["detail"]
        time.sleep(0.5)
        assert len(seen) == 3 and _lag(api, group) == 0
    finally:
        c.shutdown()
    assert api.get(f"/api/groups/{unique('ghost')}").status_code == 404


def test_an_unreachable_broker_answers_502_with_the_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(ConsoleConfig(brokers=[f"127.0.0.1:{port}"]))

    async def main() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                return await client.get("/api/topics")

    r = asyncio.run(main())
    assert r.status_code == 502 and str(port) in r.json()["detail"]


def test_outbox_summary_or_404_without_a_database(api: httpx.Client, tmp_path: Path,
                                                  console_broker: BrokerProcess,
                                                  asgi_client: Callable[..., Any]) -> None:
    r = api.get("/api/outbox")
    assert r.status_code == 404 and "--outbox-url" in r.json()["detail"]
    engine = outbox.create_sqlite_engine(tmp_path / "o.db")
    outbox.init_db(engine)
    with engine.begin() as conn:
        for i in range(3):
            outbox.put_message(conn, Message(topic="orders", body=b"{}"), event_type="E", biz_key=str(i),
                               app_id="svc")
    engine.dispose()
    app = create_app(ConsoleConfig(brokers=[console_broker.endpoints],
                                   outbox_url=f"sqlite:///{tmp_path / 'o.db'}"))

    async def main() -> dict[str, Any]:
        async with asgi_client(app) as client:
            r = await client.get("/api/outbox")
            assert r.status_code == 200, r.text
            return dict(r.json())

    got = asyncio.run(main())
    assert got["statuses"] == [{"status": "PRODUCE_INIT", "rows": 3, "oldest_age_ms": got["statuses"][0]
                                ["oldest_age_ms"]}]
    assert got["leases"] == [] and got["inbox"] == {"rows": 0, "duplicates": 0}


def test_the_console_command_serves_the_api_on_loopback(console_broker: BrokerProcess,
                                                        tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "console.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "txmq", "console", "--port", str(port), "--broker",
                             console_broker.endpoints], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/overview", timeout=5).status_code == 200
            except httpx.TransportError:
                return proc.poll() is None and False

        wait_until(up, timeout_s=60)
        assert "127.0.0.1" in (tmp_path / "console.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_brokers_are_found_through_the_name_server(tmp_path: Path, serve_console: Callable[..., Any]) -> None:
    port_file = tmp_path / "namesrv.port"
    ns = subprocess.Popen([sys.executable, "-m", "txmq", "namesrv", "--port", "0", "--port-file",
                           str(port_file), "--log-level", "WARNING"])
    try:
        wait_until(lambda: port_file.exists() and port_file.read_text().strip() != "", 30)
        addr = f"127.0.0.1:{int(port_file.read_text())}"
        with run_broker(tmp_path / "b", namesrv_addr=addr, broker_name="broker-ns") as b, \
                serve_console(ConsoleConfig(namesrv_addr=addr)) as s, \
                httpx.Client(base_url=s.url, timeout=30) as api:
            def found() -> bool:
                r = api.get("/api/overview")
                return r.status_code == 200 and [x["addr"] for x in r.json()["brokers"]] == [b.endpoints]

            wait_until(found, 30)
            assert api.post("/api/topics", json={"topic": "ns-topic", "queues": 2}).status_code == 201
            assert "ns-topic" in {t["topic"] for t in api.get("/api/topics").json()}
            wait_until(lambda: api.get("/api/topics/ns-topic").json()["route"].get("brokerDatas"), 30)
            route = api.get("/api/topics/ns-topic").json()["route"]
            assert route["brokerDatas"][0]["brokerName"] == "broker-ns"
    finally:
        ns.terminate()
        ns.wait(10)
