"""The demo ledger behind the inbox, without a broker: bookings once, rejections roll back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import sqlalchemy as sa

from txmq import outbox
from txmq.client import ConsumeStatus, MessageExt
from txmq.demo import ledger
from txmq.demo._faults import Fault, fault_of


def test_about_two_percent_of_orders_are_rejected_by_the_ledger() -> None:
    faults = Counter(fault_of(k) for k in range(1, 60_001))
    assert 0.018 < faults[Fault.LEDGER_REJECT] / 60_000 < 0.022
    assert 0.045 < faults[Fault.ROLLBACK] / 60_000 < 0.055  # the earlier buckets are unchanged


def _delivery(key: int, msg_id: str, reconsume_times: int = 0) -> MessageExt:
    return MessageExt(topic="orders", body=b"{}", keys=str(key), properties={"UNIQ_KEY": msg_id},
                      reconsume_times=reconsume_times)


def test_ledger_books_once_and_rejects_with_a_rollback(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger.init_db(db)
    engine = outbox.create_sqlite_engine(db)
    dups = []
    listener = outbox.CommitListener(engine, ledger.book, app_id=ledger.APP_ID,
                                     on_duplicate=lambda ev: dups.append(ev.biz_key))
    good = next(k for k in range(1, 10_000) if fault_of(k) is Fault.NONE)
    bad = next(k for k in range(1, 10_000) if fault_of(k) is Fault.LEDGER_REJECT)
    assert listener([_delivery(good, "m1")]) is ConsumeStatus.CONSUME_SUCCESS
    assert listener([_delivery(good, "m1", 1)]) is ConsumeStatus.CONSUME_SUCCESS  # redelivery
    for i in range(9):
        assert listener([_delivery(bad, "m2", i)]) is ConsumeStatus.RECONSUME_LATER
    assert listener([_delivery(bad, "m2", 9)]) is ConsumeStatus.CONSUME_SUCCESS  # 10th: rollback
    assert ledger.ledger_counts(db) == ({good}, 0) and dups == [str(good)]
    assert ledger.ledger_rejected(db) == {"given_up": {bad}, "rollback_sent": set()}
    with engine.connect() as conn:
        (rb,) = conn.execute(sa.select(outbox.DEFAULT_TABLES.outbox)).all()
    assert (rb.tx_type, rb.topic, rb.biz_key, rb.app_id, rb.status) == (
        "ROLLBACK", "orders-rollback", str(bad), "order-service", "PRODUCE_INIT")
