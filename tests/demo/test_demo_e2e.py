"""The main job end to end, at a tiny scale factor: real broker, producer and ledger processes,
SIGKILLed producers, ledger rejections compensated through the local message table, real Spark.
The report must be consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from demo_helpers import assert_example_trace


@pytest.mark.spark
@pytest.mark.slow
def test_demo_is_consistent_at_sf_0_002(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "--sf", "0.002", "--run-dir", str(tmp_path / "run"),
         "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["orders_total"] == 3000
    assert r["lost"] == 0 and r["phantom"] == 0
    assert r["committed"] > 0
    assert r["q1_matches_oracle"] is True and r["revenue_matches_oracle"] is True
    assert r["rolled_back"] > 0 and r["unknown_resolved_by_check"] > 0
    assert r["producer_crashes"] > 0 and r["check_backs"] >= r["unknown_resolved_by_check"]
    assert r["ledger_rejected"] == r["compensated"] == r["rejects_planned"] > 0  # the rollback flow
    assert r["uncompensated"] == 0 and r["wrongly_cancelled"] == 0
    assert r["spark_orders"] == r["committed"] - r["compensated"] and r["spark_missing"] == 0
    assert set(r["stages"]) >= {"generate", "produce", "settle", "ledger", "compensate", "spark"}
    assert_example_trace(r, proc.stdout, "rocketmq")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_on_two_brokers_is_consistent_and_spreads_the_orders(tmp_path: Path) -> None:
    """``--brokers 2``: a name server and two brokers; every client finds them through it. The
    checks are the one-broker run's, and both brokers stored orders, together exactly the
    committed ones."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "--brokers", "2", "--sf", "0.001",
         "--run-dir", str(tmp_path / "run"), "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["consistent"] is True and r["brokers"] == 2 and r["namesrv_addr"]
    assert r["orders_total"] == 1500 and r["lost"] == 0 and r["phantom"] == 0
    assert r["q1_matches_oracle"] is True and r["revenue_matches_oracle"] is True
    assert r["ledger_rejected"] == r["compensated"] == r["rejects_planned"] > 0
    assert r["spark_orders"] == r["committed"] - r["compensated"] and r["spark_missing"] == 0
    per_broker = r["orders_stored_per_broker"]
    assert set(per_broker) == {"broker-a", "broker-b"}, per_broker
    assert min(per_broker.values()) > 0 and sum(per_broker.values()) == r["committed"], per_broker
    assert "broker-a at" in proc.stdout and "broker-b at" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_on_a_sync_master_and_its_slave_ends_with_an_identical_slave_log(tmp_path: Path) -> None:
    """``--replicas 1`` (Spark off, to keep it short): the demo's checks hold on a SYNC_MASTER, and
    its slave's commit log is byte-identical to the master's at the end."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "--replicas", "1", "--sf", "0.001", "--no-spark",
         "--run-dir", str(tmp_path / "run"), "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["consistent"] is True and r["lost"] == 0 and r["phantom"] == 0
    assert r["replicas"] == 1 and r["slave_log_identical"] is True and r["slave_log_bytes"] > 0
    assert (tmp_path / "run" / "slave" / "store" / "commitlog").is_dir()
