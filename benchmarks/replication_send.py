"""Send throughput of a replicated broker group against a single broker, in one run (issue #25).

Variants, alternated round by round (real broker processes, SYNC_FLUSH, 1 KiB bodies, one
connection with 64 sends in flight, ``SECONDS`` of sending after a warm-up):

- ``single``: one ASYNC_MASTER, no HA listener;
- ``async_pair``: ASYNC_MASTER + SLAVE (the slave's lag in bytes is read when sending stops);
- ``sync_pair``: SYNC_MASTER + SLAVE (every answer waits for the slave's fsync).

Then an empty slave is started against the last master and timed until its commit log equals the
master's (catch-up, MiB/s). Prints a table and one JSON line::

    uv run --locked python benchmarks/replication_send.py [--rounds 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from txmq.client import AsyncConnection
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_UNIQ_KEY,
    RequestCode,
    SendMessageRequestHeader,
    encode_properties,
    to_ext,
)
from txmq.testing import BrokerProcess, free_port, wait_until

IN_FLIGHT = 64
BODY = os.urandom(1024)


def log_size(bp: BrokerProcess) -> int:
    d = bp.data_dir / "store" / "commitlog"
    return sum(p.stat().st_size for p in d.iterdir()) if d.exists() else 0


async def _load(addr: str, seconds: float, warm: float) -> int:
    """Acknowledged sends in ``seconds`` after ``warm`` seconds of sending."""
    conn = AsyncConnection(addr, timeout_ms=30_000)
    await conn.connect()
    ok, counting, seq = [0], [False], [0]
    stop = time.monotonic() + warm + seconds

    async def worker() -> None:
        while time.monotonic() < stop:
            seq[0] += 1
            h = SendMessageRequestHeader(producer_group="pg", topic="bench", queue_id=seq[0] % 4,
                                         properties=encode_properties({PROPERTY_UNIQ_KEY: f"M{seq[0]}"}),
                                         born_timestamp=int(time.time() * 1000))
            r = await conn.request(RequestCode.SEND_MESSAGE, to_ext(h), BODY)
            if counting[0] and r.code == ResponseCode.SUCCESS:
                ok[0] += 1

    async def window() -> None:
        await asyncio.sleep(warm)
        counting[0] = True

    await asyncio.gather(window(), *(worker() for _ in range(IN_FLIGHT)))
    await conn.close()
    return ok[0]


def _group(root: Path, variant: str) -> tuple[BrokerProcess, BrokerProcess | None]:
    ha = free_port()
    role = {"single": "ASYNC_MASTER", "async_pair": "ASYNC_MASTER", "sync_pair": "SYNC_MASTER"}[variant]
    master = BrokerProcess(root / "master", {"broker_role": role, "topics": {"bench": 4},
                                             "ha_listen_port": -1 if variant == "single" else ha})
    slave = None if variant == "single" else BrokerProcess(
        root / "slave", {"broker_role": "SLAVE", "broker_id": 1, "topics": {"bench": 4},
                         "ha_master_address": f"127.0.0.1:{ha}"})
    master.start()
    if slave is not None:
        slave.start()
    return master, slave


def one(variant: str, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="txmq-repl-") as tmp:
        master, slave = _group(Path(tmp), variant)
        try:
            if variant == "sync_pair":  # until the slave is connected, sends answer SLAVE_NOT_AVAILABLE
                wait_until(lambda: asyncio.run(_load(master.endpoints, 0.2, 0.0)) > 0, 30)
            n = asyncio.run(_load(master.endpoints, seconds, 1.0))
            lag = log_size(master) - log_size(slave) if slave is not None else 0
            return {"rate": n / seconds, "lag_bytes": lag}
        finally:
            for bp in (slave, master):
                if bp is not None:
                    bp.stop()


def catch_up(seconds: float) -> dict[str, float]:
    """Fill a master for ``seconds``, then time an empty slave's catch-up."""
    with tempfile.TemporaryDirectory(prefix="txmq-repl-") as tmp:
        master, _ = _group(Path(tmp), "single")
        master.stop()
        ha = free_port()
        master.config["ha_listen_port"] = ha
        master.start()
        try:
            asyncio.run(_load(master.endpoints, seconds, 0.0))
            size = log_size(master)
            slave = BrokerProcess(Path(tmp) / "slave", {"broker_role": "SLAVE", "broker_id": 1,
                                                         "topics": {"bench": 4},
                                                         "ha_master_address": f"127.0.0.1:{ha}"})
            t0 = time.monotonic()
            slave.start()
            try:
                wait_until(lambda: log_size(slave) >= size, 600)
                dt = time.monotonic() - t0
            finally:
                slave.stop()
            return {"mib": size / 2**20, "seconds": dt, "mib_per_s": size / 2**20 / dt}
        finally:
            master.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    variants = ["single", "sync_pair", "async_pair"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(a.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            runs[v].append(one(v, a.seconds))
            print(f"round {r + 1} {v:10s} {runs[v][-1]['rate']:8.0f} msg/s  "
                  f"slave lag {runs[v][-1]['lag_bytes']} B", flush=True)
    med = {v: statistics.median(x["rate"] for x in runs[v]) for v in variants}
    cu = catch_up(a.seconds * 2)
    print(f"median msg/s: {', '.join(f'{v} {med[v]:.0f}' for v in variants)}")
    print(f"sync_pair / single {med['sync_pair'] / med['single']:.2f}, "
          f"async_pair / single {med['async_pair'] / med['single']:.2f}")
    print(f"empty slave catch-up: {cu['mib']:.1f} MiB in {cu['seconds']:.1f} s "
          f"({cu['mib_per_s']:.1f} MiB/s)")
    print(json.dumps({"runs": runs, "median": med, "catch_up": cu}))


if __name__ == "__main__":
    main()
