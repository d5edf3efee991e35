"""Polling helper for integration tests that watch real processes."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]

POLL_INTERVAL_S = 0.05


def wait_until(pred: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Call ``pred`` every ``POLL_INTERVAL_S`` until it is true.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(POLL_INTERVAL_S)
