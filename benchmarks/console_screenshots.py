"""Screenshots of the web console's main pages for the README, with realistic data: a shop's topics,
an order service committing transactions, a payment service whose check-backs never decide (parked,
then resumed and decided by an operator), transactions of a producer that went away (pending), a
billing group working through a backlog (its lag chart falls), a notification group whose refused
messages end in its DLQ.

Usage::

    uv run --locked python benchmarks/console_screenshots.py [--out docs/img] [--warm-up-s 24]

Writes ``console-{overview,topics,group,transactions,dlq,trace}.png`` to ``--out``. Needs Chromium
(:mod:`txmq.testing.browser` installs it with apt when missing and run as root).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

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
from txmq.testing import run_broker, wait_until
from txmq.testing.browser import chromium, run_console

TOPICS = {"orders": 8, "payments": 4, "shipments": 4, "inventory": 2, "refunds": 2, "notifications": 2}
DELAY_LEVELS = " ".join(f"{100 * k}ms" for k in range(1, 19))  # retries within seconds
BACKLOG = 1_500
VIEWPORT = {"width": 1360, "height": 900}


class _Decides:
    """The order service: commits every order, and answers check-backs with COMMIT."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


class _Undecided:
    """A payment service that never learns its outcome: its check-backs answer UNKNOWN."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def _orders(endpoints: str, n: int) -> str:
    """``n`` committed orders, one of them later refused by notifications; returns an order's id."""
    with TransactionProducer("order-service", endpoints, _Decides()) as p:
        ids = [p.send_message_in_transaction(Message(
            topic="orders", body=f'{{"order": {1000 + i}, "total": {19.9 + i:.2f}}}'.encode(),
            keys=f"order-{1000 + i}", tags="created")).msg_id for i in range(n)]
    with Producer("shop-web", endpoints) as p:
        for i in range(200):
            for topic in ("shipments", "inventory", "notifications"):
                p.send(Message(topic=topic, body=f'{{"order": {1000 + i}}}'.encode(),
                               keys=f"order-{1000 + i}"))
    return ids[0]


def _payments(endpoints: str) -> list[str]:
    """Payments whose outcome is never known: checked, discarded (parked); the producer leaves."""
    with TransactionProducer("payment-service", endpoints, _Undecided()) as p:
        ids = [p.send_message_in_transaction(Message(
            topic="payments", body=f'{{"payment": {i}, "amount": {42 + i}}}'.encode(),
            keys=f"payment-{7000 + i}")).msg_id for i in range(5)]
        with Admin(endpoints) as adm:
            wait_until(lambda: all(adm.query_transaction(i)["state"] == "DISCARD" for i in ids), 60)
    with Admin(endpoints) as adm:  # an operator settles two of them
        adm.resume_transaction(ids[0])
        adm.operator_end(ids[0], "COMMIT", "alice", "capture confirmed in the PSP dashboard")
        adm.resume_transaction(ids[1])
        adm.operator_end(ids[1], "ROLLBACK", "bob", "card declined, customer notified")
    return ids


def _gone_producer(endpoints: str) -> None:
    """Refunds whose producer went away before deciding them: pending, checked by nobody."""
    with TransactionProducer("refund-service", endpoints, _Undecided()) as p:
        for i in range(12):
            p.send_message_in_transaction(Message(topic="refunds", body=f'{{"refund": {i}}}'.encode(),
                                                  keys=f"refund-{300 + i}"))


def _refuse_some(endpoints: str) -> PushConsumer:
    """Notifications: every 25th message fails twice and lands in %DLQ%notification-service."""
    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        bad = any(int(m.keys.split("-")[1]) % 25 == 0 for m in msgs)
        return ConsumeStatus.RECONSUME_LATER if bad else ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer("notification-service", endpoints, listener, max_reconsume_times=1,
                     consume_message_batch_max_size=1, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe("notifications")
    c.start()
    return c


def _behind(endpoints: str, group: str, topic: str) -> None:
    """``group`` has committed offset 0 on every queue of ``topic``: it lags by all of it."""
    with PullConsumer(endpoints, group) as c:
        for q in c.queue_ids(topic):
            c.commit_offset(topic, q, 0)


def _billing(endpoints: str, retry_key: str) -> PushConsumer:
    """Billing works through its backlog of orders steadily; ``retry_key`` fails once."""
    failed: set[str] = set()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        time.sleep(0.008 * len(msgs))
        with lock:
            if any(m.keys == retry_key and m.keys not in failed for m in msgs):
                failed.add(retry_key)
                return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer("billing-service", endpoints, listener, consume_threads=2,
                     consume_message_batch_max_size=1)
    c.subscribe("orders")
    c.start()
    return c


def _lag(endpoints: str, group: str) -> int:
    with Admin(endpoints) as adm:
        return sum(s.lag for s in adm.consume_stats(group))


def _shoot(base: str, out: Path, shots: list[tuple[str, str, str]]) -> None:
    """Each (name, path, selector to wait for) to ``out/console-<name>.png``."""
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
        for name, path, ready in shots:
            page.goto(base + path, wait_until="load")
            page.wait_for_selector(ready, state="visible", timeout=30_000)
            page.wait_for_timeout(800)  # plotly's first draw and transition
            page.screenshot(path=str(out / f"console-{name}.png"), full_page=True)
            print(f"{out / f'console-{name}.png'}: {base}{path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--warm-up-s", type=float, default=16.0,
                    help="History to gather (2 s samples) before the backlog is worked off.")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="txmq-shots-") as d, run_broker(
            Path(d) / "broker", topics=TOPICS, message_delay_level=DELAY_LEVELS,
            transaction_timeout_ms=1_000, transaction_check_interval_ms=1_000,
            transaction_check_max=3) as b, run_console([b.endpoints], Path(d) / "console.log") as con:
        e = b.endpoints
        _gone_producer(e)
        order_id = _orders(e, BACKLOG)
        for group, topic in (("billing-service", "orders"), ("inventory-sync", "inventory")):
            _behind(e, group, topic)
        shipping = PushConsumer("shipping-service", e, lambda ms: ConsumeStatus.CONSUME_SUCCESS,
                                consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        shipping.subscribe("shipments")
        shipping.start()
        notifications = _refuse_some(e)
        _payments(e)
        time.sleep(args.warm_up_s)  # the History samples a few minutes' worth of a busy shop
        billing = _billing(e, f"order-{1000}")
        try:
            wait_until(lambda: _lag(e, "billing-service") < BACKLOG // 2, 120)
            _shoot(con.url, args.out, [  # the group first: its lag still falling
                ("group", "/groups/billing-service", "#group-lag-chart[data-points]"),
                ("overview", "/", "#overview-chart[data-points]"),
                ("topics", "/topics", "#topics-table"),
                ("transactions", "/transactions", "#tx-audit-table"),
                ("dlq", "/dlq/notification-service", "#dlq-table"),
                ("trace", f"/messages/{order_id}", "#msg-trace")])
        finally:
            for c in (billing, shipping, notifications):
                c.shutdown()


if __name__ == "__main__":
    main()
