"""Controller mode wired end to end (issue #26): a real ``txmq controller`` and two real
``txmq broker --enable-controller-mode`` processes of one group. The first becomes master, the
second its slave; a send is acknowledged by both; the master is SIGKILLed; the slave becomes master
(epoch 2) and takes sends; the old master restarts as its slave and catches up byte for byte."""

from __future__ import annotations

import time
from pathlib import Path

from txmq.client import Message, Producer
from txmq.errors import TxmqError
from txmq.store import read_commit_log
from txmq.testing import BrokerProcess, ControllerProcess, free_port


def _broker(root: Path, name: str, ctl: ControllerProcess) -> BrokerProcess:
    return BrokerProcess(root / name, {"enable_controller_mode": True, "controller_addr": ctl.addr,
                                       "topics": {"t": 2}, "sync_flush_timeout_ms": 2000})


def _send_until_ok(endpoint: str, body: bytes, timeout_s: float = 15.0) -> float:
    """Seconds until a send to ``endpoint`` is acknowledged."""
    t0 = time.monotonic()
    while True:
        p = Producer("pg", endpoints=endpoint, retry_times_when_send_failed=0, timeout_ms=2000)
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
