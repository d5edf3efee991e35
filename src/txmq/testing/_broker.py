"""Run a real ``txmq broker`` process on a free loopback port with a temporary data directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from txmq.errors import BrokerUnavailable

__all__ = ["BrokerProcess", "run_broker"]

_START_TIMEOUT_S = 90.0
"""How long a broker process may take to listen: a 2-core machine under a load of 15–20 (parallel
test runs) took 40 s to start one (a cluster demo, 2026-11-26)."""


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items()) + " }"
    return msgspec.json.encode(v).decode()


class BrokerProcess:
    """A broker subprocess. ``endpoints`` is ``127.0.0.1:<port>``; the port survives restarts.

    Args:
        data_dir: the broker's data directory (kept across :meth:`kill` / :meth:`start`).
        config: extra BrokerConfig keys (e.g. ``transaction_timeout_ms=1000``).
        log_path: where the broker's stderr goes.
        env: extra environment variables of the process (e.g. the chaos clock hook's).
    """

    def __init__(self, data_dir: Path, config: dict[str, Any] | None = None,
                 log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config = dict(config or {})
        self.log_path = log_path or self.data_dir / "broker.log"
        self.port = int(self.config.pop("port", 0))
        self.env = {**os.environ, **env} if env else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoints(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process and wait until it listens. Raises BrokerUnavailable."""
        cfg = self.data_dir / "broker.toml"
        cfg.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in self.config.items()))
        port_file = self.data_dir / "broker.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "txmq", "broker", "--config", str(cfg), "--port",
               str(self.port), "--data-dir", str(self.data_dir / "store"), "--port-file",
               str(port_file)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                         start_new_session=True, env=self.env)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()  # a late start must not hold the port against the next attempt
                raise BrokerUnavailable(f"broker did not start; see {self.log_path}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def kill(self) -> None:
        """SIGKILL the broker (a crash) and wait for it to die."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (clean shutdown), SIGKILL if it does not exit in time."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def run_broker(data_dir: Path | None = None, **config: Any) -> Iterator[BrokerProcess]:
    """Context manager: a started :class:`BrokerProcess`, stopped on exit.

    Keyword arguments are BrokerConfig keys; ``topics={"orders": 4}`` creates topics at start.
    """
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txmq-")))
        bp = BrokerProcess(data_dir, config)
        bp.start()
        stack.callback(bp.stop)
        yield bp
