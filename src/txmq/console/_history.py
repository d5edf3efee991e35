"""The History sampler: rates and backlogs sampled every ``CONSOLE_SAMPLE_INTERVAL_MS`` into a
ring buffer of ``CONSOLE_HISTORY_SAMPLES`` points.

A :class:`Sample` holds raw counters (every queue's max offset, every group's consumer offset per
queue); a point is the rate between two samples. Rates count only counters present in both samples,
so a new topic or a group's first commit does not show up as a burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from txmq.console._models import History as HistoryModel
from txmq.console._models import LagHistory
from txmq.errors import TxmqError

__all__ = ["History", "Point", "Sample"]

log = logging.getLogger("txmq.console.history")


@dataclass(frozen=True)
class Sample:
    """What one sampling reads.

    Attributes:
        t_ms: when (ms since the epoch).
        produced: per queue (any hashable key): its max offset.
        consumed: per (group, queue): the group's consumer offset.
        half_backlog: pending transactions (half messages not yet decided).
        lag: per group: messages not yet consumed.
    """

    t_ms: int
    produced: dict[Hashable, int] = field(default_factory=dict)
    consumed: dict[Hashable, int] = field(default_factory=dict)
    half_backlog: int = 0
    lag: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Point:
    """One point of the history: rates (messages/s) since the sample before, and backlogs."""

    t_ms: int
    in_per_s: float
    out_per_s: float
    half_backlog: int
    lag: dict[str, int]


def _rate(cur: dict[Hashable, int], prev: dict[Hashable, int], dt_s: float) -> float:
    moved = sum(max(0, v - prev[k]) for k, v in cur.items() if k in prev)
    return round(moved / dt_s, 3) if dt_s > 0 else 0.0


class History:
    """A ring buffer of :class:`Point` fed by ``read`` every ``interval_ms``.

    Args:
        read: takes one :class:`Sample` (raises a ``TxmqError`` when a broker cannot be read;
            that round is skipped).
        interval_ms: sampling period.
        size: points kept (the oldest are dropped).
    """

    def __init__(self, read: Callable[[], Awaitable[Sample]], interval_ms: int, size: int) -> None:
        self._read = read
        self.interval_ms = interval_ms
        self.points: deque[Point] = deque(maxlen=max(1, size))
        self._last: Sample | None = None
        self._task: asyncio.Task[None] | None = None

    async def sample_now(self) -> Point | None:
        """Take one sample now; returns the new point (None for the very first sample, which
        only sets the counters' base). Raises what ``read`` raises."""
        s = await self._read()
        prev, self._last = self._last, s
        if prev is None:
            return None
        dt_s = (s.t_ms - prev.t_ms) / 1000
        p = Point(s.t_ms, _rate(s.produced, prev.produced, dt_s), _rate(s.consumed, prev.consumed, dt_s),
                  s.half_backlog, dict(s.lag))
        self.points.append(p)
        return p

    def latest(self) -> Point | None:
        """The newest point, or None before two samples were taken."""
        return self.points[-1] if self.points else None

    def snapshot(self) -> HistoryModel:
        """Every point kept, oldest first, as parallel lists."""
        pts = list(self.points)
        return HistoryModel(t_ms=[p.t_ms for p in pts], in_per_s=[p.in_per_s for p in pts],
                            out_per_s=[p.out_per_s for p in pts],
                            half_backlog=[p.half_backlog for p in pts])

    def lag_history(self, group: str) -> LagHistory:
        """``group``'s lag at each point where it was read, oldest first."""
        pts = [p for p in self.points if group in p.lag]
        return LagHistory(t_ms=[p.t_ms for p in pts], lag=[p.lag[group] for p in pts])

    async def start(self) -> None:
        """Start sampling in a background task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="txmq-console-history")

    async def stop(self) -> None:
        """Stop the background task."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample_now()
            except (TxmqError, OSError) as exc:
                log.warning("history sample skipped: %s", exc)
            elapsed_s = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.interval_ms / 1000 - elapsed_s))
