"""A fault-injecting TCP proxy in front of the broker: every chaos client connects through it.

It runs an asyncio loop in a daemon thread of the process that owns it. Faults (Jepsen's network
nemeses, on one link instead of iptables rules):

- ``drop``: close every open connection at once (the peers see a reset; new connections work);
- ``blackhole``: accept and keep connections but forward nothing until healed (bytes are held, as
  TCP retransmission would deliver them once the path comes back);
- ``delay``: add latency to every chunk in both directions;
- ``half_open``: the broker → client direction stops; client → broker still flows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Literal

__all__ = ["FaultProxy", "ProxyMode"]

ProxyMode = Literal["pass", "blackhole", "delay", "half_open"]
_CHUNK_BYTES = 64 * 1024
_HOLD_POLL_S = 0.02


class FaultProxy:
    """Listen on ``127.0.0.1:<port>`` and forward to ``127.0.0.1:<upstream_port>``.

    Args:
        upstream_port: the broker's port (kept across broker restarts by BrokerProcess).
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.mode: ProxyMode = "pass"
        self.delay_s = 0.0
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def endpoints(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> int:
        """Start listening; returns the proxy's port."""
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def set_mode(self, mode: ProxyMode, delay_ms: int = 0) -> None:
        """Switch the fault; ``pass`` heals."""
        self.delay_s = delay_ms / 1000
        self.mode = mode

    def drop(self) -> int:
        """Close every open connection; returns how many were closed."""
        async def close_all() -> int:
            ws = list(self._writers)
            for w in ws:
                w.transport.abort()
            return len(ws)
        return asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(10)

    def stop(self) -> None:
        """Close the listener and every connection; stop the thread."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                self.drop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            u_reader, u_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            c_writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((c_writer, u_writer))
        try:
            await asyncio.gather(self._pump(c_reader, u_writer, upstream=True),
                                 self._pump(u_reader, c_writer, upstream=False))
        finally:
            for w in (c_writer, u_writer):
                self._writers.discard(w)
                w.transport.abort()

    def _held(self, upstream: bool) -> bool:
        return self.mode == "blackhole" or (self.mode == "half_open" and not upstream)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    upstream: bool) -> None:
        try:
            while data := await reader.read(_CHUNK_BYTES):
                while self._held(upstream):
                    await asyncio.sleep(_HOLD_POLL_S)
                if self.mode == "delay" and self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
