"""``txmq bench tracing`` end to end, shortened: one round of each mode against a real broker, off
and no-op side by side, and the tracing calls alone; the JSON carries every rate and ratio, and the
SDK mode's spans reached its file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_one_short_round_measures_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "tracing.json"
    proc = subprocess.run([sys.executable, "-m", "txmq", "bench", "tracing", "--rounds", "1",
                           "--messages", "300", "--calls", "200", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "txmq bench tracing" in proc.stdout
    r = json.loads(out.read_text())
    for kind in ("send", "consume"):
        for mode in ("off", "noop", "sdk"):
            assert r[f"{kind}_{mode}_msgs_per_s"] > 0, (kind, mode)
        assert r[f"{kind}_noop_to_off"] > 0 and r[f"{kind}_sdk_to_off"] > 0
        assert len(r[f"{kind}_noop_to_off_side_by_side_runs"]) == 1
    for call in ("send_span", "process_span"):
        assert all(r[f"{call}_{m}_us"] > 0 for m in ("off", "noop", "sdk", "sdk_unexported"))
    # the sdk mode's spans: traced input (300) + warm-up (300) + a send run and a consume run (600)
    assert r["spans_exported"] >= 1200
    assert r["rounds"] == 1 and r["messages"] == 300
