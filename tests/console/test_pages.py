"""The console's HTML pages, rendered on the server against a real broker process (issue 15).

Every page answers 200 with its key content, unknown topics, groups and messages answer an HTML 404
with the reason, and whatever comes from the broker (message keys, bodies, properties) is escaped.
The pages' scripts are checked in a real browser by ``tests/console/browser``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import httpx
import markupsafe
import pytest

from txmq.client import (
    Admin,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)
from txmq.console import ConsoleConfig
from txmq.testing import BrokerProcess, run_broker, wait_until

WAIT_S = 30.0
"""Longest a condition on the broker may take to hold on a loaded machine."""

HOSTILE_KEY = "<script>alert('key')</script>"
"""A message key that would run as script if a page put it in unescaped (keys cannot hold spaces:
they separate keys)."""

HOSTILE_BODY = '<img src=x onerror="alert(1)"> & </pre><script>alert(2)</script>'
"""A body that breaks out of ``<pre>`` and runs script if unescaped."""


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Seed:
    """What the module's tests find on the pages: a topic with a message carrying hostile keys and
    body, a group with a committed offset, a group with one dead letter, a pending transaction."""

    topic: str
    msg_id: str
    group: str
    dlq_group: str
    dlq_msg_id: str
    tx_id: str


class _Undecided:
    """A local transaction whose outcome is never known: it stays pending."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def _dead_letter(endpoints: str, topic: str, group: str) -> str:
    with Producer(_name("pages-dlq-p"), endpoints) as p:
        msg_id = p.send(Message(topic=topic, body=HOSTILE_BODY.encode(), keys=HOSTILE_KEY)).msg_id
    refuser = PushConsumer(group, endpoints, lambda msgs: ConsumeStatus.RECONSUME_LATER,
                           suspend_ms=100, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                           max_reconsume_times=0)
    refuser.subscribe(topic)
    refuser.start()
    try:
        with Admin(endpoints) as adm:
            wait_until(lambda: len(adm.dlq_messages(group)) == 1, WAIT_S)
    finally:
        refuser.shutdown()
    return msg_id


@pytest.fixture(scope="module")
def seed(console_server: Any, console_broker: BrokerProcess) -> Seed:
    endpoints = console_broker.endpoints
    topic, dlq_topic = _name("pages"), _name("pages-dlq")
    with httpx.Client(base_url=console_server.url, timeout=30) as c:
        for t in (topic, dlq_topic):
            assert c.post("/api/topics", json={"topic": t, "queues": 2}).status_code == 201
    with Producer(_name("pages-p"), endpoints) as p:
        msg_id = p.send(Message(topic=topic, body=HOSTILE_BODY.encode(), keys=HOSTILE_KEY,
                                properties={"note": "<b>bold</b>"}), queue_id=0).msg_id
    group = _name("pages-g")
    with PullConsumer(endpoints, group) as pc:
        pc.commit_offset(topic, 0, 0)
    dlq_group = _name("pages-dlqg")
    dlq_msg_id = _dead_letter(endpoints, dlq_topic, dlq_group)
    with TransactionProducer(_name("pages-tx"), endpoints, _Undecided()) as tp:
        tx_id = tp.send_message_in_transaction(
            Message(topic=topic, body=b"half", keys=HOSTILE_KEY)).msg_id
    return Seed(topic, msg_id, group, dlq_group, dlq_msg_id, tx_id)


@pytest.fixture
def pages(console_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console_server.url, timeout=30) as client:
        yield client


def _page(client: httpx.Client, path: str, status: int = 200, **params: Any) -> str:
    r = client.get(path, params=params) if params else client.get(path)
    assert r.status_code == status, (path, r.status_code, r.text[-2000:])
    assert r.headers["content-type"].startswith("text/html")
    return r.text


def _rows(text: str, testid: str) -> list[str]:
    """The ``data-*`` attribute strings of every element with ``data-testid=testid``."""
    return re.findall(rf'data-testid="{testid}"([^>]*)>', text)


def _assert_escaped(text: str, raw: str) -> None:
    assert raw not in text
    assert str(markupsafe.escape(raw)) in text  # shown, as text


# -- every page renders ----------------------------------------------------------------------------
def test_overview_shows_brokers_rates_and_the_chart(pages: httpx.Client,
                                                   console_broker: BrokerProcess) -> None:
    text = _page(pages, "/")
    assert 'id="nav-overview" href="/" class="active"' in text
    assert console_broker.endpoints in text
    assert _rows(text, "broker-row")
    for kpi in ("kpi-in", "kpi-out", "kpi-half", "kpi-discarded", "kpi-parked"):
        assert f'id="{kpi}"' in text
    assert 'id="overview-chart"' in text and 'id="overview-data"' in text
    # console.js fetches plotly after the load event: no script tag or preload holds the page
    assert "plotly.min.js" not in text and 'src="/static/console.js"' in text


def test_topics_list_and_topic_page(pages: httpx.Client, seed: Seed) -> None:
    text = _page(pages, "/topics")
    assert f'data-testid="topic-row" data-topic="{seed.topic}"' in text
    assert 'id="topic-create-form"' in text and 'id="topic-create-submit"' in text
    one = _page(pages, f"/topics/{seed.topic}")
    assert len(_rows(one, "topic-queue-row")) == 2
    assert 'id="topic-update-queues"' in one and 'id="topic-delete-button"' in one
    assert 'id="topic-route"' in one


def test_groups_list_and_group_page_with_its_lag(pages: httpx.Client, seed: Seed) -> None:
    text = _page(pages, "/groups")
    assert f'data-testid="group-row" data-group="{seed.group}"' in text
    one = _page(pages, f"/groups/{seed.group}")
    assert 'id="group-lag-chart"' in one and 'id="group-data"' in one
    assert 'data-testid="group-lag-total" data-lag="1"' in one  # one message, offset 0 committed
    assert f'data-topic="{seed.topic}" data-queue-id="0"' in one
    assert 'id="group-reset-form"' in one


def test_transactions_page_lists_pending_and_the_decision_form(pages: httpx.Client, seed: Seed) -> None:
    text = _page(pages, "/transactions", size=1000)
    assert f'data-testid="tx-pending-row" data-tx-id="{seed.tx_id}"' in text
    for element in ("tx-decide-form", "tx-decide-operator", "tx-decide-reason", "tx-commit-button",
                    "tx-rollback-button", "tx-parked-table", "tx-audit-table"):
        assert f'id="{element}"' in text
    _assert_escaped(text, HOSTILE_KEY)


def test_dead_letter_pages(pages: httpx.Client, seed: Seed) -> None:
    text = _page(pages, "/dlq")
    assert f'data-testid="dlq-group-row" data-group="{seed.dlq_group}"' in text
    one = _page(pages, f"/dlq/{seed.dlq_group}")
    assert f'data-testid="dlq-row" data-msg-id="{seed.dlq_msg_id}"' in one
    assert f'href="/api/dlq/{seed.dlq_group}/export?format=csv"' in one
    assert 'id="dlq-resend-selected"' in one and 'id="dlq-resend-all"' in one
    _assert_escaped(one, HOSTILE_KEY)
    assert "<script>alert(2)" not in one and "<img src=x" not in one


def test_message_search_renders_results_on_the_server(pages: httpx.Client, seed: Seed) -> None:
    empty = _page(pages, "/messages")
    assert 'id="msg-search-form"' in empty and not _rows(empty, "msg-result-row")
    text = _page(pages, "/messages", topic=seed.topic, key=HOSTILE_KEY)
    assert f'data-testid="msg-result-row" data-msg-id="{seed.msg_id}"' in text
    _assert_escaped(text, HOSTILE_KEY)
    by_id = _page(pages, "/messages", msg_id=seed.msg_id)
    assert f'data-msg-id="{seed.msg_id}"' in by_id


def test_message_page_escapes_keys_body_and_properties(pages: httpx.Client, seed: Seed) -> None:
    text = _page(pages, f"/messages/{seed.msg_id}")
    assert f'data-testid="msg-id">{seed.msg_id}<' in text
    assert 'data-testid="trace-row" data-kind="stored"' in text
    _assert_escaped(text, HOSTILE_KEY)
    _assert_escaped(text, HOSTILE_BODY)
    _assert_escaped(text, "<b>bold</b>")


def test_outbox_page_without_an_outbox_says_how_to_get_one(pages: httpx.Client) -> None:
    text = _page(pages, "/outbox")
    assert 'id="outbox-unavailable"' in text and "--outbox-url" in text


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/topics/{name}", "/groups/{name}", "/messages/{msg_id}"])
def test_unknown_topic_group_or_message_is_an_html_404(pages: httpx.Client, path: str) -> None:
    name, msg_id = _name("nowhere"), "7F0000010000000000000000DEAD"
    text = _page(pages, path.format(name=name, msg_id=msg_id), status=404)
    assert 'id="not-found"' in text and 'data-testid="error-detail"' in text
    assert name in text or msg_id in text  # the API's reason names what is missing


def test_unknown_path_is_an_html_404_and_the_api_keeps_json(pages: httpx.Client) -> None:
    assert 'id="not-found"' in _page(pages, "/no-such-page", status=404)
    r = pages.get("/api/no-such-endpoint")
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"


def test_a_script_topic_name_is_refused_and_its_page_escapes_it(pages: httpx.Client) -> None:
    evil = "<script>alert(3)</script>"
    r = pages.post("/api/topics", json={"topic": evil, "queues": 1})
    assert r.status_code == 400 and r.json()["detail"]
    r = pages.get(f"/topics/{evil}")
    assert r.status_code in (400, 404) and 'data-testid="page-error"' in r.text
    assert evil not in r.text


@pytest.mark.parametrize("query", ["page=abc", "page=-1", "size=0", "size=100000"])
def test_bad_paging_parameters_are_a_400_page_with_the_reason(pages: httpx.Client, query: str) -> None:
    text = _page(pages, f"/transactions?{query}", status=400)
    assert 'data-status="400"' in text
    assert query.split("=")[0] in text


# -- static files --------------------------------------------------------------------------------------
def test_static_files_and_plotly_from_the_package(pages: httpx.Client) -> None:
    for path, kind in (("/static/console.js", "javascript"), ("/static/console.css", "text/css")):
        r = pages.get(path)
        assert r.status_code == 200 and kind in r.headers["content-type"]
    r = pages.get("/static/plotly.min.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert len(r.content) > 1_000_000 and "max-age" in r.headers["cache-control"]
    assert pages.get("/static/nothing.js").status_code == 404


def test_pages_load_no_script_from_outside(pages: httpx.Client, seed: Seed) -> None:
    for path in ("/", f"/groups/{seed.group}", "/transactions"):
        text = _page(pages, path)
        srcs = re.findall(r'<script[^>]*src="([^"]+)"', text) + re.findall(r'<link[^>]*href="([^"]+)"', text)
        assert srcs and all(s.startswith(("/static/", "data:")) for s in srcs), srcs
    assert 'src: "/static/plotly.min.js"' in pages.get("/static/console.js").text


# -- paging ----------------------------------------------------------------------------------------------
def _pending_ids(client: httpx.Client, size: int) -> tuple[list[list[str]], str]:
    """Every page of ``/transactions`` by following its next links: the ids per page, and the last
    page's text."""
    pages: list[list[str]] = []
    page, text = 0, ""
    while True:
        text = _page(client, "/transactions", page=page, size=size)
        pages.append(re.findall(r'data-testid="tx-pending-row" data-tx-id="([^"]+)"', text))
        if 'data-testid="pager-next"' not in text:
            return pages, text
        page += 1


@pytest.fixture
def tx_broker(tmp_path: Any) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"paged": 4}, transaction_timeout_ms=600_000) as b:
        yield b


def test_pending_transactions_are_paged_oldest_first(
        tx_broker: BrokerProcess,
        serve_console: Callable[[ConsoleConfig], AbstractContextManager[Any]]) -> None:
    sent: list[str] = []
    with TransactionProducer("pages-paged", tx_broker.endpoints, _Undecided()) as tp:
        for i in range(120):
            sent.append(tp.send_message_in_transaction(
                Message(topic="paged", body=b"x", keys=f"k{i}")).msg_id)
    with serve_console(ConsoleConfig(brokers=[tx_broker.endpoints])) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        pages, last = _pending_ids(client, 50)
        assert [len(p) for p in pages] == [50, 50, 20]
        assert [i for p in pages for i in p] == sent  # oldest first, each once
        assert 'data-testid="tx-pending-total">120<' in last
        assert "page 3 of 3" in last

