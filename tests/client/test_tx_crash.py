"""Transactions under crashes, with real processes: producers SIGKILLed mid-transaction, the broker
SIGKILLed and restarted. Every transaction ends as its local database says; none is lost, none is
visible twice, none is visible without a local commit."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from txmq.client import LocalTransactionState, Message, MessageExt, PullConsumer, TransactionProducer
from txmq.testing import BrokerProcess

_PRODUCER = textwrap.dedent("""
    import random, sqlite3, sys, time
    from txmq.client import TransactionProducer, Message, LocalTransactionState
    from txmq.errors import BrokerUnavailable, RequestTimeout, RemoteError
    endpoints, db, name = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = random.Random(name)
    def conn():
        c = sqlite3.connect(db, timeout=30, isolation_level="IMMEDIATE")
        c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=FULL")
        return c
    class L:
        def __init__(self): self.c = conn()
        def execute_local_transaction(self, msg, arg):
            if arg < 0.2:
                return LocalTransactionState.ROLLBACK_MESSAGE
            with self.c:
                self.c.execute("INSERT INTO tx_log VALUES (?, ?)", (msg.msg_id, msg.keys))
            return LocalTransactionState.UNKNOWN if arg < 0.3 else LocalTransactionState.COMMIT_MESSAGE
        def check_local_transaction(self, msg):
            c = conn()
            try:
                if c.execute("SELECT 1 FROM tx_log WHERE msg_id=?", (msg.msg_id,)).fetchone():
                    return LocalTransactionState.COMMIT_MESSAGE
            finally:
                c.close()
            if time.time() * 1000 - msg.born_timestamp_ms < 2000:
                return LocalTransactionState.UNKNOWN
            return LocalTransactionState.ROLLBACK_MESSAGE
    tp = TransactionProducer("pg", endpoints, L(), timeout_ms=2000)
    while True:
        try:
            tp.start(); break
        except BrokerUnavailable:
            time.sleep(0.1)
    i = 0
    while True:
        i += 1
        try:
            tp.send_message_in_transaction(Message(topic="t", body=b"x", keys=f"{name}-{i}"), rng.random())
        except (BrokerUnavailable, RequestTimeout, RemoteError):
            time.sleep(0.1)
""")


class _Checker:
    """The surviving member of the group after the chaos: answers from the local database."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def execute_local_transaction(self, msg: object, arg: object) -> LocalTransactionState:
        raise AssertionError("not used")

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        c = sqlite3.connect(self.db, timeout=30)
        try:
            found = c.execute("SELECT 1 FROM tx_log WHERE msg_id=?", (msg.msg_id,)).fetchone()
        finally:
            c.close()
        if found:
            return LocalTransactionState.COMMIT_MESSAGE
        if time.time() * 1000 - msg.born_timestamp_ms < 2000:
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.ROLLBACK_MESSAGE


def _read_all(pc: PullConsumer, queue_id: int) -> list[MessageExt]:
    """Every message of queue ``queue_id`` of topic ``t``, pulling until its end."""
    out: list[MessageExt] = []
    end = pc.max_offset("t", queue_id)
    while len(out) < end:
        got = pc.pull("t", queue_id, len(out), 1024).messages
        assert got, f"no message at offset {len(out)} below max offset {end}"
        out += got
    return out


def _spawn(endpoints: str, db: Path, name: str, logs: Path) -> subprocess.Popen[bytes]:
    with open(logs / f"{name}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-c", _PRODUCER, endpoints, str(db), name],
                                stdout=log, stderr=subprocess.STDOUT)


def test_every_transaction_ends_as_its_local_database_says(tmp_path: Path) -> None:
    db = tmp_path / "local.db"
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("CREATE TABLE tx_log (msg_id TEXT PRIMARY KEY, key TEXT NOT NULL)")
    broker = BrokerProcess(tmp_path / "broker", {"topics": {"t": 2}, "transaction_timeout_ms": 500,
                                                  "transaction_check_interval_ms": 500})
    broker.start()
    rng = random.Random(7)
    procs = [_spawn(broker.endpoints, db, f"p{i}", tmp_path) for i in range(3)]
    kills, broker_kills = 0, 0
    try:
        for step in range(14):
            time.sleep(rng.uniform(0.3, 0.8))
            if step in (5, 10):  # the broker crashes twice while producers are mid-transaction
                broker.kill()
                broker_kills += 1
                time.sleep(0.2)
                broker.start()
                continue
            i = rng.randrange(len(procs))
            procs[i].kill()
            procs[i].wait()
            kills += 1
            procs[i] = _spawn(broker.endpoints, db, f"p{i}-{kills}", tmp_path)
        for p in procs:
            p.kill()
            p.wait()
        with TransactionProducer("pg", broker.endpoints, _Checker(db)), \
                PullConsumer(broker.endpoints) as pc:
            end = time.monotonic() + 60
            while pc.transaction_stats()["PENDING"] and time.monotonic() < end:
                time.sleep(0.2)
            stats = pc.transaction_stats()
            visible = [m for q in pc.queue_ids("t") for m in _read_all(pc, q)]
    finally:
        for p in procs:
            p.kill()
        broker.stop()
    with sqlite3.connect(db) as c:
        committed = {r[0] for r in c.execute("SELECT msg_id FROM tx_log")}
    ids = [m.msg_id for m in visible]
    assert stats["PENDING"] == 0 and stats["DISCARD"] == 0
    assert (kills, broker_kills) == (12, 2)
    assert len(ids) == len(set(ids)), "a transaction was delivered twice"
    assert set(ids) <= committed, "a message is visible without a local commit"
    assert committed <= set(ids), f"{len(committed - set(ids))} locally committed transactions lost"
    assert stats["ROLLBACK"] > 0, f"no transaction was rolled back: {stats}"
    assert len(committed) > 50, f"only {len(committed)} transactions committed: {stats}"


class _UnknownThenCommit:
    """Leaves every transaction UNKNOWN; a check-back commits it."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, msg: object, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.checked.append(msg.keys)
        return LocalTransactionState.COMMIT_MESSAGE


def test_a_producer_used_without_start_is_checked_back_after_its_broker_restarts(
        tmp_path: Path) -> None:
    """The chaos bug of seed 23: a producer that was never started had no heartbeat loop, so a broker
    restarted after its half was stored never heard of the group again and the half stayed pending.
    The first request now starts the heartbeats; the restarted broker checks the half back."""
    broker = BrokerProcess(tmp_path / "broker", {"topics": {"t": 1}, "transaction_timeout_ms": 500,
                                                  "transaction_check_interval_ms": 500})
    broker.start()
    listener = _UnknownThenCommit()
    tp = TransactionProducer("lazy-pg", broker.endpoints, listener, timeout_ms=2000)  # no start()
    try:
        r = tp.send_message_in_transaction(Message(topic="t", body=b"x", keys="k1"), None)
        assert r.outcome == "PENDING"
        broker.kill()  # before the first check-back (transaction_timeout_ms 500)
        broker.start()
        deadline = time.monotonic() + 30
        while "k1" not in listener.checked and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "k1" in listener.checked, "the restarted broker never checked the half back"
        pc = PullConsumer(broker.endpoints)
        try:
            deadline = time.monotonic() + 10
            while pc.max_offset("t", 0) < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert [m.keys for m in _read_all(pc, 0)] == ["k1"]
        finally:
            pc.shutdown()
    finally:
        tp.shutdown()
        broker.stop()
