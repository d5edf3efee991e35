"""The broker always starts again (issue 11, "What to build" 3): bad metadata files are quarantined,
unparsable transaction records are skipped and counted, the transaction index is restored from a
snapshot so restart work follows the pending transactions, not the settled history."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from txmq import limits
from txmq.broker.transaction import HALF_TOPIC, OP_TOPIC, REMOVE_TAG, TRANS_CHECK_MAX_TIME_TOPIC
from txmq.broker.transaction._sink import SINK_BATCH_TOPIC
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_TXMQ_OUTCOME,
    Command,
    EndTransactionResponseHeader,
    SendMessageResponseHeader,
    decode_offset_msg_id,
    from_ext,
)
from txmq.store import FileStore, Record
from txmq.testing import BrokerHarness


def _sent(reply: Command) -> SendMessageResponseHeader:
    return from_ext(reply.ext, SendMessageResponseHeader)


def _start(root: Path, **config: object) -> BrokerHarness:
    return BrokerHarness(FileStore(root), **config)


def _stop(h: BrokerHarness) -> None:
    h.broker.persist_offsets()
    h.store.close()


def _history(root: Path) -> tuple[list[bytes], int]:
    """A committed, a rolled-back and a pending transaction, plain sends, a consumer offset and a
    created topic; returns the bodies readable on ``t`` and the pending half offset."""
    h = _start(root)
    h.heartbeat(1, "c1", ["pg"])
    a = h.send(1, "t", b"committed", transactional=True)
    assert h.end(1, a, "COMMIT").code == ResponseCode.SUCCESS
    b = h.send(1, "t", b"rolled back", transactional=True)
    h.end(1, b, "ROLLBACK")
    c = h.send(1, "t", b"pending", transactional=True)
    h.send(1, "t", b"plain")
    h.broker.create_topic("extra", 3)
    h.send(1, "extra", b"e", queue_id=2)
    h.broker.set_offset("cg", "t", 0, 1)
    _stop(h)
    return [b"committed", b"plain"], _sent(c).queue_offset


@pytest.mark.parametrize("name", ["topics.json", "consumerOffset.json", "delayOffset.json",
                                  "transactionIndex.snapshot", "transactionIndex.json"])
@pytest.mark.parametrize("damage", ["garbage", "directory"])
def test_a_bad_metadata_file_is_quarantined_and_the_broker_starts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, damage: str) -> None:
    bodies, pending = _history(tmp_path)
    path = tmp_path / "meta" / name
    path.unlink(missing_ok=True)
    if name == "transactionIndex.json":  # the check counts of a data directory of base
        (tmp_path / "meta" / "transactionIndex.snapshot").unlink()
    if damage == "garbage":
        path.write_bytes(b"\xff{not json")
    else:
        path.mkdir()
    caplog.set_level(logging.WARNING)
    h = _start(tmp_path)
    assert [m.body for m in h.pull("t", 0)] == bodies
    assert h.broker.tx.index.outcome(pending).value == "PENDING"
    assert h.broker.queue_nums("extra") == 3  # re-derived from the consume queues if lost
    (moved,) = (tmp_path / "quarantine").glob(f"*/meta/{name}")
    assert any(str(moved) in r.getMessage() for r in caplog.records)
    if name == "consumerOffset.json":
        assert any("consumer offsets start EMPTY" in r.getMessage() and r.levelno == logging.ERROR
                   for r in caplog.records)
    _stop(h)


def _bad_records() -> list[Record]:
    """What a client could write straight into system topics on base (no validation at the door)."""
    return [
        Record(topic=OP_TOPIC, queue_id=0, body=b"not,offsets,\xff", tags=REMOVE_TAG),
        Record(topic=OP_TOPIC, queue_id=0, body=b"0,", tags=REMOVE_TAG,
               properties={PROPERTY_TXMQ_OUTCOME: "MAYBE"}),
        Record(topic=OP_TOPIC, queue_id=0, body=b"99999999999999999999,", tags=REMOVE_TAG),
        Record(topic=HALF_TOPIC, queue_id=0, body=b"x",
               properties={"REAL_TOPIC": "", "REAL_QID": "0", "TRAN_MSG": "true"}),
        Record(topic=HALF_TOPIC, queue_id=0, body=b"x",
               properties={"REAL_TOPIC": "t", "REAL_QID": "x", "TRAN_MSG": "true"}),
        Record(topic=HALF_TOPIC, queue_id=0, body=b"x", properties={}),
        Record(topic=HALF_TOPIC, queue_id=0, body=b"x",
               properties={"REAL_TOPIC": "t", "REAL_QID": "0", "TXMQ_RESUMED_FROM": "abc"}),
        Record(topic=TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0, body=b"x"),
        Record(topic=SINK_BATCH_TOPIC, queue_id=0, body=b"\x93garbage"),
        Record(topic="t", queue_id=1, body=b"y",
               properties={PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: "-5"}),
    ]


@pytest.mark.parametrize("snapshot", [True, False], ids=["after snapshot", "full replay"])
def test_unparsable_transaction_records_are_skipped_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, snapshot: bool) -> None:
    """Base: ``ValueError`` in the transaction service at every start."""
    bodies, pending = _history(tmp_path)
    h = _start(tmp_path)
    if not snapshot:
        (tmp_path / "meta" / "transactionIndex.snapshot").unlink()
    h.broker.append(_bad_records())
    h.store.flush()  # then the process dies: the records are after the snapshot and checkpoint
    if not snapshot:
        (tmp_path / "meta" / "transactionIndex.snapshot").unlink(missing_ok=True)
    caplog.set_level(logging.WARNING)
    h = _start(tmp_path)
    skipped = len(_bad_records()) - 4  # the four halves are indexed, and parked by the checker
    assert h.broker.tx.stats["recovery_skipped"] == skipped
    assert sum("recovery skipped" in r.getMessage() for r in caplog.records) == skipped
    assert [m.body for m in h.pull("t", 0)] == bodies
    assert pending in h.broker.tx.index.pending and len(h.broker.tx.index.pending) == 5
    h.tick(limits.TRANSACTION_TIMEOUT_MS + 1)
    assert h.broker.tx.stats["parked"] == 3  # no valid real topic or queue: discarded, with why
    assert len(h.broker.tx.index.pending) == 2  # the one of the history, and the resumed one
    counts = h.broker.tx.index.counts()
    assert (counts["COMMIT"], counts["ROLLBACK"], counts["DISCARD"]) == (1, 1, 3)
    _stop(h)


def test_the_snapshot_restores_pending_check_counts_and_outcomes(tmp_path: Path) -> None:
    h = _start(tmp_path, transaction_timeout_ms=1000, transaction_check_interval_ms=1000)
    h.heartbeat(1, "c1", ["pg"])
    halves = [h.send(1, "t", f"m{i}".encode(), transactional=True) for i in range(6)]
    for half in halves[:3]:
        h.end(1, half, "COMMIT")
    h.end(1, halves[3], "ROLLBACK")
    assert len(h.tick(2000)) == 2  # one check-back each for the two pending ones
    _stop(h)
    h = _start(tmp_path)
    tx = h.broker.tx
    assert tx.index.counts() == {"PENDING": 2, "COMMIT": 3, "ROLLBACK": 1, "DISCARD": 0}
    assert [e.check_count for e in tx.index.pending.values()] == [1, 1]
    r = h.end(1, halves[0], "ROLLBACK")  # I4: a late duplicate gets the recorded outcome
    ended = from_ext(r.ext, EndTransactionResponseHeader)
    assert (r.code, ended.outcome, ended.duplicate) == (ResponseCode.SUCCESS, "COMMIT", True)
    assert tx.stats["duplicate_ends"] == 1
    assert [m.body for m in h.pull("t", 0)] == [b"m0", b"m1", b"m2"]
    _stop(h)


def test_a_snapshot_ahead_of_the_log_is_quarantined_and_the_index_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bodies, pending = _history(tmp_path)
    h = _start(tmp_path)
    torn = h.send(1, "t", b"torn off", transactional=True)
    h.broker.persist_offsets()  # the snapshot now reflects the half
    h.store.flush()  # then the process dies and the half's record is torn (never acknowledged)
    seg = sorted((tmp_path / "commitlog").iterdir())[-1]
    with open(seg, "r+b") as f:  # (at the log's end: the file goes on with zeros written ahead)
        f.truncate(h.store.write_offset - int(seg.name) - 3)
    caplog.set_level(logging.WARNING)
    h = _start(tmp_path)
    assert h.store.write_offset == decode_offset_msg_id(_sent(torn).msg_id)[1]
    assert any("snapshot unusable" in r.getMessage() for r in caplog.records)
    assert list((tmp_path / "quarantine").glob("*/meta/transactionIndex.snapshot"))
    assert set(h.broker.tx.index.pending) == {pending}
    assert h.broker.tx.index.counts() == {"PENDING": 1, "COMMIT": 1, "ROLLBACK": 1, "DISCARD": 0}
    assert [m.body for m in h.pull("t", 0)] == bodies
    again = h.send(1, "t", b"new half", transactional=True)  # takes the torn half's offset
    assert _sent(again).queue_offset == _sent(torn).queue_offset
    assert h.broker.tx.index.outcome(_sent(again).queue_offset).value == "PENDING"
    _stop(h)


def test_a_state_table_that_cannot_be_opened_is_quarantined_and_rebuilt(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bodies, pending = _history(tmp_path)
    assert pending == 2
    table = tmp_path / "meta" / "transactionState.table"
    table.unlink()
    table.mkdir()
    caplog.set_level(logging.WARNING)
    h = _start(tmp_path)
    assert list((tmp_path / "quarantine").glob("*/meta/transactionState.table"))
    assert h.broker.tx.index.counts() == {"PENDING": 1, "COMMIT": 1, "ROLLBACK": 1, "DISCARD": 0}
    assert h.broker.tx.index.outcome(0).value == "COMMIT"  # rebuilt from the log
    assert [m.body for m in h.pull("t", 0)] == bodies
    _stop(h)


def test_restart_replays_the_pending_transactions_not_the_settled_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Base: every half, op and committed record ever stored was read again at each start (about
    23 µs per stored transaction); with the index snapshot the replay follows what is pending."""
    from txmq.broker.transaction import TransactionService

    h = _start(tmp_path)
    h.heartbeat(1, "c1", ["pg"])
    for i in range(1500):
        half = h.send(1, "t", f"m{i}".encode(), transactional=True)
        h.end(1, half, "COMMIT" if i % 3 else "ROLLBACK")
    pending = [h.send(1, "t", b"p", transactional=True) for _ in range(5)]
    _stop(h)
    replayed: list[int] = []
    real = TransactionService.recover

    def counting(self: TransactionService, records: list[object]) -> None:
        replayed.append(len(records))
        real(self, records)  # type: ignore[arg-type]

    monkeypatch.setattr(TransactionService, "recover", counting)
    h = _start(tmp_path)
    assert sum(replayed) <= 10, replayed  # base: 3,005 records (every half and outcome)
    assert set(h.broker.tx.index.pending) == {_sent(p).queue_offset for p in pending}
    counts = h.broker.tx.index.counts()
    assert (counts["COMMIT"], counts["ROLLBACK"], counts["PENDING"]) == (1000, 500, 5)
    r = h.end(1, h.send(1, "t", b"x", transactional=True), "COMMIT")
    assert from_ext(r.ext, EndTransactionResponseHeader).outcome == "COMMIT"
    _stop(h)
