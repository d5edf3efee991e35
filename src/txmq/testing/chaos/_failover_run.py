"""One failover chaos run (``txmq chaos --cluster``): the bed (:mod:`._bed`), a plain and a
transactional producer and a consumer in each of two groups in the client hosts, the seeded
failover nemesis, then the checks and figures over the histories and a final scan of every
group's master.

Checks: :func:`~txmq.testing.chaos.check` (acknowledged sends and committed transactions stored
and consumed by both groups, rolled-back ones not, one terminal state per transaction, consumer
offsets that never skip and move back only across a master change) over the scan, the producer's
local transaction records, the groups' side effects and the offsets sampled on each group's
master (:mod:`._failover_obs`), and :func:`~txmq.testing.chaos.failover_violations`. Figures: downtime per
fault window and failover time per master kill (:mod:`._failover_check`).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from txmq import limits
from txmq.client import PullConsumer
from txmq.errors import NetnsUnavailable, TxmqError
from txmq.testing._netns import netns_unavailable
from txmq.testing.chaos._bed import FailoverBed, controller_unavailable, wait_for_masters
from txmq.testing.chaos._check import Observation, Stored, Violation, check
from txmq.testing.chaos._failover import (
    FAILOVER_KINDS,
    ClusterSpec,
    NoTarget,
    Step,
    Topology,
    View,
    failover_schedule,
    plan,
)
from txmq.testing.chaos._failover_check import (
    FailoverTime,
    MasterKill,
    WindowDowntime,
    downtime_per_fault,
    failover_summary,
    failover_times,
    failover_violations,
)
from txmq.testing.chaos._failover_obs import OffsetSampler, drain, effects, tx_local
from txmq.testing.chaos._history import read_histories
from txmq.testing.chaos._nemesis import Fault
from txmq.testing.chaos._procs import Worker
from txmq.testing.chaos._spec import GROUPS, TOPICS, prepare_databases
from txmq.testing.chaos._worker import NAMESRV_PREFIX

__all__ = ["FailoverConfig", "FailoverResult", "NemesisBed", "drive_nemesis", "run_failover_chaos"]

_QUEUES = 2
ELECTION_TIMEOUT_S = 60.0
"""How long the bed may take to elect a master in every group at start (a loaded 2-core machine
takes ~30 s to start a dozen Python processes)."""
_SETTLE_S = 10.0
"""After healing, the run waits this long for elections and routes to settle before it stops the
producers (two controller heartbeat timeouts and a lease, with room)."""
_ROLES = {"plain": "plain", "tx": "tx", GROUPS[0]: "consumer", GROUPS[1]: "consumer"}


class FailoverConfig(msgspec.Struct, kw_only=True):
    """A failover run's parameters (``duration_s``: the span the faults spread over)."""

    seed: int = 1
    faults: int = 10
    duration_s: float = 120.0
    warmup_s: float = 5.0
    spec: ClusterSpec = msgspec.field(default_factory=ClusterSpec)
    kinds: tuple[str, ...] = FAILOVER_KINDS
    quiesce_timeout_s: float = limits.CHAOS_QUIESCE_TIMEOUT_MS / 1000


class FailoverResult(msgspec.Struct, kw_only=True):
    """What a failover run found: its schedule (targets and times filled in), violations,
    operation counts, downtime per fault window and failover time per master kill."""

    config: FailoverConfig
    schedule: list[Fault]
    violations: list[Violation]
    operations: dict[str, int]
    downtime: list[WindowDowntime]
    failover: list[FailoverTime]
    failover_summary: dict[str, float | int | None]
    notes: list[str] = msgspec.field(default_factory=list)


def refusal() -> str:
    """Why a failover run cannot run here ("" when it can)."""
    return netns_unavailable() or controller_unavailable()


def run_failover_chaos(run: Path, cfg: FailoverConfig) -> FailoverResult:
    """Run ``cfg`` in directory ``run``. Raises NetnsUnavailable (no namespaces, no controller)."""
    if why := refusal():
        raise NetnsUnavailable(f"a failover chaos run cannot run here: {why}")
    (run / "history").mkdir(parents=True, exist_ok=True)
    prepare_databases(run)
    faults = failover_schedule(cfg.seed, cfg.faults, cfg.duration_s, cfg.kinds)
    notes = []
    with FailoverBed(run, cfg.spec, dict.fromkeys(TOPICS.values(), _QUEUES)) as bed:
        bed.start()
        wait_for_masters(bed, ELECTION_TIMEOUT_S)
        assert bed.hosts is not None
        clients = bed.topo.clients
        workers = [Worker(role, name, run, NAMESRV_PREFIX + bed.namesrv_addr,
                          netns=bed.hosts.netns(clients[i % len(clients)]))
                   for i, (name, role) in enumerate(_ROLES.items())]
        sampler = OffsetSampler(lambda: bed.view(leader=False), bed.addr_of, _QUEUES)
        try:
            for w in workers:
                w.start()
            sampler.start()
            time.sleep(cfg.warmup_s)
            kills = drive_nemesis(bed, faults, random.Random(cfg.seed), cfg.spec.controller_lease_ms)
            bed.heal_all()
            time.sleep(_SETTLE_S)
            (run / "stop").touch()
            if left := drain(run, cfg.quiesce_timeout_s):
                notes.append(f"the workload did not drain in {cfg.quiesce_timeout_s:.0f} s: {left}")
        finally:
            sampler.stop()
            for w in workers:
                w.resume()
                w.kill()
        stored = _scan(bed)
    events = read_histories(run / "history")
    obs = Observation(groups=list(GROUPS), stored=stored, tx_local=tx_local(run),
                      effects=effects(run), offsets=sampler.samples,
                      broker_restarts=sorted([*sampler.master_changes, *(k.t for k in kills)]))
    violations = check(events, obs) + failover_violations(events)
    times = failover_times(events, kills)
    ops = Counter(f"{e['op']} {e['phase']}" for e in events if e["phase"] != "invoke")
    return FailoverResult(
        config=cfg, schedule=faults, violations=violations, operations=dict(ops),
        downtime=downtime_per_fault(events, [(f.kind, f.started_ms, f.healed_ms)
                                             for f in faults if f.started_ms]),
        failover=times, failover_summary=failover_summary(times), notes=notes)


class NemesisBed(Protocol):
    """What :func:`drive_nemesis` needs of the bed (:class:`~._bed.FailoverBed` is one)."""

    @property
    def topo(self) -> Topology: ...
    def view(self) -> View: ...
    def apply(self, step: Step) -> None: ...
    def addr_of(self, host: str) -> str: ...


def drive_nemesis(bed: NemesisBed, faults: list[Fault], rng: random.Random, lease_ms: int,
                  sleep: Callable[[float], None] = time.sleep,
                  monotonic_s: Callable[[], float] = time.monotonic,
                  wall_ms: Callable[[], float] = lambda: time.time() * 1000) -> list[MasterKill]:
    """Run ``faults`` in order from now: at each one's ``at_s``, plan it from ``bed.view()``
    (a fault with nothing to act on is noted and skipped), apply its inject steps, wait its
    duration (at least the plan's minimum), apply its heal steps. Fills each fault's target and
    times in; returns the master kills (for :func:`failover_times`)."""
    kills: list[MasterKill] = []
    t0 = monotonic_s()
    for f in faults:
        sleep(max(0.0, t0 + f.at_s - monotonic_s()))
        try:
            p = plan(f.kind, bed.topo, bed.view(), rng, lease_ms)
        except NoTarget as exc:
            f.note = f"skipped: {exc}"
            continue
        f.target, f.started_ms = p.target, wall_ms()
        if f.kind == "kill_master":
            kills.append(MasterKill(p.group, bed.addr_of(p.target), f.started_ms))
        for step in p.inject:
            bed.apply(step)
        sleep(max(f.duration_s, p.min_duration_s))
        for step in p.heal:
            bed.apply(step)
        f.healed_ms = wall_ms()
    return kills


def _scan(bed: FailoverBed) -> list[Stored]:
    """Every message of the plain and transactional topics on each group's master now."""
    out: list[Stored] = []
    for g, host in wait_for_masters(bed, ELECTION_TIMEOUT_S).masters.items():
        with PullConsumer(bed.addr_of(host), "chaos-scan") as pc:
            for topic in (TOPICS["plain"], TOPICS["tx"]):
                for q in range(_QUEUES):
                    out += _scan_queue(pc, topic, q, g)
    return out


def _scan_queue(pc: PullConsumer, topic: str, q: int, group: str) -> list[Stored]:
    out: list[Stored] = []
    offset, end = 0, pc.max_offset(topic, q)
    while offset < end:
        try:
            r = pc.pull(topic, q, offset, 32)
        except TxmqError:
            break
        out += [Stored(f"{topic}@{group}", q, m.queue_offset, m.keys, m.msg_id) for m in r.messages]
        if r.next_begin_offset <= offset:
            break
        offset = r.next_begin_offset
    return out
