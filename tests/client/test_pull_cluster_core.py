"""Pulls across broker groups at unit level: which member a pull goes to (the broker's
``suggestWhichBrokerId``, a missing master), what a PULL_MESSAGE answer means
(PULL_RETRY_IMMEDIATELY), and a pull loop that survives a body it cannot decode. Brokers are faked
at the request boundary (``call_broker``); the real-process tests are in test_cluster_consumers.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from txmq.client import AsyncPullConsumer, AsyncPushConsumer, ConsumeStatus, PullStatus
from txmq.client._consumer import _QueueWorker
from txmq.client._pulling import PullNodeTable, pull_result, subscribe_broker_id
from txmq.errors import ConfigError, RemoteError, ResponseCode
from txmq.protocol import (
    PULL_FLAG_COMMIT_OFFSET,
    Command,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    RequestCode,
    decode_body,
    encode_body,
    from_ext,
    to_ext,
)

MQ = MessageQueue("t", 0, "broker-a")


def pull_answer(code: int, next_offset: int, suggest: int = 0, body: bytes = b"") -> Command:
    h = PullMessageResponseHeader(suggest_which_broker_id=suggest, next_begin_offset=next_offset,
                                  min_offset=0, max_offset=100)
    return Command(code, 1, 1, ext=to_ext(h), body=body)


def test_subscribe_broker_id_follows_find_broker_address_in_subscribe() -> None:
    both = {0: "m:1", 1: "s:1"}
    assert subscribe_broker_id(both, 0) == 0
    assert subscribe_broker_id(both, 1) == 1
    assert subscribe_broker_id({0: "m:1", 2: "s:2"}, 1) == 2  # a slave id: the next one
    assert subscribe_broker_id({1: "s:1", 2: "s:2"}, 0) == 1  # master gone: the first member
    assert subscribe_broker_id({0: "m:1"}, 1) == 0  # suggested slave gone: the master
    assert subscribe_broker_id({}, 0) is None


def test_pull_node_table_keeps_the_suggestion_per_queue() -> None:
    t = PullNodeTable()
    other = MessageQueue("t", 1, "broker-a")
    assert t.choose(MQ, {0: "m", 1: "s"}) == 0
    t.update(MQ, 1)
    assert t.choose(MQ, {0: "m", 1: "s"}) == 1
    assert t.choose(other, {0: "m", 1: "s"}) == 0
    assert t.choose(MQ, {}) == 0  # members unknown (a broker address only): its master
    t.forget(MQ)
    assert t.choose(MQ, {0: "m", 1: "s"}) == 0


def test_pull_retry_immediately_is_no_matched_msg_with_the_next_offset() -> None:
    """Defect 8 of issue 23: Apache RocketMQ answers PULL_RETRY_IMMEDIATELY (20) when every
    message read was filtered out; RocketMQ's client reads it as NO_MATCHED_MSG and moves on."""
    r, suggest = pull_result(pull_answer(ResponseCode.PULL_RETRY_IMMEDIATELY, 42, suggest=1), 10)
    assert (r.status, r.next_begin_offset, suggest) == (PullStatus.NO_MATCHED_MSG, 42, 1)
    assert pull_result(pull_answer(ResponseCode.PULL_NOT_FOUND, 10), 10)[0].status \
        is PullStatus.NO_NEW_MSG
    assert pull_result(pull_answer(ResponseCode.PULL_OFFSET_MOVED, 5), 10)[0].status \
        is PullStatus.OFFSET_ILLEGAL
    with pytest.raises(RemoteError):
        pull_result(Command(ResponseCode.SYSTEM_BUSY, 1, 1, remark="busy"), 10)


class FakeBrokers:
    """Answers requests by code; records (broker name, broker id, code, ext) of each."""

    def __init__(self, pull: Callable[[int], Command]) -> None:
        self.pull = pull
        self.calls: list[tuple[str, int, int, dict[str, str]]] = []

    async def __call__(self, broker_name: str, code: int, ext: dict[str, str] | None = None,
                       body: bytes = b"", timeout_s: float | None = None, *, topic: str = "",
                       broker_id: int = 0) -> Command:
        self.calls.append((broker_name, broker_id, code, dict(ext or {})))
        await asyncio.sleep(0.005)  # a real request yields to the loop
        if code == RequestCode.PULL_MESSAGE:
            return self.pull(len([c for c in self.calls if c[2] == code]))
        if code == RequestCode.QUERY_CONSUMER_OFFSET:
            return Command(0, 1, 1, ext=to_ext(OffsetResponseHeader(offset=10)))
        if code == RequestCode.UPDATE_CONSUMER_OFFSET:
            return Command(0, 1, 1)
        raise AssertionError(f"unexpected request {code}")

    def pulls(self) -> list[tuple[str, int, dict[str, str]]]:
        return [(b, i, e) for b, i, c, e in self.calls if c == RequestCode.PULL_MESSAGE]


def fake(client: Any, brokers: FakeBrokers) -> None:
    client.call_broker = brokers
    client.call = lambda *a, **k: brokers("", *a, **k)  # the code before issue 23 used call()


def test_pulls_follow_the_brokers_suggestion_and_a_slave_gets_no_offset() -> None:
    asyncio.run(asyncio.wait_for(_pulls_follow_the_brokers_suggestion_and_a_slave_gets_no_offset(), 30))


async def _pulls_follow_the_brokers_suggestion_and_a_slave_gets_no_offset() -> None:
    c = AsyncPullConsumer("127.0.0.1:1", "g")
    c._brokers["broker-a"] = {0: "m:1", 1: "s:1"}
    brokers = FakeBrokers(lambda n: pull_answer(ResponseCode.PULL_NOT_FOUND, 10, suggest=1))
    fake(c, brokers)
    await c._pull("t", 0, 10, 32, commit_offset=7, broker_name="broker-a")
    await c._pull("t", 0, 10, 32, commit_offset=7, broker_name="broker-a")
    (b0, id0, e0), (b1, id1, e1) = brokers.pulls()
    assert (b0, id0, b1, id1) == ("broker-a", 0, "broker-a", 1)
    flags = [from_ext(e, PullMessageRequestHeader).sys_flag for e in (e0, e1)]
    assert flags[0] & PULL_FLAG_COMMIT_OFFSET and not flags[1] & PULL_FLAG_COMMIT_OFFSET
    c._brokers["broker-a"] = {1: "s:1", 2: "s:2"}  # the master is gone
    c._pull_nodes.forget(MQ)
    await c._pull("t", 0, 10, 32, broker_name="broker-a")
    assert brokers.pulls()[-1][:2] == ("broker-a", 1)


def test_empty_broker_name_needs_a_topic_on_one_broker_group() -> None:
    asyncio.run(asyncio.wait_for(_empty_broker_name_needs_a_topic_on_one_broker_group(), 30))


async def _empty_broker_name_needs_a_topic_on_one_broker_group() -> None:
    c = AsyncPullConsumer("127.0.0.1:1", "g")

    async def route(topic: str, refresh: bool = False) -> Any:
        class R:
            @staticmethod
            def broker_names() -> list[str]:
                return ["broker-a", "broker-b"] if topic == "two" else ["broker-a"]
        return R()

    c.route = route  # type: ignore[method-assign]
    brokers = FakeBrokers(lambda n: pull_answer(ResponseCode.PULL_NOT_FOUND, 0))
    fake(c, brokers)
    await c.pull("one", 0, 0)
    assert brokers.pulls()[-1][0] == "broker-a"
    with pytest.raises(ConfigError, match=r"broker-a.*broker-b"):
        await c.pull("two", 0, 0)


def test_a_pull_body_that_does_not_decode_does_not_stop_the_queue() -> None:
    asyncio.run(asyncio.wait_for(_a_pull_body_that_does_not_decode_does_not_stop_the_queue(), 30))


async def _a_pull_body_that_does_not_decode_does_not_stop_the_queue() -> None:
    """Defect 2 of issue 23: an undecodable pull body killed the queue's pull task silently."""
    c = AsyncPushConsumer("g", "127.0.0.1:1", lambda ms: ConsumeStatus.CONSUME_SUCCESS,
                          suspend_ms=0)
    c.subscribe("t")

    def answer(n: int) -> Command:
        if n == 1:
            return pull_answer(ResponseCode.SUCCESS, 12, body=b"\x00\x00\x00\x10garbage")
        return pull_answer(ResponseCode.PULL_NOT_FOUND, 10)

    brokers = FakeBrokers(answer)
    fake(c, brokers)
    w = _QueueWorker(MQ)
    task = asyncio.create_task(c._run_queue(w, None))
    try:
        for _ in range(300):
            await asyncio.sleep(0.01)
            if len(brokers.pulls()) >= 3:
                break
        assert not task.done(), task.exception() if task.done() else None
        assert c.loop_errors["pull"] == 1
        assert len(brokers.pulls()) >= 3  # pulling went on after the bad body, from offset 10
        assert from_ext(brokers.pulls()[-1][2], PullMessageRequestHeader).queue_offset == 10
    finally:
        w.pq.dropped = True
        w.stopped.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_offsets_go_to_the_master_and_wait_while_the_group_has_none() -> None:
    asyncio.run(asyncio.wait_for(_offsets_go_to_the_master(), 30))


async def _offsets_go_to_the_master() -> None:
    c = AsyncPushConsumer("g", "127.0.0.1:1", lambda ms: ConsumeStatus.CONSUME_SUCCESS)
    brokers = FakeBrokers(lambda n: pull_answer(ResponseCode.PULL_NOT_FOUND, 0))
    fake(c, brokers)
    w = _QueueWorker(MQ)
    w.pq.next_offset = 33
    c._brokers["broker-a"] = {1: "s:1"}  # master gone: nothing is sent, nothing marked committed
    await c._commit_queue(w)
    assert brokers.calls == [] and w.pq.committed_offset == -1
    c._brokers["broker-a"] = {0: "m:1", 1: "s:1"}
    await c._commit_queue(w)
    [(name, bid, code, _)] = brokers.calls
    assert (name, bid, code, w.pq.committed_offset) == (
        "broker-a", 0, RequestCode.UPDATE_CONSUMER_OFFSET, 33)


def test_consumers_heartbeat_slaves_too() -> None:
    c = AsyncPushConsumer("g", "", lambda ms: ConsumeStatus.CONSUME_SUCCESS,
                          namesrv_addr="127.0.0.1:1")
    c._brokers["broker-a"] = {0: "m:1", 1: "s:1"}
    assert c._heartbeat_targets() == ["m:1", "s:1"]
    p = AsyncPullConsumer("", "g", namesrv_addr="127.0.0.1:1")
    p._brokers["broker-a"] = {0: "m:1", 1: "s:1"}
    assert p._heartbeat_targets() == ["m:1", "s:1"]


def test_orderly_locks_go_to_each_queues_master_in_one_batch_per_group() -> None:
    asyncio.run(asyncio.wait_for(_orderly_locks(), 30))


async def _orderly_locks() -> None:
    c = AsyncPushConsumer("g", "", lambda ms: ConsumeStatus.CONSUME_SUCCESS, orderly=True,
                          namesrv_addr="127.0.0.1:1")
    sent: list[tuple[str, list[MessageQueue]]] = []

    class Conn:
        def __init__(self, addr: str) -> None:
            self.addr = addr

        async def request(self, code: int, ext: Any = None, body: bytes = b"") -> Command:
            req = decode_body(body, LockBatchRequestBody)
            sent.append((self.addr, req.mq_set))
            ok = [mq for mq in req.mq_set if mq.queue_id != 3]  # someone else holds queue 3
            return Command(0, 1, 1, body=encode_body(LockBatchResponseBody(lock_ok_mq_set=ok)))

    conns = {"a:1": Conn("a:1"), "b:1": Conn("b:1")}
    c._brokers.update({"broker-a": {0: "a:1"}, "broker-b": {0: "b:1"}})
    c._conns.update(conns)  # type: ignore[arg-type]

    async def connection(addr: str) -> Any:
        return conns[addr]

    c.connection = connection  # type: ignore[method-assign]
    ws = [_QueueWorker(MessageQueue("t", q, b)) for b, q in
          [("broker-a", 0), ("broker-b", 1), ("broker-a", 2), ("broker-b", 3)]]
    assert not await c._lock(ws)
    assert sorted((a, [(m.broker_name, m.queue_id) for m in mqs]) for a, mqs in sent) == [
        ("a:1", [("broker-a", 0), ("broker-a", 2)]), ("b:1", [("broker-b", 1), ("broker-b", 3)])]
    assert [w.pq.locked for w in ws] == [True, True, True, False]
    assert ws[0].pq.lock_token is conns["a:1"] and ws[1].pq.lock_token is conns["b:1"]
    assert c._lock_token(ws[1].mq) is conns["b:1"]


def test_a_pull_answered_retry_immediately_moves_on() -> None:
    """Defect 8 through the consumer's pull: the next pull starts at the header's next offset."""
    asyncio.run(asyncio.wait_for(_retry_immediately_moves_on(), 30))


async def _retry_immediately_moves_on() -> None:
    c = AsyncPullConsumer("127.0.0.1:1", "g")
    fake(c, FakeBrokers(lambda n: pull_answer(ResponseCode.PULL_RETRY_IMMEDIATELY, 42)))
    r = await c.pull("t", 0, 10, broker_name="broker-a")
    assert (r.status, r.next_begin_offset, r.messages) == (PullStatus.NO_MATCHED_MSG, 42, [])
