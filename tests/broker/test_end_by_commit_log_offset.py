"""END_TRANSACTION finds its half message by commit log offset, as RocketMQ's broker does
(EndTransactionProcessor: lookMessageByOffset(commitLogOffset)): the C++ client core sends
``tranStateTableOffset`` 0 on its first end request (tests/conformance/captures/README.md)."""

from __future__ import annotations

from txmq.errors import ResponseCode
from txmq.protocol import (
    EndTransactionRequestHeader,
    EndTransactionResponseHeader,
    RequestCode,
    SendMessageResponseHeader,
    decode_offset_msg_id,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness
from txmq.testing._harness import END_TYPES


def _end(half_ext: dict[str, str], outcome: str, table_offset: int) -> EndTransactionRequestHeader:
    sent = from_ext(half_ext, SendMessageResponseHeader)
    return EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=table_offset,
        commit_log_offset=decode_offset_msg_id(sent.msg_id)[1],
        commit_or_rollback=END_TYPES[outcome], msg_id=sent.transaction_id or "", transaction_id="")


def test_an_end_with_table_offset_zero_settles_the_half_at_its_commit_log_offset() -> None:
    h = BrokerHarness()
    first = h.send(1, "t", b"a", transactional=True)
    second = h.send(1, "t", b"b", transactional=True)  # half queue offset 1
    r = h.request(1, RequestCode.END_TRANSACTION, to_ext(_end(second.ext, "COMMIT", 0)))
    assert r.code == ResponseCode.SUCCESS
    assert from_ext(r.ext, EndTransactionResponseHeader).outcome == "COMMIT"
    assert [m.body for m in h.all_messages("t")] == [b"b"]  # the first half is still pending
    r = h.request(1, RequestCode.END_TRANSACTION, to_ext(_end(first.ext, "ROLLBACK", 0)))
    assert from_ext(r.ext, EndTransactionResponseHeader).outcome == "ROLLBACK"
    assert [m.body for m in h.all_messages("t")] == [b"b"]


def test_a_batch_of_ends_by_commit_log_offset_answers_each_and_a_repeat_as_duplicate() -> None:
    """Regression (txmq fuzz, broker target): a batch whose ends name their halves by commit log
    offset only answered with SYSTEM_ERROR (KeyError) when it looked the results up again."""
    h = BrokerHarness()
    h.send(1, "t", b"a", transactional=True)
    half = h.send(1, "t", b"b", transactional=True)
    ends = [to_ext(_end(half.ext, "COMMIT", 0)), to_ext(_end(half.ext, "COMMIT", 0))]
    r = h.request(1, RequestCode.END_TRANSACTION_BATCH, body=encode_body(ends))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert b'"duplicate":true' in r.body and b'"outcome":"COMMIT"' in r.body
    assert [m.body for m in h.all_messages("t")] == [b"b"]


def test_a_commit_log_offset_that_is_not_a_half_changes_nothing() -> None:
    h = BrokerHarness()
    plain = h.send(1, "t", b"plain")
    h.send(1, "t", b"half", transactional=True)
    r = h.request(1, RequestCode.END_TRANSACTION, to_ext(_end(plain.ext, "COMMIT", 0)))
    assert r.code != ResponseCode.SUCCESS
    assert [m.body for m in h.all_messages("t")] == [b"plain"]
