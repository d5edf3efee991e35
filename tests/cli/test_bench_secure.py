"""``txmq bench send --secure`` end to end, shortened: ACL and TLS off, each alone and both on, in one
run against real brokers; every figure is measured and the JSON carries the ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_one_short_run_of_each_mode(tmp_path: Path) -> None:
    out = tmp_path / "secure.json"
    proc = subprocess.run([sys.executable, "-m", "txmq", "bench", "send", "--secure", "--seconds", "0.5",
                           "--producers", "1", "--in-flight", "8", "--json", str(out), "--data-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ACL on (signed), TLS enforcing" in proc.stdout
    r = json.loads(out.read_text())
    for run in ("send_plain", "send_acl", "send_tls", "send_acl_tls"):
        assert r[f"{run}_msgs_per_s"] > 0, run
    assert r["acl_tls_vs_plain"] > 0 and r["producers"] == 1
