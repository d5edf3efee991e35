"""The README's picture of one order's trace, from a real ``txmq demo`` run: the order the run's
report names (``trace_example``: UNKNOWN, committed by a check-back, refused by the ledger,
cancelled upstream), rendered by ``txmq trace show --html`` and photographed with Chromium.

Usage::

    uv run --locked txmq demo --run-dir runs/demo-trace
    uv run --locked python benchmarks/demo_trace_screenshot.py runs/demo-trace [--out docs/img/demo-trace.png]

Needs Chromium (:mod:`txmq.testing.browser` installs it with apt when missing and run as root).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from txmq.testing.browser import chromium

VIEWPORT = {"width": 1400, "height": 900}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a txmq demo run directory (with report.json)")
    p.add_argument("--out", type=Path, default=Path("docs/img/demo-trace.png"))
    a = p.parse_args()
    report = json.loads((a.run_dir / "report.json").read_text())
    example = report.get("trace_example")
    if not example:
        sys.exit(f"{a.run_dir / 'report.json'} names no example trace (a run with --no-traces, "
                 "or without the extra otlp?)")
    page = a.run_dir / f"trace-{example['trace_id']}.html"
    title = (f"Order {example['order_key']}: UNKNOWN, a check-back commits it, the ledger refuses it, "
             "a ROLLBACK event goes back, the order service cancels it")
    subprocess.run([sys.executable, "-m", "txmq", "trace", "show", report["trace_file"], "--trace-id",
                    example["trace_id"], "--html", str(page), "--title", title], check=True)
    with chromium() as browser:
        tab = browser.new_page(viewport=VIEWPORT)
        tab.goto(page.resolve().as_uri())
        tab.screenshot(path=str(a.out), full_page=True)
    print(f"{a.out}: trace {example['trace_id']} of order {example['order_key']} ({page})")


if __name__ == "__main__":
    main()
