"""Messages and dead letters through the console API against a real broker: search by key and by
id, the trace of a committed message consumed by a group and of a message retried into the DLQ,
the DLQ pages, export and resend (unknown ids refused, nothing resent)."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from txmq.client import (
    Admin,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from txmq.testing import BrokerProcess, wait_until


class Commit:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _consumer(endpoints: str, group: str, topic: str, status: ConsumeStatus,
              seen: list[MessageExt]) -> PushConsumer:
    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(msgs)
        return status

    c = PushConsumer(group, endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     max_reconsume_times=1)
    c.subscribe(topic)
    c.start()
    return c


def test_trace_of_a_committed_message_consumed_by_a_group(api: httpx.Client, console_broker: BrokerProcess,
                                                          unique: Callable[[str], str],
                                                          create_topic: Callable[..., None]) -> None:
    topic, group, idle = unique("paid"), unique("billing"), unique("idle")
    create_topic(api, topic, 2)
    with TransactionProducer("shop", console_broker.endpoints, Commit()) as tp:
        sent = tp.send_message_in_transaction(Message(topic=topic, body=b'{"order": 7}', keys="order-7"))
    assert sent.outcome == "COMMIT"
    seen: list[MessageExt] = []
    c = _consumer(console_broker.endpoints, group, topic, ConsumeStatus.CONSUME_SUCCESS, seen)
    with Admin(console_broker.endpoints) as adm:  # a group with an offset that has not got there
        adm.reset_offset(idle, topic, offset=0)
    try:
        def consumed() -> bool:
            trace = api.get(f"/api/messages/{sent.msg_id}").json()["trace"]
            return any(e["kind"] == "delivered" and e["group"] == group and e["detail"].startswith("consumed")
                       for e in trace)

        wait_until(consumed)
    finally:
        c.shutdown()
    got = api.get(f"/api/messages/{sent.msg_id}").json()
    m = got["message"]
    assert (m["msg_id"], m["topic"], m["keys"], m["body"], m["body_encoding"]) == (
        sent.msg_id, topic, "order-7", '{"order": 7}', "utf-8")
    kinds = [(e["kind"], e["by"], e["group"]) for e in got["trace"]]
    assert kinds == [("half", "", ""), ("commit", "producer", ""), ("stored", "", ""),
                     ("delivered", "", group), ("delivered", "", idle)]
    half, commit, stored = got["trace"][:3]
    assert half["time_ms"] <= commit["time_ms"] == stored["time_ms"]
    assert f"{topic} queue {m['queue_id']} offset {m['queue_offset']}" == stored["detail"]
    assert got["trace"][4]["detail"].startswith("not yet consumed")


def test_message_search_by_key_and_by_id(api: httpx.Client, console_broker: BrokerProcess,
                                         unique: Callable[[str], str],
                                         create_topic: Callable[..., None]) -> None:
    topic = unique("search")
    create_topic(api, topic, 1)
    before = int(time.time() * 1000)
    with Producer("sp", console_broker.endpoints) as p:
        ids = [p.send(Message(topic=topic, body=b"\xff\x00bin" if i else b"text", keys=f"cust-1 n{i}")).msg_id
               for i in range(3)]
    items = api.get("/api/messages", params={"topic": topic, "key": "cust-1"}).json()["items"]
    assert sorted(i["msg_id"] for i in items) == sorted(ids)
    assert {i["body_preview"] for i in items} == {"text", "(5 bytes)"}
    later = int(time.time() * 1000) + 60_000
    assert api.get("/api/messages", params={"topic": topic, "key": "cust-1", "begin_ms": later,
                                            "end_ms": later + 1}).json() == {"items": []}
    assert api.get("/api/messages", params={"topic": topic, "key": "cust-1", "begin_ms": before,
                                            "end_ms": later}).json()["items"]
    [one] = api.get("/api/messages", params={"msg_id": ids[1]}).json()["items"]
    assert one["topic"] == topic
    got = api.get(f"/api/messages/{ids[1]}").json()["message"]
    assert got["body_encoding"] == "base64" and got["body_bytes"] == 5
    assert [e["kind"] for e in api.get(f"/api/messages/{ids[0]}").json()["trace"]] == ["stored"]


@pytest.mark.parametrize(("params", "status"), [
    ({}, 400), ({"topic": "t-only"}, 400), ({"key": "k-only"}, 400),
    ({"topic": "bad topic", "key": "k"}, 400), ({"topic": "no-such-topic-xyz", "key": "k"}, 404),
    ({"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "key": "k", "begin_ms": 5, "end_ms": 4}, 400),
    ({"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "key": "k", "begin_ms": -1}, 400),
    ({"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "key": "k", "begin_ms": "yesterday"}, 400),
])
def test_bad_message_searches_say_why(api: httpx.Client, params: dict[str, object], status: int) -> None:
    r = api.get("/api/messages", params=params)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]


def test_an_unknown_message_id_is_404(api: httpx.Client) -> None:
    r = api.get("/api/messages/7F0000010000000000000000DEADBEEF")
    assert r.status_code == 404 and "no message" in r.json()["detail"]


@pytest.fixture(scope="module")
def dead_letters(console_broker: BrokerProcess, console_server: Any, unique: Callable[[str], str],
                 create_topic: Callable[..., None]) -> tuple[str, str, list[str]]:
    """A topic, a group whose listener always fails (1 retry), and the ids of 3 messages that
    went through %RETRY% into %DLQ%."""
    topic, group = unique("fail"), unique("fragile")
    with httpx.Client(base_url=console_server.url, timeout=30) as api:
        create_topic(api, topic, 1)
        with Producer("dp", console_broker.endpoints) as p:
            ids = [p.send(Message(topic=topic, body=b"poison %d" % i, keys=f"p{i}", tags="bad")).msg_id
                   for i in range(3)]
        seen: list[MessageExt] = []
        c = _consumer(console_broker.endpoints, group, topic, ConsumeStatus.RECONSUME_LATER, seen)
        try:
            wait_until(lambda: any(d["group"] == group and d["messages"] == 3
                                   for d in api.get("/api/dlq").json()))
        finally:
            c.shutdown()
    return topic, group, ids


def test_trace_of_a_message_retried_into_the_dlq(api: httpx.Client, dead_letters: tuple[str, str, list[str]]
                                                 ) -> None:
    topic, group, ids = dead_letters
    got = api.get(f"/api/messages/{ids[0]}").json()
    assert got["message"]["topic"] == topic
    kinds = [(e["kind"], e["group"]) for e in got["trace"]]
    assert kinds == [("stored", ""), ("delivered", group), ("retry", group), ("dlq", group)]
    stored, delivered, retry, dlq = got["trace"]
    assert delivered["detail"].startswith("consumed")
    assert stored["time_ms"] <= retry["time_ms"] <= dlq["time_ms"]
    assert f"%RETRY%{group}" in retry["detail"] and f"%DLQ%{group}" in dlq["detail"]


def test_dlq_list_page_show_and_export(api: httpx.Client, dead_letters: tuple[str, str, list[str]]) -> None:
    topic, group, ids = dead_letters
    [row] = [d for d in api.get("/api/dlq").json() if d["group"] == group]
    assert row == {"group": group, "topic": f"%DLQ%{group}", "messages": 3}
    page = api.get(f"/api/dlq/{group}", params={"page": 0, "size": 2}).json()
    assert page["total"] == 3 and [i["msg_id"] for i in page["items"]] == ids[:2]
    first = page["items"][0]
    assert (first["origin_topic"], first["keys"], first["tags"], first["body_preview"]) == (
        topic, "p0", "bad", "poison 0")
    assert first["reconsume_times"] >= 1 and first["stored_ms"] >= first["born_ms"] > 0
    second = api.get(f"/api/dlq/{group}", params={"page": 1, "size": 2}).json()["items"]
    assert [i["msg_id"] for i in second] == ids[2:]
    assert api.get(f"/api/dlq/{group}", params={"page": 5}).json()["items"] == []
    one = api.get(f"/api/dlq/{group}/{ids[1]}").json()
    assert one["body"] == "poison 1" and one["properties"]["RETRY_TOPIC"] == topic
    assert api.get(f"/api/dlq/{group}/NOT-AN-ID").status_code == 404
    exported = api.get(f"/api/dlq/{group}/export", params={"format": "json"})
    assert exported.headers["content-disposition"] == f'attachment; filename="dlq-{group}.json"'
    assert [r["msg_id"] for r in exported.json()] == ids and exported.json()[0]["origin_topic"] == topic
    rows = list(csv.DictReader(io.StringIO(api.get(f"/api/dlq/{group}/export",
                                                   params={"format": "csv"}).text)))
    assert [r["msg_id"] for r in rows] == ids and rows[2]["body"] == "poison 2"
    assert api.get(f"/api/dlq/{group}/export", params={"format": "xml"}).status_code == 400
    assert api.get(f"/api/dlq/{group}", params={"size": 0}).status_code == 400
    assert api.get("/api/dlq/bad@group").status_code == 400
    assert api.get("/api/dlq/nobody-here").json() == {"group": "nobody-here", "total": 0, "items": []}
    # reading the DLQ leaves no trace of the console as a consumer group
    assert not {"TXMQ_CONSOLE", "TXMQ_ADMIN"} & {g["group"] for g in api.get("/api/groups").json()}


def test_dlq_resend_refuses_unknown_ids_and_resends_known_ones(
        api: httpx.Client, console_broker: BrokerProcess, dead_letters: tuple[str, str, list[str]]) -> None:
    _, group, ids = dead_letters
    with Admin(console_broker.endpoints) as adm:
        def retry_max() -> int:
            return adm.topic_stats(f"%RETRY%{group}").offset_table[0].max_offset

        before = retry_max()
        r = api.post(f"/api/dlq/{group}/resend", json={"msg_ids": [ids[0], "NO-SUCH-ID"]})
        assert r.status_code == 404 and "NO-SUCH-ID" in r.json()["detail"]
        assert retry_max() == before  # nothing half-done
        r = api.post(f"/api/dlq/{group}/resend", json={"msg_ids": [ids[0]]})
        assert r.json() == {"results": [{"msg_id": ids[0], "ok": True, "error": "", "new_msg_id": ids[0]}]}
        assert retry_max() == before + 1
        r = api.post(f"/api/dlq/{group}/resend", json={"msg_ids": []})
        assert [(x["msg_id"], x["ok"]) for x in r.json()["results"]] == [(i, True) for i in ids]
        assert retry_max() == before + 4
        [resent] = [m for m in adm.view_message(ids[0]) if m.topic == f"%RETRY%{group}"
                    and m.queue_offset == before]
        assert resent.reconsume_times == 0 and resent.body == b"poison 0"
