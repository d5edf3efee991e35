"""The broker shell's global budget of received-but-unparsed frame bytes and unsent replies
(``buffer_budget_bytes``; :mod:`txmq.broker.server`)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["BufferBudget"]


class BufferBudget:
    """The global budget of received-but-unparsed frame bytes and unsent replies.

    A connection whose partial frame passes ``FRAME_UNRESERVED_BYTES_MAX`` reserves the frame's
    declared size (:meth:`acquire`) before reading more of it, and gives it back when the frame is
    complete or the connection closes. A reservation is granted when reservations plus the replies
    now unsent (``replies()``) plus the frame fit the budget, or when nothing is reserved (so one
    largest frame always gets through); otherwise the connection is not read from, and requests
    are granted in arrival order as reservations are released. Reserving the declared size (as
    Kafka's request memory pool does) bounds the memory by the budget whatever peers do, and a
    granted frame can always complete, so the budget frees itself without a low-water mark.
    """

    def __init__(self, budget_bytes: int, replies: Callable[[], int]) -> None:
        self.budget = budget_bytes
        self.reserved = 0
        self._replies = replies
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, n: int) -> bool:
        return self.reserved == 0 or self.reserved + self._replies() + n <= self.budget

    async def acquire(self, n: int) -> None:
        """Reserve ``n`` bytes, waiting while the budget is spent."""
        if not self._waiters and self._fits(n):
            self.reserved += n
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)
            raise

    def release(self, n: int) -> None:
        self.reserved -= n
        assert self.reserved >= 0
        self.grant()

    def grant(self) -> None:
        """Wake the waiters that fit now, oldest first (called on release and periodically, as
        replies drain)."""
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits(n):
                return
            self._waiters.popleft()
            self.reserved += n
            fut.set_result(None)
