"""Group commit's flusher thread (broker/_committer.py): one flush per group of kicks, handed over
at the end of the loop turn, the next flush started without the event loop, results and failures
delivered on the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from txmq.broker._committer import GroupCommitter
from txmq.errors import StoreError

WAIT_S = 5.0


class _Store:
    """A flush whose progress the test controls: each flush makes durable what was appended
    before it started, and can be held until ``gate`` is set."""

    def __init__(self) -> None:
        self.written = 0
        self.flushes: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: Exception | None = None

    def flush(self) -> int:
        target = self.written
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        if self.fail is not None:
            raise self.fail
        self.flushes.append(target)
        return target


async def _until(cond: object, what: str) -> None:
    for _ in range(int(WAIT_S / 0.005)):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    pytest.fail(f"timed out waiting for {what}")


def test_kicks_during_a_flush_share_the_next_one_which_starts_without_the_loop() -> None:
    asyncio.run(_test_kicks_during_a_flush_share_the_next_one_which_starts_without_the_loop())


async def _test_kicks_during_a_flush_share_the_next_one_which_starts_without_the_loop() -> None:
    loop = asyncio.get_running_loop()
    store, seen = _Store(), []
    gc = GroupCommitter(loop, store.flush, seen.append, lambda e: None)
    gc.start()
    try:
        store.gate.clear()
        store.written = 10
        gc.kick()
        assert store.entered.wait(WAIT_S)  # first flush holds at the gate (covers 10)
        store.entered.clear()
        for n in (20, 30, 40):  # three appends during that fsync: one kick
            store.written = n
            gc.kick()
        await asyncio.sleep(0)  # the turn ends: the hand-over
        store.gate.set()
        # the loop is blocked here (no await): the second flush must start anyway
        assert store.entered.wait(WAIT_S)
        await _until(lambda: seen[-1:] == [40], "the second flush's result on the loop")
        assert store.flushes[:2] == [10, 40]
        assert 10 in seen
    finally:
        gc.stop()
    assert not gc.alive


def test_kicks_are_handed_over_at_the_end_of_the_loop_turn() -> None:
    asyncio.run(_test_kicks_are_handed_over_at_the_end_of_the_loop_turn())


async def _test_kicks_are_handed_over_at_the_end_of_the_loop_turn() -> None:
    loop = asyncio.get_running_loop()
    store, seen = _Store(), []
    gc = GroupCommitter(loop, store.flush, seen.append, lambda e: None)
    gc.start()
    try:
        await asyncio.sleep(0.05)  # (the thread waits for its first kick)
        store.entered.clear()
        store.written = 10
        gc.kick()
        # the loop is still in this turn: nothing reaches the thread yet
        assert not store.entered.wait(0.2)
        store.written = 20  # a later append of the same turn joins the same flush
        gc.kick()
        await _until(lambda: 20 in seen, "the flush after the turn")
        assert store.flushes == [20]
    finally:
        gc.stop()


def test_a_failed_flush_is_reported_on_the_loop_and_the_thread_goes_on() -> None:
    asyncio.run(_test_a_failed_flush_is_reported_on_the_loop_and_the_thread_goes_on())


async def _test_a_failed_flush_is_reported_on_the_loop_and_the_thread_goes_on() -> None:
    loop = asyncio.get_running_loop()
    store, seen, failed = _Store(), [], []
    gc = GroupCommitter(loop, store.flush, seen.append,
                        lambda e: failed.append((e, threading.current_thread())))
    gc.start()
    try:
        store.fail = StoreError("fsync failed")
        store.written = 5
        gc.kick()
        await _until(lambda: failed, "the failure")
        assert isinstance(failed[0][0], StoreError)
        assert failed[0][1] is threading.current_thread()  # delivered on the loop's thread
        assert gc.alive
        store.fail = None
        gc.kick()
        await _until(lambda: 5 in seen, "a flush after the failure")
    finally:
        gc.stop()


def test_stop_ends_the_thread_and_later_kicks_flush_nothing() -> None:
    asyncio.run(_test_stop_ends_the_thread_and_later_kicks_flush_nothing())


async def _test_stop_ends_the_thread_and_later_kicks_flush_nothing() -> None:
    loop = asyncio.get_running_loop()
    store, seen = _Store(), []
    gc = GroupCommitter(loop, store.flush, seen.append, lambda e: None)
    gc.start()
    gc.stop()
    assert not gc.alive and gc.stopped
    n = len(store.flushes)
    store.written = 7
    gc.kick()
    gc.start()  # a stopped committer does not start again
    await asyncio.sleep(0.05)
    assert not gc.alive
    assert len(store.flushes) == n


def test_async_flush_waits_its_interval_after_a_kick() -> None:
    asyncio.run(_test_async_flush_waits_its_interval_after_a_kick())


async def _test_async_flush_waits_its_interval_after_a_kick() -> None:
    loop = asyncio.get_running_loop()
    store, seen = _Store(), []
    gc = GroupCommitter(loop, store.flush, seen.append, lambda e: None, delay_s=0.2)
    gc.start()
    try:
        store.written = 3
        t0 = loop.time()
        gc.kick()
        await _until(lambda: 3 in seen, "the delayed flush")
        assert loop.time() - t0 >= 0.19
    finally:
        gc.stop()
