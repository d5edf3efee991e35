"""Transactional messages in the sans-IO broker: visibility, settlement, check-back, I4, discard.

Regression tests named ``test_rocketmq_<issue>_…`` answer the RocketMQ defect of that number
(docs/rocketmq.md §2).
"""

from __future__ import annotations

from txmq.broker import Reply
from txmq.broker.transaction import HALF_TOPIC, OP_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_TRANSACTION_PREPARED,
    AdminEndTransactionRequestHeader,
    Command,
    EndTransactionResponseHeader,
    PendingTransactionsRequestHeader,
    RequestCode,
    ResumeCheckHalfMessageRequestHeader,
    SendMessageResponseHeader,
    TransactionIdRequestHeader,
    decode_body,
    decode_message_ext,
    decode_offset_msg_id,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness

TIMEOUT, INTERVAL = 6_000, 30_000


def _sent(reply: Command) -> SendMessageResponseHeader:
    return from_ext(reply.ext, SendMessageResponseHeader)


def _ended(reply: Command) -> EndTransactionResponseHeader:
    return from_ext(reply.ext, EndTransactionResponseHeader)


def harness(**kw: object) -> BrokerHarness:
    h = BrokerHarness(**kw)  # type: ignore[arg-type]
    h.heartbeat(1, "producer-1", ["pg"])
    return h


def test_half_message_is_invisible_until_commit() -> None:
    h = harness()
    half = h.send(1, "t", b"order-1", transactional=True)
    assert half.code == ResponseCode.SUCCESS
    assert h.all_messages("t") == []
    assert len(h.all_messages(HALF_TOPIC)) == 1
    assert _ended(h.end(1, half, "COMMIT")).outcome == "COMMIT"
    [msg] = h.all_messages("t")
    assert msg.body == b"order-1"
    assert PROPERTY_TRANSACTION_PREPARED not in msg.properties
    assert msg.msg_id == _sent(half).transaction_id


def test_rolled_back_message_is_never_delivered_nor_checked() -> None:
    h = harness()
    half = h.send(1, "t", b"x", transactional=True)
    assert _ended(h.end(1, half, "ROLLBACK")).outcome == "ROLLBACK"
    assert h.tick(TIMEOUT + INTERVAL * 20) == []
    assert h.all_messages("t") == []
    [op] = h.all_messages(OP_TOPIC)
    assert op.tags == "d" and op.body == f"{_sent(half).queue_offset},".encode()


def test_unknown_is_settled_by_check_back() -> None:
    h = harness()
    half = h.send(1, "t", b"x", transactional=True)
    assert _ended(h.end(1, half, "UNKNOWN")).outcome == "PENDING"
    assert h.tick(TIMEOUT - 1) == []  # younger than transactionTimeOut: not checked
    [check] = h.tick(1)
    assert check.conn == 1 and check.command.code == RequestCode.CHECK_TRANSACTION_STATE
    checked = decode_message_ext(check.command.body)
    assert checked.topic == "t" and checked.body == b"x"
    assert _ended(h.end(1, half, "COMMIT", from_check=True)).outcome == "COMMIT"
    assert [m.body for m in h.all_messages("t")] == [b"x"]
    assert h.tick(INTERVAL) == []


def test_check_back_prefers_the_sender_then_any_live_producer() -> None:
    h = harness()
    h.heartbeat(2, "producer-2", ["pg"])
    h.heartbeat(3, "producer-3", ["pg"])
    half = h.send(2, "t", b"x", transactional=True)
    assert [c.conn for c in h.tick(TIMEOUT)] == [2]
    h.close(2)  # the sender died
    assert [c.conn for c in h.tick(INTERVAL)] in ([1], [3])
    assert _ended(h.end(3, half, "ROLLBACK", from_check=True)).outcome == "ROLLBACK"


def test_no_live_producer_does_not_spend_the_check_budget() -> None:
    h = harness(transaction_check_max=2)
    half = h.send(1, "t", b"x", transactional=True)
    h.close(1)
    for _ in range(5):
        assert h.tick(TIMEOUT + INTERVAL) == []
    assert h.broker.tx.stats["checks_no_producer"] == 5
    h.heartbeat(4, "producer-4", ["pg"])
    assert [c.conn for c in h.tick(INTERVAL)] == [4]
    assert _ended(h.end(4, half, "COMMIT", from_check=True)).outcome == "COMMIT"


def test_rocketmq_8158_second_commit_and_commit_after_rollback_write_nothing() -> None:
    h = harness()
    half = h.send(1, "t", b"x", transactional=True)
    h.end(1, half, "COMMIT")
    again = h.end(1, half, "COMMIT", from_check=True)
    assert (_ended(again).outcome, _ended(again).duplicate) == ("COMMIT", True)
    late_rollback = h.end(1, half, "ROLLBACK")
    assert _ended(late_rollback).outcome == "COMMIT"
    assert len(h.all_messages("t")) == 1
    assert h.broker.tx.stats["duplicate_ends"] == 2
    half2 = h.send(1, "t", b"y", transactional=True)
    h.end(1, half2, "ROLLBACK")
    assert _ended(h.end(1, half2, "COMMIT")).outcome == "ROLLBACK"
    assert [m.body for m in h.all_messages("t")] == [b"x"]


def test_discard_after_check_max_and_no_commit_after_discard() -> None:
    h = harness(transaction_check_max=3)
    half = h.send(1, "t", b"x", transactional=True)
    sent = [len(h.tick(TIMEOUT if i == 0 else INTERVAL)) for i in range(4)]
    assert sent == [1, 1, 1, 0]
    [parked] = h.all_messages(TRANS_CHECK_MAX_TIME_TOPIC)
    assert parked.body == b"x" and parked.properties["TRANSACTION_CHECK_TIMES"] == "3"
    assert _ended(h.end(1, half, "COMMIT")).outcome == "DISCARD"
    assert h.all_messages("t") == []


def test_rocketmq_8311_immunity_does_not_eat_the_check_budget() -> None:
    h = harness(transaction_check_max=2)
    half = h.send(1, "t", b"x", transactional=True,
                  properties={PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "600"})
    for _ in range(19):  # 570 s of 30 s rounds, all inside the immunity time
        h.heartbeat(1, "producer-1", ["pg"])
        assert h.tick(INTERVAL) == []
    h.heartbeat(1, "producer-1", ["pg"])
    assert len(h.tick(INTERVAL + 1)) == 1  # first check after 600 s
    assert _ended(h.end(1, half, "COMMIT", from_check=True)).outcome == "COMMIT"


def test_rocketmq_1517_checks_write_no_copy_of_the_half_message() -> None:
    h = harness(transaction_check_max=10)
    h.send(1, "t", b"x" * 10_000, transactional=True)
    before = h.store.write_offset
    for i in range(5):
        h.heartbeat(1, "producer-1", ["pg"])  # stay alive (clients expire after 120 s of silence)
        assert len(h.tick(TIMEOUT if i == 0 else INTERVAL)) == 1
    assert h.store.write_offset == before


def test_end_from_the_wrong_producer_group_is_refused() -> None:
    h = harness()
    half = h.send(1, "t", b"x", transactional=True)
    r = h.end(1, half, "COMMIT", group="other")
    assert r.code == ResponseCode.TRANSACTION_STATE_GROUP_WRONG
    assert h.all_messages("t") == []


def test_rocketmq_9500_a_failing_check_holds_back_only_that_message() -> None:
    h = harness()
    bad = h.send(1, "t", b"bad", transactional=True)
    good = h.send(1, "t", b"good", transactional=True)
    entry = h.broker.tx.index.pending[_sent(bad).queue_offset]
    entry.commit_log_offset += 1  # its body can no longer be read
    checks = h.tick(TIMEOUT)
    assert [decode_message_ext(c.command.body).body for c in checks] == [b"good"]
    assert _ended(h.end(1, good, "COMMIT", from_check=True)).outcome == "COMMIT"
    assert h.broker.tx.stats["check_errors"] == 1


def test_recovery_rebuilds_the_index_from_half_op_and_real_messages() -> None:
    h = harness()
    committed = h.send(1, "t", b"c", transactional=True)
    h.end(1, committed, "COMMIT")
    rolled = h.send(1, "t", b"r", transactional=True)
    h.end(1, rolled, "ROLLBACK")
    pending = h.send(1, "t", b"p", transactional=True)
    h2 = BrokerHarness(store=h.store, now_ms=h.now_ms)
    h2.heartbeat(1, "producer-1", ["pg"])
    idx = h2.broker.tx.index
    assert set(idx.pending) == {_sent(pending).queue_offset}
    assert _ended(h2.end(1, committed, "COMMIT")).duplicate is True
    assert len(h2.tick(TIMEOUT)) == 1
    assert _ended(h2.end(1, pending, "COMMIT", from_check=True)).outcome == "COMMIT"
    assert sorted(m.body for m in h2.all_messages("t")) == [b"c", b"p"]


def test_reject_transaction_message() -> None:
    h = harness(reject_transaction_message=True)
    assert h.send(1, "t", b"x", transactional=True).code == ResponseCode.NO_PERMISSION


def test_rocketmq_9320_check_count_is_not_spent_by_rounds_that_do_not_check() -> None:
    h = harness(transaction_check_max=3, transaction_timeout_ms=1_000)
    half = h.send(1, "t", b"x", transactional=True,
                  properties={PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "100"})
    for _ in range(99):  # many checker rounds inside the immunity window
        assert h.tick(1_000) == []
    assert h.broker.tx.index.pending[_sent(half).queue_offset].check_count == 0
    h.heartbeat(1, "producer-1", ["pg"])
    assert len(h.tick(1_001)) == 1
    assert h.broker.tx.index.pending[_sent(half).queue_offset].check_count == 1


def test_rocketmq_1568_an_exception_in_one_round_does_not_stall_later_rounds() -> None:
    h = harness()
    a = h.send(1, "t", b"a", transactional=True)
    b = h.send(1, "t", b"b", transactional=True)
    calls = {"n": 0}
    original = h.broker.tx._check_one

    def flaky(entry, now):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return original(entry, now)

    h.broker.tx._check_one = flaky  # type: ignore[method-assign]
    first = h.tick(TIMEOUT)
    assert len(first) == 1  # the other message was still checked in the failing round
    second = h.tick(INTERVAL)
    assert len(second) == 2  # and the one that failed is checked in the next round
    for half in (a, b):
        h.end(1, half, "COMMIT", from_check=True)
    assert len(h.all_messages("t")) == 2


def test_rocketmq_9791_check_back_goes_to_the_sender_not_an_unrelated_member() -> None:
    h = harness()
    for conn in (2, 3, 4):
        h.heartbeat(conn, f"producer-{conn}", ["pg"])
    for conn in (1, 2, 3, 4):
        h.send(conn, "t", f"from-{conn}".encode(), transactional=True)
    checks = h.tick(TIMEOUT)
    assert sorted((c.conn, decode_message_ext(c.command.body).body) for c in checks) == [
        (1, b"from-1"), (2, b"from-2"), (3, b"from-3"), (4, b"from-4")]


def test_rocketmq_9431_end_transaction_needs_no_state_of_the_sending_connection() -> None:
    h = harness()
    half = h.send(1, "t", b"x", transactional=True)
    h.close(1)  # the sender's connection is gone; the request alone carries what is needed
    assert _ended(h.end(99, half, "COMMIT")).outcome == "COMMIT"
    assert [m.body for m in h.all_messages("t")] == [b"x"]


def test_a_slave_refuses_sends_and_end_transaction_naming_its_master() -> None:
    half = harness().send(1, "t", b"x", transactional=True)
    h = harness(broker_role="SLAVE", broker_id=1, ha_master_address="127.0.0.1:10912")
    sent = h.send(1, "t", b"y")
    assert sent.code == ResponseCode.SERVICE_NOT_AVAILABLE and "put to the slave" in (sent.remark or "")
    ended = h.end(1, half, "COMMIT")
    assert ended.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert "SLAVE" in (ended.remark or "") and "127.0.0.1:10912" in (ended.remark or "")
    assert h.store.write_offset == 0


def test_a_slave_never_checks_back_a_pending_half_its_log_holds() -> None:
    """The same pending half: a master over the log checks it back, a slave over it never does
    (RocketMQ ``BrokerRole.SLAVE != role``)."""
    master = harness()
    master.send(1, "t", b"x", transactional=True)
    slave = harness(store=master.store, broker_role="SLAVE", broker_id=1, now_ms=master.now_ms)
    assert slave.tick(TIMEOUT + 1) == [] and slave.tick(10 * INTERVAL) == []
    again = harness(store=master.store, now_ms=master.now_ms)
    [check] = again.tick(TIMEOUT + 1)
    assert check.command.code == RequestCode.CHECK_TRANSACTION_STATE


def test_check_counts_survive_a_restart_through_the_snapshot() -> None:
    h = harness(transaction_check_max=5)
    half = h.send(1, "t", b"x", transactional=True)
    for i in range(3):
        h.tick(TIMEOUT if i == 0 else INTERVAL)
    h.broker.persist_offsets()
    h2 = BrokerHarness(store=h.store, now_ms=h.now_ms, transaction_check_max=5)
    assert h2.broker.tx.index.pending[_sent(half).queue_offset].check_count == 3
    h2.heartbeat(1, "producer-1", ["pg"])
    assert [len(h2.tick(INTERVAL)) for _ in range(3)] == [1, 1, 0]  # 2 more, then discarded
    assert len(h2.all_messages(TRANS_CHECK_MAX_TIME_TOPIC)) == 1


def _admin(h: BrokerHarness, code: RequestCode, header: object) -> Command:
    return h.request(1, code, to_ext(header))  # type: ignore[arg-type]


def test_operator_list_show_commit_with_who_and_why() -> None:
    import msgspec

    h = harness()
    half = h.send(1, "t", b"x", transactional=True, keys="order-9")
    h.tick(1_000)
    r = _admin(h, RequestCode.GET_PENDING_TRANSACTIONS, PendingTransactionsRequestHeader(limit=10))
    [row] = msgspec.json.decode(r.body)
    assert (row["msg_id"], row["keys"], row["age_ms"], row["check_count"]) == (
        _sent(half).transaction_id, "order-9", 1_000, 0)
    shown = msgspec.json.decode(_admin(h, RequestCode.QUERY_TRANSACTION,
                                        TransactionIdRequestHeader(id=_sent(half).transaction_id or "")).body)
    assert shown["state"] == "PENDING"
    r = _admin(h, RequestCode.ADMIN_END_TRANSACTION, AdminEndTransactionRequestHeader(
        id=_sent(half).transaction_id or "", outcome="COMMIT", operator="alice", reason="ticket 42"))
    assert _ended(r).outcome == "COMMIT"
    [op] = h.all_messages(OP_TOPIC)
    assert (op.properties["TXMQ_OPERATOR"], op.properties["TXMQ_REASON"]) == ("alice", "ticket 42")
    assert [m.body for m in h.all_messages("t")] == [b"x"]
    again = _admin(h, RequestCode.ADMIN_END_TRANSACTION, AdminEndTransactionRequestHeader(
        id=f"half:{_sent(half).queue_offset}", outcome="ROLLBACK", operator="bob"))
    assert (_ended(again).outcome, _ended(again).duplicate) == ("COMMIT", True)


def test_resume_puts_a_discarded_message_back_once() -> None:
    h = harness(transaction_check_max=1)
    half = h.send(1, "t", b"x", transactional=True)
    h.tick(TIMEOUT)
    h.tick(INTERVAL)  # discarded
    msg_id = _sent(half).transaction_id or ""
    r = _admin(h, RequestCode.RESUME_CHECK_HALF_MESSAGE, ResumeCheckHalfMessageRequestHeader(msg_id=msg_id))
    assert r.code == ResponseCode.SUCCESS
    by_offset = ResumeCheckHalfMessageRequestHeader(msg_id=f"half:{_sent(half).queue_offset}")
    assert _admin(h, RequestCode.RESUME_CHECK_HALF_MESSAGE, by_offset).code == ResponseCode.ILLEGAL_OPERATION
    h.heartbeat(1, "producer-1", ["pg"])
    [check] = h.tick(TIMEOUT)
    assert decode_message_ext(check.command.body).msg_id == msg_id
    from txmq.protocol import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
    hdr = from_ext(check.command.ext, CheckTransactionStateRequestHeader)
    resumed = h.request(1, RequestCode.END_TRANSACTION, to_ext(EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=hdr.tran_state_table_offset,
        commit_log_offset=hdr.commit_log_offset, commit_or_rollback=8,
        from_transaction_check=True, msg_id=hdr.msg_id or "")))
    assert _ended(resumed).outcome == "COMMIT"
    assert _ended(h.end(1, half, "COMMIT")).outcome == "DISCARD"  # the old identity stays discarded
    assert [m.body for m in h.all_messages("t")] == [b"x"]
    h2 = BrokerHarness(store=h.store, now_ms=h.now_ms)
    assert h2.broker.tx.index.resumed == {_sent(half).queue_offset}


def _end_ext(half: Command, outcome: str, group: str = "pg") -> dict[str, str]:
    from txmq.protocol import EndTransactionRequestHeader
    from txmq.testing import END_TYPES

    sent = _sent(half)
    return to_ext(EndTransactionRequestHeader(
        producer_group=group, tran_state_table_offset=sent.queue_offset,
        commit_log_offset=decode_offset_msg_id(sent.msg_id)[1], commit_or_rollback=END_TYPES[outcome],
        msg_id=sent.transaction_id or ""))


def test_end_batch_settles_with_one_op_record_and_first_writer_wins_inside_the_batch() -> None:

    h = harness()
    halves = [h.send(1, "t", f"m{i}".encode(), transactional=True) for i in range(6)]
    ops_before = len(h.pull(OP_TOPIC))
    ends = [_end_ext(halves[0], "COMMIT"), _end_ext(halves[0], "ROLLBACK"),  # same half twice
            _end_ext(halves[1], "ROLLBACK"), _end_ext(halves[2], "COMMIT"),
            _end_ext(halves[3], "UNKNOWN"), _end_ext(halves[4], "COMMIT", group="other")]
    r = h.request(1, RequestCode.END_TRANSACTION_BATCH, body=encode_body(ends))
    items = decode_body(r.body, list[dict[str, object]])
    assert [(i["code"], i.get("outcome"), i.get("duplicate")) for i in items] == [
        (ResponseCode.SUCCESS, "COMMIT", False), (ResponseCode.SUCCESS, "COMMIT", True),
        (ResponseCode.SUCCESS, "ROLLBACK", False), (ResponseCode.SUCCESS, "COMMIT", False),
        (ResponseCode.SUCCESS, "PENDING", False),
        (ResponseCode.TRANSACTION_STATE_GROUP_WRONG, "", False)]
    assert sorted(m.body for m in h.all_messages("t")) == [b"m0", b"m2"]
    ops = h.pull(OP_TOPIC)[ops_before:]
    assert len(ops) == 2  # one op record per outcome, not one per end
    assert sorted(op.body for op in ops) == [b"0,2,", b"1,"]
    assert h.broker.tx.stats["duplicate_ends"] == 1
    assert set(h.broker.tx.index.pending) == {3, 4, 5}


def test_an_end_batch_entry_that_does_not_read_gets_its_own_error_and_the_rest_settle() -> None:
    """The batch is read in one pass; when an entry does not read, every entry is read on its
    own: that one is answered INVALID_PARAMETER with why, the others are settled. A body that is
    no list of ``extFields`` is refused whole (INVALID_PARAMETER), more than
    ``BATCH_MESSAGES_MAX`` entries too (MESSAGE_ILLEGAL)."""
    from txmq import limits

    h = harness()
    halves = [h.send(1, "t", f"m{i}".encode(), transactional=True) for i in range(2)]
    broken = {k: v for k, v in _end_ext(halves[1], "COMMIT").items() if k != "producerGroup"}
    r = h.request(1, RequestCode.END_TRANSACTION_BATCH,
                  body=encode_body([_end_ext(halves[0], "COMMIT"), broken]))
    items = decode_body(r.body, list[dict[str, object]])
    assert [(i["code"], i.get("outcome")) for i in items] == [
        (ResponseCode.SUCCESS, "COMMIT"), (ResponseCode.INVALID_PARAMETER, None)]
    assert items[1]["remark"] == "the custom field <producerGroup> is null"
    assert [m.body for m in h.all_messages("t")] == [b"m0"]
    assert set(h.broker.tx.index.pending) == {1}
    for body, code in ((b'{"producerGroup": "pg"}', ResponseCode.INVALID_PARAMETER),
                       (b"[{", ResponseCode.INVALID_PARAMETER),
                       (encode_body([_end_ext(halves[1], "COMMIT")] * (limits.BATCH_MESSAGES_MAX + 1)),
                        ResponseCode.MESSAGE_ILLEGAL),
                       (encode_body([broken] * (limits.BATCH_MESSAGES_MAX + 1)),
                        ResponseCode.MESSAGE_ILLEGAL)):
        assert h.request(1, RequestCode.END_TRANSACTION_BATCH, body=body).code == code
    assert set(h.broker.tx.index.pending) == {1}


def test_a_commit_builds_the_real_message_from_the_log_when_the_half_left_the_cache(
        monkeypatch: object) -> None:
    from txmq import limits

    monkeypatch.setattr(limits, "TRANSACTION_HALF_CACHE_BYTES", 12)  # type: ignore[attr-defined]
    h = harness()
    a = h.send(1, "t", b"first-body", transactional=True, keys="ka")
    b = h.send(1, "t", b"second-body", transactional=True, keys="kb")  # evicts a
    assert len(h.broker.tx._half_cache) == 1
    h.end(1, a, "COMMIT")
    h.end(1, b, "COMMIT")
    got = {m.body: m for m in h.all_messages("t")}
    assert set(got) == {b"first-body", b"second-body"}
    assert (got[b"first-body"].keys, got[b"second-body"].keys) == ("ka", "kb")
    for body, half in ((b"first-body", a), (b"second-body", b)):  # read back vs cached: same shape
        props = got[body].properties
        assert PROPERTY_TRANSACTION_PREPARED not in props and "REAL_TOPIC" not in props
        assert props["TRAN_PREPARED_QUEUE_OFFSET"] == str(_sent(half).queue_offset)
    assert set(got[b"first-body"].properties) == set(got[b"second-body"].properties)
    assert h.broker.tx._half_cache == {} and h.broker.tx._half_cache_bytes == 0


def test_clock_jump_back_does_not_delay_check_backs_by_the_jump() -> None:
    """Found by the chaos run: checks scheduled one interval after a "now" far in the future
    waited the jump as well once the clock came back."""
    h = harness()
    half = h.send(1, "t", b"x", transactional=True)
    assert _ended(h.end(1, half, "UNKNOWN")).outcome == "PENDING"
    jump = 100_000  # below CLIENT_EXPIRED_MS, so the producer is still there
    assert len(h.tick(jump)) == 1  # the clock leaps forward: the half is checked at once
    assert h.tick(-jump) == []  # back to the real time
    h.tick(INTERVAL - 1)
    assert len(h.tick(1)) == 1  # one interval after the return, not after jump + interval


def _end_reply(h: BrokerHarness, half: Command, outcome: str, *, from_check: bool = False) -> Reply:
    ext = _end_ext(half, outcome)
    if from_check:
        ext["fromTransactionCheck"] = "true"
    [reply] = [a for a in h.broker.handle(1, Command(code=RequestCode.END_TRANSACTION, opaque=7, ext=ext),
                                          h.now_ms) if isinstance(a, Reply)]
    return reply


def test_a_repeated_end_is_answered_only_once_the_decision_it_repeats_is_durable() -> None:
    """A commit not yet on disk (nor on a SYNC_MASTER's slaves), then a second end of the same half
    (the producer's own after a check-back's, or a retry): the repeat's answer waits for the same
    bytes as the first, so an acknowledged outcome never rests on an unflushed decision."""
    h = harness()
    halves = [h.send(1, "t", f"m{i}".encode(), transactional=True) for i in range(2)]
    first = _end_reply(h, halves[0], "COMMIT", from_check=True)
    assert first.durable_offset > h.store.flushed_offset
    again = _end_reply(h, halves[0], "COMMIT")
    assert _ended(again.command).outcome == "COMMIT"
    assert again.durable_offset >= first.durable_offset
    late_rollback = _end_reply(h, halves[0], "ROLLBACK")
    assert (_ended(late_rollback.command).outcome, late_rollback.durable_offset >= first.durable_offset) \
        == ("COMMIT", True)
    h.store.flush()
    batch = [_end_ext(halves[0], "COMMIT"), _end_ext(halves[1], "UNKNOWN")]  # nothing new appended
    r = [a for a in h.broker.handle(1, Command(code=RequestCode.END_TRANSACTION_BATCH, opaque=8,
                                                body=encode_body(batch)), h.now_ms)
         if isinstance(a, Reply)]
    assert len(r) == 1 and 0 < r[0].durable_offset <= h.store.flushed_offset  # durable already
