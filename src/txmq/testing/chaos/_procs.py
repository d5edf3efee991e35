"""The processes a chaos run drives: workload workers and the broker, behind one small interface
(start, kill, pause, resume, alive), and the tmpfs the broker's store lives on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from txmq.testing._broker import BrokerProcess

__all__ = ["BrokerTarget", "Worker", "mount_tmpfs", "unmount"]


class Worker:
    """``python -m txmq.testing.chaos._worker ROLE RUN ENDPOINTS NAME``, output in ``RUN/logs``;
    in network namespace ``netns`` when given (a failover run's client host)."""

    def __init__(self, role: str, name: str, run: Path, endpoints: str,
                 netns: str | None = None) -> None:
        self.role, self.name, self.run, self.endpoints = role, name, run, endpoints
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        log_dir = self.run / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*(["ip", "netns", "exec", self.netns] if self.netns else []), sys.executable,
                 "-m", "txmq.testing.chaos._worker", self.role, str(self.run), self.endpoints,
                 self.name],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False


class BrokerTarget:
    """The broker as a nemesis target; records when it was started again."""

    name = "broker"

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.paused = False
        self.restarts: list[float] = []

    def start(self) -> None:
        """Start the broker again; its restart time is the moment before the process is launched.

        An offset sample may be taken from the new process as soon as it listens, before
        ``start`` returns: a time taken after ``start`` would fall after that sample, and the
        checker would call the restart's rolled-back offsets a regression."""
        import time
        launched_ms = time.time() * 1000
        self.broker.start()
        self.restarts.append(launched_ms)

    def alive(self) -> bool:
        return self.broker.proc is not None and self.broker.proc.poll() is None

    def kill(self) -> None:
        if self.paused:
            self.resume()
        self.broker.kill()

    def pause(self) -> None:
        if self.alive():
            assert self.broker.proc is not None
            os.kill(self.broker.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive():
            assert self.broker.proc is not None
            os.kill(self.broker.proc.pid, signal.SIGCONT)
        self.paused = False


def _sudo(cmd: list[str]) -> list[str]:
    return cmd if os.geteuid() == 0 else ["sudo", "-n", *cmd]


def mount_tmpfs(path: Path, size: str) -> str:
    """Mount a size-limited tmpfs on ``path`` (as the disk-full tests do); return "" or why not."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(_sudo(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]),
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def unmount(path: Path) -> None:
    subprocess.run(_sudo(["umount", "-l", str(path)]), check=False, capture_output=True)
