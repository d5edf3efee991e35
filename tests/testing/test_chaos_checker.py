"""The chaos checker catches each kind of violation in a synthetic history, and nothing in a clean
one; the nemesis schedule is a function of its seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from txmq.testing.chaos import (
    CLUSTER_KINDS,
    KINDS,
    REPLICA_KINDS,
    BrokerTarget,
    ChaosConfig,
    Observation,
    OffsetSample,
    ReplicaSnapshot,
    Stored,
    check,
    run_chaos,
    schedule,
)

G = ["g1", "g2"]


def ev(t: float, op: str, phase: str, **kw: Any) -> dict[str, Any]:
    return {"t": t, "proc": "p", "inc": 1, "op": op, "phase": phase, **kw}


def clean() -> tuple[list[dict[str, Any]], Observation]:
    """Two plain sends (one ok, one unknown and absent), a committed and a rolled-back transaction,
    one outbox event; everything where it belongs."""
    events = [
        ev(1, "send", "invoke", key="a"), ev(2, "send", "ok", key="a", msg_id="A"),
        ev(3, "send", "invoke", key="u"), ev(4, "send", "unknown", key="u"),
        ev(5, "tx", "invoke", key="c"), ev(6, "local", "ok", key="c", msg_id="C", state="committed"),
        ev(7, "tx", "ok", key="c", msg_id="C", half_offset=0, outcome="COMMIT"),
        ev(8, "tx", "invoke", key="r"), ev(9, "local", "ok", key="r", msg_id="R", state="rolled_back"),
        ev(10, "tx", "ok", key="r", msg_id="R", half_offset=1, outcome="ROLLBACK"),
        *[ev(11, "deliver", "ok", group=g, key=k) for g in G for k in ("a", "c", "o")],
    ]
    obs = Observation(
        groups=G,
        stored=[Stored("plain", 0, 0, "a"), Stored("tx", 0, 0, "c"), Stored("outbox", 0, 0, "o")],
        tx_local={"c": "committed", "r": "rolled_back"},
        tx_broker={"C": "COMMIT", "R": "ROLLBACK"},
        outbox_keys=["o"],
        effects={g: {"a": 1, "c": 1, "o": 1} for g in G},
        offsets=[OffsetSample(20, g, "plain", 0, 1) for g in G],
    )
    return events, obs


def kinds(events: list[dict[str, Any]], obs: Observation) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for v in check(events, obs):
        out.setdefault(v.kind, set()).add(v.key)
        assert v.detail
    return out


def test_a_clean_history_has_no_violation() -> None:
    assert check(*clean()) == []


def test_an_unknown_send_may_be_present_or_absent() -> None:
    events, obs = clean()
    obs.stored.append(Stored("plain", 0, 1, "u"))
    for g in G:
        obs.effects[g]["u"] = 1
        events.append(ev(12, "deliver", "ok", group=g, key="u"))
    assert check(events, obs) == []


def test_a_lost_acknowledged_message_is_reported_with_its_history() -> None:
    events, obs = clean()
    obs.stored = [m for m in obs.stored if m.key != "a"]
    del obs.effects["g2"]["a"]
    (v,) = check(events, obs)
    assert (v.kind, v.key) == ("lost", "a")
    assert "the broker" in v.detail and "g2" in v.detail and "g1" not in v.detail
    assert [e["phase"] for e in v.excerpt] == ["invoke", "ok", "ok", "ok"]


def test_a_delivered_message_deleted_by_retention_is_not_lost_but_an_undelivered_one_is() -> None:
    """A full disk forces retention to delete segments (found by the 200-fault run: every message of
    the deleted segments was reported lost although both groups had it)."""
    events, obs = clean()
    events = [{**e, "topic": "plain", "queue": 0, "offset": 0} if e["op"] == "deliver" and
              e["key"] == "a" else e for e in events]
    obs.stored = [m for m in obs.stored if m.key != "a"]
    obs.min_offsets = {"plain/0": 1}  # offset 0 of plain/0 is gone
    assert check(events, obs) == []
    obs.min_offsets = {}  # not deleted by retention: it is missing
    assert {(v.kind, v.key) for v in check(events, obs)} == {("lost", "a")}
    obs.min_offsets = {"plain/0": 1}
    del obs.effects["g2"]["a"]  # deleted before g2 received it: still lost for g2
    (v,) = check(events, obs)
    assert (v.kind, v.key) == ("lost", "a") and "g2" in v.detail and "broker" not in v.detail


def test_a_lost_committed_transaction_and_outbox_event() -> None:
    events, obs = clean()
    del obs.effects["g1"]["c"], obs.effects["g1"]["o"]
    assert kinds(events, obs) == {"lost": {"c", "o"}}


def test_a_duplicate_side_effect() -> None:
    events, obs = clean()
    obs.effects["g1"]["c"] = 2
    assert kinds(events, obs) == {"duplicate_side_effect": {"c"}}


def test_a_visible_rolled_back_message() -> None:
    events, obs = clean()
    obs.stored.append(Stored("tx", 0, 1, "r"))
    obs.effects["g2"]["r"] = 1
    events.append(ev(12, "deliver", "ok", group="g2", key="r"))
    (v,) = check(events, obs)
    assert (v.kind, v.key) == ("rolled_back_visible", "r")
    assert "the broker" in v.detail and "g2" in v.detail and "g1" not in v.detail


def test_a_discarded_transaction_must_not_be_visible() -> None:
    events, obs = clean()
    obs.tx_local["c"] = "rolled_back"  # the local database never committed it ...
    obs.tx_broker["C"] = "DISCARD"     # ... and the broker discarded it, yet it was delivered
    assert kinds(events, obs) == {"rolled_back_visible": {"c"}}


def test_two_terminal_states() -> None:
    events, obs = clean()
    obs.tx_broker["R"] = "COMMIT"  # the broker committed what the local record rolled back
    events.append(ev(13, "tx", "ok", key="c", msg_id="C", half_offset=0, outcome="ROLLBACK"))
    got = kinds(events, obs)
    assert got == {"two_terminal_states": {"r", "c"}}


def test_an_offset_regression_and_an_offset_skip() -> None:
    events, obs = clean()
    obs.stored.append(Stored("plain", 0, 1, "x"))  # stored, never delivered to g1
    obs.offsets += [OffsetSample(30, "g1", "plain", 0, 2), OffsetSample(40, "g1", "plain", 0, 1)]
    got = check(events, obs)
    assert {(v.kind, v.key) for v in got} == {
        ("offset_regression", "g1/plain/0"), ("offset_skip", "x")}


def test_an_offset_going_back_across_a_broker_restart_is_not_a_regression() -> None:
    events, obs = clean()
    obs.offsets += [OffsetSample(30, "g1", "plain", 0, 1), OffsetSample(40, "g1", "plain", 0, 0)]
    obs.broker_restarts = [35]
    assert check(events, obs) == []


def test_the_schedule_is_a_function_of_the_seed() -> None:
    targets = ["broker", "plain", "tx"]
    a = schedule(7, 30, 60, targets)
    assert a == schedule(7, 30, 60, targets) and a != schedule(8, 30, 60, targets)
    assert {f.kind for f in a[:len(KINDS)]} == set(KINDS)  # every kind before any repeats
    assert all(0 < f.duration_s < 60 / 30 and f.at_s < 60 for f in a)
    assert all(f.amount_ms > 0 for f in a if f.kind in ("delay", "clock_forward"))
    assert all(f.amount_ms < 0 for f in a if f.kind == "clock_back")


def test_a_cluster_schedule_kills_brokers_of_the_cluster_and_replays() -> None:
    """``broker_kill`` hits a ``broker-…`` target only, every round has one, the same seed gives
    the same schedule, and a one-broker target list cannot take it."""
    targets = ["broker-a", "broker-b", "plain", "tx", "outbox", "chaos-g1", "chaos-g2"]
    faults = schedule(5, 12, 60.0, targets, CLUSTER_KINDS)
    kills = [f for f in faults if f.kind == "broker_kill"]
    assert len(kills) == 4 and {f.target for f in kills} <= {"broker-a", "broker-b"}
    assert faults == schedule(5, 12, 60.0, targets, CLUSTER_KINDS)
    with pytest.raises(ValueError, match="broker_kill"):
        schedule(5, 3, 10.0, ["broker", "plain"], CLUSTER_KINDS)


class _ServesDuringStart:
    """A broker stand-in whose ``start`` lets the offset sampler read the new process before
    ``start`` returns, as a real one does once it listens (unit level: no process)."""

    def __init__(self, samples: list[OffsetSample]) -> None:
        self.samples = samples

    def start(self) -> None:
        import time
        self.samples.append(OffsetSample(time.time() * 1000, "g1", "plain", 0, 0))
        time.sleep(0.01)  # the runner's thread is scheduled late


def test_a_sample_read_from_the_new_broker_before_start_returns_follows_its_restart() -> None:
    """The restart time is taken before the launch: a sample of the restarted broker, with its
    older saved offset, taken while ``start`` still waits, is not an offset regression (the
    cause of an intermittent failure of the short chaos run, seed 11)."""
    events, obs = clean()
    obs.offsets.append(OffsetSample(1.0, "g1", "plain", 0, 1))  # the old process, before the kill
    target = BrokerTarget(_ServesDuringStart(obs.offsets))  # type: ignore[arg-type]
    target.start()
    obs.broker_restarts = target.restarts
    assert obs.offsets[-1].t >= target.restarts[0]
    assert check(events, obs) == []


def replicated() -> tuple[list[dict[str, Any]], Observation]:
    """The clean history of a replicated run: the plain send and the commit acknowledged SUCCESS
    before the master was killed at t=20 and the slave scanned; at the end the caught-up slave
    holds everything the master does, and its log is a prefix of the master's."""
    events, obs = clean()
    for e in events:
        if e["op"] == "send" and e["phase"] == "ok":
            e.update(status="SEND_OK", queue=0, offset=0)
    obs.stored = [Stored(m.topic, m.queue_id, m.offset, m.key, body=m.key.encode())
                  for m in obs.stored]
    down = [m for m in obs.stored if m.key in ("a", "c")]  # the outbox event came later
    obs.replicated = True
    obs.replica_snapshots = [ReplicaSnapshot(20, down), ReplicaSnapshot(50, list(obs.stored), True)]
    obs.master_log, obs.slave_log = b"record-1record-2record-3", b"record-1record-2"
    return events, obs


def test_a_clean_replicated_history_has_no_violation() -> None:
    assert check(*replicated()) == []


def test_an_acknowledged_send_missing_from_the_slave_while_the_master_is_down() -> None:
    events, obs = replicated()
    obs.replica_snapshots[0] = ReplicaSnapshot(20, [m for m in obs.stored if m.key == "c"])
    (v,) = check(events, obs)
    assert (v.kind, v.key) == ("replica_lost", "a") and "missing" in v.detail
    assert "while the master was down" in v.detail
    assert [e["op"] for e in v.excerpt][:2] == ["send", "send"]


def test_a_committed_transaction_missing_from_the_slave_at_the_end() -> None:
    events, obs = replicated()
    final = [m for m in obs.stored if m.key != "c"]
    obs.replica_snapshots[1] = ReplicaSnapshot(50, final, True)
    (v,) = check(events, obs)
    assert (v.kind, v.key) == ("replica_lost", "c") and "at the end" in v.detail


def test_a_slave_copy_at_another_offset_or_with_other_bytes_is_not_the_message() -> None:
    events, obs = replicated()
    moved = Stored("plain", 0, 5, "a", body=b"a")
    obs.replica_snapshots[0] = ReplicaSnapshot(20, [moved, obs.stored[1]])
    (v,) = check(events, obs)
    assert v.kind == "replica_lost" and "offset 5" in v.detail
    events, obs = replicated()
    changed = Stored("tx", 0, 0, "c", body=b"C")
    obs.replica_snapshots[0] = ReplicaSnapshot(20, [obs.stored[0], changed])
    (v,) = check(events, obs)
    assert (v.kind, v.key) == ("replica_lost", "c") and "byte for byte" in v.detail


def test_a_send_not_acknowledged_by_the_slave_may_or_may_not_be_there() -> None:
    """FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE: stored on the master, not on the slave."""
    for status in ("FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"):
        events, obs = replicated()
        for e in events:
            if e["op"] == "send" and e["phase"] == "ok":
                e["status"] = status
        obs.replica_snapshots[0] = ReplicaSnapshot(20, [m for m in obs.stored if m.key == "c"])
        assert check(events, obs) == []
        obs.stored = [m for m in obs.stored if m.key != "a"]  # the master must still hold it
        assert {v.kind for v in check(events, obs)} == {"lost"}


def test_an_acknowledgement_after_the_master_died_is_not_asked_of_the_scan() -> None:
    events, obs = replicated()
    obs.replica_snapshots[0] = ReplicaSnapshot(1.5, [])  # killed before the send's ok at t=2
    assert check(events, obs) == []
    obs.replica_snapshots[0] = ReplicaSnapshot(2.5, [])
    assert kinds(events, obs) == {"replica_lost": {"a"}}


def test_a_rolled_back_transaction_on_the_slave() -> None:
    events, obs = replicated()
    obs.replica_snapshots[0] = ReplicaSnapshot(20, [*obs.replica_snapshots[0].stored,
                                                    Stored("tx", 1, 0, "r", body=b"r")])
    assert kinds(events, obs) == {"replica_rolled_back_visible": {"r"}}


def test_a_slave_log_that_is_not_a_prefix_of_the_masters() -> None:
    events, obs = replicated()
    obs.slave_log = b"record-1recXrd-2"
    (v,) = check(events, obs)
    assert v.kind == "replica_diverged" and "first difference at 11" in v.detail
    obs.slave_log = obs.master_log + b"record-4"  # ahead of its master
    (v,) = check(events, obs)
    assert v.kind == "replica_diverged"
    obs.slave_log = obs.master_log
    assert check(events, obs) == []


def test_a_slave_that_never_caught_up_is_reported_not_read_as_a_loss() -> None:
    events, obs = replicated()
    obs.replica_snapshots[1] = ReplicaSnapshot(50, obs.replica_snapshots[0].stored, True)
    assert kinds(events, obs) == {"replica_lost": {"o"}}
    obs.replica_caught_up = False
    assert kinds(events, obs) == {"replica_behind": {"commit log"}}


def test_a_replicated_schedule_aims_at_the_master_the_slave_and_the_link() -> None:
    workers = ["plain", "tx", "outbox", "chaos-g1", "chaos-g2"]
    faults = schedule(9, len(REPLICA_KINDS), 40.0, workers, REPLICA_KINDS)
    assert {f.kind for f in faults} == set(REPLICA_KINDS)
    for f in faults:
        want = {"master_kill": "master", "master_kill_cut": "master", "master_pause": "master",
                "slave_kill": "slave",
                "slave_pause": "slave"}.get(f.kind, "ha-link" if f.kind.startswith("ha_") else "")
        assert f.target == want if want else f.target in workers
    assert all(f.amount_ms > 0 for f in faults if f.kind == "ha_delay")
    assert faults == schedule(9, len(REPLICA_KINDS), 40.0, workers, REPLICA_KINDS)


def test_a_replicated_run_takes_one_slave_and_one_broker(tmp_path: Path) -> None:
    """Refused before anything starts (no process, no directory)."""
    for bad in (ChaosConfig(replicas=2), ChaosConfig(replicas=1, brokers=2)):
        with pytest.raises(ValueError, match="replicas"):
            run_chaos(tmp_path / "run", bad)
    assert not (tmp_path / "run").exists()
