"""``txmq bench grpc``: the gRPC door against the remoting door, in one run against one broker.

One ``txmq broker`` process (its default flush) serving both doors on loopback; the load generator
is this process, and it is the same kind of load on both sides:

- **send**: ``--in-flight`` sends outstanding at once, one message per request, every message with
  its own id (the door is idempotent per message id, so a repeated id would store nothing). gRPC:
  ``SendMessage`` on a grpc.aio channel through txmq's generated ``MessagingServiceStub``, the request
  the official clients build (topic, body, tag, a fresh ``message_id``, ``born_timestamp``,
  ``IDENTITY`` encoding). Remoting: :class:`~txmq.client.AsyncProducer` ``send`` (SEND_MESSAGE_V2).
  Each run warms up for 1 s, then counts acknowledged messages for ``--seconds``.
- **receive + ack**: ``--messages`` messages are stored first (not timed) in a topic of ``--queues``
  queues; then one worker per queue reads them all. gRPC pop: ``ReceiveMessage`` of up to
  ``--batch`` messages of its queue, then ``AckMessage`` (one request with an entry per message,
  ``--ack batch``; or one request per message as rocketmq-python-client does, ``--ack each``).
  Remoting pull: :class:`~txmq.client.AsyncPullConsumer` ``pull`` of up to ``--batch`` messages by
  offset, then ``commit_offset`` (UPDATE_CONSUMER_OFFSET). Rate: messages over the time to read all.

- **gRPC ceiling**: the same gRPC sends to a bare grpc.aio server in a child process (on the
  broker's event loop, uvloop) whose ``SendMessage`` answers OK without broker logic or store: what
  Python gRPC itself allows here, as ``txmq bench send``'s framed echo is for remoting.

Besides rates, the broker's CPU time per message over the same window is reported (``/proc``): it
shifts far less than a rate when other work shares the machine. The runs are interleaved over
``--rounds`` rounds, the order of the two doors swapped every round; the table shows each figure's
median over the rounds and the ratio gRPC / remoting (the ratio is what to compare across machines:
this one is shared and noisy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import grpc
import typer
from rich.console import Console
from rich.table import Table

from txmq.broker.grpc.pb import definition_pb2 as pb
from txmq.broker.grpc.pb import service_pb2 as rpc
from txmq.broker.grpc.pb import service_pb2_grpc as rpc_grpc
from txmq.client import AsyncProducer, AsyncPullConsumer, Message, PullStatus
from txmq.errors import TxmqError
from txmq.serving import new_event_loop
from txmq.testing import BrokerProcess, free_port, process_cpu_s

__all__ = ["bench_grpc", "echo_main", "grpc_cmd"]

SEND_TOPIC = "bench-grpc-send"
CONSUME_TOPIC = "bench-grpc-consume"
_WARMUP_S = 1.0
_RPC_TIMEOUT_S = 10.0
_POLL_S = 1  # long-polling time of a receive that finds nothing (whole seconds: a Duration)
_INVISIBLE_S = 60  # receipts stay invisible longer than a round lasts
_PREFILL_BATCH = 64
_START_TIMEOUT_S = 30.0
AckMode = Literal["batch", "each"]


class _Grpc:
    """A grpc.aio channel to the door, with the metadata the official clients send."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])
        self.stub: Any = rpc_grpc.MessagingServiceStub(self.channel)  # type: ignore[no-untyped-call]
        pid = os.getpid()
        self.metadata = (("x-mq-client-id", f"bench@{pid}@0@{time.time_ns():x}"),
                         ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
                         ("x-mq-client-version", "txmq-bench"))
        self.id_prefix = f"01{pid & 0xFFFF:04X}{int(time.time()) & 0xFFFFFFFF:08X}"
        self.sent = 0

    async def close(self) -> None:
        await self.channel.close()

    async def route(self, topic: str) -> list[Any]:
        req = rpc.QueryRouteRequest(topic=pb.Resource(name=topic))
        resp = await self.stub.QueryRoute(req, metadata=self.metadata, timeout=_RPC_TIMEOUT_S)
        if resp.status.code != pb.Code.OK:
            raise RuntimeError(f"QueryRoute {topic}: {resp.status.code} {resp.status.message}")
        readable = (pb.Permission.READ, pb.Permission.READ_WRITE)
        return [q for q in resp.message_queues if q.permission in readable]

    async def send(self, topic: str, body: bytes) -> bool:
        self.sent += 1
        props = pb.SystemProperties(tag="bench", message_id=f"{self.id_prefix}{self.sent:020X}",
                                    body_encoding=pb.Encoding.IDENTITY, message_type=pb.MessageType.NORMAL,
                                    born_host="127.0.0.1")
        props.born_timestamp.seconds = int(time.time())
        req = rpc.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name=topic), body=body,
                                                          system_properties=props)])
        resp = await self.stub.SendMessage(req, metadata=self.metadata, timeout=_RPC_TIMEOUT_S)
        return bool(resp.status.code == pb.Code.OK)

    async def receive(self, group: str, queue: Any, batch: int,
                      deadline_s: float = _RPC_TIMEOUT_S + _POLL_S) -> list[Any]:
        """Up to ``batch`` messages; an empty receive is held by the door until just before
        ``deadline_s`` (at most its long-polling maximum)."""
        req = rpc.ReceiveMessageRequest(group=pb.Resource(name=group), message_queue=queue,
                                        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG,
                                                                              expression="*"),
                                        batch_size=batch, auto_renew=False)
        req.invisible_duration.seconds = _INVISIBLE_S
        req.long_polling_timeout.seconds = _POLL_S
        call = self.stub.ReceiveMessage(req, metadata=self.metadata, timeout=deadline_s)
        return [r.message async for r in call if r.WhichOneof("content") == "message"]

    async def ack(self, group: str, topic: str, msgs: list[Any], mode: AckMode) -> int:
        """Ack ``msgs``; returns how many the door acknowledged."""
        def request(ms: list[Any]) -> Any:
            return rpc.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                         entries=[rpc.AckMessageEntry(
                                             message_id=m.system_properties.message_id,
                                             receipt_handle=m.system_properties.receipt_handle) for m in ms])

        parts = [msgs] if mode == "batch" else [[m] for m in msgs]
        answers = await asyncio.gather(*(self.stub.AckMessage(request(p), metadata=self.metadata,
                                                              timeout=_RPC_TIMEOUT_S) for p in parts))
        return sum(len(p) for p, a in zip(parts, answers, strict=True) if a.status.code == pb.Code.OK)


# -- send -------------------------------------------------------------------------------------------
Figure = tuple[float, float | None]
"""A run's messages per second and the server process's CPU µs per message (None off Linux)."""


def _cpu_per_msg(pid: int, c0: float | None, n: int) -> float | None:
    c1 = process_cpu_s(pid)
    return None if c0 is None or n <= 0 else (c1 - c0) / n * 1e6


async def _timed(one: Callable[[], Awaitable[bool]], in_flight: int, seconds: float, pid: int) -> Figure:
    """``in_flight`` loops calling ``one``: acknowledged calls per second after the warm-up, and the
    server's CPU per acknowledged call over the same window."""
    ok, errors, stop = [0], [0], asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            try:
                good = await one()
            except (grpc.RpcError, OSError, RuntimeError, TxmqError) as e:
                errors[0] += 1
                if errors[0] > 100:
                    raise RuntimeError(f"too many failed sends, the last: {e}") from e
                continue
            ok[0] += good
            errors[0] += not good

    tasks = [asyncio.create_task(loop()) for _ in range(in_flight)]
    try:
        await asyncio.sleep(_WARMUP_S)
        n0, t0, c0 = ok[0], time.perf_counter(), process_cpu_s(pid)
        await asyncio.sleep(seconds)
        n1, t1 = ok[0], time.perf_counter()
        cpu = _cpu_per_msg(pid, c0, n1 - n0)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    if n1 == n0:
        raise RuntimeError(f"no send acknowledged ({errors[0]} failed)")
    return (n1 - n0) / (t1 - t0), cpu


async def _send_grpc(target: str, in_flight: int, seconds: float, body: bytes, pid: int) -> Figure:
    g = _Grpc(target)
    try:
        return await _timed(lambda: g.send(SEND_TOPIC, body), in_flight, seconds, pid)
    finally:
        await g.close()


async def _send_remoting(endpoints: str, in_flight: int, seconds: float, body: bytes, pid: int) -> Figure:
    p = AsyncProducer("bench-grpc-remoting", endpoints)
    await p.start()

    async def one() -> bool:
        await p.send(Message(topic=SEND_TOPIC, body=body, tags="bench"))
        return True

    try:
        return await _timed(one, in_flight, seconds, pid)
    finally:
        await p.shutdown()


# -- the gRPC ceiling: a bare grpc.aio server -------------------------------------------------------
class _Echo(rpc_grpc.MessagingServiceServicer):
    """``SendMessage`` answers OK with the message's id; nothing is stored."""

    async def SendMessage(self, req: Any, ctx: Any) -> Any:
        ok = pb.Status(code=pb.Code.OK, message="OK")
        entries = [rpc.SendResultEntry(status=ok, message_id=m.system_properties.message_id)
                   for m in req.messages]
        return rpc.SendMessageResponse(status=ok, entries=entries)


def echo_main(port_file: str) -> None:
    """Serve :class:`_Echo` on a free loopback port (written to ``port_file``) until killed, on the
    event loop the broker uses."""

    async def main() -> None:
        server = grpc.aio.server()
        rpc_grpc.add_MessagingServiceServicer_to_server(_Echo(), server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file + ".tmp").write_text(str(port))
        os.replace(port_file + ".tmp", port_file)
        await server.wait_for_termination()

    loop = new_event_loop()
    loop.run_until_complete(main())


class _EchoProcess:
    def __init__(self, tmp: Path) -> None:
        port_file = tmp / "echo.port"
        code = "import sys; from txmq.cli._bench_grpc import echo_main; echo_main(sys.argv[1])"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(port_file)])
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the gRPC echo server did not start")
            time.sleep(0.02)
        self.target = f"127.0.0.1:{int(port_file.read_text())}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- receive + ack ----------------------------------------------------------------------------------
async def _prefill(endpoints: str, topic: str, messages: int, body: bytes) -> None:
    p = AsyncProducer("bench-grpc-prefill", endpoints)
    await p.start()
    try:
        sem = asyncio.Semaphore(16)

        async def batch(start: int) -> None:
            async with sem:
                await p.send_batch([Message(topic=topic, body=body, tags="bench")
                                    for _ in range(min(_PREFILL_BATCH, messages - start))])

        await asyncio.gather(*(batch(i) for i in range(0, messages, _PREFILL_BATCH)))
    finally:
        await p.shutdown()


async def _register_pop_group(target: str, topic: str, group: str) -> None:
    """One empty receive per queue, before the topic is filled: the group exists (its pop offsets
    start at the queues' ends, wherever a new pop group starts) when the messages arrive."""
    g = _Grpc(target)
    try:
        await asyncio.gather(*(g.receive(group, q, 1, deadline_s=1.0) for q in await g.route(topic)))
    finally:
        await g.close()


async def _pop_all(target: str, topic: str, group: str, opts: dict[str, Any], pid: int) -> Figure:
    """One worker per queue: receive, ack; messages per second until all are acked (the workers
    still parked in a receive then are cancelled)."""
    messages, g, done, finished = opts["messages"], _Grpc(target), [0], asyncio.Event()
    try:
        queues = await g.route(topic)

        async def worker(queue: Any) -> None:
            while not finished.is_set():
                msgs = await g.receive(group, queue, opts["batch"])
                if msgs:
                    acked = await g.ack(group, topic, msgs, opts["ack"])  # (not `+= await`: a lost update)
                    done[0] += acked
                    if done[0] >= messages:
                        finished.set()

        t0, c0 = time.perf_counter(), process_cpu_s(pid)
        tasks = [asyncio.create_task(worker(q)) for q in queues]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), opts["limit_s"])
        elapsed, cpu = time.perf_counter() - t0, _cpu_per_msg(pid, c0, done[0])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await g.close()
    if done[0] < messages:
        raise RuntimeError(f"gRPC pop acked {done[0]} of {messages} in {opts['limit_s']:g} s")
    return done[0] / elapsed, cpu


async def _pull_all(endpoints: str, topic: str, group: str, opts: dict[str, Any], pid: int) -> Figure:
    """One worker per queue: pull by offset, commit the offset; messages per second until all read."""
    messages, c, done = opts["messages"], AsyncPullConsumer(endpoints, group), [0]
    await c.start()
    try:
        queue_ids = await c.queue_ids(topic)

        async def worker(qid: int) -> None:
            offset = await c.min_offset(topic, qid)
            while done[0] < messages and time.perf_counter() < deadline:
                r = await c.pull(topic, qid, offset, opts["batch"])
                if r.status != PullStatus.FOUND:
                    if offset >= r.max_offset:
                        return
                    continue
                done[0] += len(r.messages)
                offset = r.next_begin_offset
                await c.commit_offset(topic, qid, offset)

        t0, c0 = time.perf_counter(), process_cpu_s(pid)
        deadline = t0 + opts["limit_s"]
        await asyncio.gather(*(worker(q) for q in queue_ids))
        elapsed, cpu = time.perf_counter() - t0, _cpu_per_msg(pid, c0, done[0])
    finally:
        await c.shutdown()
    if done[0] < messages:
        raise RuntimeError(f"remoting pull read {done[0]} of {messages} in {opts['limit_s']:g} s")
    return done[0] / elapsed, cpu


# -- the run ----------------------------------------------------------------------------------------


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker's gRPC door never listened on {port}") from None
            time.sleep(0.05)


def _round(loop: asyncio.AbstractEventLoop, r: int, bp: BrokerProcess, target: str, echo: _EchoProcess,
           opts: dict[str, Any], body: bytes) -> dict[str, Figure]:
    """One round: the ceiling, both sends and both reads; gRPC first in even rounds, remoting first
    in odd ones."""
    assert bp.proc is not None
    pid, topic, remoting = bp.proc.pid, f"{CONSUME_TOPIC}-{r}", bp.endpoints
    loop.run_until_complete(_register_pop_group(target, topic, f"bench-pop-{r}"))
    loop.run_until_complete(_prefill(remoting, topic, opts["messages"], body))
    seconds, in_flight = opts["seconds"], opts["in_flight"]
    steps: list[tuple[str, Callable[[], Awaitable[Figure]]]] = [
        ("send_grpc", lambda: _send_grpc(target, in_flight, seconds, body, pid)),
        ("send_remoting", lambda: _send_remoting(remoting, in_flight, seconds, body, pid)),
        ("receive_ack_grpc_pop", lambda: _pop_all(target, topic, f"bench-pop-{r}", opts, pid)),
        ("receive_ack_remoting_pull", lambda: _pull_all(remoting, topic, f"bench-pull-{r}", opts, pid)),
    ]
    if r % 2:
        steps = [steps[1], steps[0], steps[3], steps[2]]
    steps.insert(0, ("send_grpc_echo_ceiling",
                     lambda: _send_grpc(echo.target, in_flight, seconds, body, echo.proc.pid)))
    return {name: loop.run_until_complete(step()) for name, step in steps}


def _summary(per_round: list[dict[str, Figure]]) -> dict[str, Any]:
    """Medians over the rounds (rates, broker CPU µs per message) and the ratios."""
    def med(key: str, i: int) -> float | None:
        vals = [r[key][i] for r in per_round if r[key][i] is not None]
        return statistics.median(vals) if vals else None  # type: ignore[type-var]

    out: dict[str, Any] = {}
    for key in per_round[0]:
        out[f"{key}_msgs_per_s"] = round(med(key, 0) or 0.0)
        cpu = med(key, 1)
        out[f"{key}_server_cpu_us_per_msg"] = None if cpu is None else round(cpu, 1)
    out["send_grpc_vs_remoting"] = round(out["send_grpc_msgs_per_s"] / out["send_remoting_msgs_per_s"], 3)
    out["send_grpc_vs_echo_ceiling"] = round(out["send_grpc_msgs_per_s"]
                                             / out["send_grpc_echo_ceiling_msgs_per_s"], 3)
    out["receive_ack_grpc_vs_remoting"] = round(out["receive_ack_grpc_pop_msgs_per_s"]
                                                / out["receive_ack_remoting_pull_msgs_per_s"], 3)
    out["round_ratios"] = [{"send": round(r["send_grpc"][0] / r["send_remoting"][0], 3),
                            "receive_ack": round(r["receive_ack_grpc_pop"][0]
                                                 / r["receive_ack_remoting_pull"][0], 3)} for r in per_round]
    out["rounds"] = [{k: round(v[0]) for k, v in r.items()} for r in per_round]
    return out


def bench_grpc(rounds: int = 3, seconds: float = 3.0, in_flight: int = 32, messages: int = 5_000,
               queues: int = 4, batch: int = 32, ack: AckMode = "batch", body_bytes: int = 256,
               data_dir: Path | None = None) -> dict[str, Any]:
    """Start one broker with both doors (and the gRPC echo ceiling) and run ``rounds`` interleaved
    rounds; returns the figures (rates in msgs/s, CPU in µs per message: medians; ratios gRPC /
    remoting; every round's rates)."""
    body = os.urandom(body_bytes)
    port = free_port()
    opts = {"seconds": seconds, "in_flight": in_flight, "messages": messages, "batch": batch, "ack": ack,
            "limit_s": max(60.0, messages / 100)}
    topics = {SEND_TOPIC: queues} | {f"{CONSUME_TOPIC}-{r}": queues for r in range(rounds)}
    with tempfile.TemporaryDirectory(prefix="txmq-bench-grpc-", dir=data_dir) as tmp:
        echo = _EchoProcess(Path(tmp))
        bp = BrokerProcess(Path(tmp) / "broker", {"topics": topics, "grpc_port": port})
        loop = new_event_loop()
        try:
            bp.start()
            _wait_listening(port)
            target = f"127.0.0.1:{port}"
            per_round = [_round(loop, r, bp, target, echo, opts, body) for r in range(rounds)]
        finally:
            loop.close()
            bp.stop()
            echo.stop()
    return _summary(per_round) | {
        "seconds": seconds, "in_flight": in_flight, "messages": messages, "queues": queues,
        "batch": batch, "ack": ack, "body_bytes": body_bytes, "rounds_run": rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
    }


def _table(r: dict[str, Any]) -> Table:
    def cpu(key: str) -> str:
        v = r.get(f"{key}_server_cpu_us_per_msg")
        return "" if v is None else f"{v:,.0f}"

    table = Table("measure", "gRPC msgs/s", "remoting msgs/s", "gRPC / remoting", "CPU µs/msg gRPC",
                  "CPU µs/msg remoting",
                  title=f"txmq bench grpc: {r['body_bytes']} B, median of {r['rounds_run']} rounds",
                  caption=f"send: {r['in_flight']} in flight; receive + ack: gRPC pop ({r['ack']} ack) vs "
                          f"remoting pull + commit, {r['queues']} readers × {r['batch']}; CPU: the server's")
    table.add_row("send", f"{r['send_grpc_msgs_per_s']:,}", f"{r['send_remoting_msgs_per_s']:,}",
                  f"{r['send_grpc_vs_remoting']:.2f}", cpu("send_grpc"), cpu("send_remoting"))
    table.add_row("receive + ack", f"{r['receive_ack_grpc_pop_msgs_per_s']:,}",
                  f"{r['receive_ack_remoting_pull_msgs_per_s']:,}",
                  f"{r['receive_ack_grpc_vs_remoting']:.2f}", cpu("receive_ack_grpc_pop"),
                  cpu("receive_ack_remoting_pull"))
    table.add_row("send, bare grpc.aio (ceiling)", f"{r['send_grpc_echo_ceiling_msgs_per_s']:,}", "",
                  f"door/ceiling {r['send_grpc_vs_echo_ceiling']:.2f}", cpu("send_grpc_echo_ceiling"), "")
    return table


def grpc_cmd(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds (medians are reported).")] = 3,
    seconds: Annotated[float, typer.Option(min=0.5, help="Measured time of each send run.")] = 3.0,
    in_flight: Annotated[int, typer.Option(min=1, help="Sends outstanding at once, both doors.")] = 32,
    messages: Annotated[int, typer.Option(min=1, help="Messages read back per round, both doors.")] = 5_000,
    queues: Annotated[int, typer.Option(min=1, help="Queues of the topics (one reader per queue).")] = 4,
    batch: Annotated[int, typer.Option(min=1, max=32, help="Messages per receive / per pull.")] = 32,
    ack: Annotated[str, typer.Option(help="batch: one AckMessage per receive; each: one per message.")]
    = "batch",
    body_bytes: Annotated[int, typer.Option(min=1, help="Message body size.")] = 256,
    data_dir: Annotated[Path | None, typer.Option(help="Where the broker stores (a temp dir "
                                                       "inside it).")] = None,
) -> None:
    """gRPC door vs remoting door on one broker: send msgs/s, and receive + ack (pop vs pull)."""
    if ack not in ("batch", "each"):
        raise typer.BadParameter("--ack is batch or each")
    console = Console()
    with console.status(f"measuring ({rounds} rounds of 3 sends and 2 reads)…"):
        r = bench_grpc(rounds, seconds, in_flight, messages, queues, batch, ack,  # type: ignore[arg-type]
                       body_bytes, data_dir)
    console.print(_table(r))
    console.print("per round, gRPC / remoting: " + "; ".join(
        f"send {x['send']:.2f}, receive+ack {x['receive_ack']:.2f}" for x in r["round_ratios"]))
    console.print(f"machine: {r['machine']}")
    text = json.dumps(r, indent=2)
    if json_path is not None:
        json_path.write_text(text + "\n")
        console.print(f"JSON written to {json_path}")
    else:
        print(text)
