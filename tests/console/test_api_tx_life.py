"""The broker's record of a transaction's life in the console (issue #28): a transaction in a W3C
trace whose producer answers UNKNOWN and leaves, committed by a check-back to another producer of
its group. Its message trace shows the answer, the check-back (to whom, answered by whom, after how
long) and the deciding client, with the trace id; the search by trace id finds it; pages render
both. A real broker process, the console app served by uvicorn."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from txmq.client import Admin, LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.console import ConsoleConfig
from txmq.testing import BrokerProcess, run_broker, wait_until

TRACE_ID = "5b8efff798038103d269b633813fc60c"
TRACEPARENT = f"00-{TRACE_ID}-eee19b7ec3c1b174-01"
WAIT_S = 30.0


class _Answer:
    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return self.state

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return self.state


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, dict[str, str]]]:
    """A broker and one transaction settled by a check-back: its msg id and the two client ids."""
    # the sender leaves well before the first check-back (2 s), which goes to the checker
    with run_broker(tmp_path_factory.mktemp("tx-life"), topics={"orders": 2},
                    transaction_timeout_ms=2_000, transaction_check_interval_ms=500) as b, \
            TransactionProducer("life-pg", b.endpoints,
                                _Answer(LocalTransactionState.COMMIT_MESSAGE)) as checker:
        with TransactionProducer("life-pg", b.endpoints,
                                 _Answer(LocalTransactionState.UNKNOWN)) as sender:
            sent = sender.send_message_in_transaction(Message(
                topic="orders", body=b'{"order": 9}', keys="order-9",
                properties={"traceparent": TRACEPARENT}))
            sender_id = sender.client_id
        with Admin(b.endpoints) as adm:
            wait_until(lambda: adm.query_transaction(f"half:{sent.half_offset}")["state"]
                       == "COMMIT", WAIT_S)
        yield b, {"msg_id": sent.msg_id, "sender": sender_id, "checker": checker.client_id}


@pytest.fixture(scope="module")
def console(checked: tuple[BrokerProcess, dict[str, str]],
            serve_console: Callable[[ConsoleConfig], contextlib.AbstractContextManager[Any]]
            ) -> Iterator[httpx.Client]:
    with serve_console(ConsoleConfig(brokers=[checked[0].endpoints])) as s, \
            httpx.Client(base_url=s.url, timeout=30) as client:
        yield client


def test_the_trace_shows_the_answer_the_check_back_and_who_decided(
        console: httpx.Client, checked: tuple[BrokerProcess, dict[str, str]]) -> None:
    ids = checked[1]
    got = console.get(f"/api/messages/{ids['msg_id']}").json()
    assert got["trace_id"] == TRACE_ID
    events = [(e["kind"], e["by"]) for e in got["trace"]]
    assert events == [("half", ""), ("answer", "producer"), ("check-back", ""),
                      ("commit", "check-back"), ("stored", "")]
    _, answer, check, commit, _ = got["trace"]
    assert answer["client"].startswith(ids["sender"] + " (127.0.0.1:")
    assert answer["detail"].startswith("UNKNOWN")
    assert check["client"].startswith(ids["checker"] + " (127.0.0.1:")
    assert check["detail"].startswith(f"check-back 1: answered COMMIT by {ids['checker']} (")
    assert check["detail"].endswith(" ms")
    assert commit["client"] == check["client"]
    assert got["trace"][0]["time_ms"] <= answer["time_ms"] <= check["time_ms"] <= commit["time_ms"]


def test_the_search_by_trace_id_finds_the_committed_message(
        console: httpx.Client, checked: tuple[BrokerProcess, dict[str, str]]) -> None:
    [item] = console.get("/api/messages", params={"trace_id": TRACE_ID}).json()["items"]
    assert (item["msg_id"], item["topic"], item["keys"]) == (checked[1]["msg_id"], "orders",
                                                             "order-9")
    assert console.get("/api/messages", params={"trace_id": "1" * 32}).json() == {"items": []}
    bad = console.get("/api/messages", params={"trace_id": "not-a-trace"})
    assert bad.status_code == 400 and "trace id" in bad.text


def test_the_pages_link_the_trace_id_to_its_search(
        console: httpx.Client, checked: tuple[BrokerProcess, dict[str, str]]) -> None:
    msg_id = checked[1]["msg_id"]
    page = console.get(f"/messages/{msg_id}")
    assert page.status_code == 200
    assert f'href="/messages?trace_id={TRACE_ID}"' in page.text
    assert 'data-testid="trace-client"' in page.text and 'data-kind="check-back"' in page.text
    found = console.get("/messages", params={"trace_id": TRACE_ID})
    assert found.status_code == 200
    assert f'data-msg-id="{msg_id}"' in found.text and f'value="{TRACE_ID}"' in found.text


def test_a_message_without_a_traceparent_has_no_trace_id(
        console: httpx.Client, checked: tuple[BrokerProcess, dict[str, str]]) -> None:
    with TransactionProducer("life-pg", checked[0].endpoints,
                             _Answer(LocalTransactionState.COMMIT_MESSAGE)) as p:
        sent = p.send_message_in_transaction(Message(topic="orders", body=b"plain"))
    got = console.get(f"/api/messages/{sent.msg_id}").json()
    assert got["trace_id"] == ""
    assert [e["kind"] for e in got["trace"]] == ["half", "commit", "stored"]
    assert got["trace"][1]["client"].startswith(p.client_id)
    assert 'id="msg-trace-id"' not in console.get(f"/messages/{sent.msg_id}").text
