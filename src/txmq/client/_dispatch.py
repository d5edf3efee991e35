"""Where a push consumer's listener runs: a fixed set of threads (RocketMQ ``consumeExecutor``), or
tasks on the event loop for a coroutine listener, with a consume-timeout watchdog.

Listener calls are queued as jobs; each result comes back to the event loop through one coalesced
``call_soon_threadsafe`` per burst, so the per-message cost is a queue put and get instead of a
task, two futures and a thread hand-off. A call that runs past its timeout is settled as
``RECONSUME_LATER`` by the watchdog (RocketMQ ``cleanExpireMsg``); its thread stays busy until the
listener returns, and that late result is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from txmq.client._core import ConsumeStatus, is_consumed, restore_retry_topic
from txmq.client._tracing import processed
from txmq.protocol import MessageExt
from txmq.tracing import error_type, set_error

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["ConsumePool", "SpanOf", "is_async_listener"]

log = logging.getLogger("txmq.client.consumer")

_WATCHDOG_PERIOD_MAX_S = 1.0

SpanOf = Callable[[list[MessageExt]], AbstractContextManager["Span | None"]]
"""The span of one listener call with these messages."""


def _no_span(msgs: list[MessageExt]) -> AbstractContextManager[Span | None]:
    return _NULL


_NULL: AbstractContextManager[None] = contextlib.nullcontext(None)


def is_async_listener(fn: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004


class _Job:
    __slots__ = ("done", "msgs", "settled", "skip", "started_ns", "timeout_ns")

    def __init__(self, msgs: list[MessageExt], skip: Callable[[], bool],
                 done: Callable[[object], None], timeout_s: float | None) -> None:
        self.msgs, self.skip, self.done = msgs, skip, done
        self.timeout_ns = None if timeout_s is None else int(timeout_s * 1e9)
        self.started_ns = 0
        self.settled = False


class ConsumePool:
    """Runs listener calls, at most ``threads`` at once.

    Args:
        listener: ``listener(msgs) -> status``; a coroutine function runs on the loop instead.
        threads: calls running at once.
        name: thread name prefix.
        group: for log lines.
        span_of: the span of a listener call, current while it runs (the push consumer's
            ``process`` span, :func:`txmq.client._tracing.process_span`); None: no span.

    ``submit`` and ``call`` must be used from the event loop thread; ``done`` callbacks run there
    with the listener's status, ``RECONSUME_LATER`` (it raised or timed out) or None (skipped:
    ``skip()`` was true when a thread took the job).
    """

    def __init__(self, listener: Callable[[list[MessageExt]], Any], threads: int, name: str,
                 group: str, span_of: SpanOf | None = None) -> None:
        self.listener = listener
        self.group = group
        self._span_of: SpanOf = span_of or _no_span
        self.is_async = is_async_listener(listener)
        self._n = threads
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._results: deque[tuple[_Job, object]] = deque()
        self._drain_scheduled = False
        self._running: dict[int, _Job] = {}  # thread ident -> job in progress
        self._threads: list[threading.Thread] = []
        self._outstanding = 0
        self._idle: asyncio.Event | None = None
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.Task[None] | None = None

    def start(self, timeout_s: float) -> None:
        """Start the threads (on the event loop's thread) and the timeout watchdog."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sem = asyncio.Semaphore(self._n)
        if not self.is_async:
            for i in range(self._n):
                t = threading.Thread(target=self._work, name=f"{self._name}_{i}", daemon=True)
                t.start()
                self._threads.append(t)
            period = max(0.01, min(_WATCHDOG_PERIOD_MAX_S, timeout_s / 4))
            self._watchdog = asyncio.create_task(self._watch(period))

    def submit(self, msgs: list[MessageExt], skip: Callable[[], bool],
               done: Callable[[object], None], timeout_s: float | None) -> None:
        """Queue one listener call with ``msgs``; ``done(status)`` runs on the loop afterwards."""
        assert self._idle is not None
        job = _Job(msgs, skip, done, timeout_s)
        self._outstanding += 1
        self._idle.clear()
        if self.is_async:
            asyncio.get_running_loop().create_task(self._run_async(job))
        else:
            self._jobs.put(job)

    async def call(self, msgs: list[MessageExt], skip: Callable[[], bool],
                   timeout_s: float | None) -> object:
        """One listener call, awaited (orderly consumption)."""
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def done(status: object) -> None:
            if not fut.done():
                fut.set_result(status)

        self.submit(msgs, skip, done, timeout_s)
        return await fut

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call is queued or running (or settled by the watchdog); True if so."""
        assert self._idle is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        return self._idle.is_set()

    def shutdown(self) -> None:
        """Stop the threads once the queued jobs are taken (a hung listener keeps its daemon
        thread) and the watchdog."""
        for _ in self._threads:
            self._jobs.put(None)
        if self._watchdog is not None:
            self._watchdog.cancel()

    # -- threads ------------------------------------------------------------------------------------
    def _work(self) -> None:
        me = threading.get_ident()
        while (job := self._jobs.get()) is not None:
            if job.skip():
                self._post(job, None)
                continue
            job.started_ns = time.monotonic_ns()
            self._running[me] = job
            msgs = [restore_retry_topic(m) for m in job.msgs]
            try:
                with self._span_of(msgs) as span:
                    try:
                        status = self.listener(msgs)
                        if inspect.iscoroutine(status):  # a plain function returning a coroutine
                            assert self._loop is not None
                            status = asyncio.run_coroutine_threadsafe(status, self._loop).result()
                    except Exception as exc:
                        status = self._raised(span, msgs, exc)
                    processed(span, status, is_consumed(status))
            finally:
                self._running.pop(me, None)
            self._post(job, status)

    def _raised(self, span: Span | None, msgs: list[MessageExt], exc: Exception) -> ConsumeStatus:
        """A listener call raised (or timed out): logged, recorded on its span; RECONSUME_LATER."""
        if isinstance(exc, TimeoutError):
            log.warning("listener of %s ran past its timeout on %s; RECONSUME_LATER", self.group,
                        [m.msg_id for m in msgs])
        else:
            log.exception("listener of %s raised on %s; RECONSUME_LATER", self.group,
                          [m.msg_id for m in msgs])
        set_error(span, error_type(exc), str(exc))
        return ConsumeStatus.RECONSUME_LATER

    def _post(self, job: _Job, status: object) -> None:
        """From a worker thread: hand a result to the loop, waking it once per burst."""
        self._results.append((job, status))
        if not self._drain_scheduled:
            self._drain_scheduled = True
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody wants it
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        while self._results:
            job, status = self._results.popleft()
            self._settle(job, status)

    def _settle(self, job: _Job, status: object) -> None:
        if job.settled:
            return  # the watchdog settled it already; this is the late result
        job.settled = True
        self._outstanding -= 1
        assert self._idle is not None
        if self._outstanding == 0:
            self._idle.set()
        try:
            job.done(status)
        except Exception:
            log.exception("consume result handling failed")

    async def _watch(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic_ns()
            for job in list(self._running.values()):
                if (job.timeout_ns is not None and not job.settled and job.started_ns
                        and now - job.started_ns > job.timeout_ns):
                    log.warning("listener of %s ran past %d ms on %s; RECONSUME_LATER", self.group,
                                job.timeout_ns // 1_000_000, [m.msg_id for m in job.msgs])
                    self._settle(job, ConsumeStatus.RECONSUME_LATER)

    # -- coroutine listeners ------------------------------------------------------------------------
    async def _run_async(self, job: _Job) -> None:
        assert self._sem is not None
        status: object = None
        async with self._sem:
            if not job.skip():
                msgs = [restore_retry_topic(m) for m in job.msgs]
                with self._span_of(msgs) as span:
                    try:
                        async with asyncio.timeout(None if job.timeout_ns is None
                                                   else job.timeout_ns / 1e9):
                            status = await self.listener(msgs)
                    except Exception as exc:  # TimeoutError included
                        status = self._raised(span, msgs, exc)
                    processed(span, status, is_consumed(status))
        self._settle(job, status)
