"""Spark sink micro-batches on the sans-IO broker: atomic, idempotent per (sink, batch), orphans
rolled back, timeouts settled without a producer, torn commits completed on recovery."""

from __future__ import annotations

from txmq.broker.transaction import (
    PROPERTY_TXMQ_SINK_BATCH,
    PROPERTY_TXMQ_SINK_TASK,
    SINK_BATCH_TOPIC,
)
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    Command,
    EndTransactionResponseHeader,
    RequestCode,
    SinkBatchRequestHeader,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness

BATCH = "sink-a/7"


def write(h: BrokerHarness, task: str, rows: int, batch: str = BATCH) -> list[Command]:
    return [h.send(1, "out", f"{task}:{i}".encode(), transactional=True, group="spark",
                   properties={PROPERTY_TXMQ_SINK_BATCH: batch, PROPERTY_TXMQ_SINK_TASK: task,
                               PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "600"})
            for i in range(rows)]


def commit(h: BrokerHarness, tasks: dict[str, int], batch: str = BATCH) -> Command:
    return h.request(1, RequestCode.COMMIT_SINK_BATCH,
                     to_ext(SinkBatchRequestHeader(batch=batch, producer_group="spark")), encode_body(tasks))


def abort(h: BrokerHarness, batch: str = BATCH) -> Command:
    return h.request(1, RequestCode.ABORT_SINK_BATCH, to_ext(SinkBatchRequestHeader(batch=batch)))


def ended(r: Command) -> tuple[str, bool]:
    """(outcome, duplicate) of a sink batch answer."""
    e = from_ext(r.ext, EndTransactionResponseHeader)
    return e.outcome, e.duplicate


def bodies(h: BrokerHarness) -> list[bytes]:
    return sorted(m.body for m in h.all_messages("out"))


def harness() -> BrokerHarness:
    return BrokerHarness(topics={"out": 2})


def test_commit_makes_the_accepted_attempts_visible_and_rolls_back_orphans() -> None:
    h = harness()
    write(h, "0.0", 3)
    write(h, "1.0", 2)  # attempt 0 of partition 1 failed half-way: an orphan
    write(h, "1.1", 2)
    assert bodies(h) == []
    r = commit(h, {"0.0": 3, "1.1": 2})
    assert (r.code, *ended(r)) == (ResponseCode.SUCCESS, "COMMIT", False)
    assert bodies(h) == [b"0.0:0", b"0.0:1", b"0.0:2", b"1.1:0", b"1.1:1"]
    assert h.broker.tx.index.pending == {}
    assert h.broker.tx.stats["sink_orphans_rolled_back"] == 2
    [marker] = h.all_messages(SINK_BATCH_TOPIC)
    assert BATCH.encode() in marker.body


def test_a_rerun_of_a_committed_batch_is_rolled_back_and_abort_after_commit_changes_nothing() -> None:
    h = harness()
    write(h, "0.0", 2)
    commit(h, {"0.0": 2})
    write(h, "0.0", 2)  # Spark re-ran batch 7 after a failure in commit
    again = commit(h, {"0.0": 2})
    assert ended(again) == ("COMMIT", True)
    assert ended(abort(h))[0] == "COMMIT"
    assert bodies(h) == [b"0.0:0", b"0.0:1"]
    assert h.broker.tx.index.pending == {}


def test_abort_before_commit_rolls_everything_back() -> None:
    h = harness()
    write(h, "0.0", 2)
    assert ended(abort(h))[0] == "ROLLBACK"
    assert bodies(h) == [] and h.broker.tx.index.pending == {}


def test_a_commit_that_does_not_match_the_halves_writes_nothing() -> None:
    h = harness()
    write(h, "0.0", 2)
    before = h.store.write_offset
    r = commit(h, {"0.0": 3})
    assert r.code == ResponseCode.TRANSACTION_NOT_FOUND and "expected 3" in r.remark
    assert h.store.write_offset == before and bodies(h) == []
    wrong_group = h.request(1, RequestCode.COMMIT_SINK_BATCH,
                            to_ext(SinkBatchRequestHeader(batch=BATCH, producer_group="x")),
                            encode_body({"0.0": 2}))
    assert wrong_group.code == ResponseCode.TRANSACTION_STATE_GROUP_WRONG
    assert h.request(1, RequestCode.COMMIT_SINK_BATCH,
                     to_ext(SinkBatchRequestHeader(batch=BATCH, producer_group="spark")),
                     b"\xc1").code == ResponseCode.INVALID_PARAMETER


def test_uncommitted_halves_time_out_without_asking_any_producer() -> None:
    h = harness()
    h.heartbeat(1, "spark-task", ["spark"])
    write(h, "0.0", 2)
    assert h.tick(599_000) == []
    assert len(h.broker.tx.index.pending) == 2
    assert h.tick(2_000) == []  # due: rolled back by the broker itself, no check-back sent
    assert h.broker.tx.index.pending == {} and bodies(h) == []
    late = commit(h, {"0.0": 2})
    assert late.code == ResponseCode.TRANSACTION_NOT_FOUND


def test_committed_batches_are_remembered_across_a_restart() -> None:
    h = harness()
    write(h, "0.0", 1)
    commit(h, {"0.0": 1})
    h2 = BrokerHarness(store=h.store, now_ms=h.now_ms, topics={"out": 2})
    write(h2, "0.0", 1)
    assert ended(commit(h2, {"0.0": 1}))[1] is True
    assert bodies(h2) == [b"0.0:0"]


def test_a_commit_torn_by_a_crash_is_completed_on_recovery() -> None:
    h = harness()
    write(h, "0.0", 2)
    write(h, "0.1", 1)
    from txmq.broker.transaction._sink import BatchMarker, encode_marker
    from txmq.store import Record

    # the marker reached the disk, the crash took the real messages that follow it
    h.store.append([Record(topic=SINK_BATCH_TOPIC, queue_id=0,
                           body=encode_marker(BatchMarker(BATCH, {"0.0": 2})))])
    h.store.flush()
    h2 = BrokerHarness(store=h.store, now_ms=h.now_ms, topics={"out": 2})
    h2.tick(0)
    assert bodies(h2) == [b"0.0:0", b"0.0:1"]
    assert h2.broker.tx.index.pending == {}


def test_committed_batches_survive_a_clean_restart_of_a_file_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """After a checkpoint the broker recovers without rescanning the log: the batch markers must
    still be found (through their topic), or a re-run would be committed a second time."""
    from txmq.store import FileStore

    h = BrokerHarness(store=FileStore(tmp_path / "s"), topics={"out": 2})
    write(h, "0.0", 2)
    commit(h, {"0.0": 2})
    h.store.close()  # flush + checkpoint
    h2 = BrokerHarness(store=FileStore(tmp_path / "s"), now_ms=h.now_ms, topics={"out": 2})
    assert BATCH in h2.broker.tx.sinks.committed
    write(h2, "0.0", 2)
    assert ended(commit(h2, {"0.0": 2}))[1] is True
    assert bodies(h2) == [b"0.0:0", b"0.0:1"]
    h2.store.close()
