"""The nemesis: a seeded schedule of faults and the code that injects and heals each one.

Faults run one at a time (each is healed before the next starts), so a failure can be pinned on
one fault. Kinds:

- ``kill``: SIGKILL a process, restart it after the fault's duration;
- ``pause``: SIGSTOP a process, SIGCONT it after the duration;
- ``drop``, ``blackhole``, ``delay``, ``half_open``: network faults in the :class:`FaultProxy`;
- ``disk_full``: fill the broker's tmpfs data directory with a ballast file, remove it after;
- ``clock_forward``, ``clock_back``: jump the broker's clock (the ``_now_ms`` test hook of
  ``broker/server.py``) by ``amount_ms``, and back to true time after the duration;
- ``broker_kill`` (cluster runs only): SIGKILL one broker of the cluster (a target named
  ``broker-…``) while the others keep serving, restart it after the duration;
- replicated runs only (a SYNC_MASTER and its slave, :mod:`._replica`): ``master_kill`` /
  ``slave_kill`` (SIGKILL, restart after the duration; while the master is down the run scans the
  slave), ``master_kill_cut`` (cut the HA link, then SIGKILL the master while it is still cut: the
  master takes writes its slave never sees, which it must not acknowledge SUCCESS),
  ``master_pause`` / ``slave_pause`` (SIGSTOP, SIGCONT after the duration), and ``ha_cut``
  (close the HA connection and blackhole the link), ``ha_delay``, ``ha_half_open`` (master → slave
  stops, the slave's reports still flow) in the HA link's :class:`FaultProxy`.

``schedule(seed, ...)`` is a pure function of its arguments: the same seed replays the same faults
at the same offsets from the start of the run.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import msgspec

__all__ = ["CLUSTER_KINDS", "HA_KINDS", "KINDS", "NETWORK_KINDS", "PROCESS_KINDS", "REPLICA_KINDS",
           "Fault", "fill_disk", "schedule"]

PROCESS_KINDS = ("kill", "pause")
NETWORK_KINDS = ("drop", "blackhole", "delay", "half_open")
KINDS = (*PROCESS_KINDS, *NETWORK_KINDS, "disk_full", "clock_forward", "clock_back")
CLUSTER_KINDS = ("broker_kill", *PROCESS_KINDS)
"""The kinds of a cluster run: its clients reach the brokers through the name server, not the
fault proxy, and the brokers' stores are not on a tmpfs, so network, disk and clock faults are one
broker's affair (``txmq chaos`` without ``--brokers`` runs them)."""
HA_KINDS = ("ha_cut", "ha_delay", "ha_half_open")
REPLICA_KINDS = ("master_kill", "master_kill_cut", "slave_kill", "master_pause", "slave_pause",
                 *HA_KINDS, *PROCESS_KINDS)
"""The kinds of a replicated run: the master, the slave and the HA link's faults, and killing and
pausing the workload's processes (``kill`` and ``pause`` pick among the targets the schedule is
given: the run gives the workload's processes)."""
_CLOCK_JUMP_MS = (2_000, 20_000)
_DELAY_MS = (50, 400)


class Fault(msgspec.Struct, kw_only=True):
    """One scheduled fault. ``at_s`` and ``duration_s`` count from the start of the nemesis;
    ``amount_ms`` is the delay (``delay``) or the clock jump (``clock_*``); the outcome fields are
    filled in when it runs."""

    at_s: float
    kind: str
    target: str
    duration_s: float
    amount_ms: int = 0
    started_ms: float = 0.0
    healed_ms: float = 0.0
    note: str = ""


def schedule(seed: int, faults: int, duration_s: float, targets: list[str],
             kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """``faults`` faults spread over ``duration_s`` seconds: kinds in shuffled rounds (every kind
    before any repeats), process faults on a random target, ``broker_kill`` on a random target
    named ``broker-…``, ``master_*`` / ``slave_*`` on ``master`` / ``slave``, ``ha_*`` on
    ``ha-link``; each takes 30–60 % of its slot.

    Raises:
        ValueError: ``broker_kill`` among ``kinds`` but no target named ``broker-…``.
    """
    rng = random.Random(seed)
    slot = duration_s / max(1, faults)
    out: list[Fault] = []
    order: list[str] = []
    for i in range(faults):
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        kind = order.pop()
        target = rng.choice(targets) if kind in PROCESS_KINDS else "broker"
        if kind == "broker_kill":
            brokers = [t for t in targets if t.startswith("broker-")]
            if not brokers:
                raise ValueError("broker_kill needs targets named broker-… (a cluster run)")
            target = rng.choice(brokers)
        elif kind.startswith(("master_", "slave_")):
            target = kind.partition("_")[0]
        elif kind in HA_KINDS:
            target = "ha-link"
        amount = 0
        if kind in ("delay", "ha_delay"):
            amount = rng.randint(*_DELAY_MS)
        elif kind.startswith("clock_"):
            amount = rng.randint(*_CLOCK_JUMP_MS) * (1 if kind == "clock_forward" else -1)
        out.append(Fault(at_s=round(i * slot + rng.uniform(0, 0.2 * slot), 3), kind=kind,
                         target=target, duration_s=round(rng.uniform(0.3, 0.6) * slot, 3),
                         amount_ms=amount))
    return out


def fill_disk(directory: Path) -> Path:
    """Write a ballast file in ``directory`` until the filesystem is full; returns its path.

    Raises:
        OSError: any error but ENOSPC.
    """
    path = directory / "chaos-ballast"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1024 * 1024, 4096, 512):  # big chunks, then the last few KiB
            zeros = b"\0" * size
            while True:
                try:
                    if os.write(fd, zeros) < size:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return path
