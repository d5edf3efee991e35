"""What a failover run checks beyond :func:`txmq.testing.chaos.check` (which already holds every
acknowledged send, committed transaction and outbox event to being stored and consumed, no
rolled-back transaction visible, one terminal state per transaction and consumer offsets that never
skip or move back), and the figures it reports. Pure functions over the history.

A send's ``ok`` event of a failover run names the group (``broker``, the broker name), the address
of the broker that acknowledged it (``addr``) and that master's epoch (``epoch``: the send answer's
``masterEpoch``). Violations:

- ``two_masters_one_epoch``: two brokers of a group acknowledged writes under the same master
  epoch (a controller elected twice in one epoch, or a broker took an epoch it was not given);
- ``stale_master_write``: a send invoked after a write of a newer epoch of its group was
  acknowledged came back acknowledged under an older epoch: a deposed master took a write (its
  lease must end before the new master is elected, design of issue 26 "Fencing").

Figures:

- :func:`downtime_per_fault` — OpenChaos ``RTOChecker`` (cluster.md §5.1): in each fault window,
  the time from the first failed or unknown operation to the next successful one;
- :func:`failover_times` — from a master's SIGKILL to the first send its group acknowledged from
  another broker (issue 26's target: median <= 5 s, max <= 10 s).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import msgspec

from txmq.testing.chaos._check import Violation

__all__ = ["FailoverTime", "MasterKill", "WindowDowntime", "downtime_per_fault",
           "failover_summary", "failover_times", "failover_violations"]

_EXCERPT_MAX = 12


def _acks(events: list[dict[str, Any]], epoch: bool = True) -> list[dict[str, Any]]:
    """Acknowledged sends that name their group and acknowledging broker (and its epoch, if
    ``epoch``)."""
    return [e for e in events if e["op"] == "send" and e["phase"] == "ok" and e.get("broker")
            and e.get("addr") and (not epoch or isinstance(e.get("epoch"), int))]


def _invoked_at(events: list[dict[str, Any]]) -> dict[tuple[str, Any, str], float]:
    """(proc, incarnation, key) → time of the send's invoke."""
    return {(e["proc"], e.get("inc"), e["key"]): e["t"] for e in events
            if e["op"] == "send" and e["phase"] == "invoke" and e.get("key")}


def failover_violations(events: list[dict[str, Any]]) -> list[Violation]:
    """``two_masters_one_epoch`` and ``stale_master_write`` violations in ``events`` (by time)."""
    acks = _acks(events)
    out: list[Violation] = []
    by_epoch: dict[tuple[str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in acks:
        by_epoch[(e["broker"], e["epoch"])].setdefault(e["addr"], e)
    for (group, epoch), firsts in sorted(by_epoch.items()):
        if len(firsts) > 1:
            out.append(Violation("two_masters_one_epoch", f"{group}@{epoch}",
                                 f"group {group} epoch {epoch} acknowledged by {sorted(firsts)}",
                                 list(firsts.values())[:_EXCERPT_MAX]))
    invoked = _invoked_at(events)
    newest: dict[str, tuple[int, dict[str, Any]]] = {}  # group → (epoch, first ack of it)
    stale: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted(acks, key=lambda e: e["t"]):
        g = e["broker"]
        t0 = invoked.get((e["proc"], e.get("inc"), e["key"]))
        seen = newest.get(g)
        if seen and e["epoch"] < seen[0] and t0 is not None and t0 > seen[1]["t"]:
            stale[g].append(e)
        if not seen or e["epoch"] > seen[0]:
            newest[g] = (e["epoch"], e)
    for g, late in sorted(stale.items()):
        first = late[0]
        out.append(Violation("stale_master_write", first["key"],
                             f"group {g}: {len(late)} sends invoked after epoch "
                             f"{newest[g][0]} acknowledged were acknowledged by {first['addr']} "
                             f"under epoch {first['epoch']}", late[:_EXCERPT_MAX]))
    return out


class WindowDowntime(msgspec.Struct, frozen=True):
    """One fault window's unavailability (OpenChaos RTOChecker): ``downtime_ms`` from the first
    failed or unknown ``op`` completing in [``start_ms``, ``end_ms``] to the next ok one (0: none
    failed); ``recovered`` false when no ok followed (then it runs to the last event)."""

    kind: str
    start_ms: float
    end_ms: float
    downtime_ms: float
    recovered: bool


def downtime_per_fault(events: list[dict[str, Any]], windows: list[tuple[str, float, float]],
                       ops: tuple[str, ...] = ("send",)) -> list[WindowDowntime]:
    """For each ``(kind, start_ms, end_ms)`` window, its :class:`WindowDowntime` over the
    completions of ``ops`` in ``events`` (ms since the epoch)."""
    done = sorted((e for e in events if e["op"] in ops and e["phase"] in ("ok", "fail", "unknown")),
                  key=lambda e: e["t"])
    last_t = done[-1]["t"] if done else 0.0
    out = []
    for kind, start, end in windows:
        bad = next((e["t"] for e in done if start <= e["t"] <= end and e["phase"] != "ok"), None)
        if bad is None:
            out.append(WindowDowntime(kind, start, end, 0.0, True))
            continue
        ok = next((e["t"] for e in done if e["t"] > bad and e["phase"] == "ok"), None)
        out.append(WindowDowntime(kind, start, end, (ok if ok is not None else last_t) - bad,
                                  ok is not None))
    return out


class MasterKill(msgspec.Struct, frozen=True):
    """A master SIGKILLed at ``t`` (ms since the epoch): its group and its address."""

    group: str
    addr: str
    t: float


class FailoverTime(msgspec.Struct, frozen=True):
    """``ms`` from ``kill`` to the first send of its group acknowledged by another broker
    (``new_addr``); ``ms`` is None when none was. ``restored_ms``: from ``kill`` to the first
    send of its group acknowledged by any broker (the group's write outage), None when none was.
    ``reinstated``: that first acknowledgement came from the killed master's address: it was
    restarted and took its role back before any election (the controller keeps a live
    SyncStateSet master, RocketMQ ``CONTROLLER_MASTER_STILL_EXIST``), so no failover happened and
    ``ms`` measures some later change of master, not this kill."""

    kill: MasterKill
    ms: float | None
    new_addr: str = ""
    restored_ms: float | None = None
    reinstated: bool = False


def failover_times(events: list[dict[str, Any]], kills: list[MasterKill]) -> list[FailoverTime]:
    """The failover time of each master kill (see :class:`FailoverTime`)."""
    acks = sorted(_acks(events, epoch=False), key=lambda e: e["t"])
    out = []
    for k in kills:
        after = [e for e in acks if e["broker"] == k.group and e["t"] > k.t]
        first = next((e for e in after if e["addr"] != k.addr), None)
        restored = after[0] if after else None
        out.append(FailoverTime(k, None if first is None else first["t"] - k.t,
                                "" if first is None else first["addr"],
                                None if restored is None else restored["t"] - k.t,
                                restored is not None and restored["addr"] == k.addr))
    return out


def failover_summary(times: list[FailoverTime]) -> dict[str, float | int | None]:
    """``{"kills", "failed_over", "median_ms", "max_ms", "reinstated", "restored_median_ms",
    "restored_max_ms"}`` of :func:`failover_times`' result: median and max failover time over
    the kills that failed over (another broker acknowledged first; None when none did), how many
    kills the restarted old master took back instead, and median and max write outage (first
    acknowledgement by any broker) over every kill after which one came."""
    ms = [t.ms for t in times if t.ms is not None and not t.reinstated]
    back = [t.restored_ms for t in times if t.restored_ms is not None]
    return {"kills": len(times), "failed_over": len(ms),
            "median_ms": statistics.median(ms) if ms else None, "max_ms": max(ms) if ms else None,
            "reinstated": sum(t.reinstated for t in times),
            "restored_median_ms": statistics.median(back) if back else None,
            "restored_max_ms": max(back) if back else None}
