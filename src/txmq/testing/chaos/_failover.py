"""The failover cluster of a chaos run (issue 26): its shape, and its nemeses as pure functions of
the topology and what the cluster looks like now.

A :class:`ClusterSpec` (3 controllers, 1–2 broker groups of 2 brokers in controller mode, a name
server, clients) becomes a :class:`Topology`: one test host each (:class:`txmq.testing.Hosts`),
named ``ctl1``…, ``namesrv``, ``broker-a-1``…, ``client1``…. A nemesis :func:`plan` takes a fault
kind, the topology and a :class:`View` (each group's master host and the controller leader, as the
run sees them when the fault starts) and returns a :class:`Plan`: the steps that inject the fault
and the steps that heal it, over host names only, so the planner is tested without processes.

Kinds (:data:`FAILOVER_KINDS`; OpenChaos's names in brackets, cluster.md §5.1):

- ``kill_master``: SIGKILL a group's master, start it again at heal [leader-kill];
- ``kill_controller`` / ``kill_controller_leader``: SIGKILL a controller / the Raft leader;
- ``partition_master_slaves`` / ``_controllers`` / ``_clients``: cut the master from its group's
  slaves, from every controller, or from every client host [fixed-partition];
- ``pause_master_past_lease``: SIGSTOP the master for at least twice ``controller_lease_ms`` (it
  must not take a write when it wakes: its lease ended and a new master was elected)
  [leader-suspend];
- ``clock_jump``: move one broker's wall clock by ±2–20 s (the broker clock hook,
  ``TXMQ_TEST_CLOCK_OFFSET_FILE``); leases use monotonic clocks, so nothing may change;
- ``split_controllers``: cut a minority of the controllers (one of three; half the time the
  leader) from the majority [partition-majorities].
"""

from __future__ import annotations

import random
import string
from typing import Literal

import msgspec

from txmq.testing.chaos._nemesis import Fault

__all__ = ["FAILOVER_KINDS", "ClusterSpec", "NoTarget", "Plan", "Step", "Topology", "View",
           "failover_schedule", "plan", "topology"]

FAILOVER_KINDS = ("kill_master", "kill_controller", "kill_controller_leader",
                  "partition_master_slaves", "partition_master_controllers",
                  "partition_master_clients", "pause_master_past_lease", "clock_jump",
                  "split_controllers")
CLOCK_JUMP_MS = (2_000, 20_000)
"""Size of a clock jump, either way (as the single-broker nemesis's ``clock_*``)."""
PAUSE_LEASES = 2
"""``pause_master_past_lease`` lasts at least this many leases (so a new master is elected)."""
GROUPS_MAX = 26


class ClusterSpec(msgspec.Struct, kw_only=True, frozen=True):
    """The cluster of a failover run. Raises ValueError (:meth:`validate`) when out of range."""

    controllers: int = 3
    groups: int = 2
    brokers_per_group: int = 2
    clients: int = 2
    controller_lease_ms: int = 3000
    """The brokers' ``controller_lease_ms`` (BrokerConfig; design of issue 26)."""

    def validate(self) -> ClusterSpec:
        if self.controllers < 1 or self.controllers % 2 == 0:
            raise ValueError(f"controllers must be odd (a Raft majority), not {self.controllers}")
        if not 1 <= self.groups <= GROUPS_MAX or self.brokers_per_group < 2 or self.clients < 1:
            raise ValueError("need 1..26 groups of at least 2 brokers and at least one client")
        return self


class Topology(msgspec.Struct, frozen=True):
    """Host names by role. ``groups``: broker name (``broker-a``…) → its brokers' hosts."""

    controllers: list[str]
    namesrv: str
    groups: dict[str, list[str]]
    clients: list[str]

    def hosts(self) -> list[str]:
        """Every host, controllers first (the order :class:`txmq.testing.Hosts` numbers them)."""
        return [*self.controllers, self.namesrv, *(h for g in self.groups.values() for h in g),
                *self.clients]

    def group_of(self, host: str) -> str:
        """The group broker host ``host`` belongs to. Raises KeyError."""
        for g, members in self.groups.items():
            if host in members:
                return g
        raise KeyError(f"{host} is no broker host")


def topology(spec: ClusterSpec) -> Topology:
    """The host names of ``spec`` (validated). Raises ValueError."""
    spec.validate()
    groups = {f"broker-{string.ascii_lowercase[g]}":
              [f"broker-{string.ascii_lowercase[g]}-{i}" for i in range(1, spec.brokers_per_group + 1)]
              for g in range(spec.groups)}
    return Topology([f"ctl{i}" for i in range(1, spec.controllers + 1)], "namesrv", groups,
                    [f"client{i}" for i in range(1, spec.clients + 1)])


class View(msgspec.Struct, frozen=True):
    """The cluster as the run sees it when a fault starts: group → its master's host ("" when it
    has none), and the controller leader's host ("" when unknown)."""

    masters: dict[str, str]
    controller_leader: str = ""


StepOp = Literal["kill", "start", "stop", "cont", "partition", "heal", "clock"]


class Step(msgspec.Struct, frozen=True):
    """One action: ``kill`` (SIGKILL) / ``start`` / ``stop`` (SIGSTOP) / ``cont`` (SIGCONT) the
    process of each host of ``hosts``; ``partition`` ``hosts`` from ``peers``; ``heal`` every
    partition; ``clock``: set the clock offset of the broker on ``hosts`` to ``amount_ms``."""

    op: StepOp
    hosts: list[str] = msgspec.field(default_factory=list)
    peers: list[str] = msgspec.field(default_factory=list)
    amount_ms: int = 0


class Plan(msgspec.Struct, frozen=True):
    """A fault's steps: ``inject`` at its start, ``heal`` after ``duration_s`` (at least
    ``min_duration_s``). ``target`` is the host it is about, ``group`` its broker group."""

    kind: str
    target: str
    inject: list[Step]
    heal: list[Step]
    group: str = ""
    min_duration_s: float = 0.0


class NoTarget(ValueError):
    """The fault has nothing to act on now (a group without a master, no known leader)."""


def _master(topo: Topology, view: View, rng: random.Random) -> tuple[str, str]:
    """(group, master host) of a random group that has a master now. Raises NoTarget."""
    candidates = sorted(g for g in topo.groups if view.masters.get(g))
    if not candidates:
        raise NoTarget("no group has a master now")
    g = rng.choice(candidates)
    return g, view.masters[g]


def plan(kind: str, topo: Topology, view: View, rng: random.Random,
         lease_ms: int = 3000) -> Plan:
    """The steps of fault ``kind`` now. Raises NoTarget (nothing to act on), ValueError (kind)."""
    if kind in ("kill_controller", "kill_controller_leader"):
        if kind == "kill_controller_leader" and not view.controller_leader:
            raise NoTarget("no controller leader known")
        c = view.controller_leader if kind == "kill_controller_leader" else rng.choice(topo.controllers)
        return Plan(kind, c, [Step("kill", [c])], [Step("start", [c])])
    if kind == "split_controllers":
        minority_n = (len(topo.controllers) - 1) // 2
        pool = list(topo.controllers)
        first = view.controller_leader if view.controller_leader and rng.random() < 0.5 \
            else rng.choice(pool)
        pool.remove(first)
        minority = [first, *rng.sample(pool, minority_n - 1)] if minority_n else []
        majority = [c for c in topo.controllers if c not in minority]
        return Plan(kind, first, [Step("partition", minority, majority)] if minority else [],
                    [Step("heal")])
    if kind == "clock_jump":
        host = rng.choice([h for g in topo.groups.values() for h in g])
        amount = rng.randint(*CLOCK_JUMP_MS) * rng.choice((1, -1))
        return Plan(kind, host, [Step("clock", [host], amount_ms=amount)],
                    [Step("clock", [host], amount_ms=0)], group=topo.group_of(host))
    g, m = _master(topo, view, rng)
    others = {"partition_master_slaves": [h for h in topo.groups[g] if h != m],
              "partition_master_controllers": topo.controllers,
              "partition_master_clients": topo.clients}
    if kind == "kill_master":
        return Plan(kind, m, [Step("kill", [m])], [Step("start", [m])], group=g)
    if kind == "pause_master_past_lease":
        return Plan(kind, m, [Step("stop", [m])], [Step("cont", [m])], group=g,
                    min_duration_s=PAUSE_LEASES * lease_ms / 1000)
    if kind in others:
        return Plan(kind, m, [Step("partition", [m], others[kind])], [Step("heal")], group=g)
    raise ValueError(f"unknown failover fault kind {kind!r}; kinds: {FAILOVER_KINDS}")


def failover_schedule(seed: int, faults: int, duration_s: float,
                      kinds: tuple[str, ...] = FAILOVER_KINDS) -> list[Fault]:
    """``faults`` faults over ``duration_s`` seconds, kinds in shuffled rounds (every kind before
    any repeats), each 30–60 % of its slot; targets are chosen when each starts (:func:`plan`),
    since who is master then depends on the faults before. Pure in its arguments."""
    rng = random.Random(seed)
    slot = duration_s / max(1, faults)
    out: list[Fault] = []
    order: list[str] = []
    for i in range(faults):
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        out.append(Fault(at_s=round(i * slot + rng.uniform(0, 0.2 * slot), 3), kind=order.pop(),
                         target="", duration_s=round(rng.uniform(0.3, 0.6) * slot, 3)))
    return out
