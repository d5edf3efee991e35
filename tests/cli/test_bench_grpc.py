"""``txmq bench grpc`` end to end, shortened: one round against a real broker with both doors and the
bare grpc.aio ceiling; every figure is measured and the JSON carries the ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_one_short_round_measures_both_doors(tmp_path: Path) -> None:
    out = tmp_path / "grpc.json"
    proc = subprocess.run([sys.executable, "-m", "txmq", "bench", "grpc", "--rounds", "1", "--seconds", "0.5",
                           "--messages", "200", "--queues", "2", "--ack", "each", "--json", str(out),
                           "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gRPC / remoting" in proc.stdout
    r = json.loads(out.read_text())
    for run in ("send_grpc", "send_remoting", "send_grpc_echo_ceiling", "receive_ack_grpc_pop",
                "receive_ack_remoting_pull"):
        assert r[f"{run}_msgs_per_s"] > 0, run
        assert r[f"{run}_server_cpu_us_per_msg"] >= 0, run  # (clock ticks: a short run may read 0)
    assert r["send_grpc_vs_remoting"] > 0 and r["receive_ack_grpc_vs_remoting"] > 0
    assert r["send_grpc_vs_echo_ceiling"] > 0
    assert len(r["rounds"]) == 1 and r["ack"] == "each" and r["messages"] == 200
