"""Controller mode wired end to end (issue #26): a real ``txmq controller`` and two real
``txmq broker --enable-controller-mode`` processes of one group. The first becomes master, the
second its slave; a send is acknowledged by both; the master is SIGKILLed; the slave becomes master
(epoch 2) and takes sends; the old master restarts as its slave and catches up byte for byte.
With ACL on at the brokers, the controller's role-change push is admitted only when signed by
an account allowed All on the cluster; a role switch cycle and a controller restart leave no
unclosed connection or dropped asyncio task behind in the brokers."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from txmq.broker.acl import Accounts, Action, PolicyEntry, Resource, User, UserType, save_accounts
from txmq.client import Message, Producer
from txmq.errors import TxmqError
from txmq.store import read_commit_log
from txmq.testing import BrokerProcess, ControllerProcess, free_port, wait_until

ROOT = {"access_key": "root", "secret_key": "root-sk"}
DROPPED_TASK_LINES = ("Task was destroyed but it is pending", "exception was never retrieved")
"""What asyncio logs for a task nobody kept or awaited."""


def _broker(root: Path, name: str, ctl: ControllerProcess, **cfg: Any) -> BrokerProcess:
    return BrokerProcess(root / name, {"enable_controller_mode": True, "controller_addr": ctl.addr,
                                       "topics": {"t": 2}, "sync_flush_timeout_ms": 2000, **cfg})


def _send_until_ok(endpoint: str, body: bytes, timeout_s: float = 15.0, **cred: str) -> float:
    """Seconds until a send to ``endpoint`` is acknowledged."""
    t0 = time.monotonic()
    while True:
        p = Producer("pg", endpoints=endpoint, retry_times_when_send_failed=0, timeout_ms=2000,
                     **cred)
        try:
            p.start()
            p.send(Message(topic="t", body=body))
            return time.monotonic() - t0
        except TxmqError:
            assert time.monotonic() - t0 < timeout_s, f"no acknowledged send at {endpoint}"
            time.sleep(0.1)
        finally:
            p.shutdown()


def test_master_kill_fails_over_to_the_slave(tmp_path: Path) -> None:
    ctl = ControllerProcess(tmp_path / "ctl", "127.0.0.1", 0, f"127.0.0.1:{free_port()}", [])
    ctl.start()
    a, b = _broker(tmp_path, "a", ctl), _broker(tmp_path, "b", ctl)
    try:
        a.start()
        _send_until_ok(a.endpoints, b"first")  # a elected itself (epoch 1)
        b.start()
        time.sleep(3)  # b joins as slave; the SyncStateSet grows (checked every 1 s)
        for i in range(5):
            _send_until_ok(a.endpoints, f"m{i}".encode())
        a.kill()
        took = _send_until_ok(b.endpoints, b"after")
        print(f"first send acknowledged by the new master {took:.1f} s after the kill")
        assert took < 10
        a.start()  # back as b's slave: truncates nothing (it had only what b has), catches up
        deadline = time.monotonic() + 15
        while read_commit_log(tmp_path / "a" / "store") != read_commit_log(tmp_path / "b" / "store"):
            assert time.monotonic() < deadline, "the old master did not catch up as a slave"
            time.sleep(0.2)
        assert b"after" in read_commit_log(tmp_path / "a" / "store")
    finally:
        for p in (a, b, ctl):
            p.kill()


def test_importing_the_controller_leaves_socket_inet_ntop_working() -> None:
    import socket

    import txmq.controller  # noqa: F401  (imports pysyncobj, which patched inet_ntop)

    assert socket.inet_ntop(socket.AF_INET, b"\x7f\0\0\x01") == "127.0.0.1"


def _accounts() -> Accounts:
    cluster_all = (PolicyEntry(Resource.parse("Cluster:DefaultCluster"), (Action.ALL,)),)
    return Accounts({"root": User("root", "root-sk", UserType.SUPER),
                     "repl": User("repl", "repl-sk", UserType.NORMAL, cluster_all),
                     "ctl": User("ctl", "ctl-sk", UserType.NORMAL, cluster_all)})


def _logged_at(log: str, text: str) -> float:
    """Wall time (s since the epoch) of the first log line containing ``text``."""
    line = next(x for x in log.splitlines() if text in x)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_with_acl_on_a_signed_push_tells_the_slave_its_new_role(tmp_path: Path,
                                                                signed: bool) -> None:
    """ACL on at both brokers; the master is killed. A controller with an account allowed All on
    the cluster pushes the election and the slave becomes master from the push, well within
    REPLICA_INFO_POLL_MS; an unsigned push is refused (logged), and the slave learns its role
    from its next heartbeat answer instead."""
    from txmq.broker._replicas import REPLICA_INFO_POLL_MS

    acl = tmp_path / "acl.toml"
    save_accounts(acl, _accounts())
    keys = {"access_key": "ctl", "secret_key": "ctl-sk"} if signed else {}
    ctl = ControllerProcess(tmp_path / "ctl", "127.0.0.1", 0, f"127.0.0.1:{free_port()}", [],
                            **keys)
    ctl.start()
    cfg = {"acl_enable": True, "acl_file": str(acl), "ha_access_key": "repl",
           "ha_secret_key": "repl-sk"}
    a, b = _broker(tmp_path, "a", ctl, **cfg), _broker(tmp_path, "b", ctl, **cfg)
    try:
        a.start()
        _send_until_ok(a.endpoints, b"first", **ROOT)  # a elected itself (epoch 1)
        b.start()
        time.sleep(3)  # b joins as slave; the SyncStateSet grows (checked every 1 s)
        _send_until_ok(a.endpoints, b"m", **ROOT)
        a.kill()
        took = _send_until_ok(b.endpoints, b"after", **ROOT)
    finally:
        for p in (a, b, ctl):
            p.kill()
    blog = (tmp_path / "b" / "broker.log").read_text()
    clog = (tmp_path / "ctl" / "controller.log").read_text()
    lag_s = (_logged_at(blog, "becoming master, epoch 2")
             - _logged_at(clog, "elected broker 2 master of broker-a, epoch 2"))
    print(f"signed={signed}: b master {lag_s * 1000:.0f} ms after the election, first "
          f"acknowledged send {took:.1f} s after the kill")
    pushed = "role change pushed by the controller: master 2, epoch 2" in blog
    refused = "ACL refused request code 1008" in blog
    if signed:
        assert pushed and not refused, blog
        assert lag_s < REPLICA_INFO_POLL_MS / 1000 / 5
    else:
        assert refused and not pushed, blog


def _controller_connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to remote port ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    n = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if int(f[2].rsplit(":", 1)[1], 16) == port and f[3] == "01" and f[9] in inodes:
                n += 1
    return n


def test_a_role_switch_cycle_leaves_no_dropped_task(tmp_path: Path) -> None:
    """Master killed, slave promoted, old master back as its slave, then the controller restarts:
    each broker ends with one connection to the controller, and no broker log has asyncio's
    dropped-task lines. (The heartbeat and the poll of one tick each opened a connection when
    the kept one was gone; one was left unclosed and its reader task was reported "destroyed but
    pending" when collected: seen in the failover chaos run.)"""
    ctl = ControllerProcess(tmp_path / "ctl", "127.0.0.1", 0, f"127.0.0.1:{free_port()}", [])
    ctl.start()
    a, b = _broker(tmp_path, "a", ctl), _broker(tmp_path, "b", ctl)
    try:
        a.start()
        _send_until_ok(a.endpoints, b"first")
        b.start()
        time.sleep(3)
        a.kill()
        _send_until_ok(b.endpoints, b"after")
        a.start()  # back as b's slave
        wait_until(lambda: read_commit_log(tmp_path / "a" / "store")
                   == read_commit_log(tmp_path / "b" / "store"), 15)
        ctl.kill()
        time.sleep(2.5)  # both brokers notice and look for a leader
        ctl.start()
        pids = [p.proc.pid for p in (a, b) if p.proc is not None]
        wait_until(lambda: all(_controller_connections(pid, ctl.port) >= 1 for pid in pids), 30)
        _send_until_ok(b.endpoints, b"again")
        time.sleep(2)  # a few heartbeats and a poll on the new connections
        assert [_controller_connections(pid, ctl.port) for pid in pids] == [1, 1]
    finally:
        for p in (a, b, ctl):
            p.kill()
    for name in ("a", "b"):
        log = (tmp_path / name / "broker.log").read_text()
        assert not [x for x in log.splitlines() if any(d in x for d in DROPPED_TASK_LINES)], log
