"""The gRPC door of a SYNC_MASTER waits for its slave like the remoting door (issue #25), with real
master and slave processes: SendMessage and EndTransaction answer OK only once the slave has the
record, HA_NOT_AVAILABLE when no slave is in sync and SLAVE_PERSISTENCE_TIMEOUT when the slave
stalls (the proxy's codes for SLAVE_NOT_AVAILABLE and FLUSH_SLAVE_TIMEOUT)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Client, pull_bodies
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.testing import BrokerProcess, free_port, wait_until

TOPICS = {"t": 1, "tx": 1}


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess, Client]]:
    """A SYNC_MASTER with a gRPC door (started), its slave (not started), a gRPC client."""
    ha = free_port()
    master = BrokerProcess(
        tmp_path / "master",
        {
            "broker_role": "SYNC_MASTER",
            "ha_listen_port": ha,
            "grpc_port": free_port(),
            "topics": TOPICS,
            "sync_flush_timeout_ms": 500,
        },
    )
    slave = BrokerProcess(
        tmp_path / "slave",
        {"broker_role": "SLAVE", "broker_id": 1, "ha_master_address": f"127.0.0.1:{ha}", "topics": TOPICS},
    )
    master.start()
    client = Client(f"127.0.0.1:{master.config['grpc_port']}")
    try:
        yield master, slave, client
    finally:
        client.close()
        slave.stop()
        master.stop()


def test_grpc_send_and_end_wait_for_the_slave(group: tuple[BrokerProcess, BrokerProcess, Client]) -> None:
    master, slave, client = group
    r = client.send("t", b"alone")  # no slave yet: stored on the master, not replicated
    assert r.status.code == pd.HA_NOT_AVAILABLE and r.entries[0].status.code == pd.HA_NOT_AVAILABLE
    assert "SLAVE_NOT_AVAILABLE" in r.status.message and r.entries[0].message_id
    assert pull_bodies(master, "t", 1) == [b"alone"]

    slave.start()
    wait_until(lambda: client.send("t", b"probe").status.code == pd.OK, 30)
    r = client.send("t", b"synced")
    assert r.status.code == pd.OK
    assert b"synced" in pull_bodies(slave, "t", 1)  # on the slave when the answer came

    half = client.send("tx", b"half", message_id="TX-1", mtype=pd.TRANSACTION).entries[0]
    assert half.status.code == pd.OK and b"half" not in pull_bodies(slave, "tx", 1)
    ended = client.end("tx", "TX-1", half.transaction_id, pd.COMMIT)
    assert ended.status.code == pd.OK
    assert pull_bodies(slave, "tx", 1) == [b"half"]  # the commit record reached the slave first


def test_grpc_answers_slave_persistence_timeout_when_the_slave_stalls(
    group: tuple[BrokerProcess, BrokerProcess, Client],
) -> None:
    master, slave, client = group
    slave.start()
    wait_until(lambda: client.send("t", b"probe").status.code == pd.OK, 30)
    half = client.send("tx", b"half", message_id="TX-2", mtype=pd.TRANSACTION).entries[0]
    assert half.status.code == pd.OK
    assert slave.proc is not None
    os.kill(slave.proc.pid, signal.SIGSTOP)
    try:
        sent = client.send("t", b"stalled")
        ended = client.end("tx", "TX-2", half.transaction_id, pd.COMMIT)
    finally:
        os.kill(slave.proc.pid, signal.SIGCONT)
    assert sent.status.code == pd.SLAVE_PERSISTENCE_TIMEOUT
    assert sent.entries[0].status.code == pd.SLAVE_PERSISTENCE_TIMEOUT
    assert ended.status.code == pd.SLAVE_PERSISTENCE_TIMEOUT
    assert "FLUSH_SLAVE_TIMEOUT" in ended.status.message
    # stored on the master all the same (RocketMQ: sendOK), and on the slave once it runs again
    assert b"stalled" in pull_bodies(master, "t", 1)
    wait_until(
        lambda: b"stalled" in pull_bodies(slave, "t", 1) and pull_bodies(slave, "tx", 1) == [b"half"], 20
    )
