"""I6 for the broker's schedulers: a message the delay scheduler, the retry path or the transaction
checker cannot deliver is parked with its reason and holds back only itself (issue 11, "Timers die
silently"); no exception ends a tick."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from txmq import limits
from txmq.broker import parse_delay_levels, retry_topic
from txmq.errors import CorruptRecord, ResponseCode
from txmq.protocol import (
    PARKED_TOPIC,
    PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET,
    PROPERTY_TXMQ_PARK_ORIGIN_TOPIC,
    PROPERTY_TXMQ_PARK_REASON,
    PROPERTY_TXMQ_PARK_SOURCE,
    BrokerRuntimeInfo,
    CheckTransactionStateRequestHeader,
    Command,
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    EndTransactionResponseHeader,
    MessageExt,
    RequestCode,
    ResumeCheckHalfMessageRequestHeader,
    ResumeResponseHeader,
    SendMessageResponseHeader,
    decode_body,
    decode_offset_msg_id,
    encode_body,
    from_ext,
    offset_msg_id,
    to_ext,
)
from txmq.store import FileStore, Record
from txmq.testing import END_TYPES, BrokerHarness

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
LEVELS_MS = parse_delay_levels(limits.MESSAGE_DELAY_LEVELS)
POISONS: list[dict[str, str]] = [
    {},  # neither REAL_TOPIC nor REAL_QID
    {"REAL_TOPIC": "", "REAL_QID": "0"},
    {"REAL_TOPIC": "../../../x", "REAL_QID": "0"},
    {"REAL_TOPIC": "t", "REAL_QID": "abc"},
    {"REAL_TOPIC": "t", "REAL_QID": "99"},
    {"REAL_TOPIC": "gone", "REAL_QID": "0"},
    {"REAL_TOPIC": ".", "REAL_QID": "0"},
    {"REAL_TOPIC": "€" * 100, "REAL_QID": "0"},
    {"REAL_TOPIC": HALF_TOPIC, "REAL_QID": "0"},
    {"REAL_TOPIC": "t"},  # no REAL_QID
    {"REAL_TOPIC": "t", "REAL_QID": "-1"},
    {"REAL_TOPIC": SCHEDULE_TOPIC, "REAL_QID": "0"},
]


def _sent(reply: Command) -> SendMessageResponseHeader:
    return from_ext(reply.ext, SendMessageResponseHeader)


def _checked(check: Command) -> int:
    """The half's queue offset a CHECK_TRANSACTION_STATE request names."""
    return from_ext(check.ext, CheckTransactionStateRequestHeader).tran_state_table_offset


def _poison(h: BrokerHarness, level: int, props: dict[str, str], uniq: str) -> None:
    """A SCHEDULE_TOPIC_XXXX record as old data directories or a direct write may hold it."""
    h.broker.append([Record(topic=SCHEDULE_TOPIC, queue_id=level - 1, body=b"poison",
                            properties={"DELAY": str(level), "UNIQ_KEY": uniq, **props},
                            born_timestamp_ms=h.now_ms, store_timestamp_ms=h.now_ms)])
    h.store.flush()


def _bodies(h: BrokerHarness, topic: str = "t") -> list[bytes]:
    return [m.body for m in h.all_messages(topic)]


def _parked(h: BrokerHarness) -> list[MessageExt]:
    return h.pull(PARKED_TOPIC)


def _reopen(h: BrokerHarness, path: Path) -> BrokerHarness:
    h.broker.persist_offsets()
    h.store.close()
    return BrokerHarness(store=FileStore(path), now_ms=h.now_ms, topics={"t": 2})


def test_poison_between_two_good_messages_at_every_delay_level(tmp_path: Path) -> None:
    h = BrokerHarness(store=FileStore(tmp_path), topics={"t": 2})
    t0 = h.now_ms
    for level in range(1, len(LEVELS_MS) + 1):
        h.send(1, "t", f"a{level}".encode(), properties={"DELAY": str(level)})
        _poison(h, level, POISONS[level % len(POISONS)], f"P{level}")
        h.send(1, "t", f"b{level}".encode(), properties={"DELAY": str(level)})
    h = _reopen(h, tmp_path)  # the poison is already in the store at start-up
    for level, delay in enumerate(LEVELS_MS, start=1):
        h.now_ms = t0 + delay - 1
        h.tick()
        assert f"a{level}".encode() not in _bodies(h), f"level {level} delivered early"
        h.now_ms = t0 + delay
        h.tick()
        got = _bodies(h)
        assert f"a{level}".encode() in got and f"b{level}".encode() in got, f"level {level}"
        park = _parked(h)[-1]
        assert park.msg_id == f"P{level}" and park.body == b"poison"
        assert park.properties[PROPERTY_TXMQ_PARK_SOURCE] == f"schedule:{level}"
        assert park.properties[PROPERTY_TXMQ_PARK_ORIGIN_TOPIC] == SCHEDULE_TOPIC
        assert park.properties[PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET] == "1"
        assert "REAL_" in park.properties[PROPERTY_TXMQ_PARK_REASON]
    assert len(_bodies(h)) == 2 * len(LEVELS_MS)
    assert h.broker.schedule.parked == {"schedule": len(LEVELS_MS)}
    assert not (tmp_path.parent / "x").exists()  # `../../../x` never became a path
    h = _reopen(h, tmp_path)  # progress survives: nothing parked or delivered twice
    h.send(1, "t", b"later", properties={"DELAY": "1"})
    h.tick(LEVELS_MS[0])
    assert len(_parked(h)) == len(LEVELS_MS)
    assert sorted(_bodies(h)).count(b"later") == 1 and len(_bodies(h)) == 2 * len(LEVELS_MS) + 1


def test_poison_retry_entry_is_parked_and_the_retries_around_it_are_delivered() -> None:
    h = BrokerHarness(message_delay_level="1s 2s 3s 4s 5s")
    h.broker.create_topic(retry_topic("g"), 1)

    def send_back(body: bytes) -> None:
        clo = decode_offset_msg_id(_sent(h.send(1, "t", body)).msg_id)[1]
        back = ConsumerSendMsgBackRequestHeader(group="g", offset=clo, delay_level=0, max_reconsume_times=5)
        assert h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(back)).code == ResponseCode.SUCCESS

    send_back(b"r1")
    _poison(h, 3, {"REAL_TOPIC": "%RETRY%../g", "REAL_QID": "0", "RETRY_TOPIC": "t"}, "PR")
    send_back(b"r2")
    h.tick(3_000)
    assert [m.body for m in h.pull(retry_topic("g"))] == [b"r1", b"r2"]
    [park] = _parked(h)
    assert park.msg_id == "PR" and park.properties[PROPERTY_TXMQ_PARK_SOURCE] == "retry"
    assert h.broker.runtime_info(h.now_ms).parked == {"schedule": 0, "retry": 1, "transaction": 0}


def test_a_record_that_does_not_decode_is_parked_as_a_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    h = BrokerHarness(message_delay_level="1s")
    for body in (b"a", b"bad", b"b"):
        h.send(1, "t", body, properties={"DELAY": "1"})
    store = h.store
    real_read = store.read_queue

    def read_queue(topic: str, qid: int, off: int, n: int, max_bytes: int) -> list[MessageExt]:
        if topic == SCHEDULE_TOPIC and off <= 1 < off + n:  # the record at queue offset 1
            raise CorruptRecord("CRC mismatch")
        return real_read(topic, qid, off, n, max_bytes)

    monkeypatch.setattr(store, "read_queue", read_queue)
    h.tick(1_000)
    assert _bodies(h) == [b"a", b"b"]
    [park] = _parked(h)
    assert park.body == b"" and "does not decode" in park.properties[PROPERTY_TXMQ_PARK_REASON]
    assert park.properties[PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET] == "1"


def test_an_append_failing_for_one_message_parks_only_that_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = BrokerHarness(message_delay_level="1s")
    for body in (b"a", b"boom", b"b"):
        h.send(1, "t", body, properties={"DELAY": "1"})
    real_append = h.store.append

    def append(records: list[Record]) -> object:
        if any(r.body == b"boom" and r.topic == "t" for r in records):
            raise ValueError("this message breaks the append")
        return real_append(records)

    monkeypatch.setattr(h.store, "append", append)
    h.tick(1_000)
    assert _bodies(h) == [b"a", b"b"]
    [park] = _parked(h)
    assert park.body == b"boom" and "ValueError" in park.properties[PROPERTY_TXMQ_PARK_REASON]


def test_poison_half_message_is_discarded_with_a_reason_and_the_others_are_checked() -> None:
    h = BrokerHarness()
    h.heartbeat(1, "producer-1", ["pg"])
    good1 = h.send(1, "t", b"g1", transactional=True)
    h.broker.append([Record(topic=HALF_TOPIC, queue_id=0, body=b"poison", properties={
        "TRAN_MSG": "true", "REAL_TOPIC": "../../x", "REAL_QID": "0", "PGROUP": "pg",
        "UNIQ_KEY": "PH"}, born_timestamp_ms=h.now_ms, store_timestamp_ms=h.now_ms)])
    h.store.flush()
    h = BrokerHarness(store=h.store, now_ms=h.now_ms)  # recovery indexes the stored half
    h.heartbeat(1, "producer-1", ["pg"])
    # the second harness numbers its ids from 1 again: give g2 its own UNIQ_KEY, or the broker
    # takes it for a retry of g1 (a pending half with the same key is stored once)
    good2 = h.send(1, "t", b"g2", transactional=True, properties={"UNIQ_KEY": "G2"})
    checks = h.tick(limits.TRANSACTION_TIMEOUT_MS + 1)
    assert sorted(_checked(c.command) for c in checks) == sorted(
        _sent(g).queue_offset for g in (good1, good2))
    [discard] = h.pull(DISCARD_TOPIC)
    assert discard.msg_id == "PH"
    assert discard.properties[PROPERTY_TXMQ_PARK_SOURCE] == "transaction"
    assert "REAL_TOPIC" in discard.properties[PROPERTY_TXMQ_PARK_REASON]
    assert h.broker.tx.stats["parked"] == 1 and len(h.broker.tx.index.pending) == 2
    for g in (good1, good2):
        assert h.end(1, g, "COMMIT").code == ResponseCode.SUCCESS
    assert _bodies(h) == [b"g1", b"g2"]
    info = BrokerRuntimeInfo.decode(h.request(1, RequestCode.GET_BROKER_RUNTIME_INFO).body)
    assert info.parked["transaction"] == 1 and info.pending_transactions == 0
    # resumable (I5): put back, it is parked again when due, with a fresh reason
    r = h.request(1, RequestCode.RESUME_CHECK_HALF_MESSAGE,
                  to_ext(ResumeCheckHalfMessageRequestHeader(msg_id="PH")))
    assert r.code == ResponseCode.SUCCESS
    half_offset = from_ext(r.ext, ResumeResponseHeader).half_offset
    [resumed] = [m for m in h.pull(HALF_TOPIC) if m.queue_offset == half_offset]
    assert PROPERTY_TXMQ_PARK_REASON not in resumed.properties
    h.tick(limits.TRANSACTION_TIMEOUT_MS + 1)
    assert h.broker.tx.stats["parked"] == 2 and len(h.pull(DISCARD_TOPIC)) == 2


def test_a_commit_of_a_half_that_cannot_be_committed_is_refused_and_discarded_resumably() -> None:
    h = BrokerHarness()
    good = h.send(1, "t", b"g", transactional=True)
    [res] = h.broker.append([Record(topic=HALF_TOPIC, queue_id=0, body=b"poison", properties={
        "TRAN_MSG": "true", "REAL_TOPIC": "t", "REAL_QID": "7", "PGROUP": "pg", "UNIQ_KEY": "PH"},
        born_timestamp_ms=h.now_ms, store_timestamp_ms=h.now_ms)])
    h.store.flush()
    h = BrokerHarness(store=h.store, now_ms=h.now_ms)
    bad = good.response(ResponseCode.SUCCESS, "", to_ext(SendMessageResponseHeader(
        msg_id=offset_msg_id(h.broker.store_host, res.commit_log_offset), queue_id=0,
        queue_offset=res.queue_offset, transaction_id="PH")))
    ends = [to_ext(EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=_sent(c).queue_offset,
        commit_log_offset=decode_offset_msg_id(_sent(c).msg_id)[1],
        commit_or_rollback=END_TYPES["COMMIT"], msg_id=_sent(c).transaction_id or ""))
        for c in (bad, good)]
    r = h.request(1, RequestCode.END_TRANSACTION_BATCH, body=encode_body(ends))
    [bad_end, good_end] = decode_body(r.body, list[dict[str, object]])
    assert bad_end["code"] == ResponseCode.MESSAGE_ILLEGAL and "REAL_QID" in bad_end["remark"]
    assert good_end["code"] == ResponseCode.SUCCESS and good_end["outcome"] == "COMMIT"
    assert from_ext(h.end(1, bad, "COMMIT").ext, EndTransactionResponseHeader).outcome == \
        "DISCARD"  # I4: decided once
    assert _bodies(h) == [b"g"]
    assert [m.msg_id for m in h.pull(DISCARD_TOPIC)] == ["PH"]


def test_an_exception_in_one_tick_part_stops_neither_the_others_nor_later_ticks(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    h = BrokerHarness(message_delay_level="1s")
    h.heartbeat(1, "producer-1", ["pg"])
    half = h.send(1, "t", b"h", transactional=True)
    h.send(1, "t", b"d", properties={"DELAY": "1"})

    def boom(now_ms: int) -> int:
        raise RuntimeError("schedule broke")

    monkeypatch.setattr(h.broker.schedule, "tick", boom)
    with caplog.at_level(logging.ERROR, "txmq.broker.health"):
        h.tick(1)
        h.tick(1)
        checks = h.tick(limits.TRANSACTION_TIMEOUT_MS)
    assert [_checked(c.command) for c in checks] == [
        _sent(half).queue_offset]  # the checker ran although the scheduler failed
    health = h.broker.health
    assert health.errors["schedule"] == 3 and "schedule" not in health.last_tick_ms
    assert health.last_tick_ms["transaction"] == h.now_ms == health.last_tick_ms["clients"]
    assert sum("Traceback" in (r.exc_text or "") or r.exc_info is not None
               for r in caplog.records) == 1  # the traceback once, then rate-limited
    monkeypatch.undo()
    h.tick(1)
    assert _bodies(h) == [b"d"] and h.broker.health.last_tick_ms["schedule"] == h.now_ms
    info = h.broker.runtime_info(h.now_ms)
    assert info.timers["schedule"] == h.now_ms and info.timer_errors["schedule"] == 3


def test_runtime_info_round_trips_as_a_kvtable() -> None:
    info = BrokerRuntimeInfo(now_ms=5, boot_ms=1, timers={"schedule": 4}, timer_errors={"x": 2},
                             task_restarts={"ticker": 1}, parked={"retry": 3}, parked_stored=3,
                             pending_transactions=7)
    assert BrokerRuntimeInfo.decode(info.encode()) == info
    assert b'"timerLastTick.schedule":"4"' in info.encode()


def test_a_level_whose_queue_cannot_be_read_holds_back_only_that_level(
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = BrokerHarness(message_delay_level="1s 2s 3s")
    for level in (1, 2, 3):
        h.send(1, "t", f"d{level}".encode(), properties={"DELAY": str(level)})
    real_read = h.store.read_queue

    def read_queue(topic: str, qid: int, off: int, n: int, max_bytes: int) -> list[MessageExt]:
        if topic == SCHEDULE_TOPIC and qid == 0:
            raise OSError("consume queue file vanished")
        return real_read(topic, qid, off, n, max_bytes)

    monkeypatch.setattr(h.store, "read_queue", read_queue)
    h.tick(3_000)
    assert _bodies(h) == [b"d2", b"d3"]
    assert h.broker.health.errors == {"schedule": 1}
    monkeypatch.undo()
    h.tick(1)
    assert sorted(_bodies(h)) == [b"d1", b"d2", b"d3"]
