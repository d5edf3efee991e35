"""The whole local message table flow against a real broker process, on each database:
put_message → relay → commit listener (inbox) → (give up) → rollback event → downstream relay →
rollback topic → upstream rollback listener (compensation) → or, if that keeps failing, the DLQ.

Upstream and downstream services use two table prefixes in one database, as two services would
use two databases.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import sqlalchemy as sa
from outbox_helpers import events, fresh_tables, inbox_rows, sample

from txmq.client import Message, Producer, PullConsumer, PushConsumer
from txmq.outbox import (
    CommitListener,
    InboxEvent,
    OutboxMetrics,
    OutboxTables,
    Relay,
    RelayConfig,
    RollbackListener,
    TxType,
    drop_tables,
    put_message,
)
from txmq.testing import BrokerProcess, run_broker, wait_until

pytestmark = pytest.mark.timeout(180)

DELAYS = " ".join(["100ms"] * 18)
FAST = RelayConfig(period_ms=50, batch_size=20)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("outbox-broker"), message_delay_level=DELAYS) as b:
        yield b




class Services:
    """Upstream and downstream tables, topics and the clients started for one test."""

    def __init__(self, engine: sa.Engine, broker: BrokerProcess, stack: ExitStack) -> None:
        self.engine, self.broker, self.stack = engine, broker, stack
        self.up = fresh_tables(engine, "u")
        self.down = fresh_tables(engine, "d")
        stack.callback(drop_tables, engine, self.up)
        stack.callback(drop_tables, engine, self.down)
        tag = uuid.uuid4().hex[:8]
        self.topic, self.rollback_topic = f"orders-{tag}", f"orders-{tag}-rollback"
        self.producer = stack.enter_context(Producer(f"relay-{tag}", broker.endpoints))
        self.producer.create_topic(self.topic, 2)
        self.producer.create_topic(self.rollback_topic, 2)
        self.metrics = OutboxMetrics()
        self.tag = tag

    def relay(self, tables: OutboxTables) -> Relay:
        r = Relay(self.engine, self.producer, tables=tables, config=FAST, metrics=self.metrics)
        r.start()
        self.stack.callback(r.stop)
        return r

    def start(self, c: PushConsumer) -> PushConsumer:
        c.start()
        self.stack.callback(c.shutdown)
        return c

    def put(self, keys: list[str], tables: OutboxTables | None = None) -> None:
        for k in keys:
            with self.engine.begin() as conn:
                put_message(conn, Message(topic=self.topic, body=f"order {k}".encode()), "ORDER_CREATED", k,
                            "order-service", tables=tables or self.up)


@pytest.fixture
def svc(engine: sa.Engine, broker: BrokerProcess) -> Iterator[Services]:
    with ExitStack() as stack:
        yield Services(engine, broker, stack)


CONSUMER = {"consume_from_where": "CONSUME_FROM_FIRST_OFFSET", "suspend_ms": 500}


def test_events_reach_the_handler_once_even_when_resent(svc: Services) -> None:
    handled = Counter[str]()
    lock = threading.Lock()

    def book(conn: sa.Connection, ev: InboxEvent) -> None:
        with lock:
            handled[ev.biz_key] += 1

    svc.relay(svc.up)
    listener = CommitListener(svc.engine, book, tables=svc.down, metrics=svc.metrics)
    svc.start(listener.consumer(f"ledger-{svc.tag}", svc.broker.endpoints, svc.topic, **CONSUMER))
    keys = [str(i) for i in range(30)]
    svc.put(keys)
    wait_until(lambda: len(inbox_rows(svc.engine, svc.down)) == 30)
    assert {e.status for e in events(svc.engine, svc.up)} == {"PRODUCE_PROCESSED"}
    with svc.engine.begin() as conn:  # as if the acknowledgement of event 1 had been lost
        o = svc.up.outbox
        conn.execute(sa.update(o).where(o.c.id == 1).values(status="PRODUCE_INIT"))
    wait_until(lambda: sample(svc.metrics, "txmq_inbox_duplicates_skipped_total", svc.down.inbox.name) == 1)
    assert handled == dict.fromkeys(keys, 1)


def test_a_rejected_event_rolls_back_and_is_compensated_once(svc: Services) -> None:
    attempts = Counter[str]()
    compensated = Counter[str]()

    def book(conn: sa.Connection, ev: InboxEvent) -> None:
        attempts[ev.biz_key] += 1
        if ev.biz_key == "13":
            raise ValueError("the ledger refuses order 13")

    def cancel(conn: sa.Connection, ev: InboxEvent) -> None:
        assert ev.tx_type == "ROLLBACK" and ev.payload == b"order 13"
        compensated[ev.biz_key] += 1

    svc.relay(svc.up)
    down_relay = svc.relay(svc.down)
    ledger = CommitListener(svc.engine, book, tables=svc.down, metrics=svc.metrics,
                            on_rollback=down_relay.wake)
    svc.start(ledger.consumer(f"ledger-{svc.tag}", svc.broker.endpoints, svc.topic, **CONSUMER))
    comp = RollbackListener(svc.engine, cancel, tables=svc.up, metrics=svc.metrics)
    svc.start(comp.consumer(f"orders-comp-{svc.tag}", svc.broker.endpoints, svc.rollback_topic, **CONSUMER))
    svc.put(["11", "12", "13", "14"])
    wait_until(lambda: compensated["13"] == 1)
    wait_until(lambda: len(inbox_rows(svc.engine, svc.down)) == 4)
    time.sleep(0.5)  # nothing more may happen
    assert attempts == {"11": 1, "12": 1, "13": 10, "14": 1} and compensated == {"13": 1}
    down = {r.biz_key: r.status for r in inbox_rows(svc.engine, svc.down)}
    assert down["13"] == "CONSUME_MAX_RECONSUMETIMES" and down["11"] == "CONSUME_PROCESSED"
    (rb,) = [e for e in events(svc.engine, svc.down) if e.tx_type == "ROLLBACK"]
    assert (rb.status, rb.topic, rb.biz_key, rb.app_id) == (
        "PRODUCE_PROCESSED", svc.rollback_topic, "13", "order-service")
    assert [(r.tx_type, r.status, r.biz_key) for r in inbox_rows(svc.engine, svc.up)] == [
        ("ROLLBACK", "CONSUME_PROCESSED", "13")]
    assert sample(svc.metrics, "txmq_inbox_rollbacks_emitted_total", svc.down.inbox.name) == 1


def test_a_compensation_that_keeps_failing_ends_in_the_dlq(svc: Services) -> None:
    calls: list[int] = []

    def cancel(conn: sa.Connection, ev: InboxEvent) -> None:
        calls.append(ev.reconsume_times)
        raise RuntimeError("compensation impossible")

    with svc.engine.begin() as conn:  # a ROLLBACK event as a downstream's give-up would write it
        put_message(conn, Message(topic=svc.rollback_topic, body=b"order 7"), "ORDER_CREATED", "7",
                    "order-service", TxType.ROLLBACK, tables=svc.down)
    svc.relay(svc.down)
    group = f"orders-comp-{svc.tag}"
    comp = RollbackListener(svc.engine, cancel, tables=svc.up, metrics=svc.metrics)
    svc.start(comp.consumer(group, svc.broker.endpoints, svc.rollback_topic, **CONSUMER))
    with PullConsumer(svc.broker.endpoints) as pc:
        def dead() -> list[Message]:
            try:
                return list(pc.pull(f"%DLQ%{group}", 0, 0).messages)
            except Exception:
                return []
        wait_until(lambda: len(dead()) == 1)
        (msg,) = dead()
    assert calls == list(range(17))  # the first delivery and 16 reconsumes
    assert msg.properties["TXMQ_OUTBOX_TX_TYPE"] == "ROLLBACK" and msg.body == b"order 7"
    assert inbox_rows(svc.engine, svc.up) == []
