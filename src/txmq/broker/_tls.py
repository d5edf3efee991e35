"""TLS on the broker's doors, as RocketMQ names it (``TlsSystemConfig``, ``TlsMode``).

The ``[tls]`` table of the broker's TOML (:class:`TlsConfig`) maps RocketMQ's system properties:

==================== ================================ ============================================
txmq key             RocketMQ property                meaning
==================== ================================ ============================================
``server_mode``      ``tls.server.mode``              ``disabled`` / ``permissive`` / ``enforcing``
``cert_file``        ``tls.server.certPath``          the server's X.509 chain, PEM
``key_file``         ``tls.server.keyPath``           its private key, PEM, not encrypted
``ca_file``          ``tls.server.trustCertPath``     CAs that client certificates must chain to
``need_client_auth`` ``tls.server.need.client.auth``  ``none`` / ``optional`` / ``require``
==================== ================================ ============================================

**Remoting door** (:class:`TlsListener`): RocketMQ's ``NettyRemotingServer.TlsModeHandler``
looks at the first byte a client sends: ``0x16`` (a TLS handshake record) starts TLS, anything else
is plaintext, which ``enforcing`` closes and ``permissive`` serves. txmq does the same in its
asyncio shell: a new connection is not read until its first byte is peeked (``MSG_PEEK``, so nothing
is consumed), then ``loop.connect_accepted_socket`` wraps it with TLS (``ssl=``) or without.
``disabled`` does not use this path at all (the broker's plain ``asyncio.start_server``; a TLS client is then
closed by the frame decoder, as RocketMQ closes it).

**gRPC door** and **metrics endpoint**: grpcio and prometheus_client cannot look at the first byte,
so they serve TLS only whenever ``server_mode`` is not ``disabled`` (RocketMQ's proxy does sniff,
``ProxyAndTlsProtocolNegotiator``; txmq logs a warning for ``permissive``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from txmq import limits
from txmq.errors import ConfigError

if TYPE_CHECKING:
    import grpc

__all__ = ["TlsConfig", "TlsListener", "grpc_server_credentials", "server_context"]

log = logging.getLogger("txmq.broker.tls")

_HANDSHAKE = 0x16
"""The content type of a TLS handshake record, the first byte of every ClientHello (RFC 8446 §5.1;
RocketMQ ``TlsModeHandler.HANDSHAKE_MAGIC_CODE``)."""

ServeCallback = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class TlsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ``[tls]`` table: TLS of the remoting port, the gRPC port and the metrics endpoint.

    Off (``disabled``) by default. Checked by :meth:`validate` at start (ConfigError naming the
    key and file when a file is missing, unreadable or not a certificate / key).
    """

    server_mode: Literal["disabled", "permissive", "enforcing"] = "disabled"
    """RocketMQ ``tls.server.mode``: ``enforcing`` refuses plaintext; ``permissive`` serves TLS and
    plaintext clients on the remoting port (the gRPC and metrics ports serve TLS only)."""
    cert_file: str = ""
    """RocketMQ ``tls.server.certPath``: PEM certificate chain, the server's first."""
    key_file: str = ""
    """RocketMQ ``tls.server.keyPath``: PEM private key, unencrypted (grpcio takes no password)."""
    ca_file: str = ""
    """RocketMQ ``tls.server.trustCertPath``: PEM CAs client certificates are checked against."""
    need_client_auth: Literal["none", "optional", "require"] = "none"
    """RocketMQ ``tls.server.need.client.auth``: ask clients for a certificate (``optional``:
    checked if given; ``require``: refused without one). Needs ``ca_file`` unless ``none``."""

    @property
    def enabled(self) -> bool:
        """True unless ``server_mode`` is ``disabled``."""
        return self.server_mode != "disabled"

    def validate(self) -> TlsConfig:
        """Check that the files exist, are readable and load. Raises ConfigError."""
        if not self.enabled:
            return self
        for key in ("cert_file", "key_file"):
            if not getattr(self, key):
                raise ConfigError(f"tls.{key} is required when tls.server_mode is "
                                  f"{self.server_mode!r}")
        if self.need_client_auth != "none" and not self.ca_file:
            raise ConfigError(f"tls.need_client_auth {self.need_client_auth!r} needs tls.ca_file")
        for key in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, key)
            if path:
                try:
                    Path(path).read_bytes()
                except OSError as exc:
                    raise ConfigError(f"tls.{key}: cannot read {path}: {exc.strerror}") from exc
        server_context(self)
        return self


def server_context(cfg: TlsConfig) -> ssl.SSLContext:
    """The server-side SSLContext of ``cfg`` (TLS 1.2 or later). Raises ConfigError when the
    certificate, key or CA file does not load (wrong format, key not matching the certificate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls.cert_file {cfg.cert_file} / tls.key_file {cfg.key_file}: "
                          f"not a PEM certificate chain and its unencrypted key: {exc}") from exc
    if cfg.ca_file:
        try:
            ctx.load_verify_locations(cfg.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"tls.ca_file {cfg.ca_file}: not PEM certificates: {exc}") from exc
    ctx.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                       "require": ssl.CERT_REQUIRED}[cfg.need_client_auth]
    return ctx


def grpc_server_credentials(cfg: TlsConfig) -> grpc.ServerCredentials:
    """``grpc.ssl_server_credentials`` of ``cfg`` (client certificates required only for
    ``need_client_auth = "require"``)."""
    import grpc  # the gRPC door is optional: grpc loads only with it

    roots = Path(cfg.ca_file).read_bytes() if cfg.ca_file else None
    pair = (Path(cfg.key_file).read_bytes(), Path(cfg.cert_file).read_bytes())
    return grpc.ssl_server_credentials([pair], root_certificates=roots,
                                       require_client_auth=cfg.need_client_auth == "require")


class TlsListener:
    """The remoting port in ``permissive`` or ``enforcing`` mode: each accepted connection's first
    byte decides TLS or plaintext (module docstring), then ``serve`` gets its streams as
    ``asyncio.start_server`` would give them.

    The listener accepts sockets itself and peeks before any transport exists (uvloop starts
    reading a transport right after ``connection_made``, so a paused transport cannot be peeked):
    ``loop.connect_accepted_socket`` then wraps the socket, with ``ssl`` for a TLS client.

    Args:
        cfg: the ``[tls]`` table (``server_mode`` not ``disabled``).
        serve: the broker's connection handler.
        limit: the StreamReader's buffer limit (as ``asyncio.start_server``'s ``limit``).
    """

    def __init__(self, cfg: TlsConfig, serve: ServeCallback, limit: int) -> None:
        self.cfg = cfg
        self.context = server_context(cfg)
        self._serve = serve
        self._limit = limit
        self._tasks: set[asyncio.Task[None]] = set()
        self.sockets: list[socket.socket] = []
        """The listening socket (as ``asyncio.Server.sockets``)."""
        self.refused_plaintext = 0
        """Plaintext connections closed because the mode is ``enforcing``."""

    async def start(self, host: str, port: int) -> TlsListener:
        """Listen on ``host:port`` and start accepting. Raises OSError when it cannot be bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family,
                                    backlog=limits.TLS_LISTEN_BACKLOG)
        sock.setblocking(False)
        self.sockets = [sock]
        self._spawn(self._accept(sock))
        return self

    def close(self) -> None:
        """Stop accepting (connections already handed over stay open)."""
        for t in list(self._tasks):
            t.cancel()
        for s in self.sockets:
            s.close()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:  # e.g. EMFILE: asyncio's own server retries after a second
                log.error("cannot accept a connection: %s; retrying in 1 s", exc)
                await asyncio.sleep(1)
                continue
            self._spawn(self._route(conn))

    def _stream_protocol(self) -> asyncio.StreamReaderProtocol:
        reader = asyncio.StreamReader(limit=self._limit)
        return asyncio.StreamReaderProtocol(reader, self._serve)

    async def _route(self, conn: socket.socket) -> None:
        """Peek at the first byte, then hand the socket over with TLS, without, or close it."""
        loop = asyncio.get_running_loop()
        timeout_s = limits.TLS_HANDSHAKE_TIMEOUT_MS / 1000
        try:
            first = await asyncio.wait_for(_peek_byte(conn), timeout_s)
        except (TimeoutError, OSError):
            conn.close()
            return
        if not first:  # closed before sending anything
            conn.close()
            return
        if first[0] != _HANDSHAKE and self.cfg.server_mode == "enforcing":
            self.refused_plaintext += 1
            if self.refused_plaintext == 1 or self.refused_plaintext % 1000 == 0:
                log.warning("closed a plaintext connection from %s: tls.server_mode is enforcing "
                            "(%d so far)", _peer(conn), self.refused_plaintext)
            conn.close()
            return
        tls: dict[str, Any] = {}
        if first[0] == _HANDSHAKE:
            tls = {"ssl": self.context, "ssl_handshake_timeout": timeout_s}
        try:
            await loop.connect_accepted_socket(self._stream_protocol, conn, **tls)
        except (OSError, TimeoutError, ConnectionError) as exc:
            log.debug("TLS handshake with %s failed: %s", _peer(conn), exc)
            conn.close()


async def _peek_byte(conn: socket.socket) -> bytes:
    """The first byte waiting on ``conn``, left there (``MSG_PEEK``); b"" at EOF."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(conn.fileno(), readable.set)
    try:
        while True:  # a wake-up may come before the data: look, and wait again
            try:
                return conn.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                readable.clear()
            await readable.wait()
    finally:
        loop.remove_reader(conn.fileno())


def _peer(conn: socket.socket) -> str:
    with contextlib.suppress(OSError, TypeError, IndexError):
        peer = conn.getpeername()
        return f"{peer[0]}:{peer[1]}"
    return "?"
