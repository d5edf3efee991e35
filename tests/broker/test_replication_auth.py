"""The HA handshake with real broker processes over TCP: with ACL off any TCP peer that reports a
huge offset makes a SYNC_MASTER answer SUCCESS (RocketMQ issue #3015, the hole the handshake
closes); with ACL on such a peer, a peer without the handshake and one with a wrong signature are
refused and never counted, while a slave signing with a granted account replicates and is listed
by GET_BROKER_HA_STATUS under its name and id."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from txmq.broker.acl import Accounts, Action, PolicyEntry, Resource, User, UserType, save_accounts
from txmq.client import Admin, Message, Producer
from txmq.protocol import HA_CHALLENGE, HA_TRANSFER_HEADER, decode_challenge, encode_hello, encode_report
from txmq.testing import BrokerProcess, free_port, wait_until

pytestmark = pytest.mark.slow

ROOT = {"access_key": "root", "secret_key": "root-sk"}
HUGE = 2**60


def _accounts() -> Accounts:
    repl = (PolicyEntry(Resource.parse("Cluster:DefaultCluster"), (Action.ALL,)),)
    reader = (PolicyEntry(Resource.parse("Cluster:DefaultCluster"), (Action.GET, Action.LIST)),)
    return Accounts({"root": User("root", "root-sk", UserType.SUPER),
                     "repl": User("repl", "repl-sk", UserType.NORMAL, repl),
                     "reader": User("reader", "reader-sk", UserType.NORMAL, reader)})


def _master(tmp_path: Path, **cfg: Any) -> tuple[BrokerProcess, int]:
    ha = free_port()
    return BrokerProcess(tmp_path / "master", {"broker_role": "SYNC_MASTER", "ha_listen_port": ha,
                                               "sync_flush_timeout_ms": 1000,
                                               "topics": {"t": 1}, **cfg}), ha


def _status(master: BrokerProcess, **cred: str) -> str:
    with Producer("pg", master.endpoints, **cred) as p:
        return p.send(Message(topic="t", body=b"x")).status.name


def _rogue(ha: int, payload: bytes, *, challenged: bool) -> socket.socket:
    """A TCP peer on the HA port that sends ``payload`` (after reading the challenge if any)."""
    s = socket.create_connection(("127.0.0.1", ha), timeout=5)
    if challenged:
        _challenge(s)
    s.sendall(payload)
    return s


def _challenge(s: socket.socket) -> bytes:
    got = b""
    while len(got) < HA_CHALLENGE.size and (part := s.recv(HA_CHALLENGE.size - len(got))):
        got += part
    return decode_challenge(got)


def _hello(ha: int, access_key: str, secret_key: str, *, nonce: bytes | None = None) -> socket.socket:
    """A peer answering the challenge with a hello signed by ``access_key`` / ``secret_key`` (over
    ``nonce`` instead of the master's when given: a replayed hello), then a first report of 0
    (which a master that admitted it would serve, keeping the connection open)."""
    s = socket.create_connection(("127.0.0.1", ha), timeout=5)
    real = _challenge(s)
    s.sendall(encode_hello("broker-a", 1, access_key, secret_key, nonce or real)
              + encode_report(0))
    return s


def _closed_by_master(s: socket.socket) -> bool:
    """The master closed the connection (EOF or reset) within 5 s."""
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        s.close()


def test_without_acl_a_rogue_peer_makes_a_sync_master_acknowledge(tmp_path: Path) -> None:
    master, ha = _master(tmp_path)
    try:
        master.start()
        assert _status(master) == "SLAVE_NOT_AVAILABLE"  # no slave: not acknowledged
        rogue = _rogue(ha, encode_report(0), challenged=False)  # a believable first report
        time.sleep(0.5)
        rogue.sendall(encode_report(HUGE))  # then "I have everything"
        wait_until(lambda: _status(master) == "SEND_OK", 10)  # the hole (RocketMQ #3015)
        rogue.close()
    finally:
        master.stop()


def test_with_acl_a_rogue_peer_is_refused_and_a_granted_slave_replicates(tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    save_accounts(acl, _accounts())
    master, ha = _master(tmp_path, acl_enable=True, acl_file=str(acl))
    slave = BrokerProcess(tmp_path / "slave", {
        "broker_role": "SLAVE", "broker_id": 1, "ha_master_address": f"127.0.0.1:{ha}",
        "topics": {"t": 1}, "ha_access_key": "repl", "ha_secret_key": "repl-sk"})
    try:
        master.start()
        rogues = [_rogue(ha, encode_report(0), challenged=True),  # no hello
                  _rogue(ha, encode_report(0), challenged=False),
                  _hello(ha, "repl", "wrong-sk"),  # bad signature
                  _hello(ha, "reader", "reader-sk"),  # good signature, no All on the cluster
                  _hello(ha, "nobody", "x"),  # unknown account
                  _hello(ha, "repl", "repl-sk", nonce=b"\0" * 16)]  # replayed: another nonce
        assert [_closed_by_master(r) for r in rogues] == [True] * len(rogues)
        assert _status(master, **ROOT) == "SLAVE_NOT_AVAILABLE"  # stored, not replicated
        with Admin(master.endpoints, **ROOT) as a:
            assert a.ha_status().ha_connection_info == []  # no refused peer is listed
        good = _hello(ha, "repl", "repl-sk")  # the same peer with the right key is served
        assert len(good.recv(HA_TRANSFER_HEADER.size)) > 0
        with Admin(master.endpoints, **ROOT) as a:
            [listed] = a.ha_status().ha_connection_info
        assert (listed.broker_name, listed.broker_id) == ("broker-a", 1)
        good.close()
        slave.start()
        wait_until(lambda: _status(master, **ROOT) == "SEND_OK", 30)
        with Admin(master.endpoints, **ROOT) as a:
            info = a.ha_status()
        [conn] = info.ha_connection_info
        assert (conn.broker_name, conn.broker_id) == ("broker-a", 1)
        assert info.in_sync_slave_nums == 1 and info.broker_role == "SYNC_MASTER"
    finally:
        slave.stop()
        master.stop()


def _group(b: BrokerProcess) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "txmq", "broker", "status", "--broker", b.endpoints,
                           "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["group"]
    return rows


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: [(x.labels, x.value) for x in f.samples]
            for f in text_string_to_metric_families(text) if f.name.startswith("txmq_ha_")}


def test_broker_status_shows_the_group_with_offsets_and_lag(tmp_path: Path) -> None:
    metrics = free_port()
    master, ha = _master(tmp_path, broker_role="ASYNC_MASTER", metrics_port=metrics)
    slave = BrokerProcess(tmp_path / "slave", {
        "broker_role": "SLAVE", "broker_id": 1, "ha_master_address": f"127.0.0.1:{ha}",
        "topics": {"t": 1}})
    try:
        master.start()
        slave.start()
        _status(master)
        wait_until(lambda: [r["lag_bytes"] for r in _group(master)] == [0, 0], 30)
        me, other = _group(master)
        assert (me["role"], other["role"], other["in_sync"]) == ("ASYNC_MASTER", "SLAVE", True)
        assert me["offset"] == other["offset"] > 0
        s_me, s_master = _group(slave)
        assert (s_me["role"], s_me["offset"]) == ("SLAVE", me["offset"])
        assert (s_master["address"], s_master["in_sync"]) == (f"127.0.0.1:{ha}", True)
        assert _scrape(metrics)["txmq_ha_in_sync_slaves"] == [({}, 1.0)]
        assert slave.proc is not None
        slave.proc.send_signal(signal.SIGSTOP)  # a stalled slave: acks stop, the lag grows
        try:
            for _ in range(3):
                _status(master)
            time.sleep(1.5)
            _, stalled = _group(master)
            assert stalled["lag_bytes"] > 0 and stalled["lag_s"] >= 1.0
            [(labels, behind)] = _scrape(metrics)["txmq_ha_slave_fall_behind_bytes"]
            assert labels == {"slave": stalled["address"], "broker_id": "-1"} and behind > 0
            [(_, lag_s)] = _scrape(metrics)["txmq_ha_slave_lag_seconds"]
            assert lag_s >= 1.0
        finally:
            slave.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: [r["lag_s"] for r in _group(master)] == [0, 0], 30)
    finally:
        slave.stop()
        master.stop()
