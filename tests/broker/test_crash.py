"""Crash test: a real broker process under concurrent send load, SIGKILLed at random moments again
and again and restarted each time. Afterwards every acknowledged message is present exactly once,
at the queue offset its acknowledgement named, with an intact body, and per-queue order holds.

The broker runs with small segments, consume queue files and index files so that kills also land
on segment rolls and file creation. A failure prints the seed; ``TXMQ_CRASH_SEED=<seed>`` replays
the same kill schedule (the machine's timing still varies).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from txmq.client import AsyncConnection, PullConsumer
from txmq.errors import BrokerUnavailable, RequestTimeout, ResponseCode
from txmq.protocol import (
    PROPERTY_UNIQ_KEY,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    encode_properties,
    from_ext,
    to_ext,
)

pytestmark = pytest.mark.slow

ROUNDS = 22
PRODUCERS = 4
IN_FLIGHT = 16
QUEUES = 4
TOPIC = "crash"

_LAUNCH = """
import asyncio, logging, sys
from txmq.broker import BrokerConfig
from txmq.broker.server import run_server
from txmq.store import FileStore, StoreConfig
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
data, port_file = sys.argv[1], sys.argv[2]
cfg = BrokerConfig(port=0, data_dir=data, topics={"crash": 4})
store = FileStore(data, StoreConfig(mapped_file_size_commit_log=256 * 1024,
                                    mapped_file_size_consume_queue=1000,
                                    max_hash_slot_num=4096, max_index_num=20_000))
asyncio.run(run_server(cfg, port_file=port_file, store=store))
"""


def payload(mid: str, n: int) -> bytes:
    seed = hashlib.sha256(mid.encode()).digest()
    return f"{mid}|".encode() + (seed * (n // 32 + 1))[:n]


def check_body(body: bytes) -> str:
    mid, _, rest = body.partition(b"|")
    assert body == payload(mid.decode(), len(rest)), f"damaged body of {mid!r}"
    return mid.decode()


@dataclass
class Acks:
    by_id: dict[str, tuple[int, int]] = field(default_factory=dict)  # msg id -> (queue, offset)
    sent: set[str] = field(default_factory=set)


class Broker:
    def __init__(self, data: Path) -> None:
        self.data, self.proc, self.port = data, None, 0
        self.log = open(data.parent / "broker.log", "ab")  # noqa: SIM115

    def start(self) -> None:
        port_file = self.data.parent / "port"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(self.data), str(port_file)],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert self.proc.poll() is None, f"broker died at start; see {self.log.name}"
            assert time.monotonic() < deadline, "broker did not start"
            time.sleep(0.01)
        self.port = int(port_file.read_text())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()


async def produce(port: int, rnd: int, p: int, acks: Acks, rng: random.Random) -> None:
    """Pipelined sends on one connection until the broker goes away."""
    conn = AsyncConnection(f"127.0.0.1:{port}", timeout_ms=20_000)
    try:
        await conn.connect()
    except BrokerUnavailable:
        return
    window: set[asyncio.Task[None]] = set()
    seq = 0

    async def one(mid: str, qid: int, body: bytes) -> None:
        h = SendMessageRequestHeader(producer_group="crash", topic=TOPIC, queue_id=qid,
                                     properties=encode_properties({PROPERTY_UNIQ_KEY: mid}),
                                     born_timestamp=1)
        r = await conn.request(RequestCode.SEND_MESSAGE, to_ext(h), body)
        if r.code == ResponseCode.SUCCESS:
            sent = from_ext(r.ext, SendMessageResponseHeader)
            assert sent.queue_id == qid and sent.transaction_id is None
            acks.by_id[mid] = (qid, sent.queue_offset)

    try:
        while not conn.closed:
            while len(window) < IN_FLIGHT:
                mid = f"R{rnd:02d}P{p}S{seq:06d}"
                acks.sent.add(mid)
                t = asyncio.create_task(one(mid, seq % QUEUES, payload(mid, rng.randint(50, 2000))))
                window.add(t)
                seq += 1
            done, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.exception() is not None and not isinstance(t.exception(),
                                                                (BrokerUnavailable, RequestTimeout)):
                    raise t.exception()  # type: ignore[misc]
    finally:
        for t in window:
            t.cancel()
        await asyncio.gather(*window, return_exceptions=True)
        await conn.close()


async def round_under_load(broker: Broker, rnd: int, acks: Acks, rng: random.Random) -> None:
    tasks = [asyncio.create_task(produce(broker.port, rnd, p, acks, random.Random(rng.random())))
             for p in range(PRODUCERS)]
    await asyncio.sleep(rng.uniform(0.05, 0.8))
    broker.kill()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


def read_everything(port: int) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = {}
    with PullConsumer(f"127.0.0.1:{port}") as pc:
        for qid in range(QUEUES):
            msgs, off = [], 0
            while True:
                r = pc.pull(TOPIC, qid, off, 1024)
                if not r.messages:
                    break
                msgs += [(m.queue_offset, check_body(m.body)) for m in r.messages]
                off = r.next_begin_offset
            out[qid] = msgs
    return out


def test_acknowledged_messages_survive_repeated_sigkill(tmp_path: Path) -> None:
    seed = int(os.environ.get("TXMQ_CRASH_SEED", random.randrange(1 << 30)))
    print(f"crash test seed {seed}")
    rng = random.Random(seed)
    broker = Broker(tmp_path / "data")
    acks = Acks()
    t0 = time.monotonic()
    try:
        for rnd in range(ROUNDS):
            broker.start()
            asyncio.run(round_under_load(broker, rnd, acks, rng))
        broker.start()
        stored = read_everything(broker.port)
    finally:
        broker.stop()
    elapsed = time.monotonic() - t0
    assert len(acks.by_id) >= 500, f"too little load to mean anything ({len(acks.by_id)} acks)"
    seen: dict[str, tuple[int, int]] = {}
    for qid, msgs in stored.items():
        assert [off for off, _ in msgs] == list(range(len(msgs))), f"queue {qid} has gaps"
        last: dict[str, int] = {}
        for off, mid in msgs:
            assert mid in acks.sent, f"{mid} was never sent"
            assert mid not in seen, f"{mid} stored twice: {seen[mid]} and {(qid, off)}"
            seen[mid] = (qid, off)
            producer, s = mid.rsplit("S", 1)
            assert int(s) > last.get(producer, -1), f"queue {qid}: {mid} out of order"
            last[producer] = int(s)
    missing = {mid: where for mid, where in acks.by_id.items() if seen.get(mid) != where}
    assert not missing, (f"{len(missing)} acknowledged messages lost or moved, e.g. "
                         f"{list(missing.items())[:5]}")
    print(f"{ROUNDS} SIGKILLs, {len(acks.by_id)} acknowledged, {len(seen)} stored, "
          f"{len(acks.sent)} sent, {elapsed:.1f} s")
