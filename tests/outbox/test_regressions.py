"""Regression tests named after known defects of outbox implementations, on all three databases.

shieldTXC (peers.md §3, defects 1–9 of its code at HEAD 2aa2226) and the failure classes of other
outbox libraries (peers.md §2.10): each is impossible here, and each test shows why.
"""

from __future__ import annotations

import threading
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
from typer.testing import CliRunner

from txmq.client import ConsumeStatus, Message
from txmq.outbox import (
    CommitListener,
    InboxEvent,
    OutboxMetrics,
    OutboxTables,
    purge,
    put_message,
)
from txmq.outbox import _claims as claims


def counting_handler(table: sa.Table, calls: Counter[str], fail: set[str] | None = None):  # type: ignore[no-untyped-def]
    def handler(conn: sa.Connection, ev: InboxEvent) -> None:
        calls[ev.biz_key] += 1
        conn.execute(table.insert().values(biz_key=ev.biz_key, n=calls[ev.biz_key]))
        if fail is not None and ev.biz_key in fail:
            raise RuntimeError(f"cannot book {ev.biz_key}")
    return handler


def ledger_keys(engine: sa.Engine, ledger: sa.Table) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(ledger.c.biz_key)).scalars())


# -- shieldTXC ---------------------------------------------------------------------------------------
def test_shieldtxc_1_failed_send_is_never_marked_processed(engine: sa.Engine, tables: OutboxTables,
                                                           metrics: OutboxMetrics, clock: FakeClock) -> None:
    """shieldTXC marked a row PRODUCE_PROCESSED after a failed send: the message was lost."""
    with engine.begin() as conn:
        for i, topic in enumerate(["good", "bad", "good"]):
            put_message(conn, Message(topic=topic, body=b""), "E", f"k{i}", "a", tables=tables,
                        now_ms=clock.ms)

    class HalfBroken(RecordingSender):
        def send_batch(self, msgs: list[Message]) -> object:
            if msgs[0].topic == "bad":
                raise TimeoutError("no acknowledgement")
            return super().send_batch(msgs)

    sender = HalfBroken()
    res = make_relay(engine, tables, sender, metrics, clock).run_once()
    assert (res.sent, res.failed) == (2, 1)
    assert [(r.topic, r.status) for r in events(engine, tables)] == [
        ("good", "PRODUCE_PROCESSED"), ("bad", "PRODUCE_INIT"), ("good", "PRODUCE_PROCESSED")]
    assert [m.topic for m in sender.sent] == ["good", "good"]


def test_shieldtxc_2_a_lost_claim_stops_the_send(engine: sa.Engine, tables: OutboxTables,
                                                 metrics: OutboxMetrics, clock: FakeClock,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """shieldTXC ignored a failed CAS and sent anyway: two schedulers sent the same row."""
    put(engine, tables, 3, now_ms=clock.ms)
    with engine.begin() as conn:  # read candidates, as a slow relay would, before another claims them
        stale = claims._candidates(conn, tables.outbox, clock.ms, 10, lock=False)
    winner = RecordingSender()
    assert make_relay(engine, tables, winner, metrics, clock).run_once().claimed == 3
    monkeypatch.setattr(claims, "_candidates", lambda *a, **k: stale)
    with engine.begin() as conn:  # the compare-and-set refuses every stale candidate
        assert claims.claim_conditional(conn, tables, "late/0", clock.ms, 10, 1000) == []
    monkeypatch.undo()
    # and with leases held, a second relay finds nothing to claim
    loser = RecordingSender()
    assert make_relay(engine, tables, loser, metrics, clock).run_once().claimed == 0
    assert loser.sent == [] and len(winner.sent) == 3


def test_shieldtxc_2_concurrent_claims_never_overlap(engine: sa.Engine, tables: OutboxTables) -> None:
    put(engine, tables, 300)
    got: list[list[int]] = []
    barrier = threading.Barrier(6)

    def worker(i: int) -> None:
        barrier.wait()
        mine: list[int] = []
        while True:
            with engine.begin() as conn:
                rows = claims.claim(conn, tables, f"w/{i}", 2**62, 9, 60_000)
            if not rows:
                break
            mine.extend(r.id for r in rows)
        got.append(mine)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    ids = [i for mine in got for i in mine]
    assert sorted(ids) == list(range(1, 301))


def test_shieldtxc_3_stuck_processing_rows_are_claimed_again(
        engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics, clock: FakeClock) -> None:
    """shieldTXC polled only PRODUCE_INIT: a relay that died after claiming lost the row forever."""
    put(engine, tables, 2, now_ms=clock.ms)
    with engine.begin() as conn:
        claims.claim(conn, tables, "dead/0", clock.ms, 10, lease_ms=30_000)  # then the process died
    sender = RecordingSender()
    r = make_relay(engine, tables, sender, metrics, clock)
    clock.advance(29.9)
    assert r.run_once().claimed == 0  # the lease still holds
    clock.advance(0.2)
    assert r.run_once().sent == 2
    assert {(x.status, x.attempts, x.fencing_token) for x in events(engine, tables)} == {
        ("PRODUCE_PROCESSED", 2, 2)}


def test_shieldtxc_4_a_successful_consume_is_acknowledged(engine: sa.Engine, tables: OutboxTables,
                                                          ledger: sa.Table, metrics: OutboxMetrics,
                                                          clock: FakeClock) -> None:
    """shieldTXC returned RECONSUME_LATER after a successful consume, so every message came back."""
    (msg,) = sent_messages(engine, tables, 1, clock)
    calls = Counter[str]()
    listener = CommitListener(engine, counting_handler(ledger, calls), tables=tables, metrics=metrics)
    assert listener([delivery(msg)]) is ConsumeStatus.CONSUME_SUCCESS
    assert [r.status for r in inbox_rows(engine, tables)] == ["CONSUME_PROCESSED"]


def test_shieldtxc_5_a_duplicate_does_not_run_the_handler_again(engine: sa.Engine, tables: OutboxTables,
                                                                ledger: sa.Table, metrics: OutboxMetrics,
                                                                clock: FakeClock) -> None:
    """shieldTXC re-ran the business listener on a duplicate, found by matching error text."""
    (msg,) = sent_messages(engine, tables, 1, clock)
    calls = Counter[str]()
    dups: list[str] = []
    listener = CommitListener(engine, counting_handler(ledger, calls), tables=tables, metrics=metrics,
                              on_duplicate=lambda ev: dups.append(ev.event_id))
    for i in range(3):
        assert listener([delivery(msg, i)]) is ConsumeStatus.CONSUME_SUCCESS
    assert calls == {"k0": 1} and dups == [msg.msg_id] * 2
    assert sample(metrics, "txmq_inbox_duplicates_skipped_total", tables.inbox.name) == 2


def test_shieldtxc_5_a_handler_integrity_error_is_not_a_duplicate(engine: sa.Engine, tables: OutboxTables,
                                                                  ledger: sa.Table, metrics: OutboxMetrics,
                                                                  clock: FakeClock) -> None:
    """Only the inbox insert's own constraint violation means "already consumed"."""
    (msg,) = sent_messages(engine, tables, 1, clock)
    with engine.begin() as conn:
        conn.execute(ledger.insert().values(biz_key="k0", n=0))  # the handler's insert will collide
    listener = CommitListener(engine, counting_handler(ledger, Counter()), tables=tables, metrics=metrics)
    assert listener([delivery(msg)]) is ConsumeStatus.RECONSUME_LATER
    assert inbox_rows(engine, tables) == []
    assert sample(metrics, "txmq_inbox_duplicates_skipped_total", tables.inbox.name) == 0


def test_shieldtxc_6_the_inbox_never_reuses_the_upstream_id(engine: sa.Engine, tables: OutboxTables,
                                                            ledger: sa.Table, metrics: OutboxMetrics) -> None:
    """shieldTXC inserted the upstream row id as the downstream primary key: ids of two upstreams (or
    of the downstream's own events) collided and were taken for "already consumed"."""
    put(engine, tables, 1)  # the downstream's own outbox row id 1
    calls = Counter[str]()
    listener = CommitListener(engine, lambda c, ev: calls.update([f"{ev.app_id}:{ev.biz_key}"]),
                              tables=tables, metrics=metrics)
    for app in ("shop", "billing"):  # same upstream event id "1", same biz key, different apps
        msg = Message(topic="t", body=b"", keys="order-1",
                      properties={"UNIQ_KEY": "1", "TXMQ_OUTBOX_EVENT_ID": "1", "TXMQ_OUTBOX_APP_ID": app})
        assert listener([delivery(msg)]) is ConsumeStatus.CONSUME_SUCCESS
    assert calls == {"shop:order-1": 1, "billing:order-1": 1}
    rows = inbox_rows(engine, tables)
    assert [(r.app_id, r.event_id) for r in rows] == [("shop", "1"), ("billing", "1")]
    assert len({r.id for r in rows}) == 2


def test_shieldtxc_7_giving_up_is_atomic(engine: sa.Engine, tables: OutboxTables, ledger: sa.Table,
                                         metrics: OutboxMetrics, clock: FakeClock) -> None:
    """shieldTXC wrote CONSUME_MAX_RECONSUMETIMES and the rollback event in two transactions; when the
    second failed, the rollback was never emitted and the message went to the DLQ."""
    (msg,) = sent_messages(engine, tables, 1, clock)
    calls = Counter[str]()
    topics = iter(["x" * 300] + ["t-rollback"] * 9)  # the first rollback insert fails (topic too long)
    listener = CommitListener(engine, counting_handler(ledger, calls, fail={"k0"}), tables=tables,
                              metrics=metrics, max_reconsume_times=3, rollback_topic=lambda t: next(topics))
    for i in range(2):
        assert listener([delivery(msg, i)]) is ConsumeStatus.RECONSUME_LATER
    assert listener([delivery(msg, 2)]) is ConsumeStatus.RECONSUME_LATER  # 3rd failure; rollback write fails
    assert inbox_rows(engine, tables) == [] and len(events(engine, tables)) == 1
    assert listener([delivery(msg, 3)]) is ConsumeStatus.CONSUME_SUCCESS  # given up, without the handler
    assert calls == {"k0": 3} and ledger_keys(engine, ledger) == []
    assert [(r.status, r.tx_type) for r in inbox_rows(engine, tables)] == [
        ("CONSUME_MAX_RECONSUMETIMES", "COMMIT")]
    rb = [r for r in events(engine, tables) if r.tx_type == "ROLLBACK"]
    assert [(r.status, r.topic, r.biz_key, r.app_id, r.origin_event_id, bytes(r.payload)) for r in rb] == [
        ("PRODUCE_INIT", "t-rollback", "k0", "app", msg.msg_id, b"payload-0")]
    assert listener([delivery(msg, 4)]) is ConsumeStatus.CONSUME_SUCCESS  # once only
    assert len(events(engine, tables)) == 2
    assert sample(metrics, "txmq_inbox_rollbacks_emitted_total", tables.inbox.name) == 1


def test_shieldtxc_8_a_failed_handler_leaves_nothing_behind(engine: sa.Engine, tables: OutboxTables,
                                                            ledger: sa.Table, metrics: OutboxMetrics,
                                                            clock: FakeClock) -> None:
    """shieldTXC ignored a failed CONSUME_PROCESSING update and consumed anyway, and left
    CONSUME_PROCESSING rows of failed attempts behind."""
    (msg,) = sent_messages(engine, tables, 1, clock)
    calls = Counter[str]()
    fail = {"k0"}
    listener = CommitListener(engine, counting_handler(ledger, calls, fail=fail), tables=tables,
                              metrics=metrics)
    assert listener([delivery(msg)]) is ConsumeStatus.RECONSUME_LATER
    assert inbox_rows(engine, tables) == [] and ledger_keys(engine, ledger) == []
    fail.clear()
    assert listener([delivery(msg, 1)]) is ConsumeStatus.CONSUME_SUCCESS
    assert ledger_keys(engine, ledger) == ["k0"]
    assert sample(metrics, "txmq_inbox_handler_failures_total", tables.inbox.name) == 1


def test_shieldtxc_9_metrics_admin_and_cleanup(engine: sa.Engine, tables: OutboxTables,
                                               metrics: OutboxMetrics, clock: FakeClock) -> None:
    """shieldTXC had no metrics, no admin tooling and never cleaned its table."""
    from txmq.cli import app

    put(engine, tables, 4, now_ms=clock.ms)
    r = make_relay(engine, tables, RecordingSender(), metrics, clock, batch_size=3)
    r.run_once()
    r.refresh_gauges(clock.ms)
    assert metrics.registry.get_sample_value("txmq_outbox_backlog_events",
                                             {"table": tables.outbox.name, "status": "PRODUCE_INIT"}) == 1
    url = engine.url.render_as_string(hide_password=False)
    out = CliRunner().invoke(app, ["outbox", "status", url, "--prefix", tables.prefix, "--json"])
    assert out.exit_code == 0, out.output
    assert '"PRODUCE_PROCESSED": 3' in out.output and '"PRODUCE_INIT": 1' in out.output
    clock.advance(8 * 86400)
    assert purge(engine, tables, now_ms=clock.ms).events == 3


# -- other outbox libraries (peers.md §2.10) ---------------------------------------------------------
def test_langwatch_7037_a_claim_that_outlived_its_lease_cannot_finish(
        engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics, clock: FakeClock) -> None:
    """langwatch #7037: a leased batch outlived its lease, another pod re-leased it and the first
    pod's markDispatched silently matched 0 rows; attempts counted only on ack never reached the max."""
    put(engine, tables, 2, now_ms=clock.ms)
    slow = make_relay(engine, tables, RecordingSender(), metrics, clock, lease_ms=1000)
    with engine.begin() as conn:
        first = claims.claim(conn, tables, "slow/0", clock.ms, 10, 1000)
    clock.advance(1.5)  # the slow relay is still sending
    fast = RecordingSender()
    assert make_relay(engine, tables, fast, metrics, clock).run_once().sent == 2
    res = slow._finish(first, first, [])  # the slow relay's acknowledgement arrives at last
    assert (res.sent, res.stale) == (0, 2)
    assert sample(metrics, "txmq_outbox_stale_finishes_total", tables.outbox.name) == 2
    assert {(r.status, r.attempts, r.fencing_token) for r in events(engine, tables)} == {
        ("PRODUCE_PROCESSED", 2, 2)}


def test_scs_outbox_94_a_failure_after_publishing_resends_and_the_inbox_absorbs_it(
        engine: sa.Engine, tables: OutboxTables, ledger: sa.Table, metrics: OutboxMetrics,
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """InditexTech/scs-outbox #94: bookkeeping failed after a successful publish, and the event was sent
    again. Here that resend is expected (at-least-once) and the consumer's inbox makes it harmless."""
    put(engine, tables, 1, now_ms=clock.ms)
    sender = RecordingSender()
    r = make_relay(engine, tables, sender, metrics, clock, lease_ms=5000)

    def broken(*a: object, **k: object) -> int:
        raise sa.exc.OperationalError("UPDATE", {}, Exception("connection lost"))

    monkeypatch.setattr("txmq.outbox._relay_core.mark_sent", broken)
    with pytest.raises(sa.exc.OperationalError):
        r.run_once()
    monkeypatch.undo()
    assert [e.status for e in events(engine, tables)] == ["PRODUCE_PROCESSING"]
    clock.advance(5)
    assert r.run_once().sent == 1
    assert len(sender.sent) == 2 and sender.sent[0].msg_id == sender.sent[1].msg_id
    calls = Counter[str]()
    listener = CommitListener(engine, counting_handler(ledger, calls), tables=tables, metrics=metrics)
    assert listener([delivery(m) for m in sender.sent]) is ConsumeStatus.CONSUME_SUCCESS
    assert calls == {"k0": 1}


def test_protean_1266_nothing_is_acknowledged_before_the_rollback_is_durable(
        engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics, clock: FakeClock) -> None:
    """protean #1266: a failed DLQ publish was swallowed and the source acked, so the message was lost.
    Here a failed rollback write returns RECONSUME_LATER and the next delivery writes it."""
    (msg,) = sent_messages(engine, tables, 1, clock)
    listener = CommitListener(engine, lambda c, e: None, tables=tables, metrics=metrics,
                              max_reconsume_times=1)
    with engine.begin() as conn:  # the outbox is unusable for a moment
        conn.execute(sa.text(f"ALTER TABLE {tables.outbox.name} RENAME TO {tables.prefix}away"))
    try:
        assert listener([delivery(msg, 5)]) is ConsumeStatus.RECONSUME_LATER
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {tables.prefix}away RENAME TO {tables.outbox.name}"))
    assert inbox_rows(engine, tables) == []
    assert listener([delivery(msg, 6)]) is ConsumeStatus.CONSUME_SUCCESS
    assert [r.tx_type for r in events(engine, tables)] == ["COMMIT", "ROLLBACK"]


def test_django_outbox_pattern_44_several_relays_run_without_duplicates(
        engine: sa.Engine, tables: OutboxTables, metrics: OutboxMetrics) -> None:
    """django-outbox-pattern #44: "you cannot simply launch another Publisher, otherwise the message
    will be sent twice". Here four relays of two workers each share one outbox."""
    from txmq.outbox import Relay, RelayConfig

    n = 400
    with engine.begin() as conn:
        for i in range(n):
            put_message(conn, Message(topic=f"t{i % 3}", body=b"x"), "E", f"k{i}", "a", tables=tables)
    sender = RecordingSender()
    relays = [Relay(engine, sender, tables=tables, metrics=metrics, relay_id=f"r{i}",
                    config=RelayConfig(batch_size=7, pool_size=2, period_ms=20)) for i in range(4)]
    done = threading.Event()
    for r in relays:
        r.start()
    try:
        for _ in range(1200):
            if len(sender.sent) >= n or done.wait(0.05):
                break
    finally:
        for r in relays:
            r.stop()
    counts = Counter(m.msg_id for m in sender.sent)
    assert len(counts) == n and max(counts.values()) == 1
    assert {r.status for r in events(engine, tables)} == {"PRODUCE_PROCESSED"}
    assert sample(metrics, "txmq_outbox_stale_finishes_total", tables.outbox.name) == 0


def test_eventuate_46_processed_rows_are_purged_by_age(engine: sa.Engine, tables: OutboxTables,
                                                      clock: FakeClock, metrics: OutboxMetrics) -> None:
    """Eventuate #46 / tomorrow-one #226: outbox and inbox tables grow for ever without cleanup.
    Only PRODUCE_PROCESSED events and inbox rows older than the retention go; unsent events stay."""
    day = 86_400_000
    put(engine, tables, 6, now_ms=clock.ms - 10 * day)
    with engine.begin() as conn:
        old = claims.claim(conn, tables, "r/0", clock.ms - 9 * day, 4, 1000)
        claims.mark_sent(conn, tables, old[:3], clock.ms - 9 * day)
    listener = CommitListener(engine, lambda c, e: None, tables=tables, metrics=metrics,
                              clock=lambda: (clock.ms - 9 * day) / 1000)
    for i in range(3):
        listener([delivery(Message(topic="t", body=b"", keys=f"k{i}", properties={"UNIQ_KEY": f"m{i}"}))])
    res = purge(engine, tables, older_than_ms=7 * day, now_ms=clock.ms, batch_rows=2)
    assert (res.events, res.inbox) == (3, 3)
    assert sorted(r.status for r in events(engine, tables)) == [
        "PRODUCE_INIT", "PRODUCE_INIT", "PRODUCE_PROCESSING"]
    assert purge(engine, tables, older_than_ms=7 * day, now_ms=clock.ms) == res.__class__(0, 0)
