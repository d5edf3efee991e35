"""What every txmq server process does around its server: publish the bound port, then serve
until SIGINT or SIGTERM.

Used by the broker (:func:`txmq.broker.server.run_server`), the name server and the controller.
The port file is written whole (a temporary file renamed over it), so a reader polling for it
never sees a partial number; :class:`txmq.testing.ServerProcess` waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable

__all__ = ["new_event_loop", "serve_until_signal", "write_port_file"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop where uvloop is installed, else the default one. Here, not in the client,
    so that a server's start imports no client (``txmq.client`` costs some 90 ms to import)."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()


def write_port_file(path: str, port: int) -> None:
    """Write ``port`` (decimal) to ``path`` atomically (``path.tmp`` renamed over it).
    Raises OSError when the directory is not writable."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


async def serve_until_signal(close: Callable[[], Awaitable[None]],
                             ready: asyncio.Event | None = None) -> None:
    """Wait for SIGINT or SIGTERM (or the task's cancellation), then await ``close()``.
    ``ready`` is set once the handlers are in place. Outside the main thread, where signal
    handlers cannot be installed, only cancellation ends the wait."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await close()
