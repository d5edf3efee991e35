"""Controller mode in the broker core (issue #26): send answers carry masterEpoch, END_TRANSACTION
is checked against the epochs, fencing refuses writes, and a new master checks back every pending
half at once (sans-IO, through BrokerHarness)."""

from __future__ import annotations

from txmq.errors import ResponseCode
from txmq.protocol import (
    Command,
    EndTransactionRequestHeader,
    RequestCode,
    SendMessageResponseHeader,
    decode_offset_msg_id,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness

CLOCK = [0]


def _harness() -> BrokerHarness:
    h = BrokerHarness(enable_controller_mode=True, controller_addr="127.0.0.1:1",
                      transaction_timeout_ms=60_000)
    h.broker.role._clock = lambda: CLOCK[0]
    return h


def _master(h: BrokerHarness, epoch: int) -> None:
    h.broker.role.to_master(epoch, frozenset({1}), epoch)
    h.broker.role.lease_until_ms = CLOCK[0] + 3000


def _end(h: BrokerHarness, half: Command, epoch: int | None, offset: int | None = None) -> Command:
    sent = from_ext(half.ext, SendMessageResponseHeader)
    hdr = EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=sent.queue_offset,
        commit_log_offset=decode_offset_msg_id(sent.msg_id)[1] if offset is None else offset,
        commit_or_rollback=8, msg_id=sent.transaction_id or "", master_epoch=epoch)
    return h.request(1, RequestCode.END_TRANSACTION, to_ext(hdr))


def test_a_broker_without_a_role_is_fenced() -> None:
    h = _harness()
    r = h.send(1, "t", b"x")
    assert (r.code, r.remark) == (ResponseCode.SERVICE_NOT_AVAILABLE,
                                  "fenced: no role from the controller yet, or the role was lost")


def test_send_answers_carry_the_master_epoch_and_the_lease_fences() -> None:
    h = _harness()
    _master(h, 4)
    r = h.send(1, "t", b"x")
    assert r.code == ResponseCode.SUCCESS and r.ext["masterEpoch"] == "4"
    CLOCK[0] += 3000  # the lease ran out
    r = h.send(1, "t", b"y")
    assert (r.code, r.remark) == (ResponseCode.SERVICE_NOT_AVAILABLE, "fenced: lease expired")


def test_end_of_a_newer_epoch_is_refused_by_a_stale_master() -> None:
    h = _harness()
    _master(h, 2)
    half = h.send(1, "t", b"x", transactional=True)
    r = _end(h, half, 3)
    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "stale master epoch" in r.remark
    assert _end(h, half, 2).code == ResponseCode.SUCCESS


def test_end_of_an_older_epoch_past_its_successor_start_is_refused() -> None:
    h = _harness()
    _master(h, 1)
    old = h.send(1, "t", b"x", transactional=True)
    _master(h, 2)
    second = h.send(1, "t", b"y", transactional=True)
    start2 = decode_offset_msg_id(from_ext(second.ext, SendMessageResponseHeader).msg_id)[1]
    h.broker.role.next_epoch_start = lambda e: start2 if e == 1 else None
    r = _end(h, second, 1)  # epoch 1 named, but that offset is epoch 2's: rewritten
    assert r.code == ResponseCode.ILLEGAL_OPERATION and "check-back" in r.remark
    assert _end(h, old, 1).code == ResponseCode.SUCCESS
    assert _end(h, second, None).code == ResponseCode.SUCCESS  # no epoch: unchecked


def test_a_new_master_checks_back_every_pending_half_at_once() -> None:
    h = _harness()
    _master(h, 1)
    h.heartbeat(1, "producer-1", ["pg"])
    for i in range(3):
        h.send(1, "t", f"h{i}".encode(), transactional=True)
    assert h.tick(1) == []  # young halves: not checked yet (transaction_timeout_ms 60 s)
    h.broker.role.to_master(2, frozenset({1}), 2)
    h.broker.role.lease_until_ms = CLOCK[0] + 3000
    assert h.broker.take_master_role(h.now_ms, 0) == 3
    checks = h.tick(1)
    assert len(checks) == 3 and {c.command.code for c in checks} == {
        RequestCode.CHECK_TRANSACTION_STATE}


def test_a_fenced_master_runs_no_check_back() -> None:
    h = _harness()
    _master(h, 1)
    h.heartbeat(1, "producer-1", ["pg"])
    h.send(1, "t", b"x", transactional=True)
    h.broker.take_master_role(h.now_ms, 0)
    CLOCK[0] += 3000  # the lease ran out: no check-back (its answer could not be stored)
    assert h.tick(1) == []
    h.broker.role.lease_until_ms = CLOCK[0] + 3000
    assert len(h.tick(1)) == 1


def test_end_batch_checks_each_master_epoch() -> None:
    from txmq.protocol import decode_body, encode_body

    h = _harness()
    _master(h, 2)
    half = h.send(1, "t", b"x", transactional=True)
    sent = from_ext(half.ext, SendMessageResponseHeader)
    ends = [to_ext(EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=sent.queue_offset,
        commit_log_offset=decode_offset_msg_id(sent.msg_id)[1], commit_or_rollback=8,
        msg_id=sent.transaction_id or "", master_epoch=e)) for e in (3, 2)]
    r = h.request(1, RequestCode.END_TRANSACTION_BATCH, body=encode_body(ends))
    items = decode_body(r.body, list[dict[str, object]])
    assert [i["code"] for i in items] == [ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SUCCESS]
