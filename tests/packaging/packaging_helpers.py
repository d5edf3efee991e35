"""Helpers of the packaging tests (imported by name: pytest puts this directory on ``sys.path``):
fresh virtualenvs with the wheel and one extra set each, what they hold, and processes run in them.

The versions are uv.lock's (``uv export`` as constraints), installed from uv's cache with hardlinks:
``--offline`` first (about a second per virtualenv), then online if the cache lacks something (a cold
cache downloads). Offline first because revalidating PySpark's sdist (it has no wheel) against the
index rebuilds it whenever the index answers "modified", 45 s a virtualenv here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from txmq.testing import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
UV_TIMEOUT_S = 300
"""Longest a ``uv build`` / ``uv pip install`` may take (a cold cache downloads the wheels)."""
RUN_TIMEOUT_S = 120
"""Longest one smoke step (a ``python -c`` in a virtualenv) may take."""
BROKER_START_TIMEOUT_S = 30
"""Longest a broker started from a virtualenv may take to write its port file."""


def uv(*args: str) -> str:
    return subprocess.run(["uv", *args], cwd=ROOT, check=True, capture_output=True, text=True,
                          timeout=UV_TIMEOUT_S).stdout


def install_venv(where: Path, wheel: Path, constraints: Path, extras: str = "") -> Path:
    """A fresh virtualenv at ``where`` with ``txmq[extras]`` from ``wheel``; its python."""
    uv("venv", "--quiet", "--python", sys.executable, str(where))
    spec = f"txmq[{extras}] @ {wheel.as_uri()}" if extras else f"txmq @ {wheel.as_uri()}"
    install = ["pip", "install", "--quiet", "--python", str(where), "-c", str(constraints), spec]
    try:
        uv(*install[:2], "--offline", *install[2:])
    except subprocess.CalledProcessError:
        uv(*install)
    return where / "bin" / "python"


def site_bytes(python: Path) -> int:
    """Bytes of the files in the virtualenv's site-packages (no ``.pyc``: uv writes none)."""
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return sum(p.stat().st_size for p in Path(site).rglob("*") if p.is_file() and not p.is_symlink())


def distributions(python: Path) -> set[str]:
    """The names of the distributions installed in ``python``'s virtualenv."""
    out = uv("pip", "list", "--python", str(python), "--format", "json")
    return {d["name"] for d in json.loads(out)}


def run(python: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args…``; its output (fails the test if it does not exit 0)."""
    proc = subprocess.run([python, "-c", code, *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return proc


def txmq(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``txmq args…`` from ``python``'s virtualenv (its console script), not checked."""
    return subprocess.run([python.parent / "txmq", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env={**os.environ, "COLUMNS": "200"})


@contextlib.contextmanager
def broker(python: Path, tmp: Path, *args: str) -> Iterator[int]:
    """``txmq broker`` from ``python``'s virtualenv (topic ``smoke``, 1 queue), on a free port;
    yields the port once its port file exists, and checks that SIGTERM stops it cleanly."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "broker.toml").write_text('topics = { smoke = 1 }\n')
    port, port_file = free_port(), tmp / "port"
    proc = subprocess.Popen(
        [python, "-m", "txmq", "broker", "--config", tmp / "broker.toml", "--port", str(port),
         "--data-dir", tmp / "data", "--port-file", port_file, *args], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, timeout_s=BROKER_START_TIMEOUT_S)
        assert proc.poll() is None, proc.communicate()[1]
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
