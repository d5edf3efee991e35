"""What a failover run observes besides the histories: consumer offsets sampled on each group's
master as it moves, the groups' side effects, and the drain at the end."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq import limits
from txmq.client import PullConsumer
from txmq.testing.chaos._check import OffsetSample
from txmq.testing.chaos._failover import View
from txmq.testing.chaos._history import read_histories
from txmq.testing.chaos._spec import GROUPS, TOPICS

__all__ = ["OffsetSampler", "backlog", "drain", "effects", "tx_local"]


class OffsetSampler:
    """Every ``CHAOS_OFFSET_SAMPLE_INTERVAL_MS``, each consumer group's committed offset of every
    workload queue on each broker group's master now (queue topic ``<topic>@<group>``), in a
    thread. A group's master changing counts as a broker restart for the offset checks (a new
    master may hold older offsets than its predecessor committed: a redelivery, not a skip).

    Args:
        view: the cluster now (:meth:`FailoverBed.view`).
        addr_of: host → remoting address.
        queues: queues per topic.
    """

    def __init__(self, view: Callable[[], View], addr_of: Callable[[str], str], queues: int) -> None:
        self._view, self._addr_of, self._queues = view, addr_of, queues
        self.samples: list[OffsetSample] = []
        self.master_changes: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-offsets", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        clients: dict[tuple[str, str], PullConsumer] = {}
        last: dict[str, str] = {}
        while not self._stop.wait(limits.CHAOS_OFFSET_SAMPLE_INTERVAL_MS / 1000):
            for group, host in self._view().masters.items():
                if not host:
                    continue
                if last.get(group, host) != host:
                    self.master_changes.append(time.time() * 1000)
                last[group] = host
                for g in GROUPS:
                    self._sample(clients, self._addr_of(host), group, g)
        for c in clients.values():
            with contextlib.suppress(Exception):
                c.shutdown()

    def _sample(self, clients: dict[tuple[str, str], PullConsumer], addr: str, group: str,
                g: str) -> None:
        try:
            if (addr, g) not in clients:
                clients[(addr, g)] = PullConsumer(addr, g, timeout_ms=1000)
                clients[(addr, g)].start()
            for t in TOPICS.values():
                for q in range(self._queues):
                    off = clients[(addr, g)].fetch_consumer_offset(t, q)
                    if off is not None:
                        self.samples.append(OffsetSample(time.time() * 1000, g, f"{t}@{group}", q,
                                                         off))
        except Exception:  # the broker is down, paused or cut off: no sample this time
            with contextlib.suppress(Exception):
                clients.pop((addr, g)).shutdown()


def effects(run: Path) -> dict[str, dict[str, int]]:
    """Consumer group → key → how many times its side effect happened (the groups' databases)."""
    out = {}
    for g in GROUPS:
        with contextlib.closing(sqlite3.connect(run / f"{g}.db", timeout=30)) as c:
            out[g] = {k: n for k, n in c.execute("SELECT key, count(*) FROM effects GROUP BY key")}
    return out


def tx_local(run: Path) -> dict[str, str]:
    """The transactional producer's local records: key → ``committed`` | ``rolled_back``."""
    with contextlib.closing(sqlite3.connect(run / "tx.db", timeout=30)) as c:
        return {k: s for k, s in c.execute("SELECT key, state FROM tx")}


def backlog(run: Path) -> dict[str, int]:
    """Per consumer group, how many acknowledged sends and committed transactions it has not
    had the side effect of yet."""
    events: list[dict[str, Any]] = read_histories(run / "history")
    acked = {e["key"] for e in events if e["op"] == "send" and e["phase"] == "ok"}
    acked |= {k for k, s in tx_local(run).items() if s == "committed"}
    done = effects(run)
    return {g: len(acked - set(done.get(g, {}))) for g in GROUPS}


def drain(run: Path, timeout_s: float) -> str:
    """Wait until every group had every acknowledged message's side effect; "" when it did,
    else what was missing at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left: dict[str, int] = {}
    while time.monotonic() < deadline:
        left = backlog(run)
        if not any(left.values()):
            return ""
        time.sleep(1)
    return f"missing per group: {left}"
