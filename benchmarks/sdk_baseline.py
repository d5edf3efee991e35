"""The rebuilt SDK against a build of an earlier txmq, in one run (issue #23: single-broker send
and consume throughput through the cluster client must not fall more than 5 %).

Builds the baseline from a git ref of this repository into its own worktree and virtualenv
(``uv sync --locked`` there), starts one broker (this tree's), and runs
``benchmarks/sdk_workload.py`` under each interpreter in turn, ``--rounds`` times interleaved, each
on a fresh topic. Reports per-round rates, the medians, and the ratio this tree / baseline.

    uv run --locked python benchmarks/sdk_baseline.py --ref e5390a6 --rounds 3

Writes ``--json`` if given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from txmq.testing import run_broker

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "benchmarks" / "sdk_workload.py"
_QUEUES = 4


def _baseline(ref: str, where: Path) -> Path:
    """A worktree of ``ref`` with its locked environment; returns its python."""
    wt = where / f"baseline-{ref}"
    if not wt.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), ref],
                       check=True)
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(wt / ".venv")}
    subprocess.run(["uv", "sync", "--locked", "--quiet"], cwd=wt, check=True, env=env)
    return wt / ".venv" / "bin" / "python"


def _run(python: Path, endpoints: str, topic: str, messages: int) -> dict[str, float]:
    out = subprocess.run([str(python), str(WORKLOAD), "--endpoints", endpoints, "--topic", topic,
                          "--messages", str(messages)], check=True, capture_output=True, text=True,
                         cwd=tempfile.gettempdir())
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", default="e5390a6", help="git ref of the baseline build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "txmq-sdk-bench")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    a.work_dir.mkdir(parents=True, exist_ok=True)
    pythons = {"baseline": _baseline(a.ref, a.work_dir), "this tree": Path(sys.executable)}
    topics = {f"sdk-{n}-{r}": _QUEUES for r in range(a.rounds) for n in range(len(pythons))}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in pythons}
    with run_broker(topics=topics) as broker:
        for r in range(a.rounds):
            order = list(pythons.items()) if r % 2 == 0 else list(reversed(pythons.items()))
            for name, py in order:
                n = list(pythons).index(name)
                res = _run(py, broker.endpoints, f"sdk-{n}-{r}", a.messages)
                rows[name].append(res)
                print(f"round {r + 1} {name:>9}: send {res['send_per_s']:8.0f}/s  "
                      f"drain {res['drain_per_s']:8.0f}/s", flush=True)
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rows.items()}
    ratio = {k: med["this tree"][k] / med["baseline"][k] for k in ("send_per_s", "drain_per_s")}
    print(f"medians: {json.dumps(med)}")
    print(f"this tree / baseline: send {ratio['send_per_s']:.3f}, drain {ratio['drain_per_s']:.3f}")
    if a.json:
        a.json.write_text(json.dumps({"ref": a.ref, "rounds": rows, "medians": med,
                                      "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
