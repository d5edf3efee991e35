"""The asyncio shell of the client: connections, producers and the transaction producer."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from txmq import limits
from txmq.client._core import (
    LocalTransactionState,
    MessageIdGenerator,
    RemotingCore,
    RouteInfo,
    SendResult,
    TransactionSendResult,
    check_response,
    ensure_msg_id,
    producer_heartbeat,
    route_info,
    send_request_header,
    send_result,
    set_delay_level,
)
from txmq.client._transaction import EndAnswer, EndBatcher, EndMode, TransactionCore
from txmq.errors import (
    BrokerUnavailable,
    ConfigError,
    MessageTooLarge,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    ResponseCode,
)
from txmq.protocol import (
    Command,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    GetRouteInfoRequestHeader,
    HeartbeatData,
    Message,
    MessageExt,
    RequestCode,
    UnregisterClientRequestHeader,
    decode_cluster_info,
    encode_batch,
    encode_body,
    parse_address,
    to_ext,
)

__all__ = [
    "AsyncConnection",
    "AsyncProducer",
    "AsyncTransactionProducer",
    "TransactionListener",
    "parse_endpoint",
    "tls_client_context",
]

log = logging.getLogger("txmq.client")
_READ_BYTES = 256 * 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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


class AsyncConnection:
    """One TCP connection to a broker with pipelined requests matched by ``opaque``.

    Args:
        endpoint: ``host:port``.
        on_request: called with each broker-initiated request (check-back, notifications).
        timeout_ms: default request timeout.
        access_key, secret_key: sign every request (RocketMQ ACL; see ``RemotingCore``).
        tls: speak TLS with this context (:func:`tls_client_context`); None: plaintext.
    """

    def __init__(self, endpoint: str, on_request: Callable[[Command], None] | None = None,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, *, access_key: str = "",
                 secret_key: str = "", tls: ssl.SSLContext | None = None) -> None:
        self.host, self.port = parse_endpoint(endpoint)
        self._tls = tls
        self._on_request = on_request
        self._timeout_s = timeout_ms / 1000
        self._core = RemotingCore(access_key=access_key, secret_key=secret_key)
        self._pending: dict[int, asyncio.Future[Command]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._out: list[bytes] = []
        self.closed = True

    async def connect(self) -> None:
        """Open the connection (and its TLS handshake). Raises BrokerUnavailable, also for a TLS
        failure (a certificate that does not verify, a plaintext-only server)."""
        tls: dict[str, Any] = {}
        if self._tls is not None:
            tls = {"ssl": self._tls, "server_hostname": self.host,
                   "ssl_handshake_timeout": limits.TLS_HANDSHAKE_TIMEOUT_MS / 1000}
        try:
            reader, self._writer = await asyncio.open_connection(self.host, self.port, **tls)
        except (OSError, TimeoutError) as exc:
            raise BrokerUnavailable(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.closed = False
        self._reader_task = asyncio.create_task(self._read_loop(reader))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(_READ_BYTES):
                for cmd in self._core.receive(data):
                    if cmd.is_response:
                        fut = self._pending.pop(cmd.opaque, None)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    elif self._on_request is not None:
                        self._on_request(cmd)
        except (OSError, ProtocolError) as exc:
            log.warning("connection to %s:%d lost: %s", self.host, self.port, exc)
        finally:
            self._fail_all()

    def _fail_all(self) -> None:
        self.closed = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BrokerUnavailable(f"connection to {self.host}:{self.port} closed"))
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()

    async def request(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                      timeout_s: float | None = None) -> Command:
        """Send a request and wait for its response (any code; see ``check_response``).

        Raises:
            BrokerUnavailable: not connected, or the connection dropped before the answer.
            RequestTimeout: no answer within the timeout.
        """
        if self.closed or self._writer is None:
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
        if self.closed or self._writer is None:
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
        if out and self._writer is not None and not self._writer.is_closing():
            self._writer.write(out[0] if len(out) == 1 else b"".join(out))

    async def close(self) -> None:
        self._write_out()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        self.closed = True


class _Client:
    """Connection upkeep shared by producers and consumers: reconnect, heartbeat, routes.

    Args:
        endpoints: a broker's ``host:port``; it also answers route lookups when no name server
            is given. May be "" when ``namesrv_addr`` is.
        timeout_ms: request timeout.
        namesrv_addr: name servers ``host:port;host:port`` (RocketMQ ``namesrvAddr``): routes
            come from there, and the broker is the master the routes name.
        access_key, secret_key: RocketMQ ACL credentials: every request is signed with them
            (RocketMQ ``AclClientRPCHook``); needed by brokers with ACL on (docs/security.md).
        tls: connect to the broker over TLS (RocketMQ ``tls.enable``), checking its certificate.
        tls_ca_file: PEM CAs the broker's certificate must chain to (default: the system's).
        tls_verify_hostname: check that the certificate names the broker's address (DNS or IP
            subject alternative name); on by default.

    Raises:
        ConfigError: a bad address, half the credentials, ``tls_*`` without ``tls``, an unreadable
            ``tls_ca_file``.
    """

    def __init__(self, endpoints: str, timeout_ms: int, namesrv_addr: str = "", *,
                 access_key: str = "", secret_key: str = "", tls: bool = False,
                 tls_ca_file: str = "", tls_verify_hostname: bool = True) -> None:
        if not endpoints and not namesrv_addr:
            raise ConfigError("give a broker address (endpoints) or a name server (namesrv_addr)")
        if endpoints:
            parse_endpoint(endpoints)
        if namesrv_addr:
            parse_endpoint(namesrv_addr)
        self.endpoints = endpoints
        self.namesrv_addr = namesrv_addr
        self._timeout_ms = timeout_ms
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
        self._conn: AsyncConnection | None = None
        self._namesrv: AsyncConnection | None = None
        self._conn_lock: asyncio.Lock | None = None
        self._routes: dict[str, RouteInfo] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False

    def _heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(client_id=self.client_id)

    def _on_request(self, cmd: Command) -> None:
        log.debug("ignoring broker request code %d", cmd.code)

    async def _broker_endpoint(self) -> str:
        """The broker to talk to: ``endpoints``, or the first master the name server knows."""
        if self.endpoints:
            return self.endpoints
        r = check_response(await self._namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO))
        info = decode_cluster_info(r.body)
        for name in sorted(info.broker_addr_table):
            addr = info.broker_addr_table[name].broker_addrs.get(0)
            if addr:
                self.endpoints = addr
                return addr
        raise BrokerUnavailable(f"name server {self.namesrv_addr} knows no master broker")

    async def broker_address(self) -> str:
        """The broker this client talks to: ``endpoints``, or the master the name server knows
        (resolved once). Raises BrokerUnavailable."""
        return await self._broker_endpoint()

    async def _namesrv_call(self, code: int, ext: dict[str, str] | None = None) -> Command:
        if self._namesrv is None or self._namesrv.closed:
            self._namesrv = AsyncConnection(self.namesrv_addr, None, self._timeout_ms,
                                            **self._credentials)
            await self._namesrv.connect()
        return await self._namesrv.request(code, ext)

    async def _connection(self) -> AsyncConnection:
        """The live connection, reconnecting (and re-sending the heartbeat) if needed."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._conn_lock is None:
            self._conn_lock = asyncio.Lock()
        async with self._conn_lock:
            if self._conn is None or self._conn.closed:
                addr = await self._broker_endpoint()
                conn = AsyncConnection(addr, self._on_request, self._timeout_ms,
                                       **self._credentials, tls=self._tls)
                await conn.connect()
                self._conn = conn
                try:
                    await self._heartbeat(conn)
                except BaseException:  # e.g. refused by ACL: do not leave its reader running
                    await conn.close()
                    raise
        return self._conn

    async def _heartbeat(self, conn: AsyncConnection) -> None:
        body = encode_body(self._heartbeat_data())
        check_response(await conn.request(RequestCode.HEART_BEAT, body=body))

    async def _heartbeat_loop(self) -> None:
        while self._running:
            await asyncio.sleep(limits.HEARTBEAT_INTERVAL_MS / 1000)
            try:
                await self._heartbeat(await self._connection())
            except (BrokerUnavailable, RequestTimeout) as exc:
                log.warning("heartbeat failed: %s", exc)

    async def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                   timeout_s: float | None = None) -> Command:
        """One request on the live connection; the raw response (any code)."""
        conn = await self._connection()
        return await conn.request(code, ext, body, timeout_s)

    async def route(self, topic: str, refresh: bool = False) -> RouteInfo:
        """The broker and queue count of ``topic`` (GET_ROUTEINFO_BY_TOPIC to the name server,
        or to the broker itself without one). Raises RemoteError (TOPIC_NOT_EXIST) for a topic
        with no route, ConfigError for a topic on several brokers."""
        if refresh or topic not in self._routes:
            ext = to_ext(GetRouteInfoRequestHeader(topic=topic))
            if self.namesrv_addr:
                r = check_response(await self._namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
            else:
                r = check_response(await self.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
            self._routes[topic] = route_info(r.body, topic)
        return self._routes[topic]

    async def queue_nums(self, topic: str, refresh: bool = False) -> int:
        """Queue count of ``topic``. Raises RemoteError (TOPIC_NOT_EXIST) for unknown topics."""
        return (await self.route(topic, refresh)).queue_nums

    async def create_topic(self, topic: str, queue_nums: int = limits.DEFAULT_QUEUE_NUMS) -> int:
        """Create a topic on the broker (admin, UPDATE_AND_CREATE_TOPIC). Returns its queue count."""
        h = CreateTopicRequestHeader(topic=topic, read_queue_nums=queue_nums,
                                     write_queue_nums=queue_nums)
        check_response(await self.call(RequestCode.UPDATE_AND_CREATE_TOPIC, to_ext(h)))
        return await self.queue_nums(topic, refresh=True)

    async def start(self) -> None:
        """Connect and start heartbeats. Raises BrokerUnavailable."""
        self._running = True
        await self._connection()
        self._tasks.append(asyncio.create_task(self._heartbeat_loop()))

    def _unregister_header(self) -> UnregisterClientRequestHeader:
        return UnregisterClientRequestHeader(client_id=self.client_id)

    async def shutdown(self) -> None:
        """Stop background tasks, unregister and close the connections."""
        self._running = False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self._conn is not None and not self._conn.closed:
            with contextlib.suppress(Exception):
                await self._conn.request(RequestCode.UNREGISTER_CLIENT,
                                         to_ext(self._unregister_header()), timeout_s=2)
            await self._conn.close()
        if self._namesrv is not None:
            await self._namesrv.close()


class AsyncProducer(_Client):
    """Sends messages (RocketMQ ``DefaultMQProducer``), asyncio API.

    Args:
        group: producer group.
        endpoints: broker address ``host:port`` ("" with ``namesrv_addr``).
        max_message_size: refuse bodies larger than this locally (bytes).
        timeout_ms: request timeout.
        namesrv_addr: name server address(es), as RocketMQ clients take them.
        access_key, secret_key: ACL credentials; every request is signed (docs/security.md).
        tls, tls_ca_file, tls_verify_hostname: TLS to the broker (see ``_Client``;
            docs/security.md).
    """

    def __init__(self, group: str, endpoints: str = "", *,
                 max_message_size: int = limits.MESSAGE_SIZE_MAX_BYTES,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 access_key: str = "", secret_key: str = "", tls: bool = False,
                 tls_ca_file: str = "", tls_verify_hostname: bool = True) -> None:
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname)
        if not group:
            raise ConfigError("producer group must not be empty")
        self.group = group
        self.max_message_size = max_message_size
        self._next_queue: dict[str, int] = {}

    def _heartbeat_data(self) -> HeartbeatData:
        return producer_heartbeat(self.client_id, [self.group])

    def _unregister_header(self) -> UnregisterClientRequestHeader:
        return UnregisterClientRequestHeader(client_id=self.client_id, producer_group=self.group)

    async def _select_queue(self, topic: str, queue_id: int | None) -> int:
        n = await self.queue_nums(topic)
        if queue_id is not None:
            if not 0 <= queue_id < n:
                raise ConfigError(f"queue {queue_id} not in topic {topic!r} ({n} queues)")
            return queue_id
        i = self._next_queue.get(topic, 0)
        self._next_queue[topic] = i + 1
        return i % n

    def _validate(self, msg: Message) -> None:
        if not msg.topic:
            raise ConfigError("message topic must not be empty")
        if len(msg.body) > self.max_message_size:
            raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self.max_message_size}")

    async def send(self, msg: Message, queue_id: int | None = None, *,
                   delay_level: int = 0) -> SendResult:
        """Send one message; returns after the broker stored it (durably, with SYNC_FLUSH).

        ``delay_level`` > 0 makes it a delay message (property ``DELAY``): consumers see it after
        that level's delay (``message_delay_level``: 1 = 1 s … 18 = 2 h by default; higher levels
        are clamped to the last one).

        Raises:
            MessageTooLarge, ConfigError: refused locally, nothing sent.
            RemoteError: the broker refused it (unknown topic, disk full, …).
            BrokerUnavailable, RequestTimeout: outcome unknown; the message may have been stored.
        """
        if delay_level:
            set_delay_level(msg, delay_level)
        self._validate(msg)
        ensure_msg_id(msg, self._ids)
        qid = await self._select_queue(msg.topic, queue_id)
        ext = send_request_header(msg, self.group, qid, _now_ms())
        resp = check_response(await self.call(RequestCode.SEND_MESSAGE_V2, ext, msg.body))
        return send_result(msg.topic, msg.msg_id, resp)

    async def send_batch(self, msgs: list[Message], queue_id: int | None = None) -> SendResult:
        """Send plain messages of one topic in one request, stored contiguously in one queue.

        Returns the first message's result (``queue_offset`` of the first; the rest follow).
        """
        if not msgs or len(msgs) > limits.BATCH_MESSAGES_MAX:
            raise ConfigError(f"a batch holds 1..{limits.BATCH_MESSAGES_MAX} messages")
        topic = msgs[0].topic
        for m in msgs:
            self._validate(m)
            if m.topic != topic:
                raise ConfigError("all messages of a batch must have the same topic")
            ensure_msg_id(m, self._ids)
        qid = await self._select_queue(topic, queue_id)
        ext = send_request_header(Message(topic=topic, body=b""), self.group, qid, _now_ms(),
                                  batch=True)
        resp = check_response(await self.call(RequestCode.SEND_BATCH_MESSAGE, ext,
                                              encode_batch(msgs)))
        return send_result(topic, msgs[0].msg_id, resp)


class TransactionListener(Protocol):
    """The application's side of a transactional send (RocketMQ ``TransactionListener``).

    Either method may be a coroutine function with the async producer. With the sync producer,
    ``execute_local_transaction`` runs in the caller's thread and ``check_local_transaction`` in a
    worker thread, so it must be thread-safe (open its own database connection).
    """

    def execute_local_transaction(
        self, msg: Message, arg: Any
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...

    def check_local_transaction(
        self, msg: MessageExt
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...


class AsyncTransactionProducer(AsyncProducer):
    """Sends half messages, runs the local transaction, ends it; answers check-backs.

    Args:
        group: producer group (check-backs go to live members of it).
        endpoints: broker address.
        listener: the :class:`TransactionListener`.
        check_threads: how many check-backs run at once.
        oneway_end: send END_TRANSACTION one-way like RocketMQ's ``endTransactionOneway`` (faster;
            the result's ``outcome`` is then "SENT"). By default the broker's recorded outcome is
            awaited, so a returned COMMIT is durable and visible.
    """

    def __init__(self, group: str, endpoints: str = "", listener: TransactionListener | None = None,
                 *, check_threads: int = 4, oneway_end: bool = False, **kw: Any) -> None:
        super().__init__(group, endpoints, **kw)
        if listener is None:
            raise ConfigError("a transaction producer needs a TransactionListener")
        self.listener = listener
        self.oneway_end = oneway_end
        self._tx = TransactionCore(group, self._ids)
        self._batcher = EndBatcher()
        self._waiting: dict[int, asyncio.Future[EndAnswer]] = {}  # id(header) -> its answer
        self._check_sem = asyncio.Semaphore(check_threads)
        self._check_tasks: set[asyncio.Task[None]] = set()
        self.checks_answered = 0

    async def send_half(self, msg: Message, queue_id: int | None = None) -> SendResult:
        """Store ``msg`` as a half message (invisible until committed); see
        :meth:`TransactionCore.half` for its fresh id."""
        return await self.send(self._tx.half(msg), queue_id)

    async def send_half_batch(self, msgs: list[Message], queue_id: int | None = None) -> SendResult:
        """Store several half messages of one topic in one request, contiguous in the half queue
        (the result names the first; the rest follow). Ending them one by one needs each one's
        offsets, so this is for callers that settle a whole batch at once (the Spark sink)."""
        return await self.send_batch([self._tx.half(m) for m in msgs], queue_id)

    async def end_transaction(self, half: SendResult, state: LocalTransactionState) -> str:
        """Tell the broker the local outcome; returns its recorded outcome ("COMMIT", "ROLLBACK",
        "PENDING" for UNKNOWN), "SENT" with ``oneway_end`` or against a broker without batch ends
        (RocketMQ ``endTransactionOneway``: no answer awaited), or "UNKNOWN_END" when the request
        failed (check-back will settle it)."""
        h = self._tx.end_request(half, state)
        try:
            if self.oneway_end or self._batcher.mode is EndMode.ONEWAY:
                (await self._connection()).oneway(RequestCode.END_TRANSACTION, to_ext(h))
                return "SENT"
            item = await self._batched_end(h)
        except (BrokerUnavailable, RequestTimeout) as exc:
            log.warning("end transaction of %s not acknowledged (%s); check-back will settle it",
                        half.msg_id, exc)
            return "UNKNOWN_END"
        if item.code != ResponseCode.SUCCESS:
            raise RemoteError(item.code, item.remark)
        return item.outcome

    async def _batched_end(self, h: EndTransactionRequestHeader) -> EndAnswer:
        """Queue an end request; all ends queued in one event-loop turn go in one
        END_TRANSACTION_BATCH request (at most ``limits.BATCH_MESSAGES_MAX``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[EndAnswer] = loop.create_future()
        self._waiting[id(h)] = fut
        if self._batcher.add(h):
            loop.call_soon(self._spawn_end_flush)
        try:
            return await fut
        finally:
            self._waiting.pop(id(h), None)

    def _spawn_end_flush(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush_ends())
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)

    async def _flush_ends(self) -> None:
        batch, more = self._batcher.take()
        if more:
            asyncio.get_running_loop().call_soon(self._spawn_end_flush)
        futs = [self._waiting.get(id(h)) for h in batch]
        try:
            resp = await self.call(RequestCode.END_TRANSACTION_BATCH, body=self._batcher.body(batch))
            if self._batcher.unsupported(resp):  # an Apache RocketMQ broker: one-way ends
                conn = await self._connection()
                for h in batch:
                    conn.oneway(RequestCode.END_TRANSACTION, to_ext(h))
                answers = [EndAnswer(ResponseCode.SUCCESS, outcome="SENT") for _ in batch]
            else:
                answers = self._batcher.answers(check_response(resp), len(batch))
        except Exception as exc:
            for fut in futs:
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
            return
        for fut, answer in zip(futs, answers, strict=True):
            if fut is not None and not fut.done():
                fut.set_result(answer)

    async def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Half message → local transaction → commit or rollback (RocketMQ
        ``sendMessageInTransaction``). An exception in the local transaction counts as UNKNOWN
        (as in RocketMQ) and is logged; check-back then decides.

        Raises:
            TypeError: the listener returned something that is not a LocalTransactionState
                (after the end request: the half is left UNKNOWN for check-back).
        """
        half = await self.send_half(msg)
        try:
            result = self.listener.execute_local_transaction(msg, arg)
            if inspect.isawaitable(result):
                result = await result
        except Exception:
            log.exception("local transaction of %s raised; state UNKNOWN", half.msg_id)
            result = LocalTransactionState.UNKNOWN
        state, complaint = self._tx.local_state(result)
        outcome = await self.end_transaction(half, state)
        if complaint:
            raise TypeError(complaint)
        return TransactionSendResult(half.msg_id, msg.topic, half.queue_id, half.queue_offset,
                                     state, outcome)

    def _on_request(self, cmd: Command) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            task = asyncio.get_running_loop().create_task(self._check(cmd))
            self._check_tasks.add(task)
            task.add_done_callback(self._check_tasks.discard)

    async def _check(self, cmd: Command) -> None:
        check = self._tx.check_back(cmd)
        if check is None:
            return
        async with self._check_sem:
            try:
                result = await _call_listener(self.listener.check_local_transaction, check.message)
            except Exception:
                log.exception("check_local_transaction of %s raised; answering UNKNOWN",
                              check.header.msg_id)
                return
        state, complaint = self._tx.local_state(result)
        if complaint:
            log.error("check_local_transaction: %s", complaint)
        end = self._tx.check_answer(check, state)
        if end is None:
            return
        with contextlib.suppress(BrokerUnavailable):
            (await self._connection()).oneway(RequestCode.END_TRANSACTION, to_ext(end))
            self.checks_answered += 1


async def _call_listener(fn: Callable[..., Any], *args: Any) -> Any:
    """Await a coroutine listener; run a plain one in a worker thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result

