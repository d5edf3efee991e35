"""What every client shares, asyncio: connections to every broker of its routes, routes from the name
servers (refreshed), heartbeats to every master, supervised background loops.

A client is given a broker (``endpoints``), name servers (``namesrv_addr``), or both. With name
servers, routes come from them (each tried in turn) and requests about a queue go to the broker group
that holds it (RocketMQ ``MQClientInstance``). With a broker only, that broker answers route lookups
itself; a one-broker route is reached at ``endpoints``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from txmq import limits
from txmq.client._connection import AsyncConnection, parse_endpoint, tls_client_context
from txmq.client._core import MessageIdGenerator, check_response
from txmq.client._route import RouteRefreshGate, TopicRoute, decode_topic_route
from txmq.errors import (
    BrokerUnavailable,
    ConfigError,
    RemoteError,
    ResponseCode,
    TransportError,
)
from txmq.protocol import (
    MASTER_ID,
    Command,
    CreateTopicRequestHeader,
    GetRouteInfoRequestHeader,
    HeartbeatData,
    RequestCode,
    UnregisterClientRequestHeader,
    decode_cluster_info,
    encode_body,
    to_ext,
)
from txmq.tracing import Tracing

if TYPE_CHECKING:
    from txmq.client._msgtrace import MsgTracer

__all__ = ["ClientBase", "supervised"]

log = logging.getLogger("txmq.client")

_UNREGISTER_TIMEOUT_S = 2.0
"""How long shutdown waits for each broker's UNREGISTER_CLIENT answer (txmq)."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def supervised(name: str, step: Callable[[], Awaitable[None]], period_s: float,
                     running: Callable[[], bool], errors: Counter[str], *,
                     pause: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Run ``step`` every ``period_s`` seconds while ``running()`` (``period_s`` 0: ``step`` does its
    own waiting, as a pull loop's long poll, and runs again at once). An exception is caught, logged,
    counted in ``errors[name]``, and the next try waits twice the last pause (the first time
    ``max(2 × period_s, limits.CLIENT_LOOP_BACKOFF_MIN_MS)``), up to
    ``limits.CLIENT_LOOP_BACKOFF_MAX_MS``: a background loop never dies silently, nor spins on a
    failure (as the broker's timers). Cancellation ends it. ``pause`` is the sleep (tests)."""
    delay = period_s
    while running():
        if delay > 0:
            await pause(delay)
            if not running():
                return
        try:
            await step()
            delay = period_s
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors[name] += 1
            delay = min(max(delay * 2, limits.CLIENT_LOOP_BACKOFF_MIN_MS / 1000),
                        limits.CLIENT_LOOP_BACKOFF_MAX_MS / 1000)
            if isinstance(exc, TransportError | RemoteError):
                log.warning("%s failed (%s); next try in %.1f s", name, exc, delay)
            else:
                log.exception("%s failed; next try in %.1f s", name, delay)


class ClientBase:
    """Connection upkeep shared by producers and consumers: routes, connections, heartbeats.

    Args:
        endpoints: a broker's ``host:port``; it also answers route lookups when no name server
            is given. May be "" when ``namesrv_addr`` is.
        timeout_ms: request timeout.
        namesrv_addr: name servers ``host:port;host:port`` (RocketMQ ``namesrvAddr``), tried in
            turn: routes come from there and each request about a queue goes to its broker group.
        access_key, secret_key: RocketMQ ACL credentials: every request is signed with them
            (RocketMQ ``AclClientRPCHook``); needed by brokers with ACL on (docs/security.md).
        tls: connect to brokers over TLS (RocketMQ ``tls.enable``), checking their certificates.
        tls_ca_file: PEM CAs a broker's certificate must chain to (default: the system's).
        tls_verify_hostname: check that the certificate names the broker's address (DNS or IP
            subject alternative name); on by default.
        connect_timeout_ms: give up a connect after this (RocketMQ ``connectTimeoutMillis``, 3 s).
        poll_name_server_interval_ms: refresh routes this often (RocketMQ
            ``pollNameServerInterval``, 30 s); also at once after TOPIC_NOT_EXIST, an unknown
            queue, a broker that cannot be reached, or a refusal saying the master moved
            (:func:`~txmq.client._route.master_may_have_moved`).
        tracing: OpenTelemetry spans and trace context in message properties: True (the
            global tracer provider), False (none), or a :class:`~txmq.tracing.Tracing`
            (docs/tracing.md). Nothing is traced unless OpenTelemetry is in use.

    Raises:
        ConfigError: a bad address, half the credentials, ``tls_*`` without ``tls``, an unreadable
            ``tls_ca_file``.
    """

    def __init__(self, endpoints: str, timeout_ms: int, namesrv_addr: str = "", *,
                 access_key: str = "", secret_key: str = "", tls: bool = False,
                 tls_ca_file: str = "", tls_verify_hostname: bool = True,
                 connect_timeout_ms: int = limits.CONNECT_TIMEOUT_MS,
                 poll_name_server_interval_ms: int = limits.POLL_NAME_SERVER_INTERVAL_MS,
                 tracing: Tracing | bool = True) -> None:
        if not endpoints and not namesrv_addr:
            raise ConfigError("give a broker address (endpoints) or a name server (namesrv_addr)")
        if endpoints:
            parse_endpoint(endpoints)
        self._namesrvs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        for a in self._namesrvs:
            parse_endpoint(a)
        if connect_timeout_ms <= 0 or poll_name_server_interval_ms <= 0:
            raise ConfigError("connect_timeout_ms and poll_name_server_interval_ms must be > 0")
        self.endpoints = endpoints
        self.namesrv_addr = namesrv_addr
        self._timeout_ms = timeout_ms
        self._connect_timeout_ms = connect_timeout_ms
        self._poll_ms = poll_name_server_interval_ms
        if bool(access_key) != bool(secret_key):
            raise ConfigError("give both access_key and secret_key, or neither")
        self._credentials: dict[str, Any] = {"access_key": access_key, "secret_key": secret_key}
        if not tls and (tls_ca_file or not tls_verify_hostname):
            raise ConfigError("tls_ca_file and tls_verify_hostname need tls=True")
        self._tls = tls_client_context(tls_ca_file, tls_verify_hostname) if tls else None
        """The broker connections' TLS; name server connections stay plaintext (txmq namesrv)."""
        salt = os.urandom(4)
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{salt.hex()}"
        self._ids = MessageIdGenerator(os.getpid(), salt, _now_ms)
        self._conns: dict[str, AsyncConnection] = {}
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self._namesrv: AsyncConnection | None = None
        self._namesrv_index = 0
        self._routes: dict[str, TopicRoute] = {}
        self._brokers: dict[str, dict[int, str]] = {}
        """Broker name → {broker id → address}, merged from every route and the cluster info."""
        self._last_masters: dict[str, str] = {}
        """Broker name → the last master address a route named: a new master is seen as one
        even when a route without a master (a failover's gap) came between."""
        self._refresh_gate = RouteRefreshGate()
        self._refreshing: dict[str, asyncio.Future[None]] = {}  # topic -> its lookup under way
        self._tasks: list[asyncio.Task[None]] = []
        self._route_tasks: set[asyncio.Task[Any]] = set()  # background lookups (_refresh_route_later)
        self._running = False
        self._loops_spawned = False  # the heartbeat and route-refresh loops are spawned
        self._shut = False  # set by shutdown(): no background loop starts again (start() clears it)
        self.loop_errors: Counter[str] = Counter()
        """Failures of each background loop by name (heartbeat, route refresh, …)."""
        self.msg_trace: MsgTracer | None = None
        """The RocketMQ message trace this client writes (``enable_msg_trace``), or None."""
        self.tracing = Tracing.of(tracing)
        """What this client traces (docs/tracing.md)."""

    # -- requests from brokers ----------------------------------------------------------------------
    def _heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(client_id=self.client_id)

    def _on_request(self, conn: AsyncConnection, cmd: Command) -> None:
        log.debug("ignoring request code %d from %s", cmd.code, conn.addr)

    @property
    def _heartbeats_slaves(self) -> bool:
        """Whether heartbeats go to slaves too: consumers yes, pure producers only to masters
        (RocketMQ ``MQClientInstance.sendHeartbeatToAllBroker``)."""
        return False

    # -- name servers -------------------------------------------------------------------------------
    async def _namesrv_call(self, code: int, ext: dict[str, str] | None = None) -> Command:
        """One request to a name server, trying each of ``namesrv_addr`` in turn from the last one
        that answered. Raises BrokerUnavailable / RequestTimeout when none answers."""
        last: TransportError | None = None
        for _ in range(len(self._namesrvs)):
            addr = self._namesrvs[self._namesrv_index % len(self._namesrvs)]
            try:
                if self._namesrv is None or self._namesrv.closed or self._namesrv.addr != addr:
                    if self._namesrv is not None:
                        await self._namesrv.close()
                    self._namesrv = AsyncConnection(addr, None, self._timeout_ms,
                                                    connect_timeout_ms=self._connect_timeout_ms,
                                                    **self._credentials)
                    await self._namesrv.connect()
                return await self._namesrv.request(code, ext)
            except TransportError as exc:
                log.warning("name server %s: %s", addr, exc)
                last = exc
                self._namesrv_index += 1
        assert last is not None
        raise last

    async def cluster_masters(self) -> dict[str, str]:
        """Broker name → master address of every broker group the name servers know
        (GET_BROKER_CLUSTER_INFO); with a broker only, ``{"": endpoints}``. Raises
        BrokerUnavailable, RequestTimeout, RemoteError."""
        if not self._namesrvs:
            return {"": self.endpoints}
        r = check_response(await self._namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO))
        info = decode_cluster_info(r.body)
        out: dict[str, str] = {}
        for name, bd in info.broker_addr_table.items():
            self._brokers.setdefault(name, {}).update(bd.broker_addrs)
            if MASTER_ID in bd.broker_addrs:
                out[name] = bd.broker_addrs[MASTER_ID]
        return dict(sorted(out.items()))

    # -- routes -------------------------------------------------------------------------------------
    async def _fetch_route(self, topic: str) -> TopicRoute:
        ext = to_ext(GetRouteInfoRequestHeader(topic=topic))
        if self._namesrvs:
            r = check_response(await self._namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
            return decode_topic_route(r.body, topic)
        r = check_response(await self.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
        route = decode_topic_route(r.body, topic)
        if len(route.brokers) == 1:  # the broker we were given: reach it where we were told to
            (name, addrs), = route.brokers.items()
            route = TopicRoute(topic, route.publish, route.subscribe,
                               {name: {**addrs, MASTER_ID: self.endpoints}})
        return route

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The route of ``topic`` (GET_ROUTEINFO_BY_TOPIC to a name server, or to the broker
        itself without one), cached until the next refresh.

        Raises:
            RemoteError: TOPIC_NOT_EXIST for a topic with no route.
            BrokerUnavailable, RequestTimeout: no name server (or broker) answered.
        """
        cached = self._routes.get(topic)
        if cached is None or refresh:
            new = await self._fetch_route(topic)
            self._routes[topic] = new
            for name, addrs in new.brokers.items():
                known = self._brokers.setdefault(name, {})
                new_master = addrs.get(MASTER_ID)
                old_master = known.get(MASTER_ID) or self._last_masters.get(name)
                known.clear()
                known.update(addrs)
                if new_master:
                    self._last_masters[name] = new_master
                if old_master and new_master and old_master != new_master:
                    self._master_moved(name, old_master, new_master)
            return new
        return cached

    def _master_moved(self, broker_name: str, old: str, new: str) -> None:
        """A route names a new master for ``broker_name`` (a failover, or a broker moved)."""
        log.info("master of broker group %s moved from %s to %s", broker_name, old, new)

    async def _refresh_routes(self) -> None:
        """Refresh every cached route (RocketMQ ``updateTopicRouteInfoFromNameServer``). A topic
        whose lookup fails keeps its last route."""
        for topic in list(self._routes):
            try:
                await self.route(topic, refresh=True)
            except (RemoteError, TransportError) as exc:  # the next topic is still refreshed
                log.warning("route of %s not refreshed: %s", topic, exc)

    async def _refresh_route_soon(self, topic: str) -> TopicRoute | None:
        """Fetch ``topic``'s route again after a failure that says its master may have moved, as
        :class:`~txmq.client._route.RouteRefreshGate` allows: a caller that finds a lookup under
        way waits for it; otherwise at most one lookup per ``NAMESRV_REFRESH_MIN_INTERVAL_MS``
        per topic. Returns the route then cached (None if there is none); a failed lookup is
        logged, not raised."""
        pending = self._refreshing.get(topic)
        if pending is not None:
            await asyncio.shield(pending)
            return self._routes.get(topic)
        if not self._refresh_gate.begin(topic, time.monotonic_ns() // 1_000_000):
            return self._routes.get(topic)
        done = self._refreshing[topic] = asyncio.get_running_loop().create_future()
        try:
            await self.route(topic, refresh=True)
        except (TransportError, RemoteError) as exc:
            log.warning("route of %s not refreshed: %s", topic, exc)
        finally:
            self._refresh_gate.end(topic)
            del self._refreshing[topic]
            done.set_result(None)
        return self._routes.get(topic)

    def _refresh_route_later(self, topic: str) -> None:
        """Look ``topic``'s route up in the background, as the refresh gate allows: its route has
        a broker group without a master (a failover's gap). Sends meanwhile go to the other
        groups, so no send fails to ask for the route again; without this the client would see
        the group's new master only on its ``poll_name_server_interval_ms`` timer (30 s)."""
        if self._shut or not self._refresh_gate.may_begin(topic, time.monotonic_ns() // 1_000_000):
            return
        task = asyncio.get_running_loop().create_task(self._refresh_route_soon(topic))
        self._route_tasks.add(task)
        task.add_done_callback(self._route_tasks.discard)

    async def queue_nums(self, topic: str, refresh: bool = False) -> int:
        """How many queues a send to ``topic`` can choose from (over every broker group).
        Raises RemoteError (TOPIC_NOT_EXIST) for unknown topics."""
        return len((await self.route(topic, refresh)).publish)

    async def master_address(self, broker_name: str, topic: str = "") -> str:
        """The master address of ``broker_name`` (RocketMQ ``findBrokerAddressInPublish``); when
        it is not known, ``topic``'s route is fetched again first.

        Raises:
            BrokerUnavailable: the broker group has no master.
        """
        addr = self.known_master_address(broker_name)
        if addr is None and topic:
            await self._refresh_route_soon(topic)
            addr = self._brokers.get(broker_name, {}).get(MASTER_ID)
        if addr is None:
            raise BrokerUnavailable(f"broker group {broker_name!r} has no master in the routes")
        return addr

    def known_master_address(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` as the routes last said (the client's
        ``endpoints`` for ``""`` when it was given a broker's address), None when not known; no
        await, no route fetch (:meth:`master_address` does both)."""
        addr = self._brokers.get(broker_name, {}).get(MASTER_ID)
        if addr is None and not broker_name and self.endpoints:
            return self.endpoints
        return addr

    def broker_addresses(self, broker_name: str) -> dict[int, str]:
        """{broker id → address} of a broker group as the routes last said (empty if unknown)."""
        return dict(self._brokers.get(broker_name, {}))

    # -- connections --------------------------------------------------------------------------------
    async def connection(self, addr: str) -> AsyncConnection:
        """The live connection to ``addr``, connecting (and sending the heartbeat) when needed.

        Raises:
            ConnectTimeout, BrokerUnavailable: it cannot be reached.
            RemoteError: the broker refused the heartbeat (NO_PERMISSION by ACL, SYSTEM_BUSY for
                too many connections); a refusal for a subscribed topic that no longer exists
                (TOPIC_NOT_EXIST) is logged and the connection kept, so other topics go on.
        """
        self._ensure_background()
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._conn_locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = AsyncConnection(addr, self._on_request, self._timeout_ms,
                                       connect_timeout_ms=self._connect_timeout_ms,
                                       **self._credentials, tls=self._tls)
                await conn.connect()
                try:
                    await self._heartbeat(conn)
                except RemoteError as exc:
                    if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                        await conn.close()  # refused (ACL, too many connections): say why
                        raise
                    log.warning("heartbeat to %s refused: %s", addr, exc)  # a deleted topic
                except BaseException:
                    await conn.close()
                    raise
                self._conns[addr] = conn
        return conn

    async def _default_address(self) -> str:
        """``endpoints``, or (with name servers only) the first master the name servers know."""
        if self.endpoints:
            return self.endpoints
        masters = await self.cluster_masters()
        if not masters:
            raise BrokerUnavailable(f"name server {self.namesrv_addr} knows no master broker")
        return next(iter(masters.values()))

    async def broker_address(self) -> str:
        """The broker that requests not about one queue go to: ``endpoints``, or the first master
        the name servers know. Raises BrokerUnavailable."""
        return await self._default_address()

    async def _connection(self) -> AsyncConnection:
        return await self.connection(await self._default_address())

    async def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                   timeout_s: float | None = None) -> Command:
        """One request to the default broker (:meth:`broker_address`); the raw response."""
        conn = await self._connection()
        return await conn.request(code, ext, body, timeout_s)

    async def request(self, code: int, ext: dict[str, str] | None = None,
                      body: bytes = b"") -> Command:
        """One raw request to the default broker (admin tools); the response, checked.

        Raises:
            RemoteError (the subclass of its code), BrokerUnavailable, RequestTimeout.
        """
        return check_response(await self.call(code, ext, body))

    async def call_broker(self, broker_name: str, code: int, ext: dict[str, str] | None = None,
                          body: bytes = b"", timeout_s: float | None = None, *,
                          topic: str = "", broker_id: int = MASTER_ID) -> Command:
        """One request to a member of broker group ``broker_name`` (its master by default); the
        raw response. Raises BrokerUnavailable (no such member, or unreachable), RequestTimeout."""
        if broker_id == MASTER_ID:
            addr = await self.master_address(broker_name, topic)
        else:
            addr = self._brokers.get(broker_name, {}).get(broker_id) or ""
            if not addr:
                raise BrokerUnavailable(f"broker {broker_name!r} id {broker_id} is not in the routes")
        conn = await self.connection(addr)
        return await conn.request(code, ext, body, timeout_s)

    # -- heartbeats ---------------------------------------------------------------------------------
    async def _heartbeat(self, conn: AsyncConnection) -> None:
        body = encode_body(self._heartbeat_data())
        check_response(await conn.request(RequestCode.HEART_BEAT, body=body))

    def _heartbeat_targets(self) -> list[str]:
        out = {self.endpoints} if self.endpoints else set()
        for addrs in self._brokers.values():
            for bid, addr in addrs.items():
                if bid == MASTER_ID or self._heartbeats_slaves:
                    out.add(addr)
        return sorted(out)

    async def _heartbeat_all(self) -> None:
        """Heartbeat every master of the routes (and slaves, for consumers); a broker that fails is
        logged and counted, the others still get theirs. A broker once known stays a target (a
        killed broker's producers must be heard of as soon as it restarts, or its pending halves
        wait for a route refresh to be checked back)."""
        failed: list[str] = []
        for addr in self._heartbeat_targets():
            try:
                await self._heartbeat(await self.connection(addr))
            except (TransportError, RemoteError) as exc:
                self.loop_errors["heartbeat"] += 1
                failed.append(f"{addr}: {exc}")
        if failed:
            log.warning("heartbeat failed: %s", "; ".join(failed))

    # -- lifecycle ----------------------------------------------------------------------------------
    def _spawn_supervised(self, name: str, step: Callable[[], Awaitable[None]],
                          period_s: float) -> None:
        self._tasks.append(asyncio.create_task(
            supervised(name, step, period_s, lambda: not self._shut, self.loop_errors)))

    def _ensure_background(self) -> None:
        """Spawn the heartbeat and route-refresh loops once: at :meth:`start`, or at the first
        request of a client used without it. RocketMQ refuses a client that was not started; txmq
        serves it, and must keep it heartbeating: a transaction producer that no broker hears from
        is never checked back, so a half stored before its broker restarted would stay pending."""
        if self._loops_spawned or self._shut:
            return
        self._loops_spawned = True
        self._spawn_supervised("heartbeat", self._heartbeat_all,
                               limits.HEARTBEAT_INTERVAL_MS / 1000)
        self._spawn_supervised("route refresh", self._refresh_routes, self._poll_ms / 1000)

    async def start(self) -> None:
        """Connect and start heartbeats and route refreshes. With name servers, every master they
        know gets a heartbeat (so any of them can check back a producer); a master that cannot be
        reached is logged and retried. On failure everything started is released.

        Raises:
            BrokerUnavailable, ConnectTimeout, RequestTimeout: the broker (or every name server)
                cannot be reached.
            RemoteError: refused (e.g. NO_PERMISSION by ACL).
        """
        self._running, self._shut = True, False
        try:
            if self.endpoints:
                await self._connection()
            if self._namesrvs:
                await self.cluster_masters()
                await self._heartbeat_all()
        except BaseException:
            await self.shutdown()
            raise
        self._ensure_background()

    def _unregister_header(self) -> UnregisterClientRequestHeader:
        return UnregisterClientRequestHeader(client_id=self.client_id)

    async def shutdown(self) -> None:
        """Stop background tasks, unregister from every broker and close the connections.
        Idempotent."""
        if self.msg_trace is not None:  # the records still held go out over the connections
            await self.msg_trace.close()
        self._running, self._shut, self._loops_spawned = False, True, False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        for rt in list(self._route_tasks):
            rt.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await rt
        conns, self._conns = list(self._conns.values()), {}
        ext = to_ext(self._unregister_header())
        for conn in conns:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    await conn.request(RequestCode.UNREGISTER_CLIENT, ext,
                                       timeout_s=_UNREGISTER_TIMEOUT_S)
            await conn.close()
        if self._namesrv is not None:
            await self._namesrv.close()
            self._namesrv = None

    async def create_topic(self, topic: str, queue_nums: int = limits.DEFAULT_QUEUE_NUMS) -> int:
        """Create a topic on the default broker (admin, UPDATE_AND_CREATE_TOPIC); with name servers,
        on every master they know (mqadmin ``updateTopic -c``). Returns the number of queues a
        send can choose from afterwards. Raises RemoteError, BrokerUnavailable."""
        h = CreateTopicRequestHeader(topic=topic, read_queue_nums=queue_nums,
                                     write_queue_nums=queue_nums)
        if self._namesrvs:
            for addr in (await self.cluster_masters()).values():
                conn = await self.connection(addr)
                check_response(await conn.request(RequestCode.UPDATE_AND_CREATE_TOPIC, to_ext(h)))
        else:
            check_response(await self.call(RequestCode.UPDATE_AND_CREATE_TOPIC, to_ext(h)))
        return await self.queue_nums(topic, refresh=True)
