"""``txmq bench send``: the send path against its ceiling, and pull throughput.

All on loopback, in one run (the figures are compared as ratios; this machine is shared):

1. **ceiling**: a bare framed echo server, a child process with the broker's I/O shell (asyncio
   streams on uvloop, 256 KiB reads, :class:`~txmq.protocol.FrameDecoder`, one
   write of all the replies to one read, as the broker does) that answers each SEND_MESSAGE with a
   SendMessageResponseHeader but no broker logic, store or fsync;
2. **send, sync flush**: a real ``txmq broker`` process (SYNC_FLUSH, group commit);
3. **send, async flush**: the same with ASYNC_FLUSH;
4. **batch send** (extra): SEND_BATCH_MESSAGE of ``--batch`` messages, sync flush;
5. **pull**: the messages stored in 2., read back by offset, one connection per queue.

``--secure`` runs only four brokers, sync flush, one after the other: ACL and TLS off, ACL on alone
(every request signed with a Normal user's key, checked against its policy ``Topic:bench [Pub]``),
TLS ``enforcing`` alone, and both on (certificates made at run time with ``openssl``; the load
generator speaks TLS 1.3). The requests are signed when they are built, before the runs: the
figures are the broker's cost of checking signatures and policies and of TLS, plus the load
generator's TLS.

The load generator is the same for every run: ``--producers`` connections in this process, each
keeping ``--in-flight`` requests outstanding (a new request goes out as soon as an answer comes
back), every message ``--message-bytes`` of body with its own ``UNIQ_KEY``; requests are encoded
with :func:`~txmq.protocol.encode_command` and answers decoded with the FrameDecoder. Each run warms
up for 1 s, then counts acknowledged messages for ``--seconds``. It also reads the server process's
CPU time (``/proc``) over the same window: CPU µs per message shifts far less than a rate when other
work shares the machine, so the two ratios together say whether a change helped.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq.broker.acl import Accounts, Action, PolicyEntry, Resource, User, UserType, save_accounts
from txmq.client._core import send_request_header
from txmq.errors import ResponseCode
from txmq.protocol import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Command,
    FrameDecoder,
    Message,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    RequestCode,
    SendMessageResponseHeader,
    decode_message_exts,
    encode_batch,
    encode_command,
    from_ext,
    offset_msg_id,
    sign_remoting,
    to_ext,
)
from txmq.serving import new_event_loop
from txmq.testing import BrokerProcess, make_test_certificates, process_cpu_s

__all__ = ["bench_secure", "bench_send", "send"]

TOPIC = "bench"
QUEUES = 4
_WARMUP_S = 1.0
_READ_BYTES = 256 * 1024


# -- the echo server (ceiling) ----------------------------------------------------------------------
async def _echo_serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    decoder, offset = FrameDecoder(), 0
    reply = to_ext(SendMessageResponseHeader(msg_id=offset_msg_id("127.0.0.1:10911", 1200),
                                             queue_id=0, queue_offset=0))
    while data := await reader.read(_READ_BYTES):
        out = []
        for cmd in decoder.feed(data):
            offset += 1
            out.append(encode_command(cmd.response(ResponseCode.SUCCESS, None, reply)))
        writer.write(b"".join(out))
        await writer.drain()
    writer.close()


def echo_main(port_file: str) -> None:
    """Run the echo server on a free loopback port (written to ``port_file``) until killed."""

    async def main() -> None:
        server = await asyncio.start_server(_echo_serve, "127.0.0.1", 0)
        Path(port_file + ".tmp").write_text(str(server.sockets[0].getsockname()[1]))
        os.replace(port_file + ".tmp", port_file)
        await asyncio.Event().wait()

    loop = new_event_loop()
    loop.run_until_complete(main())


# -- the load generator -----------------------------------------------------------------------------
class _Counter:
    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.stop = False


class _Pipeline(asyncio.Protocol):
    """One connection keeping ``in_flight`` requests outstanding; ``make(i)`` builds request i and
    says how many messages it carries."""

    def __init__(self, make: Callable[[int], tuple[bytes, int]], in_flight: int,
                 counter: _Counter) -> None:
        self.make, self.in_flight, self.counter = make, in_flight, counter
        self.decoder = FrameDecoder()
        self.sent = 0
        self.carried: dict[int, int] = {}
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.lost = asyncio.get_running_loop().create_future()

    def _next(self) -> bytes:
        self.sent += 1
        frame, n = self.make(self.sent)
        self.carried[self.sent % _FRAMES_PER_PRODUCER] = n
        return frame

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transport.write(b"".join(self._next() for _ in range(self.in_flight)))

    def data_received(self, data: bytes) -> None:
        out = []
        for cmd in self.decoder.feed(data):
            n = self.carried.pop(cmd.opaque, 0)
            if cmd.code == ResponseCode.SUCCESS:
                self.counter.ok += n
            else:
                self.counter.errors += 1
            if not self.counter.stop:
                out.append(self._next())
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


_FRAMES_PER_PRODUCER = 4096
"""Requests a producer builds before the run and then sends in turn (opaque = index), so the load
generator spends its CPU on the socket, not on encoding (it shares the machine with the broker)."""


def _send_maker(producer: int, body: bytes, batch: int, serialize_type: int = SERIALIZE_JSON,
                keys: tuple[str, str] | None = None) -> Callable[[int], tuple[bytes, int]]:
    """Request ``i``: a SEND_MESSAGE_V2 (or a batch of ``batch``) as the SDK builds it, its header
    in ``serialize_type`` (signed with ``keys``, access and secret key, if given); built once per
    opaque in ``0 .. _FRAMES_PER_PRODUCER``."""
    prefix = f"{os.getpid() & 0xFFFF:04X}{producer:04X}"

    def build(i: int) -> bytes:
        if batch <= 1:
            msg = Message(topic=TOPIC, body=body, properties={"UNIQ_KEY": f"{prefix}{i:024X}"})
            ext = send_request_header(msg, "bench", i % QUEUES, 1)
            if keys is not None:
                ext = sign_remoting(ext, body, *keys)
            return encode_command(Command(RequestCode.SEND_MESSAGE_V2, i, ext=ext, body=body,
                                          serialize_type=serialize_type))
        msgs = [Message(topic=TOPIC, body=body, properties={"UNIQ_KEY": f"{prefix}{i:016X}{k:08X}"})
                for k in range(batch)]
        ext = send_request_header(Message(topic=TOPIC, body=b""), "bench", i % QUEUES, 1, batch=True)
        return encode_command(Command(RequestCode.SEND_BATCH_MESSAGE, i, ext=ext,
                                      body=encode_batch(msgs), serialize_type=serialize_type))

    frames = [build(i) for i in range(_FRAMES_PER_PRODUCER)]

    def make(i: int) -> tuple[bytes, int]:
        return frames[i % _FRAMES_PER_PRODUCER], max(batch, 1)

    return make


async def _drive(port: int, makers: list[Callable[[int], tuple[bytes, int]]], in_flight: int,
                 seconds: float, pid: int, tls: ssl.SSLContext | None = None
                 ) -> tuple[float, float | None]:
    """Run one pipeline per maker; return acknowledged messages per second after the warm-up and
    the server process's CPU time per message in µs (a figure that other load on the machine
    disturbs much less than a rate)."""
    loop = asyncio.get_running_loop()
    counter = _Counter()
    conns = [await loop.create_connection(lambda m=m: _Pipeline(m, in_flight, counter),
                                          "127.0.0.1", port, ssl=tls) for m in makers]
    await asyncio.sleep(_WARMUP_S)
    ok0, t0, c0 = counter.ok, time.perf_counter(), process_cpu_s(pid)
    await asyncio.sleep(seconds)
    ok1, t1, c1 = counter.ok, time.perf_counter(), process_cpu_s(pid)
    counter.stop = True
    for transport, _ in conns:
        transport.close()
    if counter.errors or ok1 == ok0:
        raise RuntimeError(f"{counter.errors} requests failed, {ok1 - ok0} acknowledged")
    cpu = (c1 - c0) / (ok1 - ok0) * 1e6
    return (ok1 - ok0) / (t1 - t0), cpu


async def _pull_all(port: int, seconds: float, batch: int) -> float:
    """Read every queue from offset 0, one connection per queue; messages per second."""
    total = 0

    async def one(qid: int) -> None:
        nonlocal total
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        decoder, offset, opaque = FrameDecoder(), 0, 0
        while time.perf_counter() < deadline:
            opaque += 1
            h = PullMessageRequestHeader(consumer_group="bench-pull", topic=TOPIC, queue_id=qid,
                                         queue_offset=offset, max_msg_nums=batch)
            writer.write(encode_command(Command(code=RequestCode.PULL_MESSAGE, opaque=opaque,
                                                ext=to_ext(h))))
            cmds: list[Command] = []
            while not cmds:
                cmds = decoder.feed(await reader.read(_READ_BYTES))
            if cmds[0].code != ResponseCode.SUCCESS:
                break
            msgs = decode_message_exts(cmds[0].body)
            total += len(msgs)
            offset = from_ext(cmds[0].ext, PullMessageResponseHeader).next_begin_offset
        writer.close()

    t0 = time.perf_counter()
    deadline = t0 + seconds
    await asyncio.gather(*(one(q) for q in range(QUEUES)))
    return total / (time.perf_counter() - t0)


# -- the runs -------------------------------------------------------------------------------------------
def _run(coro: Any) -> Any:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _echo_ceiling(makers: list[Callable[[int], tuple[bytes, int]]], in_flight: int,
                  seconds: float, tmp: Path) -> tuple[float, float | None]:
    port_file = tmp / "echo.port"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from txmq.cli._bench_send import "
                             "echo_main; echo_main(sys.argv[1])", str(port_file)])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("echo server did not start")
            time.sleep(0.02)
        return _run(_drive(int(port_file.read_text()), makers, in_flight, seconds,  # type: ignore[no-any-return]
                           proc.pid))
    finally:
        proc.kill()
        proc.wait()


def _broker_send(flush: str, makers: list[Callable[[int], tuple[bytes, int]]], in_flight: int,
                 seconds: float, data: Path, pull: tuple[float, int] | None = None,
                 config: dict[str, Any] | None = None, tls: ssl.SSLContext | None = None
                 ) -> tuple[tuple[float, float | None], float]:
    bp = BrokerProcess(data, {"topics": {TOPIC: QUEUES}, "flush_disk_type": flush, **(config or {})})
    bp.start()
    try:
        assert bp.proc is not None
        rate = _run(_drive(bp.port, makers, in_flight, seconds, bp.proc.pid, tls))
        pulled = float(_run(_pull_all(bp.port, *pull))) if pull is not None else 0.0
        return rate, pulled
    finally:
        bp.stop()


def bench_send(seconds: float = 5.0, producers: int = 4, in_flight: int = 64,
               message_bytes: int = 1024, batch: int = 16, pull_batch: int = 256,
               data_dir: Path | None = None) -> dict[str, Any]:
    """Run the four measurements (plus batch send); return the figures (JSON keys)."""
    body = os.urandom(message_bytes)
    singles = [_send_maker(p, body, 1) for p in range(producers)]
    binary = [_send_maker(p, body, 1, SERIALIZE_ROCKETMQ) for p in range(producers)]
    batches = [_send_maker(p, body, batch) for p in range(producers)]
    with tempfile.TemporaryDirectory(prefix="txmq-bench-send-", dir=data_dir) as tmp:
        root = Path(tmp)
        echo = _echo_ceiling(singles, in_flight, seconds, root)
        sync, pull = _broker_send("SYNC_FLUSH", singles, in_flight, seconds, root / "sync",
                                  pull=(seconds, pull_batch))
        binary_sync, _ = _broker_send("SYNC_FLUSH", binary, in_flight, seconds, root / "binary")
        async_, _ = _broker_send("ASYNC_FLUSH", singles, in_flight, seconds, root / "async")
        batched, _ = _broker_send("SYNC_FLUSH", batches, max(1, in_flight // batch), seconds,
                                  root / "batch")
    def cpu(run: tuple[float, float | None]) -> float | None:
        return None if run[1] is None else round(run[1], 1)

    return {
        "echo_ceiling_msgs_per_s": round(echo[0]),
        "send_sync_flush_msgs_per_s": round(sync[0]),
        "send_sync_flush_rocketmq_header_msgs_per_s": round(binary_sync[0]),
        "send_async_flush_msgs_per_s": round(async_[0]),
        "pull_msgs_per_s": round(pull),
        "send_batch_sync_flush_msgs_per_s": round(batched[0]),
        "sync_flush_vs_ceiling": round(sync[0] / echo[0], 3) if echo[0] else 0.0,
        "echo_ceiling_server_cpu_us_per_msg": cpu(echo),
        "send_sync_flush_server_cpu_us_per_msg": cpu(sync),
        "send_sync_flush_rocketmq_header_server_cpu_us_per_msg": cpu(binary_sync),
        "send_async_flush_server_cpu_us_per_msg": cpu(async_),
        "send_batch_sync_flush_server_cpu_us_per_msg": cpu(batched),
        "message_bytes": message_bytes,
        "producers": producers,
        "in_flight_per_producer": in_flight,
        "batch_messages": batch,
        "pull_batch": pull_batch,
        "seconds": seconds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
    }


_SECURE_RUNS = (("ACL off, TLS off", "send_plain", False, False),
                ("ACL on (signed), TLS off", "send_acl", True, False),
                ("ACL off, TLS enforcing", "send_tls", False, True),
                ("ACL on (signed), TLS enforcing", "send_acl_tls", True, True))


def bench_secure(seconds: float = 5.0, producers: int = 4, in_flight: int = 64,
                 message_bytes: int = 1024, data_dir: Path | None = None) -> dict[str, Any]:
    """Send, sync flush, with ACL and TLS off, each alone, and both on (module docstring); the
    figures (JSON keys)."""
    body = os.urandom(message_bytes)
    keys = ("bench-producer", "bench-secret")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="txmq-bench-secure-", dir=data_dir) as tmp:
        root = Path(tmp)
        certs = make_test_certificates(root / "certs")
        acl = root / "acl.toml"
        pub = PolicyEntry(Resource.parse(f"Topic:{TOPIC}"), (Action.PUB,))
        save_accounts(acl, Accounts({keys[0]: User(keys[0], keys[1], UserType.NORMAL, (pub,))}))
        tls_table = {"server_mode": "enforcing", "cert_file": str(certs.cert_file),
                     "key_file": str(certs.key_file)}
        ctx = ssl.create_default_context(cafile=str(certs.ca_file))
        for _, key, acl_on, tls_on in _SECURE_RUNS:
            config: dict[str, Any] = {"acl_enable": True, "acl_file": str(acl)} if acl_on else {}
            if tls_on:
                config["tls"] = tls_table
            makers = [_send_maker(p, body, 1, keys=keys if acl_on else None)
                      for p in range(producers)]
            (rate, cpu), _ = _broker_send("SYNC_FLUSH", makers, in_flight, seconds, root / key,
                                          config=config, tls=ctx if tls_on else None)
            out[f"{key}_msgs_per_s"] = round(rate)
            out[f"{key}_server_cpu_us_per_msg"] = None if cpu is None else round(cpu, 1)
    plain = out["send_plain_msgs_per_s"]
    return {**out, "acl_tls_vs_plain": round(out["send_acl_tls_msgs_per_s"] / plain, 3)
            if plain else 0.0,
            "message_bytes": message_bytes, "producers": producers,
            "in_flight_per_producer": in_flight, "seconds": seconds,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                       f"Python {platform.python_version()}"}


def _print_secure(console: Console, r: dict[str, Any]) -> None:
    table = Table("run", "msgs/s", "MiB/s", "vs off", "server CPU µs/msg",
                  title=f"txmq bench send --secure: {r['message_bytes']} B messages, "
                        f"{r['producers']} producers × {r['in_flight_per_producer']} in flight, "
                        f"{r['seconds']:g} s per run, sync flush")
    base = r["send_plain_msgs_per_s"] or 1
    for name, key, _, _ in _SECURE_RUNS:
        v, cpu = r[f"{key}_msgs_per_s"], r[f"{key}_server_cpu_us_per_msg"]
        table.add_row(name, f"{v:,}", f"{v * r['message_bytes'] / 2**20:,.1f}", f"{v / base:.2f}",
                      "" if cpu is None else f"{cpu:.1f}")
    console.print(table)


def send(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    seconds: Annotated[float, typer.Option(min=0.5, help="Measured time per run.")] = 5.0,
    producers: Annotated[int, typer.Option(min=1, help="Connections sending at once.")] = 4,
    in_flight: Annotated[int, typer.Option(min=1, help="Requests outstanding per producer.")] = 64,
    message_bytes: Annotated[int, typer.Option(min=1, help="Body size.")] = 1024,
    batch: Annotated[int, typer.Option(min=2, help="Messages per batch send request.")] = 16,
    pull_batch: Annotated[int, typer.Option(min=1, help="max_msg_nums of each pull.")] = 256,
    data_dir: Annotated[Path | None, typer.Option(help="Where the brokers store (a temp dir "
                                                       "inside it).")] = None,
    secure: Annotated[bool, typer.Option("--secure", help="Only ACL + TLS on against off, and "
                                                          "each alone (sync flush).")] = False,
) -> None:
    """Send throughput vs a bare framed echo ceiling (sync and async flush), batch send, pull;
    with ``--secure``, ACL + TLS on against off."""
    console = Console()
    if secure:
        with console.status("measuring ACL and TLS off, each, both (4 runs of warm-up + --seconds)…"):
            r = bench_secure(seconds, producers, in_flight, message_bytes, data_dir)
        _print_secure(console, r)
        _emit(console, r, json_path)
        return
    with console.status("measuring (about 5 runs of warm-up + --seconds)…"):
        r = bench_send(seconds, producers, in_flight, message_bytes, batch, pull_batch, data_dir)
    echo = r["echo_ceiling_msgs_per_s"] or 1
    table = Table("run", "msgs/s", "MiB/s", "vs ceiling", "server CPU µs/msg",
                  title=f"txmq bench send: {message_bytes} B messages, {producers} producers × "
                        f"{in_flight} in flight, {seconds:g} s per run")
    rows = [("framed echo (ceiling)", "echo_ceiling"),
            ("send, sync flush (group commit), JSON header", "send_sync_flush"),
            ("send, sync flush, ROCKETMQ binary header", "send_sync_flush_rocketmq_header"),
            ("send, async flush", "send_async_flush"),
            (f"batch send ×{batch}, sync flush", "send_batch_sync_flush"),
            (f"pull by offset ({pull_batch}/pull)", "pull")]
    for name, key in rows:
        v = r[f"{key}_msgs_per_s"]
        cpu = r.get(f"{key}_server_cpu_us_per_msg") if key != "pull" else None
        table.add_row(name, f"{v:,}", f"{v * message_bytes / 2**20:,.1f}", f"{v / echo:.2f}",
                      "" if cpu is None else f"{cpu:.1f}")
    console.print(table)
    _emit(console, r, json_path)


def _emit(console: Console, r: dict[str, Any], json_path: Path | None) -> None:
    console.print(f"machine: {r['machine']}")
    text = json.dumps(r, indent=2)
    if json_path is not None:
        json_path.write_text(text + "\n")
        console.print(f"JSON written to {json_path}")
    else:
        print(text)
