"""One SDK workload against a running broker, for ``benchmarks/sdk_baseline.py``: async sends at
``--in-flight`` outstanding through ``AsyncProducer``, then a ``PushConsumer`` draining them from the
first offset. Uses only the public API that txmq's SDK has had since its first release, so the same
file runs under an older build of txmq. Prints one JSON line: send and drain rates (msgs/s) and this
process's CPU seconds of each phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import threading
import time

from txmq.client import AsyncProducer, ConsumeStatus, Message, MessageExt, PushConsumer


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _send(endpoints: str, topic: str, n: int, in_flight: int, body: bytes) -> float:
    p = AsyncProducer("bench-sdk", endpoints)
    await p.start()
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await p.send(Message(topic=topic, body=body, keys=str(i)))

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t0)
    finally:
        await p.shutdown()


def _drain(endpoints: str, topic: str, n: int, timeout_s: float) -> float:
    seen: set[str] = set()
    done = threading.Event()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            seen.update(m.msg_id for m in msgs)
            if len(seen) >= n:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(f"bench-sdk-{topic}", endpoints, listener,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(topic)
    t0 = time.perf_counter()
    c.start()
    try:
        if not done.wait(timeout_s):
            raise SystemExit(f"drained {len(seen)} of {n} in {timeout_s} s")
        return n / (time.perf_counter() - t0)
    finally:
        c.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--body-bytes", type=int, default=1024)
    a = ap.parse_args()
    cpu0 = _cpu_s()
    send = asyncio.run(_send(a.endpoints, a.topic, a.messages, a.in_flight, b"x" * a.body_bytes))
    cpu1 = _cpu_s()
    drain = _drain(a.endpoints, a.topic, a.messages, 300.0)
    cpu2 = _cpu_s()
    print(json.dumps({"send_per_s": send, "drain_per_s": drain, "send_cpu_s": cpu1 - cpu0,
                      "drain_cpu_s": cpu2 - cpu1}))


if __name__ == "__main__":
    main()
