"""The outbox contract, on SQLite, PostgreSQL and MariaDB: put_message in the caller's transaction,
relay claims, leases and fencing, the inbox, the rollback emission, status and retention."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import pytest
import sqlalchemy as sa
from outbox_helpers import (
    FakeClock,
    RecordingSender,
    delivery,
    events,
    inbox_rows,
    make_relay,
    put,
    sample,
    sent_messages,
)
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from txmq.client import ConsumeStatus, Message
from txmq.errors import OutboxError
from txmq.outbox import (
    CommitListener,
    InboxEvent,
    OutboxMetrics,
    OutboxTables,
    RejectEvent,
    RollbackListener,
    TxType,
    backlog,
    outbox_status,
    put_message,
)
from txmq.outbox._claims import claim, claimable_clause
from txmq.outbox._envelope import to_message
from txmq.outbox._policy import claimable


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
