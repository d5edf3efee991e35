"""The outbox contract, on SQLite, PostgreSQL and MariaDB: put_message in the caller's transaction,
relay claims, leases and fencing, the inbox, the rollback emission, status and retention."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy as sa
from outbox_helpers import (
    DOWN_URLS,
    TRANSPORT_URLS,
    TRANSPORTS,
    TXMQ_CONSUMER,
    FakeClock,
    RecordingSender,
    delivery,
    events,
    fresh_tables,
    inbox_rows,
    make_relay,
    names,
    put,
    sample,
    sent_messages,
)
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from txmq import limits, outbox
from txmq.client import Admin, ConsumeStatus, Message, MessageExt, PullConsumer
from txmq.errors import ConfigError, OutboxError
from txmq.outbox import (
    PROPERTY_DLQ_REASON,
    AsyncCommitListener,
    AsyncRelay,
    AsyncRollbackListener,
    CommitListener,
    InboxEvent,
    Listener,
    OutboxMetrics,
    OutboxTables,
    RejectEvent,
    Relay,
    RelayConfig,
    RollbackListener,
    Transport,
    TxType,
    backlog,
    open_async_transport,
    open_transport,
    outbox_status,
    put_message,
)
from txmq.outbox._claims import claim, claimable_clause
from txmq.outbox._envelope import to_message
from txmq.outbox._policy import claimable
from txmq.testing import ClusterProcess, wait_until


# -- put_message: atomic with the business rows (I8) -------------------------------------------------
def test_put_message_commits_and_rolls_back_with_the_business_rows(
        engine: sa.Engine, tables: OutboxTables, orders: sa.Table) -> None:
    with engine.begin() as conn:
        conn.execute(orders.insert().values(id=1, total=10))
        eid = put_message(conn, Message(topic="orders", body=b"1"), "CREATED", "1", "shop", tables=tables)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(orders.insert().values(id=2, total=20))
        put_message(conn, Message(topic="orders", body=b"2"), "CREATED", "2", "shop", tables=tables)
        raise RuntimeError("business failure after put_message")
    rows = events(engine, tables)
    assert [(r.event_id, r.biz_key, r.status, r.tx_type, r.attempts) for r in rows] == [
        (eid, "1", "PRODUCE_INIT", "COMMIT", 0)]
    with engine.connect() as conn:
        assert conn.execute(sa.select(orders.c.id)).scalars().all() == [1]


def test_put_message_in_an_orm_session(engine: sa.Engine, tables: OutboxTables, orders: sa.Table) -> None:
    with Session(engine) as s, s.begin():
        s.execute(orders.insert().values(id=1, total=10))
        put_message(s, Message(topic="orders", body=b"1", tags="T", keys="k1 k2",
                               properties={"trace": "abc"}), "CREATED", "1", "shop", tables=tables)
    with Session(engine) as s:
        put_message(s, Message(topic="orders", body=b"2"), "CREATED", "2", "shop", tables=tables)
        s.rollback()
    (row,) = events(engine, tables)
    assert (row.biz_key, row.msg_tags, row.msg_keys, json.loads(row.properties)) == (
        "1", "T", "k1 k2", {"trace": "abc"})


def test_put_message_in_an_async_session(async_url: str, engine: sa.Engine, tables: OutboxTables,
                                         orders: sa.Table) -> None:
    async def main() -> None:
        aengine = create_async_engine(async_url)
        try:
            async with AsyncSession(aengine) as s, s.begin():
                await s.execute(orders.insert().values(id=1, total=10))
                await put_message(s, Message(topic="orders", body=b"1"), "CREATED", "1", "shop",
                                  tables=tables)
            async with AsyncSession(aengine) as s:
                await put_message(s, Message(topic="orders", body=b"2"), "CREATED", "2", "shop",
                                  tables=tables)
                await s.rollback()
            async with aengine.begin() as conn:  # AsyncConnection
                await put_message(conn, Message(topic="orders", body=b"3"), "CREATED", "3", "shop",
                                  tables=tables)
        finally:
            await aengine.dispose()

    asyncio.run(main())
    assert [r.biz_key for r in events(engine, tables)] == ["1", "3"]


def test_put_message_refuses_autocommit_and_bad_values(engine: sa.Engine, tables: OutboxTables) -> None:
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(OutboxError, match="autocommit"):
            put_message(auto, Message(topic="t", body=b""), "E", "k", "a", tables=tables)
    with engine.begin() as conn:
        for kw, match in (({"biz_key": ""}, "biz_key"), ({"biz_key": "x" * 256}, "biz_key"),
                          ({"event_type": ""}, "event_type"), ({"app_id": "a" * 129}, "app_id")):
            args = {"event_type": "E", "biz_key": "k", "app_id": "a", **kw}
            with pytest.raises(OutboxError, match=match):
                put_message(conn, Message(topic="t", body=b""), tables=tables, **args)
        with pytest.raises(OutboxError, match="topic"):
            put_message(conn, Message(topic="", body=b""), "E", "k", "a", tables=tables)
    assert events(engine, tables) == []


# -- relay ------------------------------------------------------------------------------------------
def test_relay_sends_the_envelope_and_marks_processed(engine: sa.Engine, tables: OutboxTables,
                                                     metrics: OutboxMetrics, clock: FakeClock) -> None:
    ids = put(engine, tables, 3, now_ms=clock.ms)
    sender = RecordingSender()
    r = make_relay(engine, tables, sender, metrics, clock)
    clock.advance(0.25)
    assert r.run_once() == (res := r.run_once().__class__(claimed=3, sent=3))
    assert res.failed == 0
    assert [m.msg_id for m in sender.sent] == ids
    m = sender.sent[0]
    assert (m.topic, m.body, m.tags, m.keys) == ("t", b"payload-0", "CREATED", "k0")
    assert m.properties["TXMQ_OUTBOX_APP_ID"] == "app" and m.properties["TXMQ_OUTBOX_TX_TYPE"] == "COMMIT"
    rows = events(engine, tables)
    assert {(x.status, x.attempts, x.fencing_token, x.lease_owner) for x in rows} == {
        ("PRODUCE_PROCESSED", 1, 1, None)}
    assert all(x.sent_at_ms == clock.ms for x in rows)
    lbl = tables.outbox.name
    assert sample(metrics, "txmq_outbox_events_sent_total", lbl) == 3
    assert metrics.registry.get_sample_value("txmq_outbox_relay_lag_seconds_sum", {"table": lbl}) == \
        pytest.approx(0.75)
    assert r.run_once().claimed == 0


def test_claim_sql_agrees_with_the_policy(engine: sa.Engine, tables: OutboxTables) -> None:
    rng = random.Random(3)
    now = 1_000_000
    t = tables.outbox
    with engine.begin() as conn:
        put(engine, tables, 60, now_ms=now)
        for i in range(1, 61):
            status = rng.choice(["PRODUCE_INIT", "PRODUCE_PROCESSING", "PRODUCE_PROCESSED"])
            conn.execute(sa.update(t).where(t.c.id == i).values(
                status=status, next_attempt_at_ms=now + rng.randint(-5, 5),
                lease_expires_at_ms=None if status == "PRODUCE_INIT" else now + rng.randint(-5, 5)))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t)).all()
        sql = set(conn.execute(sa.select(t.c.id).where(claimable_clause(t, now))).scalars())
    policy = {r.id for r in rows if claimable(r.status, r.next_attempt_at_ms, r.lease_expires_at_ms, now)}
    assert sql == policy
    with engine.begin() as conn:
        got = claim(conn, tables, "me/0", now, 1000, 10)
    assert {r.id for r in got} == sql


def test_failed_send_goes_back_with_backoff(engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics,
                                           clock: FakeClock) -> None:
    put(engine, tables, 2, now_ms=clock.ms)
    sender = RecordingSender()
    sender.fail = ConnectionError("broker down")
    r = make_relay(engine, tables, sender, metrics, clock, backoff_base_ms=1000, backoff_max_ms=4000)
    for attempt in (1, 2, 3, 4):
        res = r.run_once()
        assert (res.claimed, res.sent, res.failed) == (2, 0, 2)
        rows = events(engine, tables)
        assert {(x.status, x.attempts) for x in rows} == {("PRODUCE_INIT", attempt)}
        assert all("broker down" in x.last_error for x in rows)
        cap = min(4000, 1000 * 2 ** (attempt - 1))
        assert all(clock.ms + cap // 2 <= x.next_attempt_at_ms <= clock.ms + cap for x in rows)
        assert r.run_once().claimed == 0  # not due yet
        clock.advance(cap / 1000)
    sender.fail = None
    assert r.run_once().sent == 2
    assert sample(metrics, "txmq_outbox_send_failures_total", tables.outbox.name) == 8


def test_batches_are_split_by_topic_and_size(engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics,
                                            clock: FakeClock) -> None:
    with engine.begin() as conn:
        for i in range(10):
            put_message(conn, Message(topic=f"t{i % 2}", body=b"x" * 400), "E", f"k{i}", "a", tables=tables,
                        now_ms=clock.ms)
    batches: list[list[Message]] = []

    class Batches(RecordingSender):
        def send_batch(self, msgs: list[Message]) -> object:
            batches.append(msgs)
            return None

    make_relay(engine, tables, Batches(), metrics, clock, send_batch_bytes_max=1000).run_once()
    assert [(b[0].topic, len(b)) for b in batches] == [("t0", 2), ("t0", 2), ("t0", 1), ("t1", 2), ("t1", 2),
                                                        ("t1", 1)]


# -- inbox ------------------------------------------------------------------------------------------
def test_inbox_commits_handler_and_row_together(engine: sa.Engine, tables: OutboxTables, ledger: sa.Table,
                                               metrics: OutboxMetrics, clock: FakeClock) -> None:
    (msg,) = sent_messages(engine, tables, 1, clock)
    seen: list[InboxEvent] = []

    def handler(conn: sa.Connection, ev: InboxEvent) -> None:
        seen.append(ev)
        conn.execute(ledger.insert().values(biz_key=ev.biz_key, n=1))

    listener = CommitListener(engine, handler, tables=tables, metrics=metrics, clock=clock)
    assert listener([delivery(msg)]) is ConsumeStatus.CONSUME_SUCCESS
    (ev,) = seen
    assert (ev.event_id, ev.app_id, ev.biz_key, ev.event_type, ev.tx_type, ev.payload) == (
        msg.msg_id, "app", "k0", "CREATED", TxType.COMMIT, b"payload-0")
    (row,) = inbox_rows(engine, tables)
    assert (row.status, row.event_id, row.app_id, row.biz_key, row.tx_type) == (
        "CONSUME_PROCESSED", msg.msg_id, "app", "k0", "COMMIT")
    assert sample(metrics, "txmq_inbox_events_consumed_total", tables.inbox.name) == 1


def test_plain_messages_get_inbox_idempotency_by_message_id(engine: sa.Engine, tables: OutboxTables,
                                                           metrics: OutboxMetrics) -> None:
    calls = Counter[str]()
    msg = Message(topic="orders", body=b"{}", tags="", keys="42 other",
                  properties={"UNIQ_KEY": "AB" * 16})
    listener = CommitListener(engine, lambda c, ev: calls.update([ev.biz_key]), app_id="orders-svc",
                              tables=tables, metrics=metrics)
    assert listener([delivery(msg), delivery(msg, 1)]) is ConsumeStatus.CONSUME_SUCCESS
    assert calls == {"42": 1}
    (row,) = inbox_rows(engine, tables)
    assert (row.app_id, row.biz_key, row.event_id, row.event_type) == ("orders-svc", "42", "AB" * 16, "")


def test_rollback_listener_runs_the_compensation_once(engine: sa.Engine, tables: OutboxTables,
                                                     metrics: OutboxMetrics, clock: FakeClock) -> None:
    with engine.begin() as conn:
        put_message(conn, Message(topic="t-rollback", body=b"x"), "CREATED", "k", "app", TxType.ROLLBACK,
                    tables=tables, now_ms=clock.ms)
    with engine.begin() as conn:
        (msg,) = [to_message(r) for r in claim(conn, tables, "x/0", clock.ms, 1, 1000)]
    calls: list[InboxEvent] = []
    fail = [True]

    def compensate(conn: sa.Connection, ev: InboxEvent) -> None:
        calls.append(ev)
        if fail[0]:
            raise RuntimeError("compensation failed")

    listener = RollbackListener(engine, compensate, tables=tables, metrics=metrics)
    for i in range(20):  # a failing compensation never emits anything: it is retried (then DLQ)
        assert listener([delivery(msg, i)]) is ConsumeStatus.RECONSUME_LATER
    fail[0] = False
    assert listener([delivery(msg, 20)]) is ConsumeStatus.CONSUME_SUCCESS
    assert listener([delivery(msg, 21)]) is ConsumeStatus.CONSUME_SUCCESS
    assert len(calls) == 21 and calls[0].tx_type is TxType.ROLLBACK
    assert [(r.status, r.tx_type) for r in inbox_rows(engine, tables)] == [("CONSUME_PROCESSED", "ROLLBACK")]
    assert len(events(engine, tables)) == 1  # no rollback of a rollback


def test_reject_event_emits_the_rollback_at_once(engine: sa.Engine, tables: OutboxTables,
                                                metrics: OutboxMetrics, clock: FakeClock) -> None:
    (msg,) = sent_messages(engine, tables, 1, clock)

    def refuse(conn: sa.Connection, ev: InboxEvent) -> None:
        raise RejectEvent("insufficient funds")

    listener = CommitListener(engine, refuse, tables=tables, metrics=metrics, clock=clock)
    assert listener([delivery(msg)]) is ConsumeStatus.CONSUME_SUCCESS
    rb = [r for r in events(engine, tables) if r.tx_type == "ROLLBACK"]
    assert [(r.status, r.origin_event_id, r.topic) for r in rb] == [
        ("PRODUCE_INIT", msg.msg_id, "t-rollback")]


# -- operations -------------------------------------------------------------------------------------
def test_status_backlog_and_gauges(engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics,
                                   clock: FakeClock) -> None:
    put(engine, tables, 5, now_ms=clock.ms - 3000)
    with engine.begin() as conn:
        claim(conn, tables, "dead/0", clock.ms - 2000, 2, 1000)  # a relay that died: expired lease
    r = make_relay(engine, tables, RecordingSender(), metrics, clock)
    r.refresh_gauges(clock.ms)
    lbl = tables.outbox.name
    assert metrics.registry.get_sample_value("txmq_outbox_backlog_events",
                                             {"table": lbl, "status": "PRODUCE_INIT"}) == 3
    assert sample(metrics, "txmq_outbox_oldest_unsent_age_seconds", lbl) == 3.0
    with engine.connect() as conn:
        b = backlog(conn, tables, clock.ms)
        st = outbox_status(conn, tables, clock.ms)
    assert (b.total, b.expired_leases, b.attempts_max, b.oldest_age_ms) == (5, 2, 1, 3000)
    assert st.events == {"COMMIT": {"PRODUCE_INIT": 3, "PRODUCE_PROCESSING": 2}}
    assert st.as_dict()["backlog"]["total"] == 5


# -- the same contract on every transport (txmq, RabbitMQ, NATS JetStream), on SQLite --------------
FAST = RelayConfig(period_ms=20, batch_size=20, backoff_base_ms=50, backoff_max_ms=200)


class Flow:
    """One test's services on one transport: upstream and downstream tables in one SQLite file,
    fresh topics, and whatever relays and subscriptions the test starts (stopped at the end)."""

    def __init__(self, transport: Transport, tmp_path: Path, stack: ExitStack) -> None:
        self.t, self.stack = transport, stack
        self.engine = outbox.create_sqlite_engine(tmp_path / "flow.db")
        stack.callback(self.engine.dispose)
        self.up, self.down = fresh_tables(self.engine, "u"), fresh_tables(self.engine, "d")
        self.topic, self.rollback_topic = names()
        self.tag = self.topic.rsplit("-", 1)[1]
        transport.ensure_topic(self.topic)
        transport.ensure_topic(self.rollback_topic)
        self.metrics = OutboxMetrics(CollectorRegistry())

    def relay(self, tables: OutboxTables, relay_id: str | None = None) -> Relay:
        r = Relay(self.engine, self.t, tables=tables, config=FAST, metrics=self.metrics, relay_id=relay_id)
        r.start()
        self.stack.callback(r.stop)
        return r

    def subscribe(self, name: str, topic: str, listener: Listener, max_reconsume_times: int) -> None:
        s = self.t.subscribe(f"{name}-{self.tag}", topic, listener, max_reconsume_times=max_reconsume_times)
        s.start()
        self.stack.callback(s.shutdown)

    def put(self, keys: list[str], tables: OutboxTables | None = None) -> None:
        with self.engine.begin() as conn:
            for k in keys:
                put_message(conn, Message(topic=self.topic, body=f"order {k}".encode()), "ORDER_CREATED", k,
                            "order-service", tables=tables or self.up)


@pytest.fixture
def flow(transport: Transport, tmp_path: Path) -> Iterator[Flow]:
    with ExitStack() as stack:
        yield Flow(transport, tmp_path, stack)


class Deliveries:
    """A raw listener that counts deliveries per event id (no inbox)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen = Counter[str]()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            self.seen.update(m.msg_id for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


@pytest.mark.timeout(60)
def test_transport_put_message_is_atomic(flow: Flow) -> None:
    got = Deliveries()
    flow.subscribe("ledger", flow.topic, got, 3)
    with flow.engine.begin() as conn:
        eid = put_message(conn, Message(topic=flow.topic, body=b"1"), "CREATED", "1", "shop", tables=flow.up)
    with pytest.raises(RuntimeError), flow.engine.begin() as conn:
        put_message(conn, Message(topic=flow.topic, body=b"2"), "CREATED", "2", "shop", tables=flow.up)
        raise RuntimeError("business failure after put_message")
    flow.relay(flow.up)
    wait_until(lambda: got.seen == {eid: 1}, 20)
    time.sleep(0.3)
    assert got.seen == {eid: 1}
    assert [(r.event_id, r.status) for r in events(flow.engine, flow.up)] == [(eid, "PRODUCE_PROCESSED")]


@pytest.mark.timeout(90)
def test_transport_four_relays_send_each_event_once(flow: Flow) -> None:
    got = Deliveries()
    flow.subscribe("ledger", flow.topic, got, 3)
    for r in range(4):
        flow.relay(flow.up, f"relay-{r}")
    keys = [str(i) for i in range(200)]
    for i in range(0, 200, 20):
        flow.put(keys[i:i + 20])
    wait_until(lambda: len(got.seen) == 200, 40)
    time.sleep(0.3)
    assert set(got.seen.values()) == {1}
    rows = events(flow.engine, flow.up)
    assert {(r.status, r.attempts) for r in rows} == {("PRODUCE_PROCESSED", 1)}
    assert sample(flow.metrics, "txmq_outbox_stale_finishes_total", flow.up.outbox.name) == 0


@pytest.mark.timeout(60)
def test_transport_inbox_side_effects_once_under_redelivery(flow: Flow) -> None:
    ledger = Counter[str]()
    lock = threading.Lock()

    def book(conn: sa.Connection, ev: InboxEvent) -> None:
        with lock:
            ledger[ev.biz_key] += 1

    inbox = CommitListener(flow.engine, book, tables=flow.down, metrics=flow.metrics)
    first = set[str]()

    def ack_lost(msgs: list[MessageExt]) -> ConsumeStatus:  # handled, but the ack "gets lost" once
        status = inbox(msgs)
        with lock:
            if msgs[0].msg_id not in first:
                first.add(msgs[0].msg_id)
                return ConsumeStatus.RECONSUME_LATER
        return status

    flow.subscribe("ledger", flow.topic, ack_lost, limits.MAX_RECONSUME_TIMES)
    flow.relay(flow.up)
    keys = [str(i) for i in range(20)]
    flow.put(keys)
    dup = "txmq_inbox_duplicates_skipped_total"
    wait_until(lambda: sample(flow.metrics, dup, flow.down.inbox.name) == 20, 30)
    assert ledger == dict.fromkeys(keys, 1)
    assert {r.status for r in inbox_rows(flow.engine, flow.down)} == {"CONSUME_PROCESSED"}


@pytest.mark.timeout(90)
def test_transport_give_up_rolls_back_compensates_and_dead_letters(flow: Flow) -> None:
    attempts, compensated = Counter[str](), Counter[str]()

    def book(conn: sa.Connection, ev: InboxEvent) -> None:
        attempts[ev.biz_key] += 1
        if ev.biz_key in ("13", "14"):
            raise ValueError(f"the ledger refuses order {ev.biz_key}")

    def cancel(conn: sa.Connection, ev: InboxEvent) -> None:
        assert ev.tx_type == "ROLLBACK"
        compensated[ev.biz_key] += 1
        if ev.biz_key == "14":
            raise RuntimeError("order 14 cannot be cancelled")

    flow.relay(flow.up)
    down_relay = flow.relay(flow.down)
    ledger = CommitListener(flow.engine, book, tables=flow.down, metrics=flow.metrics, max_reconsume_times=2,
                            on_rollback=down_relay.wake)
    flow.subscribe("ledger", flow.topic, ledger, 4)
    comp = RollbackListener(flow.engine, cancel, tables=flow.up, metrics=flow.metrics)
    flow.subscribe("comp", flow.rollback_topic, comp, 2)
    flow.put(["11", "12", "13", "14"])
    group = f"comp-{flow.tag}"
    wait_until(lambda: len(flow.t.dead_letters(group, flow.rollback_topic)) == 1, 40)
    wait_until(lambda: compensated["13"] == 1 and len(inbox_rows(flow.engine, flow.down)) == 4, 20)
    (dead,) = flow.t.dead_letters(group, flow.rollback_topic)
    assert (dead.body, dead.properties["TXMQ_OUTBOX_TX_TYPE"], dead.properties["TXMQ_OUTBOX_BIZ_KEY"]) == (
        b"order 14", "ROLLBACK", "14")
    assert attempts == {"11": 1, "12": 1, "13": 2, "14": 2} and compensated == {"13": 1, "14": 3}
    down = {r.biz_key: r.status for r in inbox_rows(flow.engine, flow.down)}
    assert down == {"11": "CONSUME_PROCESSED", "12": "CONSUME_PROCESSED", "13": "CONSUME_MAX_RECONSUMETIMES",
                    "14": "CONSUME_MAX_RECONSUMETIMES"}
    assert [(r.biz_key, r.status) for r in inbox_rows(flow.engine, flow.up)] == [("13", "CONSUME_PROCESSED")]


@pytest.mark.timeout(90)
def test_transport_relay_killed_mid_batch_loses_nothing(flow: Flow, tmp_path: Path) -> None:
    ledger = Counter[str]()
    lock = threading.Lock()

    def book(conn: sa.Connection, ev: InboxEvent) -> None:
        with lock:
            ledger[ev.biz_key] += 1

    inbox = CommitListener(flow.engine, book, tables=flow.down, metrics=flow.metrics)
    flow.subscribe("ledger", flow.topic, inbox, limits.MAX_RECONSUME_TIMES)
    keys = [str(i) for i in range(300)]
    flow.put(keys)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("relay_proc.py")),
                             str(tmp_path / "flow.db"), flow.up.prefix, flow.t.url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    def mid_batch() -> bool:  # some events sent and marked, and a claimed batch in flight
        by = Counter(r.status for r in events(flow.engine, flow.up))
        return (by["PRODUCE_PROCESSED"] >= 30 and by["PRODUCE_PROCESSING"] > 0) or proc.poll() is not None

    try:
        wait_until(mid_batch, 30)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert {r.status for r in events(flow.engine, flow.up)} != {"PRODUCE_PROCESSED"}, "killed too late"
    flow.relay(flow.up)  # takes over once the dead relay's leases (1.5 s) expire
    wait_until(lambda: len(ledger) == 300, 30)
    wait_until(lambda: {r.status for r in events(flow.engine, flow.up)} == {"PRODUCE_PROCESSED"}, 10)
    assert ledger == dict.fromkeys(keys, 1)


# -- bad input on every transport --------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_transport_a_message_that_is_not_an_envelope_is_dead_lettered(flow: Flow) -> None:
    calls: list[InboxEvent] = []
    inbox = CommitListener(flow.engine, lambda c, ev: calls.append(ev), tables=flow.down,
                           metrics=flow.metrics)
    flow.subscribe("ledger", flow.topic, inbox, 3)
    uniq = uuid.uuid4().hex.upper()  # unique: NATS would drop a repeated Nats-Msg-Id for 2 min
    plain = Message(topic=flow.topic, body=b"not an envelope", keys="42", properties={"UNIQ_KEY": uniq})
    flow.t.send_batch([plain])
    if flow.t.kind == "txmq":  # RocketMQ messages carry an id: a plain one is an event (see docs/outbox.md)
        wait_until(lambda: len(calls) == 1, 20)
        assert (calls[0].event_id, calls[0].biz_key) == (uniq, "42")
        return
    group = f"ledger-{flow.tag}"
    wait_until(lambda: len(flow.t.dead_letters(group, flow.topic)) == 1, 20)
    (dead,) = flow.t.dead_letters(group, flow.topic)
    assert dead.body == b"not an envelope"
    assert dead.properties[PROPERTY_DLQ_REASON] == "not an outbox envelope: no TXMQ_OUTBOX_EVENT_ID header"
    assert calls == [] and inbox_rows(flow.engine, flow.down) == []


@pytest.mark.timeout(60)
def test_nats_a_consumer_dying_on_the_last_delivery_still_dead_letters(tmp_path: Path) -> None:
    """A consumer never answers the last delivery; JetStream gives up on the message when the next
    consumer of the group pulls, and its max-deliveries advisory moves the message to the DLQ."""
    t = open_transport(TRANSPORT_URLS["nats"], retry_delay_ms=20, ack_wait_ms=1000)
    stuck, hanging = threading.Event(), threading.Event()
    topic, _ = names()
    group = f"g-{topic.rsplit('-', 1)[1]}"

    def hang_on_last(msgs: list[MessageExt]) -> ConsumeStatus:
        if msgs[0].reconsume_times == 1:  # the last allowed delivery: "dies" (never answers in time)
            hanging.set()
            stuck.wait(20)
        return ConsumeStatus.RECONSUME_LATER

    sub = t.subscribe(group, topic, hang_on_last, max_reconsume_times=1)
    other = t.subscribe(group, topic, lambda msgs: ConsumeStatus.RECONSUME_LATER, max_reconsume_times=1)
    try:
        sub.start()
        eid = uuid.uuid4().hex
        t.send_batch([Message(topic=topic, body=b"x", properties={
            "UNIQ_KEY": eid, "TXMQ_OUTBOX_EVENT_ID": eid, "TXMQ_OUTBOX_TX_TYPE": "COMMIT"})])
        wait_until(hanging.is_set, 10)
        other.start()  # another member of the group (a restarted process) pulls
        wait_until(lambda: len(t.dead_letters(group, topic)) == 1, 20)
        (dead,) = t.dead_letters(group, topic)
        assert "max-deliveries advisory" in dead.properties[PROPERTY_DLQ_REASON]
        stuck.set()  # the consumer "comes back": its own move to the DLQ is deduplicated
        time.sleep(0.5)
        assert len(t.dead_letters(group, topic)) == 1
    finally:
        stuck.set()
        other.shutdown()
        sub.shutdown()
        t.close()


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_transport_down_the_relay_backs_off_and_keeps_the_rows(
        kind: str, tmp_path: Path, metrics: OutboxMetrics, clock: FakeClock) -> None:
    engine = outbox.create_sqlite_engine(tmp_path / "down.db")
    tables = fresh_tables(engine)
    put(engine, tables, 3, now_ms=clock.ms)
    r = Relay(engine, DOWN_URLS[kind], tables=tables, metrics=metrics, clock=clock,
              config=RelayConfig(backoff_base_ms=1000))
    try:
        for attempt in (1, 2):
            res = r.run_once()
            assert (res.claimed, res.sent, res.failed) == (3, 0, 3)
            rows = events(engine, tables)
            assert {(x.status, x.attempts, x.sent_at_ms) for x in rows} == {("PRODUCE_INIT", attempt, None)}
            assert all(x.last_error and x.next_attempt_at_ms > clock.ms for x in rows)
            assert r.run_once().claimed == 0  # backing off
            clock.advance(1)
    finally:
        r.stop()
        engine.dispose()


def test_a_wrong_transport_url_is_a_clear_error(tmp_path: Path) -> None:
    for url, match in (("kafka://127.0.0.1:9092", "unknown scheme 'kafka'"), ("amqp://", "names no host"),
                       ("nats://127.0.0.1:abc", "port is not a number"),
                       ("127.0.0.1:10911", "unknown scheme")):
        with pytest.raises(ConfigError, match=match):
            open_transport(url)
    with pytest.raises(ConfigError, match="unknown scheme"):
        Relay(outbox.create_sqlite_engine(tmp_path / "x.db"), "bogus://h:1")
    with pytest.raises(ConfigError) as exc:
        open_transport("amqp://u:secret@h:x/")
    assert "secret" not in str(exc.value)  # the password is not echoed


# -- the asyncio relay and listeners, on every transport ------------------------------------------
async def _until(pred: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.timeout(60)
def test_async_relay_and_listeners_on_every_transport(kind: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    engine = outbox.create_sqlite_engine(tmp_path / "aio.db")
    up, down = fresh_tables(engine, "u"), fresh_tables(engine, "d")
    engine.dispose()
    topic, rollback_topic = names()
    tag = topic.rsplit("-", 1)[1]
    url, kw = TRANSPORT_URLS.get(kind, ""), {"retry_delay_ms": 50}
    if kind == "txmq":
        url, kw = f"txmq://{request.getfixturevalue('txmq_broker').endpoints}", {"consumer_kw": TXMQ_CONSUMER}
    metrics = OutboxMetrics(CollectorRegistry())
    ledger, compensated, first = Counter[str](), Counter[str](), set[str]()

    async def book(conn: AsyncConnection, ev: InboxEvent) -> None:
        await conn.execute(sa.text("SELECT 1"))
        if ev.biz_key == "7":
            raise RejectEvent("order 7 refused")
        ledger[ev.biz_key] += 1

    async def cancel(conn: AsyncConnection, ev: InboxEvent) -> None:
        compensated[ev.biz_key] += 1

    async def main() -> None:
        aengine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'aio.db'}",
                                      connect_args={"timeout": 60})
        t = open_async_transport(url, **kw)
        await t.ensure_topic(topic)
        await t.ensure_topic(rollback_topic)
        up_relay = AsyncRelay(aengine, t, tables=up, config=FAST, metrics=metrics)
        down_relay = AsyncRelay(aengine, t, tables=down, config=FAST, metrics=metrics)
        inbox = AsyncCommitListener(aengine, book, tables=down, metrics=metrics, on_rollback=down_relay.wake)

        async def ack_lost(msgs: list[MessageExt]) -> ConsumeStatus:  # handled, but the first ack is lost
            status = await inbox(msgs)
            if msgs[0].msg_id in first:
                return status
            first.add(msgs[0].msg_id)
            return ConsumeStatus.RECONSUME_LATER

        subs = [t.subscribe(f"ledger-{tag}", topic, ack_lost, max_reconsume_times=16),
                AsyncRollbackListener(aengine, cancel, tables=up, metrics=metrics).subscribe(
                    t, f"comp-{tag}", rollback_topic)]
        for s in subs:
            await s.start()
        up_relay.start()
        down_relay.start()
        async with aengine.begin() as conn:
            for k in range(10):
                await put_message(conn, Message(topic=topic, body=f"order {k}".encode()), "ORDER_CREATED",
                                  str(k), "order-service", tables=up)
        up_relay.wake()
        dup = "txmq_inbox_duplicates_skipped_total"
        await _until(lambda: compensated["7"] == 1 and sample(metrics, dup, down.inbox.name) == 10, 30)
        await asyncio.sleep(0.2)
        for s in subs:
            await s.shutdown()
        await up_relay.stop()
        await down_relay.stop()
        await t.close()
        await aengine.dispose()

    asyncio.run(main())
    assert ledger == {str(k): 1 for k in range(10) if k != 7} and compensated == {"7": 1}
    assert {(r.tx_type, r.status) for r in events(engine, down)} == {("ROLLBACK", "PRODUCE_PROCESSED")}
    assert {r.status for r in events(engine, up)} == {"PRODUCE_PROCESSED"}
    engine.dispose()


# -- txmq on a cluster: the relay and the inbox over every broker group ------------------------------
def booked_at_least(ledger: Counter[str], n: int) -> bool:
    return sum(ledger.values()) >= n


def stored_by_broker(ns: str, topic: str) -> Counter[str]:
    """broker group → messages its queues of ``topic`` hold."""
    stored = Counter[str]()
    with PullConsumer(namesrv_addr=ns) as pc:
        for mq in pc.queues(topic):
            stored[mq.broker_name] += pc.max_offset(mq.topic, mq.queue_id, broker_name=mq.broker_name)
    return stored


def routed_brokers(ns: str, topic: str) -> set[str]:
    with Admin(namesrv_addr=ns) as a:
        return {q.broker_name for q in a.topic_route(topic).queue_datas}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_txmq_cluster_relay_and_inbox_span_every_broker(txmq_cluster: ClusterProcess,
                                                       tmp_path: Path) -> None:
    ns = txmq_cluster.namesrv_addr
    with ExitStack() as stack:
        setup = open_transport(f"txmq://{ns}?namesrv=1")
        stack.callback(setup.close)
        flow = Flow(setup, tmp_path, stack)  # creates the topics on both masters
        # the name server routes a topic to a broker once that broker registered it (within a
        # second); a client caches a route for poll_name_server_interval_ms (30 s), so the relay's
        # producer starts after both registered
        wait_until(lambda: routed_brokers(ns, flow.topic) == set(txmq_cluster.brokers), 20)
        flow.t = open_transport(f"txmq://{ns}?namesrv=1", consumer_kw=TXMQ_CONSUMER)
        stack.callback(flow.t.close)
        ledger = Counter[str]()
        lock = threading.Lock()

        def book(conn: sa.Connection, ev: InboxEvent) -> None:
            with lock:
                ledger[ev.biz_key] += 1

        flow.subscribe("ledger", flow.topic,
                       CommitListener(flow.engine, book, tables=flow.down, metrics=flow.metrics),
                       limits.MAX_RECONSUME_TIMES)
        flow.relay(flow.up)
        keys: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a broker slow to answer is avoided for a while
            batch = [str(len(keys) + i) for i in range(10)]  # (latency fault tolerance): go on
            flow.put(batch)                                   # until both hold events
            keys += batch
            wait_until(functools.partial(booked_at_least, ledger, len(keys)), 30)
            if min(stored_by_broker(ns, flow.topic).values()) > 0:
                break
            time.sleep(0.5)
        time.sleep(0.3)
        assert ledger == dict.fromkeys(keys, 1)  # each event once, from either broker
        stored = stored_by_broker(ns, flow.topic)
        assert set(stored) == set(txmq_cluster.brokers) and min(stored.values()) > 0
        assert sum(stored.values()) == len(keys)
