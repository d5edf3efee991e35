"""A third-party RocketMQ client against a real txmq broker: the Apache RocketMQ C++ client core
(``rocketmq-client-python`` 2.0.0 over "CPP CORE 2.1.0"), speaking RocketMQ remoting, in its own
processes. Each test reads what the client reported (``clients/rocketmq_cpp_scenarios.py`` JSON lines).

The name server address given to the client is the broker's own: a broker started without a name
server answers route lookups itself.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq_cpp_helpers import DELAY_LEVELS, FAST_TX, CppClient, CppFactory, Event, keys, settle

from txmq.client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from txmq.protocol import Command, FrameDecoder, RequestCode, encode_command
from txmq.testing import BrokerProcess, run_broker, wait_until

pytestmark = pytest.mark.slow

SEND_OK = 0  # rocketmq.client.SendStatus.OK
MAX_RECONSUME_TIMES = 16  # the C++ core's default, sent as maxReconsumeTimes in CONSUMER_SEND_MSG_BACK


def by_key(events: list[Event], event: str = "received") -> dict[str, Event]:
    return {e["key"]: e for e in events if e["event"] == event}


def test_transactions_commit_rollback_and_unknown_settled_by_check_back(cpp: CppFactory) -> None:
    tx = cpp("transact", "--topic", "cpp-tx", "--group", "cpp-tx-producers", "--prefix", "tx",
             "--plan", "commit,rollback,unknown", "--check-answer", "commit", "--expect-checks", "1",
             "--linger", "60")
    events = tx.ok()
    sent = by_key(events, "sent")
    assert sorted(sent) == ["tx-0", "tx-1", "tx-2"]
    assert {e["status"] for e in sent.values()} == {SEND_OK}
    assert len({e["msg_id"] for e in sent.values()}) == 3
    assert [(e["key"], e["answer"]) for e in tx.of("local")] == [
        ("tx-0", "commit"), ("tx-1", "rollback"), ("tx-2", "unknown")]
    checks = tx.of("check")
    assert {c["key"] for c in checks} == {"tx-2"}, "only the UNKNOWN transaction is checked back"
    assert checks[0]["msg_id"] == sent["tx-2"]["msg_id"]
    assert checks[0]["topic"] == "cpp-tx"

    reader = cpp("consume", "--topic", "cpp-tx", "--group", "cpp-tx-readers", "--expect", "2", "--idle", "3")
    got = reader.ok()
    assert sorted(keys(got)) == ["tx-0", "tx-2"], "committed and checked-back-committed, never the rollback"
    received = by_key(got)
    for k in ("tx-0", "tx-2"):
        assert received[k]["msg_id"] == sent[k]["msg_id"]
        assert received[k]["body"] == k.replace("-", ":")
        assert received[k]["props"].get("origin") == "cpp"
        assert "TRAN_MSG" not in received[k]["props"]


def test_check_back_of_a_killed_producer_is_answered_by_another_member(cpp: CppFactory,
                                                                      tmp_path: Path) -> None:
    marker = tmp_path / "locally-committed"
    survivor = cpp("transact", "--topic", "cpp-tx", "--group", "cpp-tx-members", "--prefix", "warm",
                   "--plan", "rollback", "--check-answer", f"marker:{marker}", "--expect-checks", "1",
                   "--linger", "90")
    survivor.wait_for("sent")  # the survivor has routed, sent and registered with the broker
    victim = cpp("transact", "--topic", "cpp-tx", "--group", "cpp-tx-members", "--prefix", "victim",
                 "--plan", "commit", "--die-in-local", "--marker", str(marker))
    assert victim.finish() == -signal.SIGKILL
    assert keys(victim.events, "local") == ["victim-0"]
    assert marker.read_text().split() == ["victim-0"]

    events = survivor.ok()
    assert [(c["key"], c["answer"]) for c in events if c["event"] == "check"] == [("victim-0", "commit")]

    reader = cpp("consume", "--topic", "cpp-tx", "--group", "cpp-tx-readers", "--expect", "1", "--idle", "3")
    assert keys(reader.ok()) == ["victim-0"], "the orphan half committed; the survivor's rollback never seen"


def test_plain_sync_oneway_and_orderly_sends_are_consumed(cpp: CppFactory) -> None:
    def produce(mode: str, count: int) -> CppClient:
        return cpp("produce", "--topic", "cpp-plain", "--group", "cpp-plain-producers", "--mode", mode,
                   "--prefix", mode, "--count", str(count), "--shards", "2", "--linger", "1")

    runs = {mode: produce(mode, n) for mode, n in (("sync", 10), ("oneway", 5), ("orderly", 8))}
    sent: dict[str, Event] = {}
    for run in runs.values():
        sent |= by_key(run.ok(), "sent")
    assert len(sent) == 23
    acked = [e for e in sent.values() if e["mode"] != "oneway"]
    assert {e["status"] for e in acked} == {SEND_OK}
    assert len({e["msg_id"] for e in acked}) == 18

    reader = cpp("consume", "--topic", "cpp-plain", "--group", "cpp-plain-readers", "--expect", "23",
                 "--idle", "3")
    got = [e for e in reader.ok() if e["event"] == "received"]
    assert sorted(e["key"] for e in got) == sorted(sent), "every message exactly once"
    received = by_key(got)
    for k, e in received.items():
        mode, i = k.split("-")
        assert e["body"] == f"{mode}:{i}" and e["tags"] == "cpp" and e["reconsume_times"] == 0
        if mode != "oneway":
            assert e["msg_id"] == sent[k]["msg_id"]
    for shard in (0, 1):
        in_order = [received[f"orderly-{i}"] for i in range(8) if i % 2 == shard]
        assert len({e["queue_id"] for e in in_order}) == 1, "one sharding key, one queue"
        offsets = [e["queue_offset"] for e in in_order]
        assert offsets == sorted(set(offsets)), "a sharding key's messages are queued in send order"


def test_clustering_consumers_share_the_topic(cpp: CppFactory, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    members = [cpp("consume", "--topic", "cpp-plain", "--group", "cpp-cluster", "--stop-file", str(stop),
                   "--timeout", "120") for _ in range(2)]
    for m in members:
        m.wait_for("started")
    settle(3)  # both members registered and rebalanced
    cpp("produce", "--topic", "cpp-plain", "--group", "cpp-plain-producers", "--prefix", "c",
        "--count", "40").ok()
    expected = {f"c-{i}" for i in range(40)}
    wait_until(lambda: set(keys(members[0].events)) | set(keys(members[1].events)) >= expected, 60)
    stop.touch()
    got = [m.ok() for m in members]
    assert set(keys(got[0])) | set(keys(got[1])) == expected
    assert keys(got[0]) and keys(got[1]), "clustering: both members of the group consume a share"


def test_reconsume_later_goes_to_the_retry_topic_then_to_the_dlq(cpp: CppFactory, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    cpp("produce", "--topic", "cpp-retry", "--group", "cpp-retry-producers", "--prefix", "r",
        "--count", "2").ok()
    flaky = cpp("consume", "--topic", "cpp-retry", "--group", "cpp-retry-g", "--later", "r-1",
                "--stop-file", str(stop), "--timeout", "150")
    deliveries = MAX_RECONSUME_TIMES + 1
    wait_until(lambda: keys(flaky.events).count("r-1") >= deliveries, 120)

    dlq = cpp("consume", "--topic", "%DLQ%cpp-retry-g", "--group", "cpp-dlq-readers", "--expect", "1",
              "--idle", "3")
    dead = [e for e in dlq.ok() if e["event"] == "received"]
    assert [(e["key"], e["body"]) for e in dead] == [("r-1", "r:1")]
    stop.touch()
    events = flaky.ok()
    retried = [e for e in events if e["event"] == "received" and e["key"] == "r-1"]
    assert [e["reconsume_times"] for e in retried] == list(range(deliveries)), "no delivery after the DLQ"
    assert {e["topic"] for e in retried} == {"cpp-retry"}, "a retry is delivered under its original topic"
    assert {e["msg_id"] for e in retried} == {retried[0]["msg_id"]}
    assert keys(events, answer="success") == ["r-0"]


def test_cpp_client_and_txmq_sdk_consume_what_the_other_produced(cpp: CppFactory,
                                                                 broker: BrokerProcess) -> None:
    class Commit:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    with Producer("sdk-producers", broker.endpoints) as p:
        for i in range(5):
            p.send(Message(topic="cpp-mixed", body=f"sdk:{i}".encode(), keys=f"sdk-{i}"))
    with TransactionProducer("sdk-tx-producers", broker.endpoints, Commit()) as tp:
        tp.send_message_in_transaction(Message(topic="cpp-mixed", body=b"sdktx:0", keys="sdktx-0"))
    cpp("produce", "--topic", "cpp-mixed", "--group", "cpp-mixed-producers", "--prefix", "cpp",
        "--count", "5").ok()
    cpp("transact", "--topic", "cpp-mixed", "--group", "cpp-mixed-tx", "--prefix", "cpptx",
        "--plan", "commit").ok()
    expected = {f"{p}-{i}": f"{p}:{i}" for p in ("sdk", "cpp") for i in range(5)}
    expected |= {"sdktx-0": "sdktx:0", "cpptx-0": "cpptx:0"}

    reader = cpp("consume", "--topic", "cpp-mixed", "--group", "cpp-mixed-cpp",
                 "--expect", str(len(expected)), "--idle", "3")
    got = [e for e in reader.ok() if e["event"] == "received"]
    assert sorted((e["key"], e["body"]) for e in got) == sorted(expected.items())

    seen: list[tuple[str, bytes]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend((m.keys, m.body) for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    sdk = PushConsumer("cpp-mixed-sdk", broker.endpoints, listener,
                       consume_from_where="CONSUME_FROM_FIRST_OFFSET", suspend_ms=500)
    sdk.subscribe("cpp-mixed")
    sdk.start()
    try:
        wait_until(lambda: len(seen) >= len(expected))
        settle(1)
    finally:
        sdk.shutdown()
    assert sorted(seen) == sorted((k, v.encode()) for k, v in expected.items())


@pytest.fixture
def namesrv(tmp_path: Path) -> Iterator[str]:
    """``txmq namesrv`` on a free port; yields its ``host:port``."""
    port_file = tmp_path / "namesrv.port"
    with open(tmp_path / "namesrv.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "txmq", "namesrv", "--port", "0", "--port-file",
                                 str(port_file)], stderr=log)
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, 30)
        assert proc.poll() is None, (tmp_path / "namesrv.log").read_text()
        yield f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.terminate()
        proc.wait(10)


def routed(namesrv: str, topic: str) -> bool:
    """Whether the name server answers GET_ROUTEINFO_BY_TOPIC for ``topic`` with a route."""
    host, port = namesrv.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(encode_command(Command(code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=1,
                                            ext={"topic": topic})))
        decoder, got = FrameDecoder(), []
        while not got:
            data = sock.recv(65536)
            if not data:
                return False
            got = decoder.feed(data)
    return got[0].code == 0


def test_through_a_name_server(cpp_python: Path, namesrv: str, tmp_path: Path) -> None:
    """namesrvAddr = ``txmq namesrv``, with a broker that registered its topics there."""
    with run_broker(tmp_path / "broker", topics={"cpp-ns": 4}, namesrv_addr=namesrv,
                    message_delay_level=DELAY_LEVELS, **FAST_TX):
        try:
            wait_until(lambda: routed(namesrv, "cpp-ns"), 30)
        except AssertionError:
            msg = "the broker (namesrv_addr set) never registered cpp-ns with the name server"
            raise AssertionError(msg) from None

        def start(command: str, *args: str) -> CppClient:
            return CppClient(cpp_python, namesrv, command, *args,
                             log_path=tmp_path / f"cpp-{command}-{time.monotonic_ns()}.log")

        tx = start("transact", "--topic", "cpp-ns", "--group", "cpp-ns-tx", "--prefix", "ns",
                   "--plan", "commit,rollback,unknown", "--check-answer", "commit", "--expect-checks", "1",
                   "--linger", "60")
        assert keys(tx.ok(), "check") == ["ns-2"]
        reader = start("consume", "--topic", "cpp-ns", "--group", "cpp-ns-readers", "--expect", "2",
                       "--idle", "3")
        assert sorted(keys(reader.ok())) == ["ns-0", "ns-2"]
