"""The failover run's parts without processes: the cluster's topology, each nemesis's plan over it,
the seeded schedule, the failover checks (one master per group per epoch, no write taken by a
deposed master) and the figures (downtime per fault window, failover time), each on synthetic
histories that hold and that break it."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from txmq.testing import wait_until
from txmq.testing.chaos import (
    FAILOVER_KINDS,
    ClusterSpec,
    MasterKill,
    NoTarget,
    Observation,
    Step,
    Stored,
    View,
    check,
    downtime_per_fault,
    failover_schedule,
    failover_summary,
    failover_times,
    failover_violations,
    plan,
    topology,
)

TOPO = topology(ClusterSpec())
VIEW = View({"broker-a": "broker-a-1", "broker-b": "broker-b-2"}, controller_leader="ctl2")
A1, A2 = "10.200.0.5:10911", "10.200.0.6:10911"


def test_the_topology_gives_every_role_its_own_host() -> None:
    assert TOPO.controllers == ["ctl1", "ctl2", "ctl3"]
    assert TOPO.groups == {"broker-a": ["broker-a-1", "broker-a-2"],
                           "broker-b": ["broker-b-1", "broker-b-2"]}
    hosts = TOPO.hosts()
    assert len(hosts) == len(set(hosts)) == 3 + 1 + 4 + 2
    assert topology(ClusterSpec(groups=1)).groups.keys() == {"broker-a"}
    for bad in (ClusterSpec(controllers=2), ClusterSpec(brokers_per_group=1), ClusterSpec(clients=0)):
        with pytest.raises(ValueError):
            topology(bad)


def _plan(kind: str, seed: int = 1, view: View = VIEW) -> Any:
    return plan(kind, TOPO, view, random.Random(seed), lease_ms=3000)


def test_each_nemesis_acts_on_the_hosts_its_name_says() -> None:
    p = _plan("kill_master")
    assert p.target in ("broker-a-1", "broker-b-2") and p.inject == [Step("kill", [p.target])]
    assert p.heal == [Step("start", [p.target])] and p.target == VIEW.masters[p.group]
    assert _plan("kill_controller_leader").inject == [Step("kill", ["ctl2"])]
    assert _plan("kill_controller").target in TOPO.controllers
    p = _plan("partition_master_slaves")
    slaves = [h for h in TOPO.groups[p.group] if h != p.target]
    assert p.inject == [Step("partition", [p.target], slaves)] and p.heal == [Step("heal")]
    p = _plan("partition_master_controllers")
    assert p.inject == [Step("partition", [p.target], TOPO.controllers)]
    p = _plan("partition_master_clients")
    assert p.inject == [Step("partition", [p.target], TOPO.clients)]
    p = _plan("pause_master_past_lease")
    assert p.inject == [Step("stop", [p.target])] and p.heal == [Step("cont", [p.target])]
    assert p.min_duration_s >= 6.0  # two leases of 3 s
    p = _plan("clock_jump")
    jump = p.inject[0]
    assert jump.op == "clock" and 2000 <= abs(jump.amount_ms) <= 20000 and p.group
    assert p.heal == [Step("clock", [p.target], amount_ms=0)]
    for seed in range(20):
        p = _plan("split_controllers", seed)
        (cut,) = p.inject
        assert len(cut.hosts) == 1 and sorted(cut.hosts + cut.peers) == TOPO.controllers


def test_a_nemesis_with_nothing_to_act_on_says_so() -> None:
    with pytest.raises(NoTarget):
        _plan("kill_master", view=View({"broker-a": "", "broker-b": ""}))
    with pytest.raises(NoTarget):
        _plan("kill_controller_leader", view=View(VIEW.masters))
    with pytest.raises(ValueError):
        _plan("no_such_fault")


def test_the_schedule_is_a_function_of_its_seed_and_covers_every_kind() -> None:
    a = failover_schedule(7, 18, 180.0)
    assert a == failover_schedule(7, 18, 180.0) != failover_schedule(8, 18, 180.0)
    assert {f.kind for f in a[:len(FAILOVER_KINDS)]} == set(FAILOVER_KINDS)
    assert all(a[i].at_s + a[i].duration_s < a[i + 1].at_s for i in range(len(a) - 1))


def ev(t: float, op: str, phase: str, proc: str = "p", **kw: Any) -> dict[str, Any]:
    return {"t": t, "proc": proc, "inc": 1, "op": op, "phase": phase, **kw}


def send(t0: float, t1: float, key: str, addr: str, epoch: int, group: str = "broker-a",
         proc: str = "p") -> list[dict[str, Any]]:
    return [ev(t0, "send", "invoke", proc, key=key),
            ev(t1, "send", "ok", proc, key=key, broker=group, addr=addr, epoch=epoch,
               msg_id=key.upper(), status="SEND_OK")]


def failover_history() -> list[dict[str, Any]]:
    """broker-a's master A1 (epoch 1) killed at 1000; A2 (epoch 2) acknowledges from 3500 on; a
    send invoked before the kill completes late under epoch 1 (allowed); broker-b unaffected."""
    return [*send(100, 110, "k1", A1, 1), *send(900, 3600, "slow", A1, 1, proc="q"),
            ev(1200, "send", "invoke", key="k2"), ev(4200, "send", "unknown", key="k2"),
            *send(3000, 3500, "k3", A2, 2), *send(5000, 5010, "k4", A2, 2),
            *send(1500, 1510, "b1", "10.200.0.8:10911", 1, group="broker-b")]


def test_a_clean_failover_history_has_no_violation() -> None:
    assert failover_violations(failover_history()) == []


def test_two_brokers_acknowledging_one_epoch_is_a_violation() -> None:
    events = [*failover_history(), *send(6000, 6010, "k5", A1, 2)]
    (v,) = failover_violations(events)
    assert v.kind == "two_masters_one_epoch" and v.key == "broker-a@2" and A1 in v.detail


def test_a_deposed_master_taking_a_write_is_a_violation() -> None:
    # invoked at 3550, after epoch 2's first ack (3500), yet acknowledged by the old master
    events = [*failover_history(), *send(3550, 3560, "late", A1, 1, proc="r")]
    (v,) = failover_violations(events)
    assert v.kind == "stale_master_write" and v.key == "late"


def test_an_acknowledged_send_lost_in_the_failover_is_found_by_the_main_check() -> None:
    events = failover_history()
    keys = ["k1", "slow", "k3", "k4", "b1"]
    obs = Observation(groups=["g"], stored=[Stored("plain", 0, i, k) for i, k in enumerate(keys)],
                      effects={"g": dict.fromkeys(keys, 1)})
    assert check(events, obs) == []
    obs.stored = [m for m in obs.stored if m.key != "slow"]  # truncated away by the new master
    assert [(v.kind, v.key) for v in check(events, obs)] == [("lost", "slow")]


def test_downtime_per_fault_window_runs_from_the_first_failure_to_the_next_success() -> None:
    events = failover_history()
    got = downtime_per_fault(events, [("kill_master", 1000, 5000), ("noop", 5500, 6000)])
    assert [(d.kind, d.downtime_ms, d.recovered) for d in got] == \
        [("kill_master", 810.0, True), ("noop", 0.0, True)]  # unknown at 4200, ok at 5010
    never = [*events, ev(7000, "send", "invoke", key="z"), ev(7100, "send", "fail", key="z")]
    (d,) = downtime_per_fault(never, [("kill_master", 6900, 8000)])
    assert not d.recovered and d.downtime_ms == 0.0  # the failure is the last event


def test_failover_time_runs_from_the_kill_to_the_first_ack_of_another_broker() -> None:
    times = failover_times(failover_history(), [MasterKill("broker-a", A1, 1000),
                                                MasterKill("broker-b", "10.200.0.8:10911", 1000)])
    assert [(t.ms, t.new_addr, t.restored_ms, t.reinstated) for t in times] == \
        [(2500.0, A2, 2500.0, False), (None, "", 510.0, True)]  # broker-b's master acked on
    assert failover_summary(times) == {"kills": 2, "failed_over": 1, "median_ms": 2500.0,
                                       "max_ms": 2500.0, "reinstated": 1,
                                       "restored_median_ms": 1505.0, "restored_max_ms": 2500.0}
    assert failover_summary([])["median_ms"] is None
    # an SDK without masterEpoch: failover time still measurable, the epoch checks have no input
    no_epoch = [{k: v for k, v in e.items() if k != "epoch"} for e in failover_history()]
    assert [t.ms for t in failover_times(no_epoch, [MasterKill("broker-a", A1, 1000)])] == [2500.0]


def test_a_killed_master_restarted_before_an_election_is_reinstated_not_failed_over() -> None:
    # seed 2027: the old master came back within its lease and kept its role; the other broker
    # acknowledged only after a later fault moved the master (it counted as a 19-64 s failover)
    events = [*send(100, 110, "k1", A1, 1), *send(4000, 4010, "k2", A1, 1),
              *send(30_000, 30_010, "k3", A2, 2)]
    (t,) = failover_times(events, [MasterKill("broker-a", A1, 1000)])
    assert (t.ms, t.restored_ms, t.reinstated) == (29_010.0, 3010.0, True)
    s = failover_summary([t])
    assert (s["failed_over"], s["median_ms"], s["reinstated"], s["restored_max_ms"]) == \
        (0, None, 1, 3010.0)


class FakeBed:
    """The bed as the nemesis driver sees it: the topology, a view whose master moves when a
    master is killed, and a record of the steps applied."""

    def __init__(self) -> None:
        self.topo = TOPO
        self.masters = dict(VIEW.masters)
        self.applied: list[tuple[float, Step]] = []
        self.now = 0.0

    def view(self) -> View:
        return View(dict(self.masters), controller_leader="ctl1")

    def apply(self, step: Step) -> None:
        self.applied.append((self.now, step))
        if step.op == "kill" and step.hosts[0] in self.masters.values():
            g = TOPO.group_of(step.hosts[0])
            self.masters[g] = next(h for h in TOPO.groups[g] if h != step.hosts[0])

    def addr_of(self, host: str) -> str:
        return f"{host}:10911"

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_nemesis_driver_runs_each_fault_at_its_time_and_heals_it() -> None:
    from txmq.testing.chaos._failover_run import drive_nemesis

    bed = FakeBed()
    faults = failover_schedule(3, len(FAILOVER_KINDS), 90.0)
    kills = drive_nemesis(bed, faults, random.Random(3), 3000, sleep=bed.sleep,
                          monotonic_s=lambda: bed.now, wall_ms=lambda: 1000 * bed.now)
    assert all(f.started_ms and f.healed_ms > f.started_ms and f.target for f in faults)
    for f in faults:
        assert f.started_ms >= 1000 * f.at_s - 1e-3  # never before its time
        held_s = (f.healed_ms - f.started_ms) / 1000
        assert held_s >= f.duration_s - 1e-6
        assert f.kind != "pause_master_past_lease" or held_s >= 6.0 - 1e-6
    (kill,) = [f for f in faults if f.kind == "kill_master"]
    assert kills == [MasterKill(TOPO.group_of(kill.target), f"{kill.target}:10911",
                                kill.started_ms)]
    assert [s.op for _, s in bed.applied].count("heal") == 4  # 3 master partitions + the split
    leader_kill = next(f for f in faults if f.kind == "kill_controller_leader")
    assert leader_kill.target == "ctl1"


def test_the_nemesis_driver_skips_a_fault_with_nothing_to_act_on() -> None:
    from txmq.testing.chaos._failover_run import drive_nemesis

    bed = FakeBed()
    bed.masters = {"broker-a": "", "broker-b": ""}
    (f,) = [f for f in failover_schedule(3, 9, 90.0) if f.kind == "kill_master"]
    assert drive_nemesis(bed, [f], random.Random(1), 3000, sleep=bed.sleep,
                         monotonic_s=lambda: bed.now, wall_ms=lambda: 1000 * bed.now) == []
    assert f.note.startswith("skipped") and not f.started_ms and bed.applied == []


def test_the_drain_waits_for_every_acknowledged_message_in_both_groups(tmp_path: Path) -> None:
    import sqlite3

    from txmq.testing.chaos._failover_obs import backlog, drain
    from txmq.testing.chaos._spec import GROUPS, prepare_databases

    (tmp_path / "history").mkdir()
    prepare_databases(tmp_path)
    lines = [json.dumps(e) for e in send(1, 2, "k1", A1, 1) + send(3, 4, "k2", A1, 1)]
    (tmp_path / "history" / "plain.jsonl").write_text("\n".join(lines) + "\n")
    with sqlite3.connect(tmp_path / "tx.db") as c:
        c.execute("INSERT INTO tx VALUES ('t1', 'committed', 0), ('t2', 'rolled_back', 0)")
    assert backlog(tmp_path) == {g: 3 for g in GROUPS}
    for g in GROUPS:
        with sqlite3.connect(tmp_path / f"{g}.db") as c:
            c.executemany("INSERT INTO effects (key, topic, event_id) VALUES (?, 't', ?)",
                          [(k, k) for k in ("k1", "k2", "t1")])
    assert backlog(tmp_path) == dict.fromkeys(GROUPS, 0) and drain(tmp_path, 5.0) == ""


def test_the_offset_sampler_counts_a_master_change_as_a_restart() -> None:
    from txmq.testing.chaos._failover_obs import OffsetSampler

    views = iter([View({"broker-a": "broker-a-1"}), View({"broker-a": ""}),
                  View({"broker-a": "broker-a-1"}), View({"broker-a": "broker-a-2"})])
    last = View({"broker-a": "broker-a-2"})
    sampler = OffsetSampler(lambda: next(views, last), lambda h: "127.0.0.1:1", 1)
    sampler.start()
    wait_until(lambda: len(sampler.master_changes) == 1, timeout_s=10)
    time.sleep(1.2)  # more samples of the same master: no more changes
    sampler.stop()
    assert len(sampler.master_changes) == 1 and sampler.samples == []  # nothing listens there
