"""A small chaos run over real processes: the workload under ≥ 10 faults of every kind, then the
history check finds no violation (see txmq.testing.chaos and docs/reliability.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txmq.testing.chaos import (
    CLUSTER_KINDS,
    KINDS,
    REPLICA_KINDS,
    ChaosConfig,
    render_markdown,
    run_chaos,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_a_small_chaos_schedule_leaves_no_violation(tmp_path: Path) -> None:
    res = run_chaos(tmp_path / "run", ChaosConfig(seed=11, faults=len(KINDS) + 2, duration_s=33))
    report = render_markdown(res)
    (tmp_path / "report.md").write_text(report)
    if res.skipped_kinds and os.environ.get("TXMQ_REQUIRE_TMPFS") == "1":
        pytest.fail(f"fault kinds skipped: {res.skipped_kinds}")
    assert res.violations == [], report
    assert res.quiesced, report
    injected = sum(res.faults_by_kind.values())
    assert injected >= 10 and set(res.faults_by_kind) == set(KINDS) - set(res.skipped_kinds), report
    ops = res.operations
    assert min(ops.get("send ok", 0), ops.get("tx ok", 0), ops.get("put ok", 0)) > 50, report
    assert res.tx_states.get("COMMIT", 0) > 20 and res.tx_states.get("ROLLBACK", 0) > 5, report
    assert all(f.healed_ms > f.started_ms > 0 for f in res.schedule), report


def test_a_broker_killed_in_a_cluster_leaves_no_violation(tmp_path: Path) -> None:
    """A cluster run: a name server and two brokers, the workload finding them through it; the
    nemesis SIGKILLs one broker at a time (restarted after its slot) while the other keeps serving,
    besides killing and pausing the workload's processes. The history check finds nothing."""
    res = run_chaos(tmp_path / "run", ChaosConfig(seed=23, brokers=2, faults=4, duration_s=20,
                                                   warmup_s=3))
    report = render_markdown(res)
    (tmp_path / "report.md").write_text(report)
    assert res.violations == [], report
    assert res.quiesced, report
    assert res.faults_by_kind.get("broker_kill", 0) >= 1, report
    assert set(res.faults_by_kind) <= set(CLUSTER_KINDS), report
    assert all(f.healed_ms > f.started_ms > 0 for f in res.schedule), report
    assert set(res.stored_by_broker) == {"broker-a", "broker-b"}, report
    assert min(res.stored_by_broker.values()) > 0, report
    ops = res.operations
    assert min(ops.get("send ok", 0), ops.get("tx ok", 0), ops.get("put ok", 0)) > 20, report
    assert res.tx_states.get("COMMIT", 0) > 10, report


def test_a_replicated_group_under_master_slave_and_ha_link_faults_leaves_no_violation(
        tmp_path: Path) -> None:
    """A replicated run: a SYNC_MASTER and its slave, the HA link through a fault proxy. The
    nemesis SIGKILLs (and restarts) and SIGSTOPs the master and the slave, cuts, delays and
    half-opens the link, and kills the master while the link is cut, one fault of each kind; the
    slave is scanned while the master is down and at the end. The checker's replication
    properties find nothing: what the master acknowledged SUCCESS is on the slave byte for byte,
    no rolled-back transaction is, and the slave's commit log is a prefix of the master's."""
    kinds = tuple(k for k in REPLICA_KINDS if k not in ("kill", "pause"))
    res = run_chaos(tmp_path / "run", ChaosConfig(seed=7, replicas=1, faults=len(kinds),
                                                   duration_s=21, warmup_s=2, kinds=kinds))
    report = render_markdown(res)
    (tmp_path / "report.md").write_text(report)
    assert res.violations == [], report
    assert res.quiesced, report
    assert set(res.faults_by_kind) == set(kinds), report
    assert all(f.healed_ms > f.started_ms > 0 for f in res.schedule), report
    kills = [f for f in res.schedule if f.kind in ("master_kill", "master_kill_cut")]
    assert len(kills) == 2 and all(f.note.startswith("slave scanned") for f in kills), report
    assert res.replica["snapshots"] == 3 and res.replica["stored"] == res.stored, report
    assert 0 < res.replica["log_bytes"] <= res.replica["master_log_bytes"], report
    assert res.operations.get("send ok", 0) > 20 and res.tx_states.get("COMMIT", 0) > 0, report
    assert res.operations.get("send ok (SLAVE_NOT_AVAILABLE)", 0) > 0, report  # the slave's kill
