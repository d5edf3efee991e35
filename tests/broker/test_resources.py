"""Connection resources are bounded on a real broker process: a connection cap below the
file-descriptor limit with a clear refusal, all-or-nothing sends at the descriptor limit, one
global budget for partial frames, and an idle timeout."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import select
import socket
import struct
import time
from pathlib import Path

import pytest

from txmq import limits
from txmq.broker import BrokerConfig
from txmq.broker.server import BrokerServer
from txmq.client import AsyncConnection, Message, Producer
from txmq.errors import ConfigError, RemoteError, ResponseCode, TxmqError
from txmq.protocol import (
    PROPERTY_UNIQ_KEY,
    PULL_FLAG_SUSPEND,
    Command,
    FrameDecoder,
    GetMaxOffsetRequestHeader,
    HeartbeatData,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeader,
    encode_body,
    encode_command,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.store import MemoryStore
from txmq.testing import BrokerProcess, run_broker, wait_until

BUDGET_BYTES = 256 * 1024 * 1024  # the default buffer_budget_bytes
HEARTBEAT = encode_command(Command(code=RequestCode.HEART_BEAT, opaque=7,
                                   body=encode_body(HeartbeatData(client_id="raw"))))


def ask(sock: socket.socket, frame: bytes, timeout_s: float = 3.0) -> int | str:
    """Send one request; its response code, or ``"eof"``, ``"reset"``, ``"timeout"``."""
    sock.settimeout(timeout_s)
    dec = FrameDecoder()
    try:
        sock.sendall(frame)
        while True:
            data = sock.recv(65536)
            if not data:
                return "eof"
            cmds = dec.feed(data)
            if cmds:
                return cmds[0].code if cmds[0].code != ResponseCode.SYSTEM_BUSY else (
                    f"busy: {cmds[0].remark}")
    except TimeoutError:
        return "timeout"
    except ConnectionError:
        return "reset"


def send_frame(topic: str, uniq: str) -> bytes:
    h = SendMessageRequestHeader(producer_group="p", topic=topic, queue_id=0,
                                 born_timestamp=int(time.time() * 1000),
                                 properties=encode_properties({PROPERTY_UNIQ_KEY: uniq}))
    return encode_command(Command(code=RequestCode.SEND_MESSAGE, opaque=9, ext=to_ext(h),
                                  body=b"payload"))


def stored(bp: BrokerProcess, topic: str) -> int:
    async def main() -> int:
        conn = AsyncConnection(bp.endpoints)
        await conn.connect()
        r = await conn.request(RequestCode.GET_MAX_OFFSET,
                               to_ext(GetMaxOffsetRequestHeader(topic=topic, queue_id=0)))
        await conn.close()
        assert r.code == ResponseCode.SUCCESS, r.remark
        return from_ext(r.ext, OffsetResponseHeader).offset

    return asyncio.run(main())


def fill_connections(bp: BrokerProcess, fd_limit: int) -> tuple[socket.socket, list[socket.socket],
                                                                 list[int | str]]:
    """Lower the broker's descriptor limit to ``fd_limit`` (prlimit), then open connections (each
    sends a heartbeat) until one is not answered; the first one stays for later requests."""
    main = socket.create_connection(("127.0.0.1", bp.port))
    assert ask(main, HEARTBEAT) == ResponseCode.SUCCESS
    assert bp.proc is not None
    resource.prlimit(bp.proc.pid, resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
    extra: list[socket.socket] = []
    outcomes: list[int | str] = []
    for _ in range(fd_limit + 8):
        s = socket.create_connection(("127.0.0.1", bp.port))
        extra.append(s)
        outcomes.append(ask(s, HEARTBEAT))
        if outcomes[-1] != ResponseCode.SUCCESS and outcomes[-2:-1] != [ResponseCode.SUCCESS]:
            break  # two refusals in a row
    return main, extra, outcomes


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_connection_cap_refuses_clearly_and_keeps_descriptors_for_the_store(tmp_path: Path) -> None:
    """Over the cap a client gets SYSTEM_BUSY "too many connections (N)"; the store still has
    descriptors, so a send that needs new files (the first message: the index file) is stored
    and acknowledged. Before the cap, the send failed with the message stored anyway."""
    with run_broker(tmp_path, topics={"fresh": 1}) as bp:
        assert bp.proc is not None
        fds = len(os.listdir(f"/proc/{bp.proc.pid}/fd"))
        limit = fds + 40
        main, extra, outcomes = fill_connections(bp, limit)
        sent = ask(main, send_frame("fresh", "m1"), timeout_s=10)
        assert ask(main, HEARTBEAT) == ResponseCode.SUCCESS
        late = Producer("p", bp.endpoints)
        refused: TxmqError | None = None
        try:
            late.start()
        except TxmqError as exc:
            refused = exc
        late.shutdown()
        for s in [main, *extra]:
            s.close()
        bp.restart()  # a new process, with the usual descriptor limit
        n = stored(bp, "fresh")
    assert n == (1 if sent == ResponseCode.SUCCESS else 0), f"send answered {sent}, {n} stored"
    assert sent == ResponseCode.SUCCESS
    accepted = outcomes.count(ResponseCode.SUCCESS)
    cap = limit - min(limits.CONNECTION_FD_RESERVE, limit // 2)  # a small limit: half is kept
    assert accepted == cap - 1, outcomes  # main is one of the cap
    assert outcomes[accepted:] == [f"busy: too many connections ({cap})"] * 2
    assert isinstance(refused, RemoteError), refused  # the SDK says why, and may retry
    assert (refused.code, refused.retriable) == ("SYSTEM_BUSY", True)
    assert f"too many connections ({cap})" in str(refused)


def test_at_the_descriptor_limit_sends_are_all_or_nothing_and_the_broker_recovers(
        tmp_path: Path) -> None:
    """With the cap set above the descriptor limit, connections use up every descriptor: new ones
    are dropped, the broker does not spin, a send that needs a new index file is refused with
    nothing stored (or stored and acknowledged), and once descriptors are free it serves again."""
    with run_broker(tmp_path, topics={"fresh": 1}, max_connections=100_000) as bp:
        assert bp.proc is not None
        pid = bp.proc.pid
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        main, extra, outcomes = fill_connections(bp, fds + 30)
        assert ResponseCode.SUCCESS in outcomes and outcomes[-1] != ResponseCode.SUCCESS
        sent = ask(main, send_frame("fresh", "m1"), timeout_s=10)
        ticks = cpu_ticks(pid)
        time.sleep(2)
        busy_ticks = cpu_ticks(pid) - ticks
        for s in extra:
            s.close()

        def serves_a_new_connection() -> bool:
            with socket.create_connection(("127.0.0.1", bp.port)) as late:
                return ask(late, HEARTBEAT, timeout_s=1) == ResponseCode.SUCCESS

        wait_until(serves_a_new_connection, timeout_s=10)
        assert ask(main, send_frame("fresh", "m2")) == ResponseCode.SUCCESS
        main.close()
        bp.restart()
        n = stored(bp, "fresh")
    assert n == (2 if sent == ResponseCode.SUCCESS else 1), f"send answered {sent}, {n} stored"
    assert busy_ticks < 50, f"{busy_ticks} CPU ticks in 2 s at the descriptor limit"


def stall_in_big_frames(port: int, conns: int, frame_bytes: int,
                        sent_bytes: int) -> list[socket.socket]:
    """``conns`` connections each send the start of a ``frame_bytes`` frame (``sent_bytes`` of it)
    as far as the broker reads, and then stall."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
    prefix = struct.pack(">II", frame_bytes - 4, 16)
    chunk = prefix + bytes(sent_bytes - len(prefix))
    view = memoryview(chunk)
    left = {s: 0 for s in socks}
    for s in socks:
        s.setblocking(False)
    deadline = time.monotonic() + 60
    while left and time.monotonic() < deadline:
        _, writable, _ = select.select([], list(left), [], 1.0)
        if not writable:
            break  # nobody reads any more: the broker stopped reading them
        for s in writable:
            try:
                left[s] += s.send(view[left[s]: left[s] + 256 * 1024])
            except BlockingIOError:
                continue
            if left[s] >= len(chunk):
                del left[s]
    return socks


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_stalled_big_frames_stay_within_the_buffer_budget(tmp_path: Path) -> None:
    """64 connections stall halfway through 16 MiB frames: the broker's memory stays within the
    budget (it grew to about 1.1 GB before), other clients keep sending, and a largest frame
    still gets through on an otherwise idle broker."""
    with run_broker(tmp_path, topics={"t": 1}) as bp:
        assert bp.proc is not None
        pid = bp.proc.pid
        big = socket.create_connection(("127.0.0.1", bp.port))
        frame = encode_command(Command(code=RequestCode.HEART_BEAT, opaque=3,
                                       body=bytes(limits.FRAME_SIZE_MAX_BYTES - 256)))
        assert ask(big, frame, timeout_s=30) == ResponseCode.SYSTEM_ERROR  # read whole (bad body)
        big.close()
        base = rss_bytes(pid)
        socks = stall_in_big_frames(bp.port, 64, limits.FRAME_SIZE_MAX_BYTES, 8 * 1024 * 1024)
        time.sleep(1)
        grown = rss_bytes(pid) - base
        with Producer("p", bp.endpoints, timeout_ms=5000) as producer:
            for i in range(20):
                producer.send(Message(topic="t", body=f"m{i}".encode()))
        for s in socks:
            s.close()
    print(f"broker RSS grew {grown >> 20} MiB")
    assert grown < BUDGET_BYTES + 150 * 1024 * 1024, f"RSS grew {grown >> 20} MiB"
    assert limits.BUFFER_BUDGET_BYTES == BUDGET_BYTES


def test_idle_connections_are_closed_and_active_ones_kept(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``channel_idle_max_ms`` 1.5 s: a silent socket is closed; a heartbeating client and a
    connection whose long-polling pull is held (3 s) are not."""
    monkeypatch.setattr(limits, "HEARTBEAT_INTERVAL_MS", 300)
    with run_broker(tmp_path, topics={"t": 1}, channel_idle_max_ms=1500) as bp:
        silent = socket.create_connection(("127.0.0.1", bp.port))
        poller = socket.create_connection(("127.0.0.1", bp.port))
        pull = encode_command(Command(code=RequestCode.PULL_MESSAGE, opaque=5, ext=to_ext(
            PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=0, queue_offset=0,
                                     max_msg_nums=32, sys_flag=PULL_FLAG_SUSPEND,
                                     suspend_timeout_millis=3000))))
        t0 = time.monotonic()
        with Producer("p", bp.endpoints) as producer:
            held = ask(poller, pull, timeout_s=10)
            held_s = time.monotonic() - t0
            poller.close()
            silent.settimeout(5)
            assert silent.recv(10) == b""  # closed by the broker
            time.sleep(1)
            producer.send(Message(topic="t", body=b"still connected"))
        log = bp.log_path.read_text()
    assert held == ResponseCode.PULL_NOT_FOUND and held_s > 2.5, (held, held_s)
    assert log.count("no traffic for 1500 ms") == 1, log  # only the silent socket


def test_resource_keys_are_checked() -> None:
    assert BrokerConfig(channel_idle_max_ms=0, max_connections=5).validate().max_connections == 5
    with pytest.raises(ConfigError, match="buffer_budget_bytes"):
        BrokerConfig(buffer_budget_bytes=limits.FRAME_SIZE_MAX_BYTES - 1).validate()
    with pytest.raises(ConfigError, match="negative"):
        BrokerConfig(channel_idle_max_ms=-1).validate()


def test_accept_failures_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """On asyncio's own loop, accept at the descriptor limit fails once a second (asyncio retries
    it); the broker logs that once per ACCEPT_ERROR_LOG_INTERVAL_MS, and other errors as before."""
    server = BrokerServer(BrokerConfig(port=0), MemoryStore())
    seen: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx["message"]))
        await server.start()
        try:
            for _ in range(3):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(errno.EMFILE, "Too many open files")})
            loop.call_exception_handler({"message": "something else"})
        finally:
            await server.close()

    with caplog.at_level(logging.ERROR, logger="txmq.broker.server"):
        asyncio.run(main())
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["cannot accept connections"]
    assert "(1 failures)" in caplog.records[0].getMessage()
    assert seen == ["something else"]


def test_a_flood_of_refused_connections_is_closed_without_waiting(tmp_path: Path) -> None:
    """Refused connections wait for their first request (to answer it) only up to
    CONNECTIONS_REFUSING_MAX at a time; the others are answered and closed at once."""
    with run_broker(tmp_path, max_connections=1) as bp:
        holder = socket.create_connection(("127.0.0.1", bp.port))
        assert ask(holder, HEARTBEAT) == ResponseCode.SUCCESS
        n = limits.CONNECTIONS_REFUSING_MAX + 24
        t0 = time.monotonic()
        silent = [socket.create_connection(("127.0.0.1", bp.port)) for _ in range(n)]
        quick = 0
        for s in silent:
            s.settimeout(max(0.01, t0 + 0.6 - time.monotonic()))
            try:
                cmds = FrameDecoder().feed(s.recv(65536))
                quick += bool(cmds) and cmds[0].code == ResponseCode.SYSTEM_BUSY
            except TimeoutError:
                pass
        for s in [holder, *silent]:
            s.close()
    assert quick >= 24, f"{quick} of {n} refused within 0.6 s"
