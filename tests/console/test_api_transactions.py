"""Transactions through the console API against real brokers: the pending list, operators'
commit and rollback (operator required, recorded, a second decision refused), the audit log and
its speed with 100,000 pending transactions, parked (discarded) halves and resume, and the trace
of a message rolled back by an operator."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from txmq.client import (
    Admin,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionProducer,
)
from txmq.console import ConsoleConfig
from txmq.protocol import OP_TOPIC
from txmq.testing import BrokerProcess, run_broker, wait_until


class Undecided:
    """A local transaction that never decides (the half message stays pending)."""

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def _pending(endpoints: str, topic: str, n: int, group: str = "txp") -> list[str]:
    with TransactionProducer(group, endpoints, Undecided()) as tp:
        return [tp.send_message_in_transaction(
            Message(topic=topic, body=b"order %d" % i, keys=f"o{i}")).msg_id for i in range(n)]


def test_pending_list_operator_decisions_and_audit(api: httpx.Client, console_broker: BrokerProcess,
                                                   unique: Callable[[str], str],
                                                   create_topic: Callable[..., None]) -> None:
    topic = unique("tx")
    create_topic(api, topic, 1)
    ids = _pending(console_broker.endpoints, topic, 3)
    page = api.get("/api/transactions", params={"limit": 1000}).json()
    mine = [t for t in page["items"] if t["topic"] == topic]
    assert [t["id"] for t in mine] == ids  # oldest first
    assert page["pending_total"] >= 3 and mine[0]["producer_group"] == "txp" and mine[0]["keys"] == "o0"
    assert mine[0]["age_ms"] >= mine[2]["age_ms"] >= 0 and mine[0]["born_host"]
    assert api.get(f"/api/transactions/{ids[0]}").json()["state"] == "PENDING"
    # no operator: refused, nothing decided
    for body in ({"reason": "no one"}, {"operator": "  ", "reason": "blank"}):
        r = api.post(f"/api/transactions/{ids[0]}/commit", json=body)
        assert r.status_code == 400 and "operator" in r.json()["detail"]
    assert api.get(f"/api/transactions/{ids[0]}").json()["state"] == "PENDING"
    r = api.post(f"/api/transactions/{ids[0]}/commit", json={"operator": "alice", "reason": "paid"})
    assert r.json() == {"id": ids[0], "outcome": "COMMIT", "operator": "alice", "reason": "paid"}
    r = api.post(f"/api/transactions/{ids[1]}/rollback", json={"operator": "bob", "reason": "fraud"})
    assert r.json()["outcome"] == "ROLLBACK"
    # a second decision is a conflict and changes nothing
    r = api.post(f"/api/transactions/{ids[0]}/rollback", json={"operator": "bob", "reason": "late"})
    assert r.status_code == 409 and "COMMIT" in r.json()["detail"]
    assert api.get(f"/api/transactions/{ids[0]}").json()["state"] == "COMMIT"
    assert api.post("/api/transactions/NO-SUCH-ID/commit", json={"operator": "x"}).status_code == 404
    assert api.get("/api/transactions/half:99999999").status_code == 404
    audit = [e for e in api.get("/api/transactions/audit").json()["items"] if e["topic"] == topic]
    assert [(e["id"], e["outcome"], e["operator"], e["reason"]) for e in audit] == [
        (ids[1], "ROLLBACK", "bob", "fraud"), (ids[0], "COMMIT", "alice", "paid")]
    assert audit[0]["time_ms"] >= audit[1]["time_ms"] > 0
    # the committed one is in its topic, the rolled-back one never is
    with Admin(console_broker.endpoints) as adm:
        assert [m.msg_id for m in adm.query_messages(topic, "o0")] == [ids[0]]
    left = [t["id"] for t in api.get("/api/transactions").json()["items"] if t["topic"] == topic]
    assert left == [ids[2]]


def test_trace_of_a_message_rolled_back_by_an_operator(api: httpx.Client, console_broker: BrokerProcess,
                                                       unique: Callable[[str], str],
                                                       create_topic: Callable[..., None]) -> None:
    topic = unique("rb")
    create_topic(api, topic, 1)
    [msg_id] = _pending(console_broker.endpoints, topic, 1)
    # the producer's UNKNOWN, from the broker's record of the transaction's life
    assert [(e["kind"], e["by"]) for e in api.get(f"/api/messages/{msg_id}").json()["trace"]] == [
        ("half", ""), ("answer", "producer")]
    api.post(f"/api/transactions/{msg_id}/rollback", json={"operator": "carol", "reason": "duplicate order"})
    got = api.get(f"/api/messages/{msg_id}").json()
    assert got["message"]["msg_id"] == msg_id and got["message"]["body"] == "order 0"
    half, _, decision = got["trace"]
    assert half["kind"] == "half" and "producer group txp" in half["detail"]
    assert decision["kind"] == "rollback" and decision["by"] == "operator"
    assert (decision["operator"], decision["reason"]) == ("carol", "duplicate order")
    assert decision["time_ms"] >= half["time_ms"]


def test_trace_of_a_message_committed_by_check_back(tmp_path: Path, unique: Callable[[str], str],
                                                    serve_console: Callable[..., Any]) -> None:
    """A producer that answers UNKNOWN, then COMMIT when checked: the decision is by check-back."""
    class CommitWhenChecked(Undecided):
        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    with run_broker(tmp_path / "b", transaction_timeout_ms=200, transaction_check_interval_ms=100,
                    topics={"t": 1}) as b, \
            serve_console(ConsoleConfig(brokers=[b.endpoints])) as s, \
            httpx.Client(base_url=s.url, timeout=30) as api, \
            TransactionProducer("pg", b.endpoints, CommitWhenChecked()) as tp:
        msg_id = tp.send_message_in_transaction(Message(topic="t", body=b"x")).msg_id
        wait_until(lambda: api.get(f"/api/transactions/{msg_id}").json()["state"] == "COMMIT")
        kinds = [(e["kind"], e["by"]) for e in api.get(f"/api/messages/{msg_id}").json()["trace"]]
    # (the life: UNKNOWN from the producer, then check-backs until one was answered COMMIT)
    assert kinds[:2] == [("half", ""), ("answer", "producer")]
    assert set(kinds[2:-2]) == {("check-back", "")}
    assert kinds[-2:] == [("commit", "check-back"), ("stored", "")]


def test_parked_transactions_and_resume(tmp_path: Path, serve_console: Callable[..., Any]) -> None:
    """Discarded after transactionCheckMax UNKNOWN answers: listed as parked with the reason;
    resumed: pending again and gone from the list; a second resume is refused."""
    with run_broker(tmp_path / "b", transaction_timeout_ms=200, transaction_check_interval_ms=100,
                    transaction_check_max=1, topics={"t": 1}) as b, \
            serve_console(ConsoleConfig(brokers=[b.endpoints])) as s, \
            httpx.Client(base_url=s.url, timeout=30) as api:
        with TransactionProducer("pg", b.endpoints, Undecided()) as tp:
            msg_id = tp.send_message_in_transaction(Message(topic="t", body=b"x", keys="k1")).msg_id
            wait_until(lambda: api.get("/api/transactions/parked").json()["total"] == 1)
        [p] = api.get("/api/transactions/parked").json()["items"]
        assert (p["id"], p["topic"], p["producer_group"], p["keys"]) == (msg_id, "t", "pg", "k1")
        assert p["check_count"] >= 1 and "check-backs" in p["reason"] and p["parked_at_ms"] > 0
        kinds = [(e["kind"], e["by"]) for e in api.get(f"/api/messages/{msg_id}").json()["trace"]]
        assert kinds[:2] == [("half", ""), ("answer", "producer")]
        assert kinds[2:-1] == [("check-back", "")] and kinds[-1] == ("rollback", "check-back")
        assert api.get("/api/overview").json()["discarded"] == 1
        r = api.post(f"/api/transactions/{msg_id}/resume")
        assert r.status_code == 200 and r.json()["half_offset"] > 0
        assert api.get("/api/transactions/parked").json() == {"total": 0, "items": []}
        assert api.get("/api/overview").json()["discarded"] == 0
        assert api.get(f"/api/transactions/{msg_id}").json()["state"] == "PENDING"
        r = api.post(f"/api/transactions/{msg_id}/resume")
        assert r.status_code in (404, 409) and r.json()["detail"]
        assert api.get("/api/transactions/parked", params={"limit": 0}).status_code == 400


def test_operator_decisions_are_found_through_the_key_index(console_broker: BrokerProcess, api: httpx.Client,
                                                            unique: Callable[[str], str],
                                                            create_topic: Callable[..., None]) -> None:
    """The broker side of the audit log: an operator's op record carries KEYS
    ``TXMQ_OPERATOR_DECISION <msg id>``, the operator, reason, id and topic; the console reads the
    same property names (``txmq.protocol``)."""
    topic = unique("ix")
    create_topic(api, topic, 1)
    [msg_id] = _pending(console_broker.endpoints, topic, 1)
    with Admin(console_broker.endpoints) as adm:
        adm.operator_end(msg_id, "COMMIT", "dave", "checked by hand")
        [op] = adm.query_messages(OP_TOPIC, msg_id)
        assert op.keys.split() == ["TXMQ_OPERATOR_DECISION", msg_id]
        assert {k: op.properties[k] for k in ("TXMQ_OUTCOME", "TXMQ_DECIDED_BY", "TXMQ_OPERATOR",
                                              "TXMQ_REASON", "TXMQ_TX_ID", "TXMQ_TX_TOPIC")} == {
            "TXMQ_OUTCOME": "COMMIT", "TXMQ_DECIDED_BY": "operator", "TXMQ_OPERATOR": "dave",
            "TXMQ_REASON": "checked by hand", "TXMQ_TX_ID": msg_id, "TXMQ_TX_TOPIC": topic}
        assert msg_id in [m.properties["TXMQ_TX_ID"] for m in adm.query_messages(OP_TOPIC,
                                                                                 "TXMQ_OPERATOR_DECISION")]


@pytest.fixture(scope="module")
def busy_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker holding 100,000 pending transactions (never checked: 10 min timeout)."""
    with run_broker(tmp_path_factory.mktemp("busy"), transaction_timeout_ms=600_000,
                    topics={"orders": 4}) as b:
        async def fill() -> None:
            tp = AsyncTransactionProducer("bulk", b.endpoints, Undecided())
            await tp.start()
            try:
                for start in range(0, 100_000, 1000):
                    await tp.send_half_batch([Message(topic="orders", body=b"{}", keys=f"b{start + i}")
                                              for i in range(1000)])
            finally:
                await tp.shutdown()

        asyncio.run(fill())
        yield b


def _median_ms(api: httpx.Client, path: str, **params: Any) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = api.get(path, params=params)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text
    return statistics.median(times)


@pytest.mark.slow
def test_transaction_pages_stay_fast_with_100000_pending(busy_broker: BrokerProcess,
                                                         serve_console: Callable[..., Any]) -> None:
    with serve_console(ConsoleConfig(brokers=[busy_broker.endpoints])) as s, \
            httpx.Client(base_url=s.url, timeout=30) as api:
        page = api.get("/api/transactions", params={"limit": 100}).json()
        assert page["pending_total"] == 100_000 and len(page["items"]) == 100
        for t in page["items"][:5]:
            r = api.post(f"/api/transactions/{t['id']}/rollback", json={"operator": "ops", "reason": "bulk"})
            assert r.status_code == 200, r.text
        audit = api.get("/api/transactions/audit", params={"limit": 100}).json()["items"]
        assert [e["id"] for e in audit] == [t["id"] for t in reversed(page["items"][:5])]
        assert _median_ms(api, "/api/transactions/audit", limit=100) < 500
        assert _median_ms(api, "/api/transactions", limit=100) < 500
        assert _median_ms(api, "/api/transactions/parked", limit=100) < 500
