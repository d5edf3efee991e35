"""Starting and supervising the demo's service processes (producers and ledgers)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["ServiceProcess"]


class ServiceProcess:
    """A ``python -m <module>`` child with its output in a log file."""

    def __init__(self, module: str, args: list[str], log_path: Path) -> None:
        self.module, self.args, self.log_path = module, args, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
