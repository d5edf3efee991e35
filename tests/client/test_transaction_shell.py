"""The asyncio shell of the transaction flow, at unit level (the half's send and the broker
faked): which thread runs the local transaction, and how ends are batched and answered."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from txmq import limits
from txmq.client import AsyncTransactionProducer, LocalTransactionState, Message
from txmq.client._core import SendResult
from txmq.protocol import Command, RequestCode, decode_body, encode_body

COMMIT = LocalTransactionState.COMMIT_MESSAGE


class _Broker:
    """Answers END_TRANSACTION_BATCH requests COMMIT, remembering each batch's size."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def request(self, code: int, ext: Any = None, body: bytes = b"") -> Command:
        assert code == RequestCode.END_TRANSACTION_BATCH
        n = len(decode_body(body, list[dict[str, str]]))
        self.batches.append(n)
        await asyncio.sleep(0)
        return Command(0, 1, body=encode_body([{"code": 0, "outcome": "COMMIT"}] * n))


class _Producer(AsyncTransactionProducer):
    broker = _Broker()
    offsets = iter(range(1, 10**6))

    async def send(self, msg: Message, queue_id: Any = None) -> SendResult:
        off = next(self.offsets)
        return SendResult(msg_id=msg.properties["UNIQ_KEY"], topic=msg.topic, queue_id=0,
                          queue_offset=off, commit_log_offset=off * 100)

    async def connection(self, addr: str) -> Any:
        assert addr == "127.0.0.1:1"  # the endpoints: the half's group is nameless
        return self.broker


def test_a_coroutine_listener_runs_on_the_loop_a_plain_one_in_a_worker_thread() -> None:
    """Listener classes whose methods share a name, one a coroutine function and one plain,
    alternate in one process: each is called the way its kind needs, every time (the kind is
    remembered per function, never per name)."""
    threads: list[tuple[str, bool]] = []

    class Async:
        async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            threads.append(("async", threading.current_thread() is threading.main_thread()))
            return COMMIT

        async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
            return COMMIT

    class Plain:
        def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            threads.append(("plain", threading.current_thread() is threading.main_thread()))
            return COMMIT

        def check_local_transaction(self, msg: Any) -> LocalTransactionState:
            return COMMIT

    class Deferred:  # a plain function returning an awaitable: awaited too
        def execute_local_transaction(self, msg: Message, arg: Any) -> Any:
            return asyncio.sleep(0, COMMIT)

        def check_local_transaction(self, msg: Any) -> LocalTransactionState:
            return COMMIT

    async def main() -> list[str]:
        out = []
        for listener in (Async(), Plain(), Async(), Plain(), Deferred()):
            p = _Producer("g", "127.0.0.1:1", listener)
            r = await p.send_message_in_transaction(Message(topic="t", body=b"x"))
            out.append(f"{r.local_transaction_state.name} {r.outcome}")
        return out

    assert asyncio.run(main()) == ["COMMIT_MESSAGE COMMIT"] * 5
    assert threads == [("async", True), ("plain", False), ("async", True), ("plain", False)]


class _Commit:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return COMMIT

    async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return COMMIT


def test_ends_queued_in_one_loop_turn_go_in_one_batch_each_answered() -> None:
    _Producer.broker = _Broker()

    async def main() -> list[str]:
        p = _Producer("g", "127.0.0.1:1", _Commit())
        halves = [await p.send_half(Message(topic="t", body=b"x")) for _ in range(n + 3)]
        first = await asyncio.gather(*(p.end_transaction(h, COMMIT) for h in halves[:n + 1]))
        rest = await asyncio.gather(*(p.end_transaction(h, COMMIT) for h in halves[n + 1:]))
        return [*first, *rest]

    n = limits.BATCH_MESSAGES_MAX
    assert asyncio.run(main()) == ["COMMIT"] * (n + 3)
    assert _Producer.broker.batches == [n, 1, 2]  # at most BATCH_MESSAGES_MAX per request
