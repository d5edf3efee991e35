"""Issue 24 item 4: END_TRANSACTION requests that arrive together (one-way, one per transaction,
as RocketMQ producers and txmq's ``oneway_end`` send them) are settled together, with one append,
as an END_TRANSACTION_BATCH is; what each request is answered and what is stored are those of
handling them one by one."""

from __future__ import annotations

from txmq.broker._server_setup import request_runs
from txmq.broker.transaction import Outcome
from txmq.errors import ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Command,
    EndTransactionRequestHeader,
    EndTransactionResponseHeader,
    RequestCode,
    SendMessageResponseHeader,
    decode_offset_msg_id,
    from_ext,
    to_ext,
)
from txmq.store import MemoryStore
from txmq.testing import BrokerHarness


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.appends = 0

    def append(self, records):  # type: ignore[no-untyped-def]
        self.appends += 1
        return super().append(records)


def _end(half: Command, kind: int, opaque: int, oneway: bool = True,
         group: str = "pg") -> Command:
    sent = from_ext(half.ext, SendMessageResponseHeader)
    h = EndTransactionRequestHeader(producer_group=group, tran_state_table_offset=sent.queue_offset,
                                    commit_log_offset=decode_offset_msg_id(sent.msg_id)[1],
                                    commit_or_rollback=kind, msg_id=sent.transaction_id or "")
    return Command(RequestCode.END_TRANSACTION, opaque, FLAG_ONEWAY if oneway else 0, ext=to_ext(h))


def _harness() -> tuple[BrokerHarness, _CountingStore]:
    store = _CountingStore()
    h = BrokerHarness(store)
    h.heartbeat(1, "c1", ["pg"])
    return h, store


def test_a_run_of_one_way_ends_is_settled_with_one_append() -> None:
    h, store = _harness()
    halves = [h.send(1, "t", f"m{i}".encode(), transactional=True) for i in range(10)]
    run = [_end(x, TRANSACTION_COMMIT_TYPE if i % 3 else TRANSACTION_ROLLBACK_TYPE, 100 + i)
           for i, x in enumerate(halves)]
    before = store.appends
    assert h.broker.handle_ends(1, run, h.now_ms) == []  # one-way: nothing answered
    assert store.appends == before + 1
    store.flush()
    idx = h.broker.tx.index
    offs = [from_ext(x.ext, SendMessageResponseHeader).queue_offset for x in halves]
    assert [idx.outcome(o) for o in offs] == [
        Outcome.COMMIT if i % 3 else Outcome.ROLLBACK for i in range(10)]
    assert sorted(m.body for m in h.all_messages("t")) == sorted(
        f"m{i}".encode() for i in range(10) if i % 3)
    assert h.broker.tx.stats["commits"] == 6 and h.broker.tx.stats["rollbacks"] == 4


def test_answers_in_a_run_are_those_of_handling_each_alone() -> None:
    """Two-way ends in a run: each gets its own answer; a repeated end of one half gets the first
    one's outcome as a duplicate, an unknown half and a malformed header their errors."""
    h, _ = _harness()
    a = h.send(1, "t", b"a", transactional=True)
    b = h.send(1, "t", b"b", transactional=True)
    unknown = Command(RequestCode.END_TRANSACTION, 5, ext=to_ext(EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=999, commit_log_offset=10**9,
        commit_or_rollback=TRANSACTION_COMMIT_TYPE, msg_id="x")))
    malformed = Command(RequestCode.END_TRANSACTION, 6, ext={"producerGroup": "pg"})
    run = [_end(a, TRANSACTION_COMMIT_TYPE, 1, oneway=False),
           _end(a, TRANSACTION_ROLLBACK_TYPE, 2, oneway=False),
           _end(b, TRANSACTION_ROLLBACK_TYPE, 3, oneway=True), unknown, malformed,
           _end(b, TRANSACTION_COMMIT_TYPE, 7, oneway=False, group="other")]
    replies = {r.command.opaque: r.command for r in h.broker.handle_ends(1, run, h.now_ms)}
    assert sorted(replies) == [1, 2, 5, 6, 7]
    first = from_ext(replies[1].ext, EndTransactionResponseHeader)
    again = from_ext(replies[2].ext, EndTransactionResponseHeader)
    assert (first.outcome, first.duplicate) == ("COMMIT", False)
    assert (again.outcome, again.duplicate) == ("COMMIT", True)
    assert replies[5].code == ResponseCode.TRANSACTION_NOT_FOUND
    assert replies[6].code == ResponseCode.SYSTEM_ERROR  # a header that does not read
    # b was rolled back earlier in the run: a later end by another group is a duplicate answer
    late = from_ext(replies[7].ext, EndTransactionResponseHeader)
    assert (late.outcome, late.duplicate) == ("ROLLBACK", True)


def test_a_slave_refuses_every_end_of_a_run() -> None:
    store = MemoryStore()
    h = BrokerHarness(store, broker_role="SLAVE", broker_id=1)
    cmds = [Command(RequestCode.END_TRANSACTION, i, ext={"producerGroup": "pg"}) for i in range(3)]
    replies = h.broker.handle_ends(1, cmds, h.now_ms)
    assert [r.command.code for r in replies] == [ResponseCode.SLAVE_NOT_AVAILABLE] * 3  # type: ignore[union-attr]


def test_the_shell_groups_ends_and_sends_but_never_responses() -> None:
    """One-way ends of a read form its last run (so the sends between them form one run); two-way
    ends and sends are grouped when consecutive; everything else stays alone and in order."""
    end = Command(RequestCode.END_TRANSACTION, 1, FLAG_ONEWAY)
    send = Command(RequestCode.SEND_MESSAGE, 2)
    other = Command(RequestCode.HEART_BEAT, 3)
    response = Command(RequestCode.END_TRANSACTION, 4, FLAG_RESPONSE)
    two_way = Command(RequestCode.END_TRANSACTION, 5)
    runs = request_runs([end, send, end, send, end, other, two_way, two_way, end, response, send, end])
    assert [[c.opaque for c in r] for r in runs] == [
        [2, 2], [3], [5, 5], [4], [2], [1, 1, 1, 1, 1]]

