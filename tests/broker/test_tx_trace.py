"""The broker's record of each transaction's life (issue #28, docs/tracing.md "The broker's leg"):
half stored, check-backs and their answers, the end and who decided, on the sans-IO broker; the
GET_TRANSACTION_TRACE request; the bounds of the record (lives, steps, memory); what a restart
keeps; the listener the OTLP export hangs on."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest

from txmq.broker.transaction import TRANSACTION_TRACE_STEPS_MAX, HalfEntry, TransactionTraces
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_TRACEPARENT,
    TRANSACTION_COMMIT_TYPE,
    AdminEndTransactionRequestHeader,
    Command,
    EndTransactionRequestHeader,
    RequestCode,
    SendMessageResponseHeader,
    TransactionLife,
    TransactionStep,
    TransactionTraceRequestHeader,
    decode_body,
    decode_offset_msg_id,
    from_ext,
    to_ext,
    trace_id_of,
)
from txmq.testing import BrokerHarness

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
TIMEOUT_MS = 1_000


def _harness(**config: Any) -> BrokerHarness:
    h = BrokerHarness(transaction_timeout_ms=TIMEOUT_MS, transaction_check_interval_ms=TIMEOUT_MS,
                      **config)
    h.broker.connection_opened(1, "10.0.0.1:5001")
    h.broker.connection_opened(2, "10.0.0.2:5002")
    h.heartbeat(1, "producer-a", ["pg"])
    return h


def _lives(h: BrokerHarness, ident: str = "", trace_id: str = "", limit: int = 16
           ) -> list[TransactionLife]:
    r = h.request(9, RequestCode.GET_TRANSACTION_TRACE,
                  to_ext(TransactionTraceRequestHeader(id=ident, trace_id=trace_id, limit=limit)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return decode_body(r.body, list[TransactionLife])


def _steps(life: TransactionLife) -> list[tuple[object, ...]]:
    return [(s.kind, s.check_count, s.client_id, s.address, s.answer, s.outcome, s.decided_by)
            for s in life.steps]


class _Recorder:
    """A TraceListener that keeps what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def half_stored(self, life: TransactionLife) -> None:
        self.calls.append(("half", life.half_offset, life.stored_ms))

    def check_closed(self, life: TransactionLife, check: TransactionStep,
                     answer: TransactionStep | None, closed_ms: int) -> None:
        self.calls.append(("check", check.check_count, answer.answer if answer else None,
                           check.time_ms, closed_ms))

    def ended(self, life: TransactionLife, end: TransactionStep) -> None:
        self.calls.append(("end", end.outcome, end.decided_by, end.reason))


def test_unknown_then_a_check_back_commit_is_recorded_with_who_and_when() -> None:
    h = _harness()
    born = h.now_ms
    half = h.send(1, "t", b"order", transactional=True,
                  properties={PROPERTY_TRACEPARENT: TRACEPARENT})
    h.end(1, half, "UNKNOWN")
    h.heartbeat(2, "producer-b", ["pg"])
    h.close(1)  # the sender is gone: the check-back goes to producer-b
    [check] = h.tick(TIMEOUT_MS)
    assert check.conn == 2
    h.now_ms += 25
    r = h.request(2, RequestCode.END_TRANSACTION, to_ext(_end_header(half, from_check=True)))
    assert r.code == ResponseCode.SUCCESS
    [life] = _lives(h, "M00000001")
    assert (life.msg_id, life.topic, life.producer_group, life.client_id, life.address) == (
        "M00000001", "t", "pg", "producer-a", "10.0.0.1:5001")
    assert (life.born_ms, life.stored_ms, life.traceparent) == (born, born, TRACEPARENT)
    assert _steps(life) == [
        ("answer", 0, "producer-a", "10.0.0.1:5001", "UNKNOWN", "", ""),
        ("check-back", 1, "producer-b", "10.0.0.2:5002", "", "", ""),
        ("answer", 1, "producer-b", "10.0.0.2:5002", "COMMIT", "", ""),
        ("end", 0, "producer-b", "10.0.0.2:5002", "", "COMMIT", "check-back"),
    ]
    check_step, answer = life.steps[1], life.steps[2]
    assert (check_step.time_ms, answer.sent_ms, answer.time_ms) == (
        born + TIMEOUT_MS, born + TIMEOUT_MS, born + TIMEOUT_MS + 25)
    assert _lives(h, "half:0") == [life]
    assert _lives(h, trace_id=TRACE_ID) == [life]


def _end_header(half: Command, *, from_check: bool) -> EndTransactionRequestHeader:
    sent = from_ext(half.ext, SendMessageResponseHeader)
    return EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=sent.queue_offset,
        commit_log_offset=decode_offset_msg_id(sent.msg_id)[1],
        commit_or_rollback=TRANSACTION_COMMIT_TYPE, from_transaction_check=from_check,
        msg_id=sent.transaction_id or "")


def test_a_producer_s_own_commit_is_ended_by_the_producer() -> None:
    h = _harness()
    half = h.send(1, "t", b"x", transactional=True)
    h.end(1, half, "COMMIT")
    [life] = _lives(h, "half:0")
    assert life.traceparent == ""
    assert _steps(life) == [("end", 0, "producer-a", "10.0.0.1:5001", "", "COMMIT", "producer")]


def test_discard_after_check_max_closes_the_unanswered_check_backs_for_the_listener() -> None:
    h = _harness(transaction_check_max=2)
    listener = _Recorder()
    h.broker.tx_traces.listener = listener
    born = h.now_ms
    h.send(1, "t", b"x", transactional=True, properties={PROPERTY_TRACEPARENT: TRACEPARENT})
    h.send(1, "t", b"untraced", transactional=True)  # no traceparent: the listener hears nothing
    for _ in range(3):
        h.tick(TIMEOUT_MS)
    first, second = born + TIMEOUT_MS, born + 2 * TIMEOUT_MS
    assert listener.calls == [
        ("half", 0, born),
        ("check", 1, None, first, second),  # closed when the next one was sent
        ("check", 2, None, second, born + 3 * TIMEOUT_MS),  # closed by the discard
        ("end", "DISCARD", "check-back", "no decision after 2 check-backs (transaction_check_max)"),
    ]
    [life] = _lives(h, "half:0")
    assert [s.kind for s in life.steps] == ["check-back", "check-back", "end"]
    assert [s.kind for s in _lives(h, "half:1")[0].steps] == ["check-back", "check-back", "end"]


def test_an_operator_s_decision_is_recorded_with_name_and_reason() -> None:
    h = _harness()
    h.send(1, "t", b"x", transactional=True)
    h.end(1, h.send(1, "t", b"y", transactional=True), "UNKNOWN")
    r = h.request(3, RequestCode.ADMIN_END_TRANSACTION, to_ext(AdminEndTransactionRequestHeader(
        id="half:0", outcome="ROLLBACK", operator="alice", reason="order cancelled")))
    assert r.code == ResponseCode.SUCCESS
    [end] = _lives(h, "half:0")[0].steps
    assert (end.outcome, end.decided_by, end.operator, end.reason, end.client_id) == (
        "ROLLBACK", "operator", "alice", "order cancelled", "")


def test_a_transaction_pending_across_a_restart_gets_a_life_at_its_next_check_back() -> None:
    h = _harness()
    h.send(1, "t", b"x", transactional=True, properties={PROPERTY_TRACEPARENT: TRACEPARENT})
    h.broker.persist_offsets()
    again = BrokerHarness(store=h.store, now_ms=h.now_ms, transaction_timeout_ms=TIMEOUT_MS,
                          transaction_check_interval_ms=TIMEOUT_MS)
    assert _lives(again, "half:0") == []  # memory only: nothing survived
    again.broker.connection_opened(1, "10.0.0.9:6000")
    again.heartbeat(1, "producer-c", ["pg"])
    [_] = again.tick(TIMEOUT_MS)
    [life] = _lives(again, "half:0")
    assert (life.stored_ms, life.traceparent, life.client_id, life.producer_group) == (
        0, TRACEPARENT, "producer-a", "pg")
    assert _steps(life) == [("check-back", 1, "producer-c", "10.0.0.9:6000", "", "", "")]


def test_recording_can_be_turned_off() -> None:
    h = _harness(transaction_trace_max=0)
    h.end(1, h.send(1, "t", b"x", transactional=True), "COMMIT")
    assert _lives(h, "half:0") == []
    assert len(h.broker.tx_traces) == 0 and h.broker.tx_traces.stats["recorded"] == 0


@pytest.mark.parametrize(("header", "code"), [
    (TransactionTraceRequestHeader(), ResponseCode.INVALID_PARAMETER),
    (TransactionTraceRequestHeader(id="M1", trace_id=TRACE_ID), ResponseCode.INVALID_PARAMETER),
    (TransactionTraceRequestHeader(trace_id=TRACE_ID.upper()), ResponseCode.INVALID_PARAMETER),
    (TransactionTraceRequestHeader(trace_id="abc"), ResponseCode.INVALID_PARAMETER),
    (TransactionTraceRequestHeader(id="half:x"), ResponseCode.INVALID_PARAMETER),
])
def test_a_bad_trace_request_is_refused_with_its_reason(header: TransactionTraceRequestHeader,
                                                       code: ResponseCode) -> None:
    r = _harness().request(9, RequestCode.GET_TRANSACTION_TRACE, to_ext(header))
    assert r.code == code and r.remark


def test_a_trace_query_answers_newest_first_within_its_limit() -> None:
    h = _harness()
    for _ in range(5):
        h.end(1, h.send(1, "t", b"x", transactional=True,
                        properties={PROPERTY_TRACEPARENT: TRACEPARENT}), "COMMIT")
    assert [life.half_offset for life in _lives(h, trace_id=TRACE_ID, limit=3)] == [4, 3, 2]
    assert _lives(h, trace_id="1" * 32) == []


def _entry(off: int) -> HalfEntry:
    return HalfEntry(half_offset=off, commit_log_offset=off * 100, producer_group="pg",
                     sender_client_id="c", msg_id=f"M{off}", real_topic="t", keys="", born_ms=0,
                     first_check_ms=0, next_check_ms=0)


def test_lives_are_bounded_pending_by_a_cap_settled_by_a_ring_steps_per_life() -> None:
    traces = TransactionTraces(10, TIMEOUT_MS)
    for off in range(12):  # two more pending than the bound: not recorded
        traces.half(_entry(off), {}, 1, "a:1")
    assert (len(traces), traces.pending, traces.stats["untraced"]) == (10, 10, 2)
    for off in range(10):
        traces.ended(_entry(off), "COMMIT", 2, "producer")
    for off in range(100, 1_100):  # a thousand more, settled: the ring keeps the last ten
        traces.half(_entry(off), {}, 3, "a:1")
        traces.ended(_entry(off), "ROLLBACK", 4, "producer")
    assert (len(traces), traces.pending, traces.stats["evicted"]) == (10, 0, 1_000)
    assert [life.half_offset for life in traces.newest()] == list(range(1_099, 1_089, -1))
    busy = _entry(5_000)
    traces.half(busy, {}, 5, "a:1")
    for n in range(1, 3 * TRANSACTION_TRACE_STEPS_MAX):
        busy.check_count = n
        traces.check_sent(busy, {}, "", 6 + n, "c", "a:1")
    traces.ended(busy, "DISCARD", 9_999, "check-back")
    steps = traces.get(5_000).steps  # type: ignore[union-attr]
    assert len(steps) == TRANSACTION_TRACE_STEPS_MAX + 1 and steps[-1].kind == "end"


def test_a_settled_life_takes_under_a_kibibyte() -> None:
    """The figure limits.TRANSACTION_TRACE_MAX's memory bound rests on: a life with two
    check-backs answered, its half and its end, measured with tracemalloc against the same
    broker recording nothing."""
    n = 2_000

    def bytes_per_transaction(trace_max: int) -> float:
        h = _harness(transaction_trace_max=trace_max, transaction_checks_in_flight_max=n)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            halves = [h.send(1, "t", b"x" * 16, transactional=True, properties={
                PROPERTY_TRACEPARENT: f"00-{i + 1:032x}-b7ad6b7169203331-01"}) for i in range(n)]
            h.tick(TIMEOUT_MS)
            h.tick(TIMEOUT_MS)
            for half in halves:
                h.end(1, half, "COMMIT", from_check=True)
            del halves
            h.sent.clear()
            gc.collect()
            return (tracemalloc.get_traced_memory()[0] - before) / n
        finally:
            tracemalloc.stop()

    per_life = bytes_per_transaction(n) - bytes_per_transaction(0)
    assert 0 < per_life < 1024, per_life


def test_a_failing_listener_is_counted_and_the_broker_goes_on() -> None:
    h = _harness()

    class Broken(_Recorder):
        def ended(self, life: TransactionLife, end: TransactionStep) -> None:
            raise RuntimeError("exporter down")

    h.broker.tx_traces.listener = Broken()
    r = h.end(1, h.send(1, "t", b"x", transactional=True,
                        properties={PROPERTY_TRACEPARENT: TRACEPARENT}), "COMMIT")
    assert r.code == ResponseCode.SUCCESS
    assert h.broker.tx_traces.stats["listener_errors"] == 1
    assert [m.body for m in h.all_messages("t")] == [b"x"]


@pytest.mark.parametrize(("value", "trace_id"), [
    (TRACEPARENT, TRACE_ID),
    (f"01-{TRACE_ID}-b7ad6b7169203331-00-future", TRACE_ID),  # a later version may add fields
    (f"00-{TRACE_ID}-b7ad6b7169203331-01-x", ""),  # version 00 may not
    (f"ff-{TRACE_ID}-b7ad6b7169203331-01", ""),
    (f"00-{'0' * 32}-b7ad6b7169203331-01", ""),
    (f"00-{TRACE_ID}-{'0' * 16}-01", ""),
    (f"00-{TRACE_ID.upper()}-b7ad6b7169203331-01", ""),
    (f"00_{TRACE_ID}-b7ad6b7169203331-01", ""),
    ("", ""),
    ("00-abc", ""),
])
def test_trace_id_of_reads_only_a_valid_traceparent(value: str, trace_id: str) -> None:
    assert trace_id_of(value) == trace_id
