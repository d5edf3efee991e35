"""Histories: one JSON-lines file per workload process, every operation's invoke and completion.

A line is one event: ``{"t": ms since the epoch (float), "proc": process name, "inc": incarnation,
"op": operation kind, "phase": "invoke" | "ok" | "fail" | "unknown" | "info", ...}`` plus ids
(``key``, ``msg_id``, ``group``, ``topic``, ``queue``, ``offset``). Each line is written and flushed
at once, so a SIGKILLed process keeps every event it recorded (the page cache survives the process).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["HistoryWriter", "read_histories"]


class HistoryWriter:
    """Append events to ``path``; thread-safe."""

    def __init__(self, path: Path, proc: str) -> None:
        self.proc = proc
        self.inc = time.time_ns() // 1_000_000
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115  (open for the process's life)
        self._lock = threading.Lock()

    def write(self, op: str, phase: str, **fields: Any) -> None:
        event = {"t": time.time() * 1000, "proc": self.proc, "inc": self.inc, "op": op,
                 "phase": phase, **fields}
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()


def read_histories(directory: Path) -> list[dict[str, Any]]:
    """Every event of every ``*.jsonl`` file in ``directory``, by time. A torn last line (the
    process died mid-write) is skipped."""
    events: list[dict[str, Any]] = []
    for p in sorted(directory.glob("*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    events.sort(key=lambda e: e["t"])
    return events
