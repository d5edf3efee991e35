"""One connection to a broker or name server, asyncio: pipelined requests matched by ``opaque``,
a connect timeout, TLS.

Received bytes are decoded in the protocol's ``data_received`` callback, as the transport hands
them over: no stream reader buffers them and no reader task is woken per read (a 1.6 MB pull reply
arrives in dozens of reads)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from txmq import limits
from txmq.client._core import RemotingCore
from txmq.errors import BrokerUnavailable, ConfigError, ConnectTimeout, ProtocolError, RequestTimeout
from txmq.protocol import Command, parse_address

__all__ = ["AsyncConnection", "RequestHandler", "parse_endpoint", "tls_client_context"]

log = logging.getLogger("txmq.client")


def parse_endpoint(endpoints: str) -> tuple[str, int]:
    """``"host:port"`` (the first of a ``;``-separated list) → ``(host, port)``. Raises ConfigError."""
    return parse_address(endpoints.split(";")[0])


def tls_client_context(ca_file: str = "", verify_hostname: bool = True) -> ssl.SSLContext:
    """The SSLContext of a client with ``tls=True``: TLS 1.2 or later, the server's certificate
    checked against ``ca_file`` (PEM; the system's CAs when empty) and, with ``verify_hostname``,
    its names (DNS or IP subject alternative names) against the address dialled.

    Raises:
        ConfigError: ``ca_file`` cannot be read or holds no PEM certificate.
    """
    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_ca_file {ca_file}: cannot load CA certificates: {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = verify_hostname
    return ctx


def _expire(fut: asyncio.Future[Command], code: int) -> None:
    if not fut.done():
        fut.set_exception(RequestTimeout(f"request code {code} timed out"))


RequestHandler = Callable[["AsyncConnection", Command], None]
"""Called with the connection and each request the peer sends (check-back, notifications)."""


class _Wire(asyncio.Protocol):
    """The asyncio protocol of one :class:`AsyncConnection`: hands received bytes and the loss of
    the connection to it."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self.transport: asyncio.BaseTransport | None = None
        """Set once connected."""
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the connection is lost or closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._conn._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self._conn._lost(exc)


class AsyncConnection:
    """One TCP connection to a broker with pipelined requests matched by ``opaque``.

    Args:
        endpoint: ``host:port``.
        on_request: called with this connection and each broker-initiated request (check-back,
            notifications), so an answer goes back to the broker that asked.
        timeout_ms: default request timeout.
        connect_timeout_ms: give up connecting after this (RocketMQ ``connectTimeoutMillis``).
        access_key, secret_key: sign every request (RocketMQ ACL; see ``RemotingCore``).
        tls: speak TLS with this context (:func:`tls_client_context`); None: plaintext.
    """

    def __init__(self, endpoint: str, on_request: RequestHandler | None = None,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, *, access_key: str = "",
                 secret_key: str = "", tls: ssl.SSLContext | None = None,
                 connect_timeout_ms: int = limits.CONNECT_TIMEOUT_MS) -> None:
        self.host, self.port = parse_endpoint(endpoint)
        self.addr = f"{self.host}:{self.port}"
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._tls = tls
        self._on_request = on_request
        self._timeout_s = timeout_ms / 1000
        self._core = RemotingCore(access_key=access_key, secret_key=secret_key)
        self._pending: dict[int, asyncio.Future[Command]] = {}
        self._transport: asyncio.Transport | None = None
        self._wire: _Wire | None = None
        self._out: list[bytes] = []
        self.closed = True

    async def connect(self) -> None:
        """Open the connection (and its TLS handshake).

        Raises:
            ConnectTimeout: no connection within ``connect_timeout_ms``.
            BrokerUnavailable: refused, or a TLS failure (a certificate that does not verify, a
                plaintext-only server).
        """
        tls: dict[str, Any] = {}
        if self._tls is not None:
            tls = {"ssl": self._tls, "server_hostname": self.host,
                   "ssl_handshake_timeout": limits.TLS_HANDSHAKE_TIMEOUT_MS / 1000}
        loop = asyncio.get_running_loop()
        wire = _Wire(self)
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: wire, self.host, self.port, **tls),
                self._connect_timeout_s)
        except TimeoutError as exc:
            raise ConnectTimeout(f"cannot connect to {self.host}:{self.port}: no answer in "
                                 f"{self._connect_timeout_s:g} s") from exc
        except OSError as exc:
            raise BrokerUnavailable(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self._transport, self._wire = transport, wire
        self.closed = False

    def _received(self, data: bytes) -> None:
        """Decode ``data``; complete the futures of the responses in it and hand the requests
        to ``on_request``. A stream that does not decode closes the connection."""
        try:
            cmds = self._core.receive(data)
        except ProtocolError as exc:
            log.warning("connection to %s:%d lost: %s", self.host, self.port, exc)
            self._fail_all()
            return
        for cmd in cmds:
            if cmd.is_response:
                fut = self._pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
            elif self._on_request is not None:
                self._on_request(self, cmd)

    def _lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.warning("connection to %s:%d lost: %s", self.host, self.port, exc)
        self._fail_all()

    def _fail_all(self) -> None:
        self.closed = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BrokerUnavailable(f"connection to {self.host}:{self.port} closed"))
        self._pending.clear()
        if self._transport is not None:
            self._transport.close()

    async def request(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                      timeout_s: float | None = None) -> Command:
        """Send a request and wait for its response (any code; see ``check_response``).

        Raises:
            BrokerUnavailable: not connected, or the connection dropped before the answer.
            RequestTimeout: no answer within the timeout.
        """
        if self.closed or self._transport is None:
            raise BrokerUnavailable(f"not connected to {self.host}:{self.port}")
        opaque, frame = self._core.request(code, ext, body)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Command] = loop.create_future()
        self._pending[opaque] = fut
        self._write(frame)
        timer = loop.call_later(timeout_s or self._timeout_s, _expire, fut, code)
        try:
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(opaque, None)

    def oneway(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> None:
        """Send a request that gets no response. Raises BrokerUnavailable if not connected."""
        if self.closed or self._transport is None:
            raise BrokerUnavailable(f"not connected to {self.host}:{self.port}")
        self._write(self._core.request(code, ext, body, oneway=True)[1])

    def _write(self, frame: bytes) -> None:
        """Queue a frame; all frames queued in one turn of the loop go out in one write (one
        syscall and one TCP segment train instead of one per request)."""
        if not self._out:
            asyncio.get_running_loop().call_soon(self._write_out)
        self._out.append(frame)

    def _write_out(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def close(self) -> None:
        self._write_out()
        if self._transport is not None:
            self._transport.close()
        if self._wire is not None:
            with contextlib.suppress(Exception):
                await self._wire.lost
        self.closed = True
