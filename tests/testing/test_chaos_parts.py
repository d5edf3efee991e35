"""The nemesis's instruments on their own: the fault-injecting proxy and the broker clock hook."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.client import Message, Producer, PullConsumer
from txmq.testing import BrokerProcess
from txmq.testing.chaos import FaultProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP server answering every chunk with the same bytes."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve(c: socket.socket) -> None:
        with c:
            while data := c.recv(4096):
                c.sendall(data)

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


@pytest.fixture
def proxy(echo_port: int) -> Iterator[FaultProxy]:
    p = FaultProxy(echo_port)
    p.start()
    yield p
    p.stop()


def roundtrip(c: socket.socket, data: bytes, timeout_s: float = 2.0) -> bytes:
    c.settimeout(timeout_s)
    c.sendall(data)
    try:
        return c.recv(4096)
    except TimeoutError:
        return b"<timeout>"


def test_the_proxy_forwards_holds_delays_and_drops(proxy: FaultProxy) -> None:
    c = socket.create_connection(("127.0.0.1", proxy.port))
    assert roundtrip(c, b"a") == b"a"
    proxy.set_mode("blackhole")
    assert roundtrip(c, b"b", 0.3) == b"<timeout>"
    proxy.set_mode("pass")  # held bytes flow once healed, as TCP would retransmit them
    assert roundtrip(c, b"", 2.0) == b"b"
    proxy.set_mode("delay", 300)
    t0 = time.monotonic()
    assert roundtrip(c, b"c") == b"c" and time.monotonic() - t0 >= 0.55  # both directions
    proxy.set_mode("half_open")
    assert roundtrip(c, b"d", 0.3) == b"<timeout>"
    proxy.set_mode("pass")
    assert roundtrip(c, b"", 2.0) == b"d"
    assert proxy.drop() == 2  # the client side and the upstream side
    c.settimeout(2.0)
    with contextlib.suppress(ConnectionResetError):
        assert c.recv(10) == b""
    c2 = socket.create_connection(("127.0.0.1", proxy.port))  # new connections still work
    assert roundtrip(c2, b"e") == b"e"
    c.close()
    c2.close()


def test_the_broker_clock_hook_moves_the_brokers_now(tmp_path: Path) -> None:
    offset_file = tmp_path / "clock"
    offset_file.write_text(str(86_400_000))  # one day ahead
    broker = BrokerProcess(tmp_path / "b", {"topics": {"t": 1}},
                           env={"TXMQ_TEST_CLOCK_OFFSET_FILE": str(offset_file)})
    broker.start()
    try:
        with Producer("pg", broker.endpoints) as p, PullConsumer(broker.endpoints) as pc:
            p.send(Message(topic="t", body=b"x"), 0)
            offset_file.write_text("0")
            time.sleep(0.3)  # more than CHAOS_CLOCK_POLL_MS
            p.send(Message(topic="t", body=b"y"), 0)
            a, b = pc.pull("t", 0, 0, 2).messages
    finally:
        broker.stop()
    now = time.time() * 1000
    assert abs(a.store_timestamp_ms - 86_400_000 - now) < 60_000
    assert abs(b.store_timestamp_ms - now) < 60_000
