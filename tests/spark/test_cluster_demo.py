"""``txmq demo --spark-master spark://…``: the demo's Spark stage on the standalone cluster, at a
tiny scale factor. The report must be consistent and name the master it ran on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from txmq.testing import FAST_START_JAVA_OPTIONS, SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_demo_runs_its_spark_stage_on_the_cluster(spark_cluster: SparkCluster,
                                                      tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "--sf", "0.001", "--run-dir", str(tmp_path / "run"),
         "--report", str(report), "--spark-master", spark_cluster.master_url],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAVA_TOOL_OPTIONS": FAST_START_JAVA_OPTIONS})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["spark_master"] == spark_cluster.master_url
    assert r["spark_stage_s"] == r["stages"]["spark"] > 0
    assert r["consistent"] is True and r["spark_skipped"] is False
    assert r["spark_orders"] == r["committed"] - r["compensated"] > 0 and r["spark_missing"] == 0
    assert r["q1_matches_oracle"] is True and r["revenue_matches_oracle"] is True


def test_the_demo_refuses_a_master_it_cannot_use(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "--sf", "0.001", "--run-dir", str(tmp_path / "run"),
         "--spark-master", "yarn"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "use local[N] or spark://host:port" in proc.stdout
    assert not (tmp_path / "run").exists()  # refused before anything started
