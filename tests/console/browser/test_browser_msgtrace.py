"""A message's RocketMQ message trace in a real browser: a transactional message sent, ended UNKNOWN,
committed by a check-back answer, and consumed twice (one retry) by clients with
``enable_msg_trace``; the message page's "Message trace" section shows its Pub (producer group,
client host, cost, status), both EndTransaction records (by the producer, by check-back) and the
SubBefore / SubAfter of each delivery (consumer group, retry times, success)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from txmq.client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    PushConsumer,
    TransactionProducer,
)
from txmq.testing import BrokerProcess, run_broker, wait_until

WAIT_S = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """This module's broker (overrides the package's): trace topics on, fast check-backs and retries."""
    with run_broker(tmp_path_factory.mktemp("broker"), topics={"orders": 2}, trace_topic_enable=True,
                    transaction_timeout_ms=300, transaction_check_interval_ms=300,
                    message_delay_level=" ".join(["100ms"] * 18)) as b:
        yield b


class _LaterCommit:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _traced_message(endpoints: str) -> str:
    with TransactionProducer("browser-trace-tg", endpoints, _LaterCommit(), enable_msg_trace=True) as tp:
        sent = tp.send_message_in_transaction(Message(topic="orders", body=b'{"order": 77}', keys="order-77"))
        wait_until(lambda: tp._a.checks_answered >= 1, WAIT_S)
    calls: list[str] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            calls.append(msgs[0].msg_id)
            return ConsumeStatus.RECONSUME_LATER if len(calls) == 1 else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("browser-trace-cg", endpoints, listener, suspend_ms=300,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", enable_msg_trace=True)
    c.subscribe("orders")
    c.start()
    try:
        wait_until(lambda: calls.count(sent.msg_id) >= 2, WAIT_S)
    finally:
        c.shutdown()
    return sent.msg_id


def test_message_page_shows_the_message_trace_timeline(page: Page, broker: BrokerProcess) -> None:
    msg_id = _traced_message(broker.endpoints)
    page.goto(f"/messages/{msg_id}")
    rows = page.locator("#msg-trace-records [data-testid=msgtrace-row]")
    expect(rows).to_have_count(7)  # Pub, 2 × EndTransaction, 2 × (SubBefore, SubAfter)
    pub = rows.nth(0)
    expect(pub).to_have_attribute("data-type", "Pub")
    expect(pub.locator("[data-testid=msgtrace-group]")).to_have_text("browser-trace-tg")
    expect(pub.locator("[data-testid=msgtrace-status]")).to_have_text("success")
    expect(pub.locator("[data-testid=msgtrace-host]")).to_contain_text("127.0.0.1:")
    expect(pub.locator("[data-testid=msgtrace-cost]")).to_contain_text(" ms")
    ends = page.locator("[data-testid=msgtrace-row][data-type=EndTransaction]")
    expect(ends.nth(0).locator("[data-testid=msgtrace-status]")).to_have_text("unknown")
    expect(ends.nth(0).locator("[data-testid=msgtrace-by]")).to_have_text("producer")
    expect(ends.nth(1).locator("[data-testid=msgtrace-status]")).to_have_text("commit")
    expect(ends.nth(1).locator("[data-testid=msgtrace-by]")).to_have_text("check-back")
    afters = page.locator("[data-testid=msgtrace-row][data-type=SubAfter][data-group=browser-trace-cg]")
    expect(afters).to_have_count(2)
    expect(afters.nth(0).locator("[data-testid=msgtrace-status]")).to_have_text("failed")
    expect(afters.nth(0).locator("[data-testid=msgtrace-retry]")).to_have_text("0")
    expect(afters.nth(1).locator("[data-testid=msgtrace-status]")).to_have_text("success")
    expect(afters.nth(1).locator("[data-testid=msgtrace-retry]")).to_have_text("1")
    expect(page.locator("#msg-trace-topics")).to_contain_text("RMQ_SYS_TRACE_TOPIC")
    # the console's own trace of the same message is still there
    expect(page.locator("[data-testid=trace-row][data-kind=commit]")).to_be_visible()
