"""The name server's asyncio shell: sockets, the frame codec and the expiry timer around
:class:`~txmq.namesrv.NameServerCore`.

- Each connection feeds a :class:`~txmq.protocol.FrameDecoder`; every request goes to the core with
  the wall-clock time and the connection's id, and its response (in the request's serialize type)
  is written back. A frame that cannot be trusted (bad length, unknown serialize type, an
  undecodable header) closes the connection; nothing a peer sends stops the server.
- Every ``SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS`` the core drops brokers silent longer than their
  timeout (RocketMQ NamesrvController ``scanNotActiveBroker``); a broker's connection closing
  unregisters it at once (RocketMQ BrokerHousekeepingService).
- A connection silent for ``CHANNEL_IDLE_MAX_MS`` is closed (RocketMQ NettyServerConfig
  ``serverChannelMaxIdleTimeSeconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from itertools import count

from txmq import limits
from txmq.errors import ProtocolError, ResponseCode
from txmq.namesrv._core import NameServerCore
from txmq.protocol import Command, FrameDecoder, encode_command
from txmq.serving import serve_until_signal, write_port_file

__all__ = ["NameServer", "run_namesrv"]

log = logging.getLogger("txmq.namesrv")
_READ_BYTES = 64 * 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class NameServer:
    """A name server listening on ``host:port`` (port 0 picks a free one; see :attr:`port`).

    Args:
        core: the tables (a fresh :class:`NameServerCore` by default).
        scan_interval_ms: period of the inactive-broker scan.
        idle_max_ms: a connection silent this long is closed.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = limits.NAMESRV_PORT, *,
                 core: NameServerCore | None = None,
                 scan_interval_ms: int = limits.SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS,
                 idle_max_ms: int = limits.CHANNEL_IDLE_MAX_MS) -> None:
        self.host, self.port = host, port
        self.core = core or NameServerCore()
        self._scan_s = scan_interval_ms / 1000
        self._idle_s = idle_max_ms / 1000
        self._ids = count(1)
        self._server: asyncio.Server | None = None
        self._scanner: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._scanner = asyncio.create_task(self._scan_loop(), name="namesrv-scan")
        log.info("name server listening on %s:%d", self.host, self.port)
        return self.port

    async def close(self) -> None:
        """Stop accepting, end the scanner and every connection."""
        if self._server is not None:
            self._server.close()
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self._scan_s)
            try:
                self.core.scan_inactive(_now_ms())
            except Exception:  # a bug in the scan must not end the timer
                log.exception("inactive broker scan failed")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        conn = next(self._ids)
        try:
            await self._read_loop(conn, reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            self.core.connection_closed(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_loop(self, conn: int, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while True:
            try:
                data = await asyncio.wait_for(reader.read(_READ_BYTES), self._idle_s)
            except TimeoutError:
                log.info("closing idle connection %d", conn)
                return
            if not data:
                return
            try:
                commands = decoder.feed(data)
            except ProtocolError as exc:
                log.warning("closing connection %d: %s", conn, exc)
                return
            for cmd in commands:
                reply = self._answer(cmd, conn)
                if reply is not None:
                    writer.write(reply)
            await writer.drain()

    def _answer(self, cmd: Command, conn: int) -> bytes | None:
        """The encoded response to one command (None for a one-way request or a response)."""
        if cmd.is_response:
            return None
        try:
            response = self.core.handle(cmd, _now_ms(), conn)
        except Exception as exc:  # a bug must cost one request, not the server
            log.exception("request %d failed", cmd.code)
            response = None if cmd.is_oneway else cmd.response(ResponseCode.SYSTEM_ERROR, repr(exc))
        if response is None:
            return None
        try:
            return encode_command(response)
        except ProtocolError as exc:  # e.g. a route too large for one frame
            return encode_command(cmd.response(ResponseCode.SYSTEM_ERROR, str(exc)))


async def run_namesrv(host: str = "127.0.0.1", port: int = limits.NAMESRV_PORT,
                      port_file: str | None = None) -> None:
    """Serve until SIGINT or SIGTERM; write the bound port to ``port_file`` when given."""
    server = NameServer(host, port)
    bound = await server.start()
    if port_file:
        write_port_file(port_file, bound)
    await serve_until_signal(server.close)
