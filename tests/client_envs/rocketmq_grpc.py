"""A separate Python environment holding the official Apache RocketMQ 5 Python client (gRPC), and a
runner for scenario scripts that use it.

The conformance tests drive txmq's gRPC door with PyPI ``rocketmq-python-client`` 5.1.2, the only
maintained Python client of Apache RocketMQ, which speaks ``apache.rocketmq.v2.MessagingService`` only.
It is never a txmq dependency: :func:`ensure_env` builds its own virtual environment from a
requirements file that pins the client *and every package it pulls in* (grpcio, protobuf,
opentelemetry, ...) to exact versions, installed with ``--no-deps``, so the environment is the same on
every machine. The environment is made once and cached under :func:`~client_envs._venv.cache_root`
(``$TXMQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/txmq``, else ``~/.cache/txmq``) in a directory named after
the client version, a digest of the requirements file and the Python minor version: editing a pin
builds a new one. Building needs PyPI and either ``uv`` on ``PATH`` or ``pip`` in this interpreter.

A scenario script runs with that environment's python (:class:`ScenarioProcess`, :func:`run_scenario`)
and reports what the client saw as one JSON object per stdout line (``{"event": "...", ...}``). The
client writes its own log to ``~/logs/rocketmq_python/rocketmq_client.log``; :func:`scenario_env`
points ``HOME`` at a directory of the caller's choosing so that log lands beside the test's files.

From a shell (builds first if needed, then prints the environment's python)::

    PYTHONPATH=tests python -m client_envs.rocketmq_grpc \
        tests/conformance/clients/rocketmq_grpc_requirements.txt
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client_envs._venv import cache_root, locked, run_installer, venv_python
from txmq.errors import LocalError
from txmq.testing import wait_until

__all__ = [
    "CLIENT_LOG",
    "CLIENT_PACKAGE",
    "CLIENT_VERSION",
    "REQUIRE_ENV",
    "Event",
    "GrpcClientUnavailable",
    "ScenarioProcess",
    "ensure_env",
    "env_dir",
    "read_pins",
    "run_scenario",
    "scenario_env",
]

CLIENT_PACKAGE = "rocketmq-python-client"
CLIENT_VERSION = "5.1.2"
REQUIRE_ENV = "TXMQ_REQUIRE_ROCKETMQ_GRPC"
"""``1``: tests that cannot build the environment fail instead of skipping (``.ci/run`` sets it)."""
CLIENT_LOG = Path("logs") / "rocketmq_python" / "rocketmq_client.log"
"""Where the client logs, relative to ``HOME`` (``rocketmq/v5/log/log_config.py``)."""
INSTALL_TIMEOUT_S = 600.0  # one installer call: a venv, or the download of ~25 wheels
SCENARIO_TIMEOUT_S = 120.0  # a scenario process that has not exited by then is killed
_READY_MARKER = ".txmq-ready"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")

Event = dict[str, Any]
"""One JSON line of a scenario script: ``{"event": name, ...fields}``."""


class GrpcClientUnavailable(LocalError):
    """The official gRPC client environment cannot be built here: no PyPI, no installer, a pinned
    wheel missing for this platform, or a requirements file that is not a list of exact pins. The
    message carries the installer's output."""

    code = "GRPC_CLIENT_UNAVAILABLE"


def read_pins(requirements: Path) -> dict[str, str]:
    """The ``name==version`` lines of ``requirements`` (comments and blank lines skipped).

    Raises:
        GrpcClientUnavailable: the file is unreadable, a line is not an exact pin, or the client is
            not pinned at :data:`CLIENT_VERSION`.
    """
    try:
        text = requirements.read_text()
    except OSError as e:
        raise GrpcClientUnavailable(f"cannot read {requirements}: {e}") from e
    pins: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if m is None:
            raise GrpcClientUnavailable(f"{requirements}:{n}: not an exact pin (name==version): {line!r}")
        pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    if pins.get(CLIENT_PACKAGE) != CLIENT_VERSION:
        raise GrpcClientUnavailable(f"{requirements} must pin {CLIENT_PACKAGE}=={CLIENT_VERSION}")
    return pins


def env_dir(requirements: Path, root: Path | None = None) -> Path:
    """The environment's directory: one per client version, requirements digest and Python minor."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return (root or cache_root()) / f"rocketmq-grpc-{CLIENT_VERSION}-{digest}-{py}"


def _run(cmd: list[str], what: str) -> None:
    run_installer(cmd, what, GrpcClientUnavailable, INSTALL_TIMEOUT_S)


def _install(venv: Path, requirements: Path) -> None:
    """Make the venv and install exactly the pinned packages (``--no-deps``: nothing unpinned)."""
    uv = shutil.which("uv")
    if uv:
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], "uv venv")
        _run([uv, "pip", "install", "--quiet", "--python", str(venv_python(venv)), "--no-deps",
              "--requirement", str(requirements)], f"installing {requirements.name}")
        return
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    _run([str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "--quiet", "install",
          "--no-deps", "--requirement", str(requirements)], f"installing {requirements.name}")


def _verify(python: Path) -> None:
    code = ("import rocketmq; from rocketmq import (ClientConfiguration, Credentials, Producer, "
            "SimpleConsumer, TransactionChecker); from importlib.metadata import version; "
            "print(version('rocketmq-python-client'))")
    _run([str(python), "-c", code], f"importing {CLIENT_PACKAGE} {CLIENT_VERSION}")


def ensure_env(requirements: Path, root: Path | None = None) -> Path:
    """Build (once; cached, idempotent, safe across processes) and return the environment's python.

    Args:
        requirements: exact pins of the client and all its dependencies (``name==version`` lines);
            it must pin :data:`CLIENT_PACKAGE` at :data:`CLIENT_VERSION`.
        root: the cache directory (default ``cache_root()``).

    Returns:
        The path of the environment's ``python``, which can ``import rocketmq``.

    Raises:
        GrpcClientUnavailable: a bad requirements file, no installer, PyPI unreachable, a pinned
            wheel missing for this platform, or a client that does not import.
    """
    read_pins(requirements)
    venv = env_dir(requirements, root)
    with locked(venv.with_name(venv.name + ".lock")):
        if (venv / _READY_MARKER).exists():
            return venv_python(venv)
        shutil.rmtree(venv, ignore_errors=True)  # a build interrupted earlier
        _install(venv, requirements)
        _verify(venv_python(venv))
        (venv / _READY_MARKER).write_text(requirements.read_text())
    return venv_python(venv)


def scenario_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a scenario process: this one's, with ``HOME`` = ``home`` (where the client
    writes :data:`CLIENT_LOG`), unbuffered output and no ``PYTHONPATH`` leaking txmq's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra or {})
    return env


class ScenarioProcess:
    """One scenario script run with the client environment's ``python``.

    Its stdout JSON lines are collected by a thread as they arrive (:attr:`events`); its stderr goes
    to ``log_path``, and the client's own log to ``home / CLIENT_LOG`` (both quoted by
    :meth:`describe`).

    Args:
        python: the environment's python (:func:`ensure_env`).
        script: the scenario script.
        args: its arguments.
        home: the process's ``HOME`` (made if missing).
        log_path: where its stderr goes.
    """

    def __init__(self, python: Path, script: Path, args: list[str], *, home: Path, log_path: Path) -> None:
        self.argv = [str(python), str(script), *args]
        self.home = home
        self.log_path = log_path
        self.events: list[Event] = []
        self._lock = threading.Lock()
        home.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env=scenario_env(home))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                with self._lock:
                    self.events.append(event)

    def of(self, event: str) -> list[Event]:
        """The events named ``event`` so far, in order."""
        with self._lock:
            return [e for e in self.events if e.get("event") == event]

    def wait_for(self, event: str, n: int = 1, timeout_s: float = 30.0) -> list[Event]:
        """Wait until ``n`` events named ``event`` arrived (or the process exited).

        Raises:
            AssertionError: fewer than ``n`` arrived; the message quotes the process's logs.
        """
        try:
            wait_until(lambda: len(self.of(event)) >= n or self.proc.poll() is not None, timeout_s)
        except AssertionError:
            msg = f"{n} {event!r} events not seen in {timeout_s}s: {self.describe()}"
            raise AssertionError(msg) from None
        if self.proc.poll() is not None:
            self._reader.join(5)
        got = self.of(event)
        assert len(got) >= n, f"{n} {event!r} events expected: {self.describe()}"
        return got

    def finish(self, timeout_s: float = SCENARIO_TIMEOUT_S) -> int:
        """Wait for the process to exit (killing it after ``timeout_s``); return its exit status.

        Raises:
            AssertionError: it was still running after ``timeout_s``.
        """
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout_s}s: {self.describe()}") from None
        self._reader.join(5)
        return rc

    def ok(self, timeout_s: float = SCENARIO_TIMEOUT_S) -> list[Event]:
        """Wait for a clean exit (status 0, no ``error`` event) and return every event.

        Raises:
            AssertionError: another exit status, or the script reported an error.
        """
        rc = self.finish(timeout_s)
        assert rc == 0, f"exit status {rc}: {self.describe()}"
        assert not self.of("error"), f"the scenario reported errors: {self.describe()}"
        return list(self.events)

    def kill(self) -> None:
        """SIGKILL the process if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def describe(self) -> str:
        """The command, the last events and errors, and the tails of stderr and the client's log."""
        def tail(p: Path, n: int) -> str:
            return p.read_text(errors="replace")[-n:] if p.exists() else ""

        with self._lock:
            last = self.events[-8:]
        return (f"{' '.join(self.argv[1:])}\n errors: {self.of('error')}\n events: {last}\n"
                f" stderr: {tail(self.log_path, 1500)}\n client log: {tail(self.home / CLIENT_LOG, 2500)}")


def run_scenario(python: Path, script: Path, args: list[str], *, home: Path, log_path: Path,
                 timeout_s: float = SCENARIO_TIMEOUT_S) -> list[Event]:
    """Run ``script args`` to completion with the client environment and return its events.

    Raises:
        AssertionError: a non-zero exit, an ``error`` event, or still running after ``timeout_s``.
    """
    start = time.monotonic()
    proc = ScenarioProcess(python, script, args, home=home, log_path=log_path)
    return proc.ok(max(1.0, timeout_s - (time.monotonic() - start)))


def main(argv: list[str] | None = None) -> int:
    """``PYTHONPATH=tests python -m client_envs.rocketmq_grpc REQUIREMENTS``: print the environment's
    python, building it first; exit status 1 if it cannot be built, 2 on bad usage."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: PYTHONPATH=tests python -m client_envs.rocketmq_grpc REQUIREMENTS.txt",
              file=sys.stderr)
        return 2
    try:
        print(ensure_env(Path(args[0])))
    except GrpcClientUnavailable as e:
        print(f"rocketmq gRPC client environment unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
