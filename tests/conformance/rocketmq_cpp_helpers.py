"""Run the RocketMQ C++-core scenario script (``clients/rocketmq_cpp_scenarios.py``) as processes and
read the JSON lines they print."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.testing import wait_until

SCENARIOS = Path(__file__).resolve().parent / "clients" / "rocketmq_cpp_scenarios.py"
PROCESS_TIMEOUT_S = 120.0
# Retries of a consumer's RECONSUME_LATER use delay levels 3 + reconsumeTimes (RocketMQ
# SendMessageProcessor), up to level 18 for the 16th retry: every level is short here.
DELAY_LEVELS = " ".join(["100ms"] * 18)
FAST_TX = {"transaction_timeout_ms": 500, "transaction_check_interval_ms": 300}
Event = dict[str, Any]


class CppClient:
    """One scenario process (``produce``, ``transact`` or ``consume``) against ``namesrv``.

    Its stdout events are collected by a thread as they arrive (:attr:`events`); its stderr (the C++
    core's and Python's complaints) goes to ``log_path``.
    """

    def __init__(self, python: Path, namesrv: str, command: str, *args: str, log_path: Path) -> None:
        self.argv = [str(python), str(SCENARIOS), command, "--namesrv", namesrv, *args]
        self.log_path = log_path
        self.events: list[Event] = []
        self._lock = threading.Lock()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.events.append(json.loads(line))

    def of(self, event: str) -> list[Event]:
        """The events named ``event`` so far, in order."""
        with self._lock:
            return [e for e in self.events if e["event"] == event]

    def wait_for(self, event: str, n: int = 1, timeout_s: float = 60.0) -> list[Event]:
        """Wait until ``n`` events named ``event`` arrived; fail naming the process's log otherwise."""
        try:
            wait_until(lambda: len(self.of(event)) >= n or self.proc.poll() is not None, timeout_s)
        except AssertionError:
            msg = f"{n} {event!r} events not seen in {timeout_s}s: {self.describe()}"
            raise AssertionError(msg) from None
        self._reader.join(0.5 if self.proc.poll() is not None else 0)
        got = self.of(event)
        assert len(got) >= n, f"{n} {event!r} events expected: {self.describe()}"
        return got

    def finish(self, timeout_s: float = PROCESS_TIMEOUT_S) -> int:
        """Wait for the process to exit (killing it after ``timeout_s``); return its exit status."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running after {timeout_s}s: {self.describe()}") from None
        self._reader.join(5)
        return rc

    def ok(self, timeout_s: float = PROCESS_TIMEOUT_S) -> list[Event]:
        """Wait for a clean exit (status 0) and return every event."""
        rc = self.finish(timeout_s)
        assert rc == 0, f"exit status {rc}: {self.describe()}"
        return list(self.events)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def describe(self) -> str:
        tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        errors = self.of("error")
        return f"{' '.join(self.argv[2:])}\n errors: {errors}\n events: {self.events[-8:]}\n stderr: {tail}"


CppFactory = Callable[..., CppClient]
"""The ``cpp`` fixture: ``cpp(command, *args)`` starts a :class:`CppClient` against the test's broker."""


def keys(events: list[Event], event: str = "received", answer: str | None = None) -> list[str]:
    """The message keys of ``event`` events (only those answered ``answer`` when given), in order."""
    return [e["key"] for e in events if e["event"] == event and (answer is None or e.get("answer") == answer)]


def settle(seconds: float) -> None:
    """Give the system time to show something that must NOT happen (a rolled-back message delivered)."""
    time.sleep(seconds)
