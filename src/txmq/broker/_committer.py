"""Group commit's flusher thread: one long-lived thread that makes the store durable for the loop.

The event loop appends and calls :meth:`GroupCommitter.kick`. The first kick of a loop turn
schedules the hand-over (``loop.call_soon``), which runs once the loop has carried out everything
that turn had ready (every connection's requests read together): it sets a ``threading.Event``.
The thread clears the event, calls ``flush`` (fsync of everything appended so far,
:meth:`txmq.store.Store.flush`; ``os.fdatasync`` releases the GIL, so the loop keeps appending
meanwhile) and hands the durable offset to the loop with one ``call_soon_threadsafe`` per group.
A turn that appended during that fsync set the event again at its end, so the thread goes straight
into the next fsync without a round trip through the loop: a durable reply waits for at most the
end of its loop turn, the fsync under way and its own, never for the loop to start the next one.

Why at the end of the turn, not at the first append (as until issue #24's follow-up): an fsync
that starts at a turn's first append covers only part of that turn, and the rest of the turn needs
another; a CPU-bound loop then paid 1.6 (single sends) to 2.7 (batches of 16) times as many
fsyncs, hand-backs and releases per message as the flusher task before the thread
(docs/benchmarks.md, "Group commit at the end of the loop turn"). RocketMQ's
``GroupCommitService`` hands requests over in lists (``putRequest`` adds to the write list; the
service swaps the lists and flushes once for all of them, ``CommitLog.GroupCommitService``
``swapRequests`` / ``doCommit``); here a list is what one loop turn appended.

This replaces a flusher task that awaited an ``asyncio.Event`` and ran each flush through
``loop.run_in_executor``: per group that cost a wake of the task, an executor ``submit`` (work
queue, ``concurrent.futures.Future``, thread-count check) and two loop hops back (the wrapped
future, then the task), and the next fsync could only start once the loop had run them
(docs/benchmarks.md, "Issue 24": ``submit`` was 12–20 % of the loop thread's wall-clock samples).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from txmq import limits
from txmq.errors import StoreError

__all__ = ["GroupCommitter"]

log = logging.getLogger("txmq.broker")


class GroupCommitter:
    """Run ``flush`` on a thread of its own whenever the loop kicks it.

    Args:
        loop: the event loop the callbacks run on (each through ``call_soon_threadsafe``).
        flush: makes the store durable and returns the durable commit log offset (bytes); raises
            StoreError when the fsync failed (the store refuses writes from then on).
        on_flushed: called on the loop with the durable offset after each flush, also every
            ``limits.FLUSHER_IDLE_TICK_MS`` while idle (a flush with nothing to do), so the
            caller's health-check tick stays fresh.
        on_failed: called on the loop with the exception when ``flush`` raised. After anything
            but a StoreError the thread waits ``limits.TIMER_TASK_RESTART_DELAY_MS`` and goes on.
        delay_s: seconds to wait between a kick and its flush (ASYNC_FLUSH's
            ``flush_interval_ms``; 0 for SYNC_FLUSH).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, flush: Callable[[], int],
                 on_flushed: Callable[[int], object], on_failed: Callable[[Exception], object],
                 delay_s: float = 0.0) -> None:
        self._loop = loop
        self._flush = flush
        self._on_flushed = on_flushed
        self._on_failed = on_failed
        self._delay_s = delay_s
        self._kicked = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._handing_over = False  # (loop side) a hand-over waits for the end of this loop turn

    @property
    def alive(self) -> bool:
        """Whether the thread runs (False before :meth:`start` and after :meth:`stop`)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` ever ran (a thread that is not alive then has died)."""
        return self._thread is not None

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called: callbacks still queued on the loop should do nothing."""
        return self._stopping.is_set()

    def start(self) -> None:
        """Start the thread (again, if it died); a no-op while it runs."""
        if self.alive or self._stopping.is_set():
            return
        self._thread = threading.Thread(target=self._run, name="txmq-flush", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Something was appended: flush it once this loop turn is over (call it on the loop;
        cheap when already kicked in this turn)."""
        if not self._handing_over:
            self._handing_over = True
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """On the loop, after the turn that kicked: wake the thread."""
        self._handing_over = False
        if not self._kicked.is_set():
            self._kicked.set()

    def stop(self) -> None:
        """Stop the thread after the flush under way (if any); waits for it."""
        self._stopping.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        idle_s = limits.FLUSHER_IDLE_TICK_MS / 1000
        while not self._stopping.is_set():
            if self._kicked.wait(idle_s) and self._delay_s:
                self._stopping.wait(self._delay_s)
            self._kicked.clear()
            if self._stopping.is_set():
                return
            try:
                flushed = self._flush()
            except StoreError as exc:
                self._post(self._on_failed, exc)
                continue
            except Exception as exc:  # never ends the thread; the caller's health records it
                log.exception("group commit flush failed")
                self._post(self._on_failed, exc)
                self._stopping.wait(limits.TIMER_TASK_RESTART_DELAY_MS / 1000)
                continue
            self._post(self._on_flushed, flushed)

    def _post(self, fn: Callable[..., object], arg: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            self._stopping.set()
