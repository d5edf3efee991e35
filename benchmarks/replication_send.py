"""Send throughput of a replicated broker group against a single broker, the slave's lag under that
load, and the catch-up time of an empty slave, in one run (issue #25; docs/benchmarks.md).

Variants, alternated round by round (the order reverses every other round; real broker processes,
SYNC_FLUSH, 1 KiB bodies, one connection with 64 sends in flight, ``SECONDS`` of sending after a
1 s warm-up):

- ``single``: one ASYNC_MASTER, no HA listener;
- ``async_pair``: ASYNC_MASTER + SLAVE;
- ``sync_pair``: SYNC_MASTER + SLAVE (every answer waits for the slave's fsync).

For the pairs, after the counted seconds, the load goes on for ``LAG_SECONDS`` more while the
slave's lag is sampled every ``LAG_SAMPLE_MS`` (sampling is not free for the brokers, so it stays
out of the counted seconds): in bytes (the master's commit log end less the slave's, read with
GET_BROKER_RUNTIME_INFO, master first) and in ms (how long after the master's end was read the
slave's end passed it; resolution: one sampling period). Then a master is filled with
``--catch-up-mib`` MiB (ASYNC_FLUSH, 256 KiB bodies) and an
empty slave is started against it and timed from the moment it listens (it connects to its master
then) until its commit log ends where the master's does; its process start is reported apart (on a
loaded machine, importing Python modules can take longer than the copy). Prints a table and one
JSON line::

    uv run --locked python benchmarks/replication_send.py [--rounds 5] [--seconds 4] [--catch-up-mib 1024]
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
    BrokerRuntimeInfo,
    RequestCode,
    SendMessageRequestHeader,
    encode_properties,
    to_ext,
)
from txmq.testing import BrokerProcess, free_port, wait_until

IN_FLIGHT = 64
BODY = os.urandom(1024)
FILL_BODY = os.urandom(256 * 1024)
LAG_SAMPLE_MS = 20
LAG_SECONDS = 2.0
VARIANTS = ["single", "sync_pair", "async_pair"]


async def _end(conn: AsyncConnection) -> tuple[int, float]:
    """(the broker's commit log end, when it was read: time.monotonic)."""
    r = await conn.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    return BrokerRuntimeInfo.decode(r.body).commit_log_max_offset, time.monotonic()


class LagSampler:
    """Samples the master's and the slave's commit log ends while the load runs."""

    def __init__(self, master: str, slave: str) -> None:
        self.addrs = (master, slave)
        self.lag_bytes: list[int] = []
        self.lag_ms: list[float] = []

    async def run(self, stop: float) -> None:
        m, s = (AsyncConnection(a, timeout_ms=30_000) for a in self.addrs)
        await m.connect()
        await s.connect()
        pending: list[tuple[int, float]] = []  # master ends not yet reached by the slave
        try:
            while time.monotonic() < stop:
                m_end, t = await _end(m)
                s_end, t_s = await _end(s)
                self.lag_bytes.append(max(0, m_end - s_end))
                pending.append((m_end, t))
                while pending and pending[0][0] <= s_end:
                    self.lag_ms.append((t_s - pending.pop(0)[1]) * 1000)
                await asyncio.sleep(LAG_SAMPLE_MS / 1000)
        finally:
            await m.close()
            await s.close()


async def _load(
    addr: str, seconds: float, warm: float, body: bytes = BODY, sampler: LagSampler | None = None
) -> int:
    """Acknowledged sends in ``seconds`` after ``warm`` seconds of sending (the sampler, if any,
    runs during the counted seconds)."""
    conn = AsyncConnection(addr, timeout_ms=30_000)
    await conn.connect()
    ok, counting, seq = [0], [False], [0]
    stop = time.monotonic() + warm + seconds

    async def worker() -> None:
        while time.monotonic() < stop:
            seq[0] += 1
            h = SendMessageRequestHeader(
                producer_group="pg",
                topic="bench",
                queue_id=seq[0] % 4,
                properties=encode_properties({PROPERTY_UNIQ_KEY: f"M{seq[0]}"}),
                born_timestamp=int(time.time() * 1000),
            )
            r = await conn.request(RequestCode.SEND_MESSAGE, to_ext(h), body)
            if counting[0] and r.code == ResponseCode.SUCCESS:
                ok[0] += 1

    async def window() -> None:
        await asyncio.sleep(warm)
        counting[0] = True
        if sampler is not None:
            await sampler.run(stop)

    await asyncio.gather(window(), *(worker() for _ in range(IN_FLIGHT)))
    await conn.close()
    return ok[0]


def _slave(root: Path, ha: int) -> BrokerProcess:
    return BrokerProcess(
        root / "slave",
        {
            "broker_role": "SLAVE",
            "broker_id": 1,
            "topics": {"bench": 4},
            "ha_master_address": f"127.0.0.1:{ha}",
        },
    )


def _group(root: Path, variant: str) -> tuple[BrokerProcess, BrokerProcess | None]:
    ha = free_port()
    role = {"single": "ASYNC_MASTER", "async_pair": "ASYNC_MASTER", "sync_pair": "SYNC_MASTER"}[variant]
    master = BrokerProcess(
        root / "master",
        {"broker_role": role, "topics": {"bench": 4}, "ha_listen_port": -1 if variant == "single" else ha},
    )
    slave = None if variant == "single" else _slave(root, ha)
    master.start()
    if slave is not None:
        slave.start()
    return master, slave


def _median(xs: list[float] | list[int]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _p95(xs: list[float] | list[int]) -> float:
    return float(sorted(xs)[int(0.95 * (len(xs) - 1))]) if xs else 0.0


def one(variant: str, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="txmq-repl-") as tmp:
        master, slave = _group(Path(tmp), variant)
        try:
            if variant == "sync_pair":  # until the slave is connected, sends answer SLAVE_NOT_AVAILABLE
                wait_until(lambda: asyncio.run(_load(master.endpoints, 0.2, 0.0)) > 0, 30)
            elif slave is not None:  # until the slave follows: a send, and its end equals the master's
                asyncio.run(_load(master.endpoints, 0.1, 0.0))
                wait_until(lambda: _in_step(master, slave), 30)
            n = asyncio.run(_load(master.endpoints, seconds, 1.0))
            out: dict[str, Any] = {"rate": n / seconds}
            if slave is not None:  # then the lag, under the same load (sampling costs the brokers)
                sampler = LagSampler(master.endpoints, slave.endpoints)
                asyncio.run(_load(master.endpoints, LAG_SECONDS, 0.5, sampler=sampler))
                out.update(
                    lag_bytes_median=_median(sampler.lag_bytes),
                    lag_bytes_p95=_p95(sampler.lag_bytes),
                    lag_ms_median=_median(sampler.lag_ms),
                    lag_ms_p95=_p95(sampler.lag_ms),
                    lag_samples=len(sampler.lag_bytes),
                )
            return out
        finally:
            for bp in (slave, master):
                if bp is not None:
                    bp.stop()


def _in_step(master: BrokerProcess, slave: BrokerProcess) -> bool:
    m, s = asyncio.run(_ends(master.endpoints, slave.endpoints))
    return m == s > 0


async def _ends(*addrs: str) -> list[int]:
    out = []
    for a in addrs:
        conn = AsyncConnection(a, timeout_ms=30_000)
        await conn.connect()
        try:
            out.append((await _end(conn))[0])
        finally:
            await conn.close()
    return out


async def _fill(addr: str, size: int) -> None:
    """Send FILL_BODY messages until the commit log holds ``size`` bytes."""
    while (await _ends(addr))[0] < size:
        await _load(addr, 1.0, 0.0, FILL_BODY)


def catch_up(mib: int) -> dict[str, float]:
    """Fill a master with ``mib`` MiB, then time an empty slave's catch-up."""
    with tempfile.TemporaryDirectory(prefix="txmq-repl-") as tmp:
        ha = free_port()
        master = BrokerProcess(
            Path(tmp) / "master",
            {"topics": {"bench": 4}, "ha_listen_port": ha, "flush_disk_type": "ASYNC_FLUSH"},
        )
        master.start()
        try:
            asyncio.run(_fill(master.endpoints, mib * 2**20))
            [size] = asyncio.run(_ends(master.endpoints))
            slave = _slave(Path(tmp), ha)
            t0 = time.monotonic()
            slave.start()
            listening = time.monotonic()  # it connects to the master as it starts listening
            try:
                wait_until(lambda: asyncio.run(_ends(slave.endpoints))[0] >= size, 3600)
                done = time.monotonic()
            finally:
                slave.stop()
            dt = done - listening
            return {
                "mib": size / 2**20,
                "seconds": dt,
                "mib_per_s": size / 2**20 / dt,
                "process_start_seconds": listening - t0,
            }
        finally:
            master.stop()


def _report(runs: dict[str, list[dict[str, Any]]], cu: dict[str, float] | None) -> None:
    med = {v: _median([x["rate"] for x in runs[v]]) for v in VARIANTS}
    print(f"median msg/s: {', '.join(f'{v} {med[v]:.0f}' for v in VARIANTS)}")
    for v in ("sync_pair", "async_pair"):
        per_round = [x["rate"] / s["rate"] for x, s in zip(runs[v], runs["single"], strict=True)]
        lag = {
            k: _median([x[k] for x in runs[v]])
            for k in ("lag_bytes_median", "lag_bytes_p95", "lag_ms_median", "lag_ms_p95")
        }
        print(
            f"{v} / single: {med[v] / med['single']:.2f} (median of per-round ratios "
            f"{_median(per_round):.2f}); slave lag median {lag['lag_bytes_median']:.0f} B "
            f"(p95 {lag['lag_bytes_p95']:.0f} B), {lag['lag_ms_median']:.0f} ms "
            f"(p95 {lag['lag_ms_p95']:.0f} ms)"
        )
    if cu is not None:
        print(
            f"empty slave catch-up: {cu['mib']:.1f} MiB in {cu['seconds']:.1f} s "
            f"({cu['mib_per_s']:.1f} MiB/s) once it listened; its process start took "
            f"{cu['process_start_seconds']:.1f} s more"
        )
    print(json.dumps({"runs": runs, "median": med, "catch_up": cu}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--catch-up-mib", type=int, default=1024, help="0: skip the catch-up")
    a = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(a.rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            runs[v].append(one(v, a.seconds))
            x = runs[v][-1]
            print(
                f"round {r + 1} {v:10s} {x['rate']:8.0f} msg/s  slave lag median "
                f"{x.get('lag_bytes_median', 0):.0f} B {x.get('lag_ms_median', 0):.0f} ms",
                flush=True,
            )
    _report(runs, catch_up(a.catch_up_mib) if a.catch_up_mib else None)


if __name__ == "__main__":
    main()
