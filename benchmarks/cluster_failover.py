"""Sends through a broker kill (issue #23): a name server and three brokers, one
``AsyncProducer`` over the name server keeping ``--in-flight`` sends outstanding; after
``--before-s`` one broker is SIGKILLed. Measured, with latency fault tolerance on (txmq's default)
and off (RocketMQ's default):

- sends that failed (raised to the caller), and how many were in flight to the killed broker;
- acknowledged sends missing after the broker is restarted (read back from every broker);
- time from the kill to full send rate again: the start of the first 100 ms bucket from which on
  three buckets in a row reach 90 % of the median rate before the kill;
- the lowest 100 ms rate after the kill, as a share of the rate before.

Each mode runs ``--repeat`` times (interleaved, a fresh cluster each): this machine is shared, and
one run's rate can dip for reasons of its own.

    uv run --locked python benchmarks/cluster_failover.py [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from pathlib import Path

from txmq.client import AsyncProducer, Message, PullConsumer, PullStatus
from txmq.testing import ClusterProcess, run_cluster

TOPIC = "failover"
QUEUES = 4
BUCKET_S = 0.1
FULL_RATE_SHARE = 0.9
FULL_RATE_BUCKETS = 3
VICTIM = "broker-b"


async def _load(c: ClusterProcess, fault_tolerance: bool, in_flight: int, before_s: float,
                after_s: float) -> dict[str, object]:
    p = AsyncProducer("bench-failover", namesrv_addr=c.namesrv_addr,
                      send_latency_fault_enable=fault_tolerance)
    await p.start()
    acked: list[tuple[float, str, str]] = []  # (done at, msg id, broker)
    failed: list[float] = []
    t0 = time.monotonic()
    stop = t0 + before_s + after_s
    kill_at = t0 + before_s
    seq = [0]

    async def sender() -> None:
        while time.monotonic() < stop:
            seq[0] += 1
            try:
                r = await p.send(Message(topic=TOPIC, body=b"x" * 256, keys=str(seq[0])))
                acked.append((time.monotonic() - t0, r.msg_id, r.broker_name))
            except Exception:
                failed.append(time.monotonic() - t0)

    async def killer() -> None:
        await asyncio.sleep(kill_at - time.monotonic())
        await asyncio.to_thread(c.kill, VICTIM)

    await asyncio.gather(killer(), *(sender() for _ in range(in_flight)))
    await p.shutdown()
    return {"acked": acked, "failed": failed, "t_kill": before_s,
            "send_failures": dict(p.send_failures)}


def _rates(acked: list[tuple[float, str, str]], total_s: float) -> list[int]:
    n = int(total_s / BUCKET_S) + 1
    buckets = [0] * n
    for t, _, _ in acked:
        buckets[min(int(t / BUCKET_S), n - 1)] += 1
    return buckets


def _recovery(buckets: list[int], t_kill: float) -> tuple[float, float, float]:
    """(time to full rate in s, lowest share after the kill, rate before in msgs/s)."""
    k = int(t_kill / BUCKET_S)
    before = statistics.median(buckets[int(1 / BUCKET_S):k])
    after = buckets[k:-1]
    for i in range(len(after) - FULL_RATE_BUCKETS + 1):
        if all(b >= FULL_RATE_SHARE * before for b in after[i:i + FULL_RATE_BUCKETS]):
            return i * BUCKET_S, min(after) / before, before / BUCKET_S
    return float("inf"), min(after) / before, before / BUCKET_S


def _stored_ids(c: ClusterProcess) -> set[str]:
    ids: set[str] = set()
    for b in c.brokers.values():
        with PullConsumer(b.endpoints) as pc:
            for q in range(QUEUES):
                off = pc.min_offset(TOPIC, q)
                while True:
                    r = pc.pull(TOPIC, q, off, 256)
                    if r.status is not PullStatus.FOUND:
                        break
                    ids.update(m.msg_id for m in r.messages)
                    off = r.next_begin_offset
    return ids


def run(fault_tolerance: bool, in_flight: int, before_s: float, after_s: float,
        ) -> dict[str, object]:
    with run_cluster(3, topics={TOPIC: QUEUES}) as c:
        res = asyncio.run(_load(c, fault_tolerance, in_flight, before_s, after_s))
        c.restart(VICTIM)
        stored = _stored_ids(c)
    acked = res["acked"]
    assert isinstance(acked, list)
    failed = res["failed"]
    assert isinstance(failed, list)
    buckets = _rates(acked, before_s + after_s)
    recovery_s, low, rate = _recovery(buckets, before_s)
    lost = [mid for _, mid, _ in acked if mid not in stored]
    return {"fault_tolerance": fault_tolerance, "acked": len(acked), "failed": len(failed),
            "lost": len(lost), "rate_before_per_s": rate, "recovery_s": recovery_s,
            "lowest_share_after_kill": low, "send_failures_by_broker": res["send_failures"],
            "acked_by_victim_after_kill": sum(1 for t, _, b in acked
                                              if b == VICTIM and t > before_s)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--before-s", type=float, default=4.0)
    ap.add_argument("--after-s", type=float, default=6.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each mode, interleaved")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    logging.getLogger("txmq").setLevel(logging.ERROR)
    rows = [run(ft, a.in_flight, a.before_s, a.after_s)
            for _ in range(a.repeat) for ft in (True, False)]
    for r in rows:
        print(json.dumps(r))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
