"""Real broker processes over TCP: sends, consumption, retries, check-back after SIGKILL, bad input."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txmq.client import (
    AsyncProducer,
    AsyncTransactionProducer,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)
from txmq.errors import MessageTooLarge, RemoteError, ResponseCode
from txmq.protocol import FrameDecoder
from txmq.testing import BrokerProcess, run_broker, wait_until

FAST_TX = {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300}
ONEWAY_TX_TIMEOUT_MS = 5_000
"""A transaction's check-back delay where a test asserts that none comes (ms)."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"t": 2}, message_delay_level="100ms 200ms 300ms 400ms",
                    **FAST_TX) as b:
        yield b




def recorder(into: list[bytes]) -> Callable[[list[MessageExt]], ConsumeStatus]:
    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        into.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS
    return listener


def collect(endpoints: str, group: str, listener: Callable[[list[MessageExt]], ConsumeStatus],
            topic: str = "t") -> PushConsumer:
    c = PushConsumer(group, endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     suspend_ms=500)
    c.subscribe(topic)
    c.start()
    return c


def test_sent_messages_are_consumed(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        for i in range(50):
            p.send(Message(topic="t", body=str(i).encode()))
    got: list[bytes] = []
    c = collect(broker.endpoints, "g", recorder(got))
    try:
        wait_until(lambda: len(got) >= 50)
    finally:
        c.shutdown()
    assert sorted(int(b) for b in got) == list(range(50))


def test_redelivery_after_reconsume_later(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        p.send(Message(topic="t", body=b"flaky", keys="k1"))
    seen: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.append(msgs[0].reconsume_times)
        assert msgs[0].topic == "t"  # the original topic, not %RETRY%g
        return ConsumeStatus.RECONSUME_LATER if len(seen) < 3 else ConsumeStatus.CONSUME_SUCCESS

    c = collect(broker.endpoints, "g", listener)
    try:
        wait_until(lambda: len(seen) >= 3)
        time.sleep(0.5)
    finally:
        c.shutdown()
    assert seen == [0, 1, 2]


def test_unknown_is_settled_by_check_back_over_tcp(broker: BrokerProcess) -> None:
    checked: list[str] = []

    class Listener:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOWN

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            checked.append(msg.keys)
            return LocalTransactionState.COMMIT_MESSAGE

    with TransactionProducer("pg", broker.endpoints, Listener()) as tp:
        r = tp.send_message_in_transaction(Message(topic="t", body=b"u", keys="K"))
        assert r.outcome == "PENDING"
        with PullConsumer(broker.endpoints) as pc:
            assert sum(pc.max_offset("t", q) for q in pc.queue_ids("t")) == 0
            wait_until(lambda: pc.transaction_stats()["COMMIT"] == 1)
            assert sum(pc.max_offset("t", q) for q in pc.queue_ids("t")) == 1
    assert checked == ["K"]


_KILLED_PRODUCER = textwrap.dedent("""
    import os, signal, sys
    from txmq.client import TransactionProducer, Message, LocalTransactionState
    marker = sys.argv[2]
    class L:
        def execute_local_transaction(self, msg, arg):
            open(marker, "w").write(msg.keys)  # the local transaction commits
            os.kill(os.getpid(), signal.SIGKILL)  # and the process dies before ending it
        def check_local_transaction(self, msg):
            return LocalTransactionState.UNKNOWN
    tp = TransactionProducer("pg", sys.argv[1], L())
    tp.start()
    tp.send_message_in_transaction(Message(topic="t", body=b"orphan", keys="ORDER-7"))
""")


def test_check_back_reaches_another_producer_after_the_sender_was_killed(
        broker: BrokerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "committed"
    checked: list[str] = []

    class Survivor:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            raise AssertionError("not used")

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            checked.append(msg.keys)
            ok = marker.exists() and marker.read_text() == msg.keys
            return LocalTransactionState.COMMIT_MESSAGE if ok else LocalTransactionState.ROLLBACK_MESSAGE

    with TransactionProducer("pg", broker.endpoints, Survivor()):
        proc = subprocess.run([sys.executable, "-c", _KILLED_PRODUCER, broker.endpoints, str(marker)],
                              timeout=60)
        assert proc.returncode == -9
        got: list[bytes] = []
        c = collect(broker.endpoints, "g", recorder(got))
        try:
            wait_until(lambda: got == [b"orphan"])
        finally:
            c.shutdown()
    assert checked == ["ORDER-7"]


def test_acknowledged_messages_survive_a_broker_crash(tmp_path: Path) -> None:
    bp = BrokerProcess(tmp_path / "b", {"topics": {"t": 2}})
    bp.start()
    try:
        with Producer("p", bp.endpoints) as p:
            acked = [p.send(Message(topic="t", body=f"m{i}".encode())).msg_id for i in range(200)]
        bp.kill()
        bp.start()
        with PullConsumer(bp.endpoints) as pc:
            ids = [m.msg_id for q in pc.queue_ids("t") for m in pc.pull("t", q, 0, 1000).messages]
    finally:
        bp.stop()
    assert sorted(ids) == sorted(acked)


def test_bad_input_over_tcp_gets_errors_and_the_broker_keeps_serving(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints, max_message_size=10) as p:
        with pytest.raises(MessageTooLarge):
            p.send(Message(topic="t", body=b"x" * 11))
        with pytest.raises(RemoteError) as exc:
            p.send(Message(topic="unknown-topic", body=b"x"))
        assert exc.value.response_code == ResponseCode.TOPIC_NOT_EXIST
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as s:
        s.sendall(struct.pack(">II", 12, 40) + b"garbage!")
        data = s.recv(65536)
        [reply] = FrameDecoder().feed(data)
        assert reply.code == ResponseCode.SYSTEM_ERROR and "does not fit" in (reply.remark or "")
        assert s.recv(65536) == b""  # connection closed
    with Producer("p", broker.endpoints) as p:
        assert p.send(Message(topic="t", body=b"still-up")).queue_offset >= 0


def test_async_api_with_an_async_listener(broker: BrokerProcess) -> None:
    class AsyncListener:
        async def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            await asyncio.sleep(0)
            return LocalTransactionState.COMMIT_MESSAGE if arg else LocalTransactionState.ROLLBACK_MESSAGE

        async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK_MESSAGE

    async def main() -> list[str]:
        tp = AsyncTransactionProducer("pg", broker.endpoints, AsyncListener())
        p = AsyncProducer("plain", broker.endpoints)
        await tp.start()
        await p.start()
        try:
            results = await asyncio.gather(*(tp.send_message_in_transaction(
                Message(topic="t", body=b"x"), i % 2 == 0) for i in range(20)))
            await p.send_batch([Message(topic="t", body=b"b") for _ in range(5)])
            return [r.outcome for r in results]
        finally:
            await tp.shutdown()
            await p.shutdown()

    outcomes = asyncio.run(main())
    assert outcomes.count("COMMIT") == 10 and outcomes.count("ROLLBACK") == 10
    with PullConsumer(broker.endpoints) as pc:
        assert sum(pc.max_offset("t", q) for q in pc.queue_ids("t")) == 15


def test_oneway_ends_of_one_loop_turn_settle_without_check_back(tmp_path: Path) -> None:
    """One-way ends (RocketMQ ``endTransactionOneway``) go out as one-way batches; each commit and
    rollback is applied by the broker without any check-back. The check-back would come after
    ``ONEWAY_TX_TIMEOUT_MS``, not the 300 ms of ``FAST_TX``: a CI run once took longer than that
    from storing the halves to ending them, and every transaction was checked back. An end that
    was not applied leaves its transaction pending (the check answers UNKNOWN), so the counts
    below never match."""
    checked: list[str] = []

    class Listener:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE if arg else LocalTransactionState.ROLLBACK_MESSAGE

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            checked.append(msg.keys)
            return LocalTransactionState.UNKNOWN

    async def main(endpoints: str) -> list[str]:
        tp = AsyncTransactionProducer("pg", endpoints, Listener(), oneway_end=True)
        await tp.start()
        try:
            results = await asyncio.gather(*(tp.send_message_in_transaction(
                Message(topic="t", body=b"%d" % i, keys=str(i)), i % 3 != 0) for i in range(30)))
            return [r.outcome for r in results]
        finally:
            await tp.shutdown()

    with run_broker(tmp_path / "broker", topics={"t": 2}, transaction_check_interval_ms=300,
                    transaction_timeout_ms=ONEWAY_TX_TIMEOUT_MS) as broker, \
            PullConsumer(broker.endpoints) as pc:
        assert asyncio.run(main(broker.endpoints)) == ["SENT"] * 30
        wait_until(lambda: (pc.transaction_stats()["COMMIT"], pc.transaction_stats()["ROLLBACK"])
                   == (20, 10), timeout_s=ONEWAY_TX_TIMEOUT_MS / 1000 - 1)

        def bodies() -> list[int]:  # a decided commit is readable once its record is flushed
            return sorted(int(m.body) for q in pc.queue_ids("t")
                          for m in pc.pull("t", q, 0, 100).messages)

        wait_until(lambda: len(bodies()) >= 20)
        assert bodies() == [i for i in range(30) if i % 3 != 0]
    assert checked == []


def test_clustering_splits_queues_between_members(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        for i in range(40):
            p.send(Message(topic="t", body=str(i).encode()))
    lock = threading.Lock()
    by_member: dict[str, set[int]] = {"a": set(), "b": set()}

    def listener(name: str) -> Callable[[list[MessageExt]], ConsumeStatus]:
        def f(msgs: list[MessageExt]) -> ConsumeStatus:
            with lock:
                by_member[name].update(m.queue_id for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS
        return f

    a = collect(broker.endpoints, "g2", listener("a"))
    b = collect(broker.endpoints, "g2", listener("b"))
    try:
        with Producer("p", broker.endpoints) as p:
            for i in range(40):
                p.send(Message(topic="t", body=str(i).encode()))
        wait_until(lambda: bool(by_member["a"]) and bool(by_member["b"]))
    finally:
        a.shutdown()
        b.shutdown()
    assert by_member["a"] != by_member["b"]
