"""The RocketMQ C++ client core (``rocketmq-client-python`` 2.0.0 over "CPP CORE 2.1.0") against a txmq
*cluster*: one ``txmq namesrv`` and three broker groups (``broker-a``, ``broker-b``, ``broker-c``, each a
master process) from ``txmq.testing.run_cluster``, every broker holding topic ``t`` with
:data:`QUEUES_PER_BROKER` queues. The client is given only the name server's address; it routes, sends,
consumes and answers check-backs across the brokers by itself.

What each broker stored is read back from that broker alone (``StoreReader``: GET_MAX_OFFSET and
PULL_MESSAGE over a plain socket), so "landed on every broker" and "stored exactly once across the
cluster" are checked against the stores, not against what the client says.

The C++ client's Python binding exposes no broker name or store host on a send result or on a received
message (``SendResult`` is status, msg id, offset; ``ReceivedMessage`` has queue id and offset only), so
which broker a message or a check-back came from is found by its key in the brokers' stores.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rocketmq_cpp_helpers import (
    DELAY_LEVELS,
    FAST_TX,
    PROCESS_TIMEOUT_S,
    CppClient,
    CppFactory,
    Event,
    keys,
    settle,
    stored,
)

from txmq.protocol import HALF_TOPIC
from txmq.testing import ClusterProcess, run_cluster, wait_until

pytestmark = pytest.mark.slow

TOPIC = "t"
QUEUES_PER_BROKER = 8
BROKERS = ("broker-a", "broker-b", "broker-c")
SEND_OK = 0  # rocketmq.client.SendStatus.OK
SPREAD_SENDS = 60  # 2.5 per queue of the cluster: every broker gets some
SHARED_SENDS = 96  # 4 per queue: every queue gets some
TX_ROUNDS = 12  # of commit, rollback, unknown: 36 halves over the 24 queues, UNKNOWNs on every broker
CHECK_WAIT_S = 60.0  # for the check-backs of every UNKNOWN half
IDLE_S = "3"  # seconds a reader waits, after the last expected message, for one too many
DELIVERY_TIMEOUT_S = 60.0
DUPLICATE_SETTLE_S = 1.0  # after the last expected delivery, for a duplicate to show up
CONSUME_TIMEOUT_S = 120.0  # a consumer process's whole life
REBALANCE_SETTLE_S = 3.0  # for both members of a group to heartbeat every broker and rebalance
KILL_SENDS = 600  # sync sends of the kill scenario (12 s at least)
KILL_SEND_INTERVAL_S = 0.02  # between them
# A broker is SIGKILLed once this many were answered: after the client's first route refresh (3 s after
# its start), so the dead broker stays in its route until the next one.
KILL_AFTER_SENDS = 250
KILL_IN_FLIGHT_S = 0.5  # a send answered this soon after the kill may have been stored before it


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterProcess]:
    with run_cluster(brokers=len(BROKERS), data_dir=tmp_path / "cluster", topics={TOPIC: QUEUES_PER_BROKER},
                     message_delay_level=DELAY_LEVELS, **FAST_TX) as c:
        assert sorted(c.brokers) == list(BROKERS)
        yield c


@pytest.fixture
def ccpp(cpp_python: Path, cluster: ClusterProcess, tmp_path: Path) -> Iterator[CppFactory]:
    """``ccpp("produce", ...)`` starts a scenario process with ``namesrvAddr`` = the cluster's name
    server; every process still running at the end of the test is killed."""
    started: list[CppClient] = []
    n = itertools.count()

    def start(command: str, *args: str) -> CppClient:
        c = CppClient(cpp_python, cluster.namesrv_addr, command, *args,
                      log_path=tmp_path / f"cpp-{next(n)}-{command}.log")
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def stores(cluster: ClusterProcess, topic: str = TOPIC) -> dict[str, Counter[tuple[str, str]]]:
    """Broker name → how many times each (key, msg id) is stored in ``topic`` on that broker."""
    return {name: Counter((m.keys, m.msg_id) for m in stored(b.endpoints, topic, QUEUES_PER_BROKER))
            for name, b in cluster.brokers.items()}


def where(per_broker: dict[str, Counter[tuple[str, str]]]) -> dict[str, str]:
    """Key → the broker storing it (keys stored once across the cluster)."""
    return {k: name for name, c in per_broker.items() for k, _ in c}


def sent_ok(events: list[Event]) -> dict[str, Event]:
    return {e["key"]: e for e in events if e["event"] == "sent" and e["status"] == SEND_OK}


def test_sends_spread_over_every_broker_each_stored_once(ccpp: CppFactory, cluster: ClusterProcess) -> None:
    count = SPREAD_SENDS
    events = ccpp("produce", "--topic", TOPIC, "--group", "cl-producers", "--prefix", "a",
                  "--count", str(count)).ok()
    ok = sent_ok(events)
    assert sorted(ok) == sorted(f"a-{i}" for i in range(count)), "every sync send answered SEND_OK"
    assert len({e["msg_id"] for e in ok.values()}) == count
    per_broker = stores(cluster)
    for name in BROKERS:
        assert sum(per_broker[name].values()) > 0, f"nothing stored on {name}: {per_broker}"
    total = sum(per_broker.values(), Counter())
    assert total == Counter((k, e["msg_id"]) for k, e in ok.items()), \
        "every message sent OK stored exactly once across the cluster, under the msg id the send returned"
    reader = ccpp("consume", "--topic", TOPIC, "--group", "cl-readers", "--expect", str(count),
                  "--idle", IDLE_S)
    got = [e for e in reader.ok() if e["event"] == "received"]
    assert sorted((e["key"], e["msg_id"], e["body"]) for e in got) == sorted(
        (k, e["msg_id"], k.replace("-", ":")) for k, e in ok.items()), \
        "one push consumer reads every message of the topic, from every broker, once"


def test_two_push_consumers_share_the_queues_of_every_broker(ccpp: CppFactory, cluster: ClusterProcess,
                                                             tmp_path: Path) -> None:
    """Clustering is at-least-once: a member shutting down unregisters before it persists its last
    offsets (the C++ core's order), so the other may take over a queue and get a message again. Exactly
    once is asserted for the steady state (deliveries before the members are told to stop); over the
    whole run, the set of deliveries equals the set sent."""
    stop = tmp_path / "stop"
    members = [ccpp("consume", "--topic", TOPIC, "--group", "cl-shared", "--stop-file", str(stop),
                    "--timeout", str(CONSUME_TIMEOUT_S)) for _ in range(2)]
    for m in members:
        m.wait_for("started")
    settle(REBALANCE_SETTLE_S)  # both members heartbeat every broker and rebalance the 24 queues
    ok = sent_ok(ccpp("produce", "--topic", TOPIC, "--group", "cl-producers", "--prefix", "b",
                      "--count", str(SHARED_SENDS)).ok())
    assert len(ok) == SHARED_SENDS
    wait_until(lambda: set(keys(members[0].events)) | set(keys(members[1].events)) >= set(ok),
               DELIVERY_TIMEOUT_S)
    settle(DUPLICATE_SETTLE_S)  # a duplicate delivery would show up now
    stop_t = time.time()
    stop.touch()
    got = [[e for e in m.ok() if e["event"] == "received"] for m in members]
    expected = {(k, e["msg_id"], k.replace("-", ":")) for k, e in ok.items()}
    assert {(e["key"], e["msg_id"], e["body"]) for g in got for e in g} == expected
    steady = [[e for e in g if e["t"] < stop_t] for g in got]
    dup = {k for k, n in Counter(e["key"] for g in steady for e in g).items() if n > 1}
    assert not dup, f"delivered twice: {[(i, e) for i, g in enumerate(got) for e in g if e['key'] in dup]}"
    assert sorted(e["key"] for g in steady for e in g) == sorted(ok), "every message once before the stop"
    located = where(stores(cluster))
    queues = [{(located[e["key"]], e["queue_id"]) for e in g} for g in steady]
    assert queues[0] and queues[1], "clustering: both members of the group consume a share"
    assert not queues[0] & queues[1], "a queue is consumed by one member of the group"
    assert {b for b, _ in queues[0] | queues[1]} == set(BROKERS)
    assert len(queues[0] | queues[1]) == len(BROKERS) * QUEUES_PER_BROKER, "every queue of every broker"


def test_transactions_checked_back_by_every_broker(ccpp: CppFactory, cluster: ClusterProcess,
                                                   tmp_path: Path) -> None:
    plans = ["commit", "rollback", "unknown"] * TX_ROUNDS
    unknown = [f"tx-{i}" for i, p in enumerate(plans) if p == "unknown"]
    marker = tmp_path / "commit-on-check"  # the checker commits these, rolls the others back
    marker.write_text("\n".join(unknown[::2]) + "\n")
    tx = ccpp("transact", "--topic", TOPIC, "--group", "cl-tx", "--prefix", "tx", "--plan", ",".join(plans),
              "--check-answer", f"marker:{marker}", "--expect-checks", str(len(unknown)),
              "--linger", str(CHECK_WAIT_S))
    events = tx.ok()
    sent = {e["key"]: e for e in events if e["event"] == "sent"}
    assert len(sent) == len(plans) and {e["status"] for e in sent.values()} == {SEND_OK}
    checks = [e for e in events if e["event"] == "check"]
    assert {c["key"] for c in checks} == set(unknown), "every UNKNOWN half, and only those, checked back"
    assert all(c["msg_id"] == sent[c["key"]]["msg_id"] and c["topic"] == TOPIC for c in checks)
    assert {(c["key"], c["answer"]) for c in checks} == {
        (k, "commit" if k in unknown[::2] else "rollback") for k in unknown}

    halves = {name: {m.keys for m in stored(b.endpoints, HALF_TOPIC, 1)}
              for name, b in cluster.brokers.items()}
    assert sorted(k for h in halves.values() for k in h) == sorted(sent), f"each half on one broker: {halves}"
    for name in BROKERS:
        assert set(unknown) & halves[name], f"no UNKNOWN half on {name} (so no check-back from it): {halves}"
    committed = {k for k, p in zip(sent, plans, strict=True) if p == "commit"} | set(unknown[::2])
    per_broker = stores(cluster)
    assert sum(per_broker.values(), Counter()) == Counter((k, sent[k]["msg_id"]) for k in committed), \
        "committed (locally or on check-back) stored once in the topic; rolled back never"
    for name in BROKERS:
        assert {k for k, _ in per_broker[name]} == committed & halves[name], "committed where its half was"

    reader = ccpp("consume", "--topic", TOPIC, "--group", "cl-tx-readers", "--expect", str(len(committed)),
                  "--idle", IDLE_S)
    assert sorted(keys(reader.ok())) == sorted(committed), "the committed ones are consumed, never a rollback"


def failed_attempts(log_dir: Path, broker: str) -> int:
    """How many send attempts to ``broker`` the C++ core logged as failed (each then retried on
    another broker, or failing the send once its retries are spent)."""
    return sum(f.read_text(errors="replace").count(f"send failed of times:1,brokerName:{broker}")
               for f in log_dir.glob("*rocketmq-cpp.log*"))


def test_sends_go_on_while_a_broker_is_killed(ccpp: CppFactory, cluster: ClusterProcess, tmp_path: Path,
                                              record_property: Callable[[str, object], None]) -> None:
    victim = "broker-b"
    log_dir = tmp_path / "producer-log"
    log_dir.mkdir()
    producer = ccpp("produce", "--topic", TOPIC, "--group", "cl-producers", "--prefix", "d", "--keep-going",
                    "--count", str(KILL_SENDS), "--interval", str(KILL_SEND_INTERVAL_S),
                    "--log-dir", str(log_dir))
    producer.wait_for("sent", KILL_AFTER_SENDS)
    cluster.kill(victim)
    killed_t = time.time()
    events = producer.ok(PROCESS_TIMEOUT_S)
    attempts = [e for e in events if e["event"] in ("sent", "failed")]
    assert len(attempts) == KILL_SENDS
    ok = sent_ok(events)
    failed = [e for e in events if e["event"] == "failed"]
    stall = max(b["t"] - a["t"] for a, b in itertools.pairwise(attempts))
    errors = sorted({e["error"][:160] for e in failed})
    retried = failed_attempts(log_dir, victim)
    for name, value in (("failed_sends", len(failed)), ("failed_attempts_on_the_dead_broker", retried),
                        ("longest_gap_between_sends_s", round(stall, 2)), ("failed_errors", errors)):
        record_property(name, value)
    print(f"\n{len(failed)} of {KILL_SENDS} sends failed after {victim} was SIGKILLed; {retried} attempts"
          f" on it failed; longest gap between two sends {stall:.2f}s; errors: {errors}")
    assert retried >= 1, "the client never tried the dead broker: the kill was not exercised"

    cluster.restart(victim)
    per_broker = stores(cluster)
    total = sum(per_broker.values(), Counter())
    missing = [k for k, e in ok.items() if total[(k, e["msg_id"])] == 0]
    assert not missing, f"acknowledged SEND_OK but stored nowhere: {missing}"
    twice = {k for (k, _), n in total.items() if n > 1}
    # A send stored by the victim just before the kill, its answer lost, is retried elsewhere: at most
    # one (sends are sync, one at a time), and one copy is on the victim.
    assert len(twice) <= 1 and all(per_broker[victim][(k, ok[k]["msg_id"])] for k in twice), twice
    after = {e["key"] for e in attempts if e["t"] > killed_t + KILL_IN_FLIGHT_S} & set(ok)
    assert len(after) > KILL_SENDS // 2, f"sends did not go on after the kill: {len(after)} OK"
    # A send in flight on the victim at the kill, stored there but unanswered, is retried elsewhere
    # after the client's send timeout (3 s), so it is answered late: it is in ``twice`` (one copy
    # on the victim, checked above), not a new send to a dead broker.
    landed = {name for name, c in per_broker.items() for k, _ in c if k in after - twice}
    assert landed == set(BROKERS) - {victim}, "after the kill, sends land on the live brokers only"
