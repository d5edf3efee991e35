"""The official Apache RocketMQ 5 Python client (PyPI ``rocketmq-python-client`` 5.1.2, gRPC) against a
real txmq broker's gRPC door (``grpc_port``), in its own processes and its own pinned environment
(``client_envs.rocketmq_grpc``). Each test reads what the client reported
(``clients/rocketmq_grpc_scenarios.py`` JSON lines) and, where the remoting side must agree, what the
txmq SDK sees on the same broker.

One broker serves the whole module; every test has its own topics and groups.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client_envs.rocketmq_grpc import (
    CLIENT_LOG,
    REQUIRE_ENV,
    Event,
    GrpcClientUnavailable,
    ScenarioProcess,
    ensure_env,
)
from txmq.client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)
from txmq.testing import BrokerProcess, free_port, run_broker, wait_until

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).resolve().parent / "clients"
SCENARIOS = CLIENTS / "rocketmq_grpc_scenarios.py"
REQUIREMENTS = CLIENTS / "rocketmq_grpc_requirements.txt"
# The official client's born_timestamp is whole seconds (int(time.time())), and a half is first checked
# at born + transaction timeout (RocketMQ's rule): a half may look up to 1 s older than it is, so a
# timeout under 1 s could check a half before its own commit or rollback arrives.
FAST_TX = {"transaction_timeout_ms": 1500, "transaction_check_interval_ms": 300}
# A delivery_timestamp becomes the first delay level at least as long as the wait (the proxy's useDelayLevel
# rule): 1 s steps keep a 2 s delay message at 2 s, not the default levels' 5 s.
DELAY_LEVELS = " ".join(f"{s}s" for s in range(1, 19))
SIMPLE_GROUP = "py-simple-g"
SIMPLE_RETRY_MAX_TIMES = 1  # max delivery attempts = retry max times + 1 (RocketMQ 5 pop)
FIFO_GROUP = "py-fifo-g"
GROUPS = {SIMPLE_GROUP: {"retry_max_times": SIMPLE_RETRY_MAX_TIMES},
          FIFO_GROUP: {"consume_message_orderly": True, "retry_max_times": 3}}
MAX_BODY = 256 * 1024  # the broker's max_message_size, which the door's settings give as max_body_size
TOPICS = {"py-send": 4, "py-tx": 4, "py-orphan": 4, "py-simple": 1, "py-fifo": 1, "py-mixed": 4}

Start = Callable[..., ScenarioProcess]


@pytest.fixture(scope="module")
def py_client() -> Path:
    """The official client's python (built once, cached); skip, or fail under TXMQ_REQUIRE_ROCKETMQ_GRPC=1."""
    try:
        return ensure_env(REQUIREMENTS)
    except GrpcClientUnavailable as e:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the official gRPC client environment cannot be built: {e}")
        pytest.skip(f"the official gRPC client environment cannot be built here (is PyPI reachable?): {e}")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Door:
    """The module's broker: ``remoting`` (txmq SDK) and ``grpc`` (official client) endpoints."""

    def __init__(self, broker: BrokerProcess, grpc_port: int) -> None:
        self.broker = broker
        self.remoting = broker.endpoints
        self.grpc = f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def door(py_client: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    port = free_port()
    with run_broker(tmp_path_factory.mktemp("grpc-broker"), topics=TOPICS, grpc_port=port, groups=GROUPS,
                    message_delay_level=DELAY_LEVELS, max_message_size=MAX_BODY, **FAST_TX) as b:
        wait_until(lambda: listening(port), 15)
        yield Door(b, port)


@pytest.fixture
def start(py_client: Path, door: Door, tmp_path: Path) -> Iterator[Start]:
    """``start("consume", "--group", ...)`` runs a scenario process against the door; every process
    still running at the end of the test is killed."""
    started: list[ScenarioProcess] = []
    n = itertools.count()

    def run(command: str, *args: str) -> ScenarioProcess:
        i = next(n)
        p = ScenarioProcess(py_client, SCENARIOS, ["--endpoints", door.grpc, command, *args],
                            home=tmp_path / f"home-{i}", log_path=tmp_path / f"py-{i}-{command}.log")
        started.append(p)
        return p

    yield run
    for p in started:
        p.kill()


def of(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e["event"] == name]


def by_key(events: list[Event], name: str) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = {}
    for e in of(events, name):
        out.setdefault(e["key"], []).append(e)
    return out


def read_topic(door: Door, topic: str) -> list[MessageExt]:
    """Every message of ``topic`` as the txmq SDK pulls it over remoting, queue by queue."""
    out: list[MessageExt] = []
    with PullConsumer(door.remoting, "py-conf-reader") as pc:
        for q in pc.queue_ids(topic):
            offset, end = pc.min_offset(topic, q), pc.max_offset(topic, q)
            while offset < end:
                r = pc.pull(topic, q, offset, 32)
                out.extend(r.messages)
                if r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
    return out


def test_normal_delay_and_fifo_sends_reach_both_doors(start: Start, door: Door) -> None:
    runs = [start("produce", "--topic", "py-send", "--mode", "normal", "--prefix", "normal", "--count", "5"),
            start("produce", "--topic", "py-send", "--mode", "fifo", "--prefix", "fifo", "--count", "8",
                  "--groups", "2"),
            start("produce", "--topic", "py-send", "--mode", "delay", "--prefix", "delay", "--count", "2",
                  "--delay-s", "2")]
    events = [e for r in runs for e in r.ok()]
    assert all(e["settings"] for e in of(events, "started")), "every producer got the door's settings"
    sent = {k: v[0] for k, v in by_key(events, "sent").items()}
    assert len(sent) == 15 and len({e["message_id"] for e in sent.values()}) == 15

    stored: dict[str, MessageExt] = {}

    def all_stored() -> bool:  # the delay messages reach the topic when their time comes
        stored.update((m.keys, m) for m in read_topic(door, "py-send"))
        return len(stored) >= len(sent)

    wait_until(all_stored, 10)
    assert sorted(stored) == sorted(sent), "the remoting door sees the same messages"
    for k, m in stored.items():
        assert m.body.decode() == sent[k]["body"] and m.tags == "py" and m.properties["origin"] == "python"
        assert m.msg_id == sent[k]["message_id"], "UNIQ_KEY is the client's message id"
    for g in ("fifo-g0", "fifo-g1"):
        in_group = [stored[k] for k in sorted(sent, key=lambda k: int(k.split("-")[1]))
                    if sent[k]["group"] == g]
        assert len(in_group) == 4
        assert {m.properties.get("__SHARDINGKEY") for m in in_group} == {g}
        assert len({m.queue_id for m in in_group}) == 1, "one message group, one queue"
        offsets = [m.queue_offset for m in in_group]
        assert offsets == sorted(offsets), "a message group is queued in send order"

    reader = start("consume", "--group", "py-send-g", "--topic", "py-send", "--expect", "15", "--idle", "0.5")
    got = reader.ok()
    received = by_key(got, "received")
    assert sorted(received) == sorted(sent), "every message once"
    assert all(len(v) == 1 for v in received.values()), "acked messages are never redelivered"
    for k, (e,) in received.items():
        assert e["body"] == sent[k]["body"] and e["tag"] == "py" and e["topic"] == "py-send"
        assert e["message_id"] == sent[k]["message_id"] and e["keys"] == [k]
        assert e["attempt"] == 1 and not e["corrupted"]
        assert e["props"] == {"origin": "python"}
        if k.startswith("fifo"):
            assert e["group"] == sent[k]["group"]
        if k.startswith("delay"):  # (delivery_timestamp is not echoed: the proxy's delay-level mode)
            assert e["t"] >= sent[k]["delivery_s"] - 0.2, "a delay message is not delivered early"
    assert len(of(got, "acked")) == 15


def test_an_unknown_topic_and_a_body_over_the_doors_maximum_are_refused(start: Start, door: Door) -> None:
    probe = start("probe", "--topic", "py-send", "--unknown-topic", "py-no-such-topic",
                  "--body-size", str(MAX_BODY + 1))
    events = probe.ok()
    assert of(events, "started")[0]["settings"]
    refused = {e["case"]: e for e in of(events, "refused")}
    assert sorted(refused) == ["oversized", "unknown-topic"] and not of(events, "sent")
    # the client's own default is 4 MiB: it refuses this body only because the door's settings said so
    assert refused["oversized"]["message"].endswith(f"max size={MAX_BODY} bytes")
    assert "py-no-such-topic" in refused["unknown-topic"]["message"]
    log = (probe.home / CLIENT_LOG).read_text()
    assert "40402, topic 'py-no-such-topic' does not exist" in log, "QueryRoute answers TOPIC_NOT_FOUND"
    assert not topic_exists(door, "py-no-such-topic"), "nothing was created for the unknown topic"


def test_commit_rollback_and_unknown_settled_by_the_checker(start: Start) -> None:
    tx = start("transact", "--topic", "py-tx", "--prefix", "tx", "--plan", "commit,rollback,unknown",
               "--check-answer", "commit", "--expect-checks", "1", "--linger", "20")
    events = tx.ok()
    assert of(events, "started")[0]["settings"]
    sent = {k: v[0] for k, v in by_key(events, "sent").items()}
    assert sorted(sent) == ["tx-0", "tx-1", "tx-2"]
    assert all(e["transaction_id"] for e in sent.values()), "a half send answers a transaction id"
    checks = of(events, "check")
    assert {c["key"] for c in checks} == {"tx-2"}, "only the UNKNOWN transaction is checked back"
    c = checks[0]
    assert (c["topic"], c["body"], c["tag"]) == ("py-tx", "tx:2", "py")
    assert c["message_id"] == sent["tx-2"]["message_id"]
    assert c["props"] == {"origin": "python"}

    reader = start("consume", "--group", "py-tx-g", "--topic", "py-tx", "--expect", "2", "--idle", "0.5")
    received = by_key(reader.ok(), "received")
    assert sorted(received) == ["tx-0", "tx-2"], "committed and checked-back-committed, never the rollback"
    assert [e["body"] for e in received["tx-2"]] == ["tx:2"]


def test_a_killed_producers_half_is_checked_back_through_another_process(start: Start,
                                                                         tmp_path: Path) -> None:
    marker = tmp_path / "locally-committed"
    survivor = start("transact", "--topic", "py-orphan", "--prefix", "warm", "--check-answer",
                     f"marker:{marker}", "--expect-checks", "1", "--linger", "30")
    assert survivor.wait_for("started")[0]["settings"], "the survivor's publishing settings reached the door"
    victim = start("transact", "--topic", "py-orphan", "--prefix", "victim", "--plan", "commit",
                   "--die-after-half", "--marker", str(marker))
    assert victim.finish(30) == -signal.SIGKILL
    assert [e["key"] for e in victim.of("sent")] == ["victim-0"]
    assert marker.read_text().split() == ["victim-0"]

    events = survivor.ok()
    checks = of(events, "check")
    assert [(c["key"], c["answer"]) for c in checks] == [("victim-0", "commit")]
    assert checks[0]["message_id"] == victim.of("sent")[0]["message_id"]

    reader = start("consume", "--group", "py-orphan-g", "--topic", "py-orphan", "--expect", "1",
                   "--idle", "0.5")
    got = by_key(reader.ok(), "received")
    assert [(k, v[0]["body"]) for k, v in got.items()] == [("victim-0", "victim:0")]


def test_simple_consumer_ack_change_invisible_redelivery_and_dlq(start: Start, door: Door) -> None:
    with Producer("py-simple-sdk", door.remoting) as p:
        for i in range(5):
            p.send(Message(topic="py-simple", body=f"s:{i}".encode(), tags="sdk", keys=f"s-{i}"))
    # The door takes invisible times of 10 s and more on receive (the proxy's minimum): s-4 comes back
    # when its 10 s pass; the others are brought forward by ChangeInvisibleDuration, as the push
    # consumers' nack does. An ack with the handle a change returned must keep the message from
    # coming back a second later (s-0, s-1).
    consumer = start("consume", "--group", SIMPLE_GROUP, "--topic", "py-simple", "--invisible", "10",
                     "--expect", "9", "--idle", "1", "--timeout", "40", "--rule", "s-0=cid:1+ack",
                     "--rule", "s-1=cid:1,cid:1+ack", "--rule", "s-2=cid:3,ack", "--rule", "s-3=cid:1",
                     "--rule", "s-4=skip,ack")
    events = consumer.ok()
    got = by_key(events, "received")
    attempts = {k: [e["attempt"] for e in v] for k, v in got.items()}
    max_attempts = SIMPLE_RETRY_MAX_TIMES + 1
    assert attempts == {"s-0": [1], "s-1": [1, 2], "s-2": [1, 2], "s-3": list(range(1, max_attempts + 1)),
                        "s-4": [1, 2]}
    assert all(e["body"] == f"s:{k[2:]}" and e["tag"] == "sdk" for k, v in got.items() for e in v)
    assert {e["message_id"] for e in got["s-1"]} == {got["s-1"][0]["message_id"]}, "a retry keeps its id"
    gaps = {k: got[k][1]["t"] - got[k][0]["t"] for k in ("s-1", "s-2", "s-4")}
    assert 0.9 <= gaps["s-1"] < 4, f"changed to 1 s invisible, back after {gaps['s-1']:.2f} s"
    assert 2.9 <= gaps["s-2"] < 6, f"changed to 3 s invisible, back after {gaps['s-2']:.2f} s"
    assert 9.9 <= gaps["s-4"] < 14, f"received 10 s invisible, back after {gaps['s-4']:.2f} s"
    changed = sorted(e["key"] for e in of(events, "changed"))
    assert changed == ["s-0", "s-1", "s-1", "s-2", *["s-3"] * max_attempts]
    assert sorted(e["key"] for e in of(events, "acked")) == ["s-0", "s-1", "s-2", "s-4"]

    # the DLQ as the txmq SDK reads it (pop refuses %DLQ% topics, as RocketMQ's read permission does)
    dead = wait_for_dlq(door, SIMPLE_GROUP)
    assert [(m.keys, m.body, m.tags) for m in dead] == [("s-3", b"s:3", "sdk")]
    assert dead[0].msg_id == got["s-3"][0]["message_id"], "the DLQ keeps the message id"


def test_a_fifo_group_gets_a_message_group_in_order_and_waits_for_its_retry(start: Start) -> None:
    start("produce", "--topic", "py-fifo", "--mode", "fifo", "--prefix", "f", "--count", "8",
          "--groups", "2").ok()
    consumer = start("consume", "--group", FIFO_GROUP, "--topic", "py-fifo", "--batch", "1",
                     "--invisible", "10", "--expect", "9", "--idle", "0.5", "--rule", "f-0=cid:1,ack")
    got = of(consumer.ok(), "received")
    runs: dict[str, list[tuple[str, int]]] = {}
    for e in got:
        runs.setdefault(e["group"], []).append((e["key"], e["attempt"]))
    assert runs == {"f-g0": [("f-0", 1), ("f-0", 2), ("f-2", 1), ("f-4", 1), ("f-6", 1)],
                    "f-g1": [("f-1", 1), ("f-3", 1), ("f-5", 1), ("f-7", 1)]}, \
        "in send order; nothing after an unacked message until it is redelivered and acked"


def wait_for_dlq(door: Door, group: str) -> list[MessageExt]:
    got: list[MessageExt] = []

    def dead() -> bool:
        got[:] = read_topic(door, f"%DLQ%{group}") if topic_exists(door, f"%DLQ%{group}") else []
        return bool(got)

    wait_until(dead, 10)
    return got


def topic_exists(door: Door, topic: str) -> bool:
    with PullConsumer(door.remoting, "py-conf-reader") as pc:
        try:
            return bool(pc.queue_ids(topic))
        except Exception:
            return False


class UnknownThenSilent:
    """A txmq SDK transaction listener that leaves its half UNKNOWN and never settles it on check."""

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def test_official_client_and_txmq_sdk_consume_each_others_messages(start: Start, door: Door) -> None:
    topic = "py-mixed"
    checker = start("transact", "--topic", topic, "--prefix", "pytx", "--plan", "commit",
                    "--check-answer", "commit", "--expect-check-keys", "sdktx-0", "--linger", "30")
    assert checker.wait_for("started")[0]["settings"]
    with Producer("py-mixed-sdk", door.remoting) as p:
        for i in range(5):
            p.send(Message(topic=topic, body=f"sdk:{i}".encode(), tags="sdk", keys=f"sdk-{i}",
                           properties={"origin": "sdk"}))
    # producer group == topic: the gRPC door's producer group for the official client's producers
    with TransactionProducer(topic, door.remoting, UnknownThenSilent()) as tp:
        half = tp.send_message_in_transaction(Message(topic=topic, body=b"sdktx:0", tags="sdk",
                                                      keys="sdktx-0", properties={"origin": "sdk"}))
    assert (half.local_transaction_state, half.outcome) == (LocalTransactionState.UNKNOWN, "PENDING")
    start("produce", "--topic", topic, "--prefix", "py", "--count", "5").ok()

    events = checker.ok()
    checks = [c for c in of(events, "check") if c["key"] == "sdktx-0"]
    assert [(c["key"], c["body"], c["topic"]) for c in checks] == [("sdktx-0", "sdktx:0", topic)], \
        "the SDK's half is checked back on the official client's TransactionChecker"
    assert checks[0]["tag"] == "sdk" and checks[0]["props"].get("origin") == "sdk"
    expected = {f"{p}-{i}": f"{p}:{i}" for p in ("sdk", "py") for i in range(5)}
    expected |= {"sdktx-0": "sdktx:0", "pytx-0": "pytx:0"}

    reader = start("consume", "--group", "py-mixed-official", "--topic", topic,
                   "--expect", str(len(expected)), "--idle", "0.5")
    received = by_key(reader.ok(), "received")
    assert {k: [e["body"] for e in v] for k, v in received.items()} == {k: [v] for k, v in expected.items()}
    tags = {k: v[0]["tag"] for k, v in received.items()}
    assert tags == {k: "sdk" if k.startswith("sdk") else "py" for k in expected}
    assert received["sdk-0"][0]["props"].get("origin") == "sdk"

    seen: list[tuple[str, bytes, str]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend((m.keys, m.body, m.properties.get("origin", "")) for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    sdk = PushConsumer("py-mixed-txmq", door.remoting, listener,
                       consume_from_where="CONSUME_FROM_FIRST_OFFSET", suspend_ms=500)
    sdk.subscribe(topic)
    sdk.start()
    try:
        wait_until(lambda: len(seen) >= len(expected), 20)
        time.sleep(0.5)
    finally:
        sdk.shutdown()
    assert sorted((k, b) for k, b, _ in seen) == sorted((k, v.encode()) for k, v in expected.items())
    assert {o for k, _, o in seen if k.startswith("py")} == {"python"}
