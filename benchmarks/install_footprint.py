"""What ``pip install txmq[...]`` costs, and how fast the installed ``txmq`` starts (issue 27).

For each wheel given (default: one ``uv build --wheel`` of this tree) and each extra set, a fresh
virtualenv at uv.lock's versions (``uv export`` as constraints, from uv's cache): its distributions
and installed megabytes (10^6 bytes) without ``.pyc`` (as uv installs) and with them (as pip does:
``--compile-bytecode``). Then, in the compiled ``broker`` virtualenv of each wheel, interleaved
(the wheels side by side, so that the machine's load hits them alike), ``--runs`` times:
``python -X importtime -c 'import txmq.cli'`` (the cumulative figure) and a ``txmq broker`` on an
empty data directory, until its port file exists (wall time, and the process's CPU time then).
Prints a table and, with ``--json PATH``, writes the figures::

    uv run --locked python benchmarks/install_footprint.py [--wheel A.whl --wheel B.whl] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("", "broker", "outbox", "console", "spark", "all")
PORT_FILE_TIMEOUT_S = 30.0


def _uv(*args: str) -> str:
    return subprocess.run(["uv", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _venv(where: Path, wheel: Path, constraints: Path, extras: str, compiled: bool) -> Path:
    _uv("venv", "--quiet", "--python", sys.executable, str(where))
    spec = f"txmq[{extras}] @ {wheel.as_uri()}" if extras else f"txmq @ {wheel.as_uri()}"
    args = ["--quiet", "--python", str(where), "-c", str(constraints), spec]
    args += ["--compile-bytecode"] if compiled else []
    try:
        _uv("pip", "install", "--offline", *args)
    except subprocess.CalledProcessError:  # not all in uv's cache: download
        _uv("pip", "install", *args)
    return where / "bin" / "python"


def _footprint(python: Path) -> tuple[int, float]:
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    size = sum(p.stat().st_size for p in Path(site).rglob("*") if p.is_file() and not p.is_symlink())
    dists = json.loads(_uv("pip", "list", "--python", str(python), "--format", "json"))
    return len(dists), size / 1e6


def _import_cli_s(python: Path) -> float:
    err = subprocess.run([python, "-X", "importtime", "-c", "import txmq.cli"], check=True,
                         capture_output=True, text=True).stderr
    line = next(ln for ln in err.splitlines() if ln.rstrip().endswith("| txmq.cli"))
    return int(line.split("|")[1]) / 1e6


def _listen_s(python: Path, tmp: Path) -> tuple[float, float]:
    """Wall seconds from the start of ``txmq broker`` to its port file, and its CPU seconds then."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.monotonic()
    proc = subprocess.Popen([python, "-m", "txmq", "broker", "--port", "0", "--data-dir", str(tmp / "data"),
                             "--port-file", str(tmp / "port")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (tmp / "port").exists():
            if time.monotonic() - started > PORT_FILE_TIMEOUT_S:
                raise TimeoutError("the broker wrote no port file")
            time.sleep(0.002)
        wall = time.monotonic() - started
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return wall, cpu


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", type=Path, action="append", help="a txmq wheel (repeatable)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="txmq-footprint-"))
    wheels = [w.resolve() for w in a.wheel or []]
    if not wheels:
        _uv("build", "--quiet", "--wheel", "--out-dir", str(work / "dist"))
        wheels = [next((work / "dist").glob("txmq-*.whl"))]
    constraints = work / "constraints.txt"
    _uv("export", "--quiet", "--locked", "--all-extras", "--no-dev", "--no-emit-project", "--no-hashes",
        "--output-file", str(constraints))
    labels = [f"{w}:{wheel.name}" for w, wheel in enumerate(wheels)]
    sizes: dict[str, dict[str, dict[str, float]]] = {label: {} for label in labels}
    for w, (label, wheel) in enumerate(zip(labels, wheels, strict=True)):
        for extras in EXTRAS:
            name = extras or "core"
            raw = _footprint(_venv(work / f"{w}-{name}", wheel, constraints, extras, False))
            pyc = _footprint(_venv(work / f"{w}-{name}-pyc", wheel, constraints, extras, True))
            sizes[label][name] = {"distributions": raw[0], "mb": round(raw[1], 1),
                                  "mb_with_pyc": round(pyc[1], 1)}
            print(f"{label} {name:8} {raw[0]:3} distributions {raw[1]:7.1f} MB ({pyc[1]:.1f} MB with .pyc)")
    times: dict[str, dict[str, list[float]]] = {
        label: {"import_cli_s": [], "listen_s": [], "listen_cpu_s": []} for label in labels}
    for _ in range(a.runs):
        for w, label in enumerate(labels):
            python = work / f"{w}-broker-pyc" / "bin" / "python"
            times[label]["import_cli_s"].append(_import_cli_s(python))
            wall, cpu = _listen_s(python, work / f"run-{w}")
            times[label]["listen_s"].append(wall)
            times[label]["listen_cpu_s"].append(cpu)
    for label, row in times.items():
        print(f"{label}: import txmq.cli {_spread(row['import_cli_s'])} s; broker listening "
              f"{_spread(row['listen_s'])} s after start, {_spread(row['listen_cpu_s'])} s of CPU "
              f"(median, min–max of {a.runs})")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print("load average", " ".join(load))
    if a.json:
        a.json.write_text(json.dumps({"sizes": sizes, "times": times, "load_average": load}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
