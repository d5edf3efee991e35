"""The console's flows in a real browser (issue 15): create a topic; send with ``txmq send`` and find
the message and its trace; a parked transaction resumed, committed by an operator with a reason, and
in the audit log; a dead letter resent and consumed; a group's lag chart falling as its consumer
catches up. Each flow also checks the broker's side with the client API."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import threading
import time
from typing import Any

from playwright.sync_api import Page, expect

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
from txmq.testing import BrokerProcess, wait_until

WAIT_S = 30.0
"""Longest a condition on the broker may take to hold (checks, deliveries) on a loaded machine."""


def _txmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txmq", *args], capture_output=True, text=True,
                          timeout=120, check=True)


def _api(page: Page, path: str) -> Any:
    """GET ``path`` of the console's JSON API (through the page's context: its base URL)."""
    r = page.request.get(path)
    assert r.ok, f"{path}: {r.status} {r.text()}"
    return r.json()


def _push(endpoints: str, group: str, topic: str, listener: Any, **kw: Any) -> PushConsumer:
    c = PushConsumer(group, endpoints, listener, suspend_ms=500,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", **kw)
    c.subscribe(topic)
    c.start()
    return c


def test_create_a_topic_and_a_bad_name_is_refused_with_its_reason(
        page: Page, broker: BrokerProcess) -> None:
    page.goto("/topics")
    page.fill("#topic-create-name", "made-in-browser")
    page.fill("#topic-create-queues", "3")
    page.click("#topic-create-submit")
    expect(page.locator("#flash")).to_contain_text("made-in-browser")
    expect(page.locator("[data-testid=topic-row][data-topic=made-in-browser]")).to_contain_text("3")
    with PullConsumer(broker.endpoints, "browser-probe") as c:
        assert c.queue_ids("made-in-browser") == [0, 1, 2]
    page.fill("#topic-create-name", "no spaces allowed")
    page.fill("#topic-create-queues", "1")
    page.click("#topic-create-submit")
    status = page.locator("#topic-create-status")
    expect(status).to_have_attribute("data-state", "error")
    expect(status).to_contain_text("no spaces allowed")  # the API's detail names the bad topic
    with Admin(broker.endpoints) as adm:  # nothing half-done
        assert [t for t in adm.topic_configs().topic_config_table if " " in t] == []


def test_message_sent_with_txmq_send_is_found_and_its_trace_shown(
        page: Page, broker: BrokerProcess) -> None:
    out = _txmq("send", "orders", "--body", '{"order": 4711}', "--key", "order-4711",
                "--endpoints", broker.endpoints, "--json")
    msg_id = json.loads(out.stdout)["msg_id"]
    page.goto("/messages")
    page.fill("#msg-search-topic", "orders")
    page.fill("#msg-search-key", "order-4711")
    page.click("#msg-search-submit")
    row = page.locator("[data-testid=msg-result-row]", has_text=msg_id)
    expect(row).to_be_visible()
    row.locator("[data-testid=msg-link]").click()
    expect(page).to_have_url(re.compile(rf"/messages/{msg_id}$"))
    expect(page.locator("[data-testid=msg-id]")).to_have_text(msg_id)
    expect(page.locator("[data-testid=msg-body]")).to_contain_text('{"order": 4711}')
    expect(page.locator("[data-testid=trace-row][data-kind=stored]")).to_be_visible()


class _Undecided:
    """A local transaction whose outcome is never known: check-backs answer UNKNOWN."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def _parked_transaction(endpoints: str) -> str:
    """A transaction discarded after transaction_check_max UNKNOWN check-backs, whose producer is
    then gone; returns its id."""
    with TransactionProducer("browser-tx", endpoints, _Undecided()) as p:
        sent = p.send_message_in_transaction(Message(topic="orders", body=b'{"refund": 12}',
                                                     keys="refund-12"))
        with Admin(endpoints) as adm:
            wait_until(lambda: adm.query_transaction(sent.msg_id)["state"] == "DISCARD", WAIT_S)
    return sent.msg_id


def test_parked_transaction_is_resumed_then_committed_by_an_operator_and_audited(
        page: Page, broker: BrokerProcess) -> None:
    tx_id = _parked_transaction(broker.endpoints)
    # the discarded half is listed once the broker's discard topic holds it (its consume queue
    # follows the commit log asynchronously); the page is rendered on the server, so wait first
    wait_until(lambda: tx_id in {t["id"] for t in _api(page, "/api/transactions/parked")["items"]},
               WAIT_S)
    page.goto("/transactions")
    parked = page.locator(f"[data-testid=tx-parked-row][data-tx-id='{tx_id}']")
    expect(parked).to_contain_text("browser-tx")
    parked.locator("[data-testid=tx-resume-button]").click()
    expect(parked.locator("[data-testid=tx-resume-status]")).to_have_attribute("data-state", "ok")
    expect(page.locator("#tx-decide-id")).to_have_value(tx_id)
    with Admin(broker.endpoints) as adm:
        assert adm.query_transaction(tx_id)["state"] == "PENDING"
    page.reload()
    pending = page.locator(f"[data-testid=tx-pending-row][data-tx-id='{tx_id}']")
    expect(pending).to_contain_text("browser-tx")
    pending.locator("[data-testid=tx-decide-button]").click()
    expect(page.locator("#tx-decide-id")).to_have_value(tx_id)
    page.fill("#tx-decide-operator", "alice")
    page.fill("#tx-decide-reason", "refund confirmed by the payment provider")
    page.click("#tx-commit-button")
    expect(page.locator("#tx-decide-status")).to_have_attribute("data-state", "ok")
    audit = page.locator(f"[data-testid=tx-audit-row][data-tx-id='{tx_id}']")
    expect(audit).to_contain_text("alice")
    expect(audit).to_contain_text("refund confirmed by the payment provider")
    with Admin(broker.endpoints) as adm:  # committed: stored in its topic, visible to consumers
        [stored] = adm.query_messages("orders", "refund-12")
        assert (stored.msg_id, stored.body) == (tx_id, b'{"refund": 12}')
    page.goto(f"/messages/{tx_id}")
    commit = page.locator("[data-testid=trace-row][data-kind=commit]")
    expect(commit.locator("[data-testid=trace-by]")).to_contain_text("operator")
    expect(commit.locator("[data-testid=trace-operator]")).to_contain_text("alice")


def test_dead_letter_is_resent_from_the_page_and_consumed(page: Page, broker: BrokerProcess) -> None:
    with Producer("browser-dlq-producer", broker.endpoints) as p:
        msg_id = p.send(Message(topic="dlq-source", body=b'{"invoice": 9}', keys="invoice-9")).msg_id
    refuser = _push(broker.endpoints, "browser-dlq", "dlq-source",
                    lambda msgs: ConsumeStatus.RECONSUME_LATER, max_reconsume_times=0)
    try:
        with Admin(broker.endpoints) as adm:
            wait_until(lambda: len(adm.dlq_messages("browser-dlq")) == 1, WAIT_S)
    finally:
        refuser.shutdown()
    page.goto("/dlq")
    page.locator("[data-testid=dlq-group-link]", has_text="browser-dlq").click()
    row = page.locator(f"[data-testid=dlq-row][data-msg-id='{msg_id}']")
    expect(row).to_contain_text("invoice-9")
    row.locator("[data-testid=dlq-select]").check()
    page.click("#dlq-resend-selected")
    result = page.locator(f"[data-testid=dlq-result-row][data-msg-id='{msg_id}']")
    expect(result).to_have_attribute("data-ok", "true")
    got: list[MessageExt] = []
    done = threading.Event()

    def take(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = _push(broker.endpoints, "browser-dlq", "dlq-source", take)
    try:
        assert done.wait(WAIT_S)
    finally:
        c.shutdown()
    assert [(m.keys, m.body) for m in got] == [("invoice-9", b'{"invoice": 9}')]
    assert got[0].msg_id == msg_id


def _lag_chart(page: Page) -> list[float]:
    ys: list[float] = page.evaluate(
        "() => { const el = document.getElementById('group-lag-chart');"
        " return el && el.data ? el.data.flatMap(t => Array.from(t.y)) : []; }")
    return ys


def test_group_lag_chart_falls_as_its_consumer_catches_up(page: Page, broker: BrokerProcess) -> None:
    n = 40
    with Producer("browser-lag-producer", broker.endpoints) as p:
        for i in range(n):
            p.send(Message(topic="lines", body=f'{{"line": {i}}}'.encode(), keys=f"line-{i}"))
    with PullConsumer(broker.endpoints, "browser-lag") as c:
        c.commit_offset("lines", 0, 0)
    page.goto("/groups/browser-lag")
    chart = page.locator("#group-lag-chart")
    expect(page.locator("#group-lag-total")).to_have_attribute("data-lag", str(n))
    expect(chart).to_have_attribute("data-last-lag", str(n))  # sampled before the consumer starts

    def slowly(msgs: list[MessageExt]) -> ConsumeStatus:
        time.sleep(0.05)  # a consumer working through its backlog, not a jump to zero
        return ConsumeStatus.CONSUME_SUCCESS

    c2 = _push(broker.endpoints, "browser-lag", "lines", slowly, consume_threads=1,
               consume_message_batch_max_size=1)
    try:
        expect(page.locator("#group-lag-total")).to_have_attribute("data-lag", "0")
        expect(chart).to_have_attribute("data-last-lag", "0")
    finally:
        c2.shutdown()
    ys = _lag_chart(page)  # the plotted points: the backlog, then falling to nothing
    after = ys[ys.index(n):]
    assert len(after) > 1 and after[-1] == 0
    assert all(a >= b for a, b in itertools.pairwise(after))  # it only falls


class _CommitWhenChecked(_Undecided):
    """UNKNOWN from the local transaction, COMMIT when checked back."""

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def test_a_traced_transaction_shows_its_check_back_and_links_its_trace_id(
        page: Page, broker: BrokerProcess) -> None:
    """Issue #28: a transaction in a W3C trace, answered UNKNOWN and committed by a check-back;
    its page shows the check-back (to whom, answered how) and the deciding client, and its trace
    id links to the search of that trace."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with TransactionProducer("browser-traced", broker.endpoints, _CommitWhenChecked()) as p:
        sent = p.send_message_in_transaction(Message(
            topic="orders", body=b'{"order": 31}', keys="traced-31",
            properties={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}))
        with Admin(broker.endpoints) as adm:
            wait_until(lambda: adm.query_transaction(f"half:{sent.half_offset}")["state"]
                       == "COMMIT", WAIT_S)
        client_id = p.client_id
    page.goto(f"/messages/{sent.msg_id}")
    answer = page.locator("[data-testid=trace-row][data-kind=answer]")
    expect(answer).to_contain_text("UNKNOWN")
    check = page.locator("[data-testid=trace-row][data-kind=check-back]").first
    expect(check.locator("[data-testid=trace-client]")).to_contain_text(client_id)
    expect(check).to_contain_text("answered COMMIT")
    commit = page.locator("[data-testid=trace-row][data-kind=commit]")
    expect(commit.locator("[data-testid=trace-by]")).to_have_text("check-back")
    expect(commit.locator("[data-testid=trace-client]")).to_contain_text(client_id)
    page.locator("[data-testid=msg-trace-id]").click()
    expect(page).to_have_url(re.compile(rf"/messages\?trace_id={trace_id}$"))
    expect(page.locator("#msg-search-trace-id")).to_have_value(trace_id)
    row = page.locator(f"[data-testid=msg-result-row][data-msg-id='{sent.msg_id}']")
    expect(row).to_contain_text("traced-31")
    expect(page.locator("#msg-search-status")).to_contain_text("1 message(s) found")
