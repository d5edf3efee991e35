"""The main job end to end, at a tiny scale factor: real broker, producer and ledger processes,
SIGKILLed producers, ledger rejections compensated through the local message table, real Spark.
The report must be consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


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
