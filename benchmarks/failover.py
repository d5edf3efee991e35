"""Automatic failover in controller mode (issue #26; docs/benchmarks.md): real processes on
loopback, three ``txmq controller`` (one Raft group), a name server and broker groups of two
``txmq broker --enable-controller-mode`` each.

1. Failover time. One ``AsyncProducer`` over the name server keeps one SYNC send in flight to
   group ``fo-a`` continuously (after a failed send it waits ``RETRY_PAUSE_MS``). The group's
   master is SIGKILLed; measured is the time from the kill to the first send acknowledged by the
   new master (its answer's ``masterEpoch`` is newer than the killed master's). The old master is
   restarted (it rejoins as slave) and the run waits until the controller's SyncStateSet holds both
   brokers again, then kills the master again: ``--kills`` times. The split comes from the
   processes' log lines (``asctime``, ms): detection (kill -> the controller leader logs the broker
   inactive), lease wait and election (-> "elected broker"), the role change on the broker
   (-> "becoming master"), and the client (-> first acknowledged send).
2. Idle CPU: the three controllers, the name server and two groups of two brokers left idle
   ``--idle-s`` seconds: CPU seconds of every process (``/proc``) over wall time.
3. SYNC send rate (``IN_FLIGHT`` sends outstanding, 1 KiB, ``--rate-s`` seconds) of the
   controller-mode group against a classic SYNC_MASTER + SLAVE pair, alternated ``--rate-rounds``
   times.

Prints a table and one JSON line::

    uv run --locked python benchmarks/failover.py [--kills 10] [--idle-s 30] [--rate-s 4]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import statistics
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from txmq.client import AsyncConnection, AsyncProducer, Message
from txmq.errors import ResponseCode, TxmqError
from txmq.protocol import (
    GetMetaDataResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    RequestCode,
    SyncStateSet,
    decode_controller_body,
    from_ext,
    to_ext,
)
from txmq.testing import (
    BrokerProcess,
    ControllerProcess,
    NamesrvProcess,
    free_port,
    process_cpu_s,
    wait_until,
)

TOPIC = "fo"
GROUP = "fo-a"
IDLE_GROUP = "fo-b"
BODY = os.urandom(1024)
RETRY_PAUSE_MS = 20
"""Pause of the failover producer after a failed send (resolution of the measurement)."""
SEND_TIMEOUT_MS = 3000
"""The failover producer's budget of one send (all attempts)."""
IN_FLIGHT = 16
"""Sends outstanding in the rate comparison."""
STEADY_TIMEOUT_S = 60.0
"""How long a round waits for the group to be whole again (SyncStateSet of two, sends acked)."""


def _stamp(line: str) -> float | None:
    """Wall time (s since the epoch) of a log line that starts with ``asctime``."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _first_after(logs: list[Path], t: float, needle: str) -> float | None:
    """Earliest time >= ``t`` of a line containing ``needle`` in any of ``logs``."""
    found: list[float] = []
    for p in logs:
        with suppress(OSError), open(p, errors="replace") as f:
            for line in f:
                if needle in line and (s := _stamp(line)) is not None and s >= t - 0.001:
                    found.append(s)
    return min(found) if found else None


@dataclass
class Cluster:
    root: Path
    controllers: list[ControllerProcess] = field(default_factory=list)
    namesrv: NamesrvProcess | None = None
    brokers: dict[str, BrokerProcess] = field(default_factory=dict)

    @property
    def controller_addr(self) -> str:
        return ";".join(c.addr for c in self.controllers)

    def start(self, groups: list[str]) -> None:
        raft = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        for i, r in enumerate(raft):
            self.controllers.append(ControllerProcess(
                self.root / f"ctl{i}", "127.0.0.1", 0, r, [x for x in raft if x != r]))
        self.namesrv = NamesrvProcess(self.root / "ns")
        for c in self.controllers:
            c.start()
        self.namesrv.start()
        for g in groups:
            for m in ("1", "2"):
                self.brokers[f"{g}-{m}"] = BrokerProcess(self.root / f"{g}-{m}", {
                    "broker_name": g, "namesrv_addr": self.namesrv.addr,
                    "topics": {TOPIC if g == GROUP else "idle": 4},
                    "enable_controller_mode": True, "controller_addr": self.controller_addr})
        for b in self.brokers.values():
            b.start()

    def procs(self) -> list[Any]:
        return [*self.controllers, self.namesrv, *self.brokers.values()]

    def stop(self) -> None:
        for p in self.procs():
            if p is not None and p.proc is not None:
                with suppress(Exception):
                    p.stop()


async def _request(addr: str, code: int, ext: dict[str, str] | None = None) -> Any:
    conn = AsyncConnection(addr, timeout_ms=2000)
    await conn.connect()
    try:
        return await conn.request(code, ext)
    finally:
        await conn.close()


async def _leader(addrs: list[str]) -> str:
    """The controller leader's remoting address, as the first controller that knows says."""
    for a in addrs:
        with suppress(TxmqError, OSError):
            r = await _request(a, RequestCode.CONTROLLER_GET_METADATA_INFO)
            if r.code == ResponseCode.SUCCESS:
                h = from_ext(r.ext, GetMetaDataResponseHeader)
                if h.controller_leader_address:
                    return h.controller_leader_address
    return ""


async def _replica_info(addrs: list[str], group: str) -> tuple[str, int, frozenset[int]]:
    """(master address, master epoch, SyncStateSet) of ``group`` as the controller leader says."""
    leader = await _leader(addrs)
    if not leader:
        return "", 0, frozenset()
    conn = AsyncConnection(leader, timeout_ms=2000)
    await conn.connect()
    try:
        r = await conn.request(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                               to_ext(GetReplicaInfoRequestHeader(broker_name=group)))
    finally:
        await conn.close()
    if r.code != ResponseCode.SUCCESS:
        return "", 0, frozenset()
    h = from_ext(r.ext, GetReplicaInfoResponseHeader)
    sss = decode_controller_body(r.body, SyncStateSet)
    return h.master_address or "", h.master_epoch or 0, frozenset(sss.sync_state_set)


class Sender:
    """One SYNC send in flight, continuously; remembers (monotonic, wall, masterEpoch) of acks."""

    def __init__(self, namesrv: str) -> None:
        self.p = AsyncProducer("bench-fo", namesrv_addr=namesrv, timeout_ms=SEND_TIMEOUT_MS)
        self.acks: list[tuple[float, float, int]] = []
        self.failed = 0
        self.stopped = False

    async def run(self) -> None:
        await self.p.start()
        try:
            while not self.stopped:
                try:
                    r = await self.p.send(Message(topic=TOPIC, body=BODY))
                    self.acks.append((time.monotonic(), time.time(), r.master_epoch or 0))
                except TxmqError:
                    self.failed += 1
                    await asyncio.sleep(RETRY_PAUSE_MS / 1000)
        finally:
            await self.p.shutdown()

    async def first_ack_after(self, t: float, epoch: int, timeout_s: float) -> tuple[float, float]:
        deadline = time.monotonic() + timeout_s
        i = bisect.bisect_right([a[0] for a in self.acks], t)
        while time.monotonic() < deadline:
            for mono, wall, e in self.acks[i:]:
                if e > epoch:
                    return mono, wall
            i = len(self.acks)
            await asyncio.sleep(0.01)
        raise TimeoutError(f"no send acknowledged in an epoch after {epoch}")


async def _whole(c: Cluster, s: Sender) -> tuple[str, int]:
    """Wait until the group's SyncStateSet holds both brokers and a send was acked since."""
    addrs = [x.addr for x in c.controllers]
    deadline = time.monotonic() + STEADY_TIMEOUT_S
    while time.monotonic() < deadline:
        with suppress(TxmqError, OSError):
            master, epoch, sss = await _replica_info(addrs, GROUP)
            if len(sss) == 2 and master:
                t = time.monotonic()
                await s.first_ack_after(t, epoch - 1, STEADY_TIMEOUT_S)
                return master, epoch
        await asyncio.sleep(0.2)
    raise TimeoutError("the group did not become whole again")


async def _kill_round(c: Cluster, s: Sender) -> dict[str, float]:
    master_addr, epoch = await _whole(c, s)
    victim = next(b for b in c.brokers.values() if b.addr == master_addr)
    await asyncio.sleep(0.5)  # sends flowing at full rate
    t_kill, w_kill = time.monotonic(), time.time()
    victim.kill()
    t_ack, w_ack = await s.first_ack_after(t_kill, epoch, 30)
    ctl_logs = [x.log_path for x in c.controllers]
    new_logs = [b.log_path for b in c.brokers.values() if b is not victim]
    inactive = _first_after(ctl_logs, w_kill, f"broker {GROUP}/")
    elected = _first_after(ctl_logs, w_kill, f"master of {GROUP}, epoch {epoch + 1}")
    became = _first_after(new_logs, w_kill, f"becoming master, epoch {epoch + 1}")
    out = {"seconds": t_ack - t_kill, "epoch": epoch + 1}
    marks = [("detect", inactive), ("lease_elect", elected), ("role", became), ("client", w_ack)]
    prev = w_kill
    for name, w in marks:
        if w is not None:
            out[name] = w - prev
            prev = w
    await asyncio.to_thread(victim.start)  # rejoins as slave
    return out


async def _failover(c: Cluster, kills: int) -> list[dict[str, float]]:
    s = Sender(c.namesrv.addr if c.namesrv else "")
    task = asyncio.create_task(s.run())
    rounds: list[dict[str, float]] = []
    try:
        for i in range(kills):
            r = await _kill_round(c, s)
            rounds.append(r)
            split = " ".join(f"{k} {r[k]:.2f}" for k in ("detect", "lease_elect", "role", "client")
                             if k in r)
            print(f"kill {i + 1}: first ack by the new master (epoch {r['epoch']:.0f}) "
                  f"{r['seconds']:.2f} s after the kill ({split})", flush=True)
        await _whole(c, s)
    finally:
        s.stopped = True
        await task
    return rounds


def _idle_cpu(c: Cluster, seconds: float) -> dict[str, float]:
    pids = {name: p.proc.pid for name, p in _named(c).items()}
    before = {n: process_cpu_s(pid) for n, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    used = {n: process_cpu_s(pid) - before[n] for n, pid in pids.items()}
    out = {f"{n}_pct": 100 * u / wall for n, u in used.items()}
    out["total_pct"] = 100 * sum(used.values()) / wall
    out["wall_s"] = wall
    return out


def _named(c: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {f"controller{i}": x for i, x in enumerate(c.controllers)}
    out["namesrv"] = c.namesrv
    out.update(c.brokers)
    return out


async def _rate(addr: str, seconds: float) -> float:
    """Acknowledged SYNC sends per second to broker ``addr`` (IN_FLIGHT outstanding)."""
    p = AsyncProducer("bench-rate", endpoints=addr, timeout_ms=10_000)
    await p.start()
    ok = [0]
    stop = time.monotonic() + seconds + 0.5
    count_from = time.monotonic() + 0.5

    async def worker() -> None:
        while time.monotonic() < stop:
            with suppress(TxmqError):
                await p.send(Message(topic=TOPIC, body=BODY))
                if time.monotonic() >= count_from:
                    ok[0] += 1

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    await p.shutdown()
    return ok[0] / seconds


def _classic_rate(root: Path, seconds: float) -> float:
    ha = free_port()
    m = BrokerProcess(root / "m", {"broker_role": "SYNC_MASTER", "topics": {TOPIC: 4},
                                   "ha_listen_port": ha})
    s = BrokerProcess(root / "s", {"broker_role": "SLAVE", "broker_id": 1, "topics": {TOPIC: 4},
                                   "ha_master_address": f"127.0.0.1:{ha}"})
    m.start()
    s.start()
    try:
        wait_until(lambda: asyncio.run(_rate(m.addr, 0.2)) > 0, 30)
        return asyncio.run(_rate(m.addr, seconds))
    finally:
        s.stop()
        m.stop()


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--rate-s", type=float, default=4.0, help="0: skip the rate comparison")
    ap.add_argument("--rate-rounds", type=int, default=3)
    ap.add_argument("--keep", help="keep the processes' directories here (logs)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="txmq-fo-") as tmp:
        root = Path(a.keep or tmp)
        c = Cluster(root / "cluster")
        try:
            c.start([GROUP, IDLE_GROUP])
            asyncio.run(_whole_once(c))
            idle = _idle_cpu(c, a.idle_s)
            each = ", ".join(f"{k[:-4]} {v:.2f}" for k, v in idle.items()
                             if k.endswith("_pct") and k != "total_pct")
            print(f"idle CPU, 3 controllers + name server + 2 groups x 2 brokers, "
                  f"{idle['wall_s']:.0f} s: {idle['total_pct']:.2f} % of one core ({each})",
                  flush=True)
            rounds = asyncio.run(_failover(c, a.kills))
            rates: dict[str, list[float]] = {"controller": [], "classic": []}
            for r in range(a.rate_rounds if a.rate_s else 0):
                master, _, _ = asyncio.run(_replica_info([x.addr for x in c.controllers], GROUP))
                rates["controller"].append(asyncio.run(_rate(master, a.rate_s)))
                rates["classic"].append(_classic_rate(root / f"classic{r}", a.rate_s))
                print(f"rate round {r + 1}: controller mode {rates['controller'][-1]:.0f} msg/s, "
                      f"classic SYNC_MASTER {rates['classic'][-1]:.0f} msg/s", flush=True)
        finally:
            c.stop()
    _report(rounds, idle, rates)


async def _whole_once(c: Cluster) -> None:
    s = Sender(c.namesrv.addr if c.namesrv else "")
    task = asyncio.create_task(s.run())
    try:
        await _whole(c, s)
    finally:
        s.stopped = True
        await task


def _report(rounds: list[dict[str, float]], idle: dict[str, float],
            rates: dict[str, list[float]]) -> None:
    secs = [r["seconds"] for r in rounds]
    parts = {k: _median([r[k] for r in rounds if k in r])
             for k in ("detect", "lease_elect", "role", "client")}
    print(f"failover over {len(secs)} kills: median {_median(secs):.2f} s, max {max(secs):.2f} s, "
          f"min {min(secs):.2f} s; median split: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    print(f"idle CPU: {idle['total_pct']:.2f} % of one core")
    if rates["controller"]:
        mc, mk = _median(rates["controller"]), _median(rates["classic"])
        print(f"SYNC send rate: controller mode {mc:.0f} msg/s, classic {mk:.0f} msg/s, "
              f"ratio {mc / mk:.2f}")
    print(json.dumps({"failover": rounds, "idle": idle, "rates": rates,
                      "load_avg": os.getloadavg()}))


if __name__ == "__main__":
    main()
