"""The gRPC door's asyncio shell: a grpc.aio server on the broker's loop, Telemetry streams, waits.

Each rpc asks :class:`~txmq.broker.grpc._core.GrpcCore` (sans-IO) for a result, gives its broker
actions to the broker shell, waits until the store is durable where the result says so (the
broker shell's group commit releases a marker reply; an fsync failure answers
INTERNAL_SERVER_ERROR), and answers. Business errors travel in ``Status.code`` with gRPC OK, as
the proxy does; a Telemetry stream whose settings are refused ends with INVALID_ARGUMENT
(``ClientActivity#processTelemetryException``). Check-backs for a gRPC client's connection id
arrive through :meth:`GrpcDoor.deliver` and are written on its newest Telemetry stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import grpc

from txmq import limits
from txmq.broker import Action, TlsConfig, grpc_server_credentials
from txmq.broker.acl import source_ip
from txmq.broker.grpc._convert import (
    REPLICATION_CODES,
    GrpcError,
    Result,
    not_replicated,
    status,
)
from txmq.broker.grpc._core import GRPC_CONN_BASE, GrpcCore, is_grpc_conn
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.errors import ConfigError, ResponseCode
from txmq.protocol import Command

if TYPE_CHECKING:
    from txmq.broker import Broker
    from txmq.broker.acl import AclGuard

__all__ = ["GrpcDoor"]

log = logging.getLogger("txmq.broker.grpc")

M = TypeVar("M")
_Context: TypeAlias = Any  # grpc.aio.ServicerContext (grpcio ships no type hints)
_CLIENT_ID = "x-mq-client-id"
_DOOR_CONN = GRPC_CONN_BASE  # durability markers; clients' ids start above it
_END = object()


def _client_id(context: _Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == _CLIENT_ID:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


def endpoints_of(host: str, port: int) -> pd.Endpoints:
    """``Endpoints`` naming ``host:port`` (IPv4, IPv6 or a domain name)."""
    try:
        scheme = pd.IPv4 if ipaddress.ip_address(host).version == 4 else pd.IPv6
    except ValueError:
        scheme = pd.DOMAIN_NAME
    return pd.Endpoints(scheme=scheme, addresses=[pd.Address(host=host, port=port)])


class GrpcDoor:
    """``apache.rocketmq.v2.MessagingService`` on ``host:port``, over the broker shell's broker.

    Args:
        broker: the broker core.
        host, port: where to listen (port 0: a free one, known after :meth:`start`).
        advertise_host: the host routes name (the door's own address as clients reach it).
        apply: the broker shell's action runner (replies wait for fsync there).
        now_ms: the broker shell's clock.
        acl: the ACL check (docs/security.md), or None when ACL is off.
        tls: the broker's ``[tls]`` table: unless disabled, the door serves TLS only (grpcio
            cannot tell a TLS client from a plaintext one, so ``permissive`` is TLS here too).
    """

    def __init__(self, broker: Broker, host: str, port: int, advertise_host: str,
                 apply: Callable[[list[Action]], None], now_ms: Callable[[], int],
                 acl: AclGuard | None = None, tls: TlsConfig | None = None) -> None:
        self.broker, self.host, self.port = broker, host, port
        self.tls = tls if tls is not None and tls.enabled else None
        self.acl = acl
        self.advertise_host = advertise_host
        self._apply, self._now = apply, now_ms
        self.core = GrpcCore(broker, endpoints_of(advertise_host, port))
        self._server: grpc.aio.Server | None = None
        self._waits: dict[int, asyncio.Future[Command]] = {}
        self._sends: list[tuple[str, ps.SendMessageRequest, str,
                                asyncio.Future[Result | GrpcError]]] = []
        self._send_timer: asyncio.TimerHandle | None = None
        self._streams: dict[str, list[asyncio.Queue[object]]] = {}
        self._polls: dict[str, set[asyncio.Event]] = {}
        """Parked receives by the topics whose new data wakes them."""
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> int:
        """Listen; return the bound port. Raises ConfigError when the port cannot be bound."""
        options = [("grpc.max_receive_message_length", limits.GRPC_MAX_INBOUND_BYTES),
                   ("grpc.max_send_message_length", -1)]
        self._server = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers((_handlers(self),))
        try:
            bound = self._bind(self._server)
        except RuntimeError as exc:  # grpcio: "Failed to bind to address"
            raise ConfigError(f"grpc_port: cannot listen on {self.host}:{self.port}: {exc}") from exc
        if not bound:
            raise ConfigError(f"grpc_port: cannot listen on {self.host}:{self.port}")
        self.port = bound
        self.core.endpoints = endpoints_of(self.advertise_host, self.port)
        await self._server.start()
        self._tasks.append(asyncio.create_task(self._expire()))
        log.info("gRPC door (apache.rocketmq.v2.MessagingService) listening on %s:%d", self.host,
                 self.port)
        return self.port

    def _bind(self, server: grpc.aio.Server) -> int:
        """Add the listening port, with TLS when the ``[tls]`` table says so."""
        addr = f"{self.host}:{self.port}"
        if self.tls is None:
            return int(server.add_insecure_port(addr))
        if self.tls.server_mode == "permissive":
            log.warning("gRPC door: TLS only (tls.server_mode permissive serves plaintext on the "
                        "remoting port only: grpcio cannot tell the two apart)")
        return int(server.add_secure_port(addr, grpc_server_credentials(self.tls)))

    async def stop(self) -> None:
        """Stop serving: open calls are cancelled, streams end."""
        for t in self._tasks:
            t.cancel()
        self._send_now()  # sends waiting to be gathered are stored (or answered) now
        for queues in self._streams.values():
            for q in queues:
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(_END)
        if self._server is not None:
            await self._server.stop(grace=0.5)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self._apply(self.core.expire(self._now()))
            except Exception:  # never stops the door
                log.exception("gRPC client expiry failed")

    # -- the broker shell's hooks -----------------------------------------------------------------
    @staticmethod
    def owns(conn: int) -> bool:
        """Whether broker connection id ``conn`` is a gRPC client's (or the door's own)."""
        return is_grpc_conn(conn)

    def deliver(self, conn: int, cmd: Command) -> None:
        """A command the broker shell writes to a gRPC connection id: a durability marker's
        release, or a check-back for the client's Telemetry stream."""
        if cmd.is_response:
            fut = self._waits.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            if self._send_timer is not None:  # that fsync is done: store what gathered now
                self._send_timer.cancel()
                self._send_timer = None
                asyncio.get_running_loop().call_soon(self._send_now)
            return
        found = self.core.check_back(conn, cmd)
        if found is None:
            return
        client_id, command = found
        queues = self._streams.get(client_id)
        if not queues:
            log.info("check-back for gRPC client %s dropped: no Telemetry stream", client_id)
            return
        try:
            queues[-1].put_nowait(command)
        except asyncio.QueueFull:
            log.warning("check-back for gRPC client %s dropped: its stream is full", client_id)

    def wake(self, keys: set[tuple[str, int]]) -> None:
        """New data is durable in ``keys`` (topic, queue): parked receives look again."""
        for topic in {t for t, _ in keys}:
            for ev in self._polls.get(topic, ()):
                ev.set()

    # -- helpers for the servicer -----------------------------------------------------------------
    def refused(self, rpc: str, request: object, context: _Context) -> pd.Status | None:
        """The status refusing this call under ACL (UNAUTHORIZED: no or bad credentials;
        FORBIDDEN: denied by the policies), or None to serve it."""
        if self.acl is None:
            return None
        md = {k: v if isinstance(v, str) else v.decode(errors="replace")
              for k, v in context.invocation_metadata() or ()}
        r = self.acl.check_grpc(rpc, request, md, source_ip(context.peer() or ""), self._now())
        if r is None:
            return None
        return status(pd.FORBIDDEN if r.denied else pd.UNAUTHORIZED, f"ACL: {r.reason}")

    async def durable(self, offset: int) -> int:
        """Wait until the store is durable up to ``offset`` (and, on a SYNC_MASTER, replicated):
        the marker's response code, SUCCESS, SYSTEM_ERROR (the fsync failed), FLUSH_SLAVE_TIMEOUT
        or SLAVE_NOT_AVAILABLE (docs/replication.md)."""
        if offset <= 0:
            return ResponseCode.SUCCESS
        op, marker = self.core.durable_marker(_DOOR_CONN, offset)
        fut: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._waits[op] = fut
        try:
            self._apply([marker])
            cmd = await fut
        finally:
            self._waits.pop(op, None)
        return cmd.code

    async def unary(self, fn: Callable[[str, Any, int], Result], request: object,
                    context: _Context, make: Callable[..., M]) -> M:
        """Run one unary rpc: the core's result, its actions applied, durability awaited; every
        failure becomes ``make(status=...)``."""
        try:
            res = fn(_client_id(context), request, self._now())
        except GrpcError as exc:
            return make(status=status(exc.status_code, exc.message))
        except Exception as exc:  # the broker never crashes on input
            log.exception("gRPC %s failed", type(request).__name__)
            return make(status=status(pd.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}"))
        self._apply(res.actions)
        code = await self.durable(res.durable_offset)
        if code in REPLICATION_CODES:  # stored on this master, not on enough slaves
            return not_replicated(res.response, code)  # type: ignore[no-any-return]
        if code != ResponseCode.SUCCESS:
            return make(status=status(pd.INTERNAL_SERVER_ERROR, "the store failed to flush"))
        response: M = res.response  # type: ignore[assignment]
        return response

    async def send(self, req: ps.SendMessageRequest, context: _Context) -> ps.SendMessageResponse:
        """SendMessage. Calls are stored together (:meth:`GrpcCore.send_many`: one store append per
        client), as the remoting shell appends the sends of one read together: those of one turn
        of the loop, and while an fsync is under way (``SYNC_FLUSH``) those that arrive until it
        ends, at most ``GRPC_SEND_GATHER_MAX_MS``: their records would wait for the next fsync
        anyway, which starts when this one ends."""
        fut: asyncio.Future[Result | GrpcError] = asyncio.get_running_loop().create_future()
        self._sends.append((_client_id(context), req, context.peer() or "", fut))
        if len(self._sends) == 1:
            loop = asyncio.get_running_loop()
            if self._waits:  # an fsync is under way: store with the sends that come meanwhile
                self._send_timer = loop.call_later(limits.GRPC_SEND_GATHER_MAX_MS / 1000,
                                                   self._send_now)
            else:
                loop.call_soon(self._send_now)

        def answer(cid: str, r: ps.SendMessageRequest, now: int) -> Result:
            got = fut.result()
            if isinstance(got, GrpcError):
                raise got
            return got
        await fut
        return await self.unary(answer, req, context, ps.SendMessageResponse)

    def _send_now(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        calls, self._sends = self._sends, []
        if not calls:
            return
        try:
            results = self.core.send_many([(c, r, p) for c, r, p, _ in calls], self._now())
        except Exception as exc:  # never leave a caller waiting
            log.exception("gRPC SendMessage failed")
            results = [GrpcError(pd.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")] * len(calls)
        for (_, _, _, fut), r in zip(calls, results, strict=True):
            if not fut.done():
                fut.set_result(r)

    async def receive(self, req: ps.ReceiveMessageRequest, context: _Context
                      ) -> AsyncIterator[ps.ReceiveMessageResponse]:
        """ReceiveMessage with long polling, written as the proxy's
        ``ReceiveMessageResponseStreamWriter`` does: ``{status OK}``, one frame per message, then
        ``{delivery_timestamp}``; ``{status MESSAGE_NOT_FOUND}`` and the timestamp when the polling
        time passes with nothing; a single status frame for an error."""
        consume = self.core.consume
        try:
            left = context.time_remaining()
            plan = consume.plan(_client_id(context), req, self._now(),
                                None if left is None else int(left * 1000))
            now = self._now()
            deadline = now + plan.polling_ms
            while not (msgs := consume.receive(plan, now)) and now < deadline:
                await self._park(plan.topics, min(deadline - now, limits.GRPC_RECEIVE_RECHECK_MS))
                now = self._now()
        except GrpcError as exc:
            yield ps.ReceiveMessageResponse(status=status(exc.status_code, exc.message))
            return
        except Exception as exc:  # the broker never crashes on input
            log.exception("gRPC ReceiveMessage failed")
            yield ps.ReceiveMessageResponse(status=status(pd.INTERNAL_SERVER_ERROR,
                                                          f"{type(exc).__name__}: {exc}"))
            return
        if msgs:
            yield ps.ReceiveMessageResponse(status=status(pd.OK))
            for m in msgs:
                yield ps.ReceiveMessageResponse(message=m)
        else:
            yield ps.ReceiveMessageResponse(status=status(pd.MESSAGE_NOT_FOUND, "no new message"))
        done = ps.ReceiveMessageResponse()
        done.delivery_timestamp.FromMilliseconds(now)
        yield done

    async def _park(self, topics: tuple[str, ...], wait_ms: int) -> None:
        """Wait until new data of ``topics`` is durable, or ``wait_ms``."""
        ev = asyncio.Event()
        for t in topics:
            self._polls.setdefault(t, set()).add(ev)
        try:
            async with asyncio.timeout(wait_ms / 1000):
                await ev.wait()
        except TimeoutError:
            pass
        finally:
            for t in topics:
                waiting = self._polls.get(t)
                if waiting is not None:
                    waiting.discard(ev)
                    if not waiting:
                        del self._polls[t]

    async def telemetry(self, requests: AsyncIterator[ps.TelemetryCommand],
                        context: _Context) -> None:
        """One Telemetry stream: settings answered, check-backs written, until either side ends."""
        client_id = _client_id(context)
        queue: asyncio.Queue[object] = asyncio.Queue(limits.GRPC_TELEMETRY_QUEUE_MAX)
        if client_id:
            self.core.stream_opened(client_id, self._now())
            self._streams.setdefault(client_id, []).append(queue)
        reader = asyncio.create_task(self._read_telemetry(client_id, requests, queue))
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, GrpcError):
                    code = (grpc.StatusCode.INVALID_ARGUMENT
                            if pd.BAD_REQUEST <= item.status_code < pd.INTERNAL_ERROR
                            else grpc.StatusCode.INTERNAL)
                    await context.abort(code, f"process client telemetryCommand failed. {item.message}")
                await context.write(item)
        finally:
            reader.cancel()
            if client_id:
                queues = self._streams.get(client_id, [])
                with contextlib.suppress(ValueError):
                    queues.remove(queue)
                if not queues:
                    self._streams.pop(client_id, None)
                self._apply(self.core.stream_closed(client_id, self._now()))

    async def _read_telemetry(self, client_id: str, requests: AsyncIterator[ps.TelemetryCommand],
                              queue: asyncio.Queue[object]) -> None:
        try:
            async for cmd in requests:
                if not client_id:
                    await queue.put(ps.TelemetryCommand(status=status(
                        pd.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")))
                    continue
                try:
                    res = self.core.settings(client_id, cmd, self._now())
                except GrpcError as exc:
                    await queue.put(exc)
                    return
                self._apply(res.actions)
                if res.response is not None:
                    await queue.put(res.response)
        except Exception as exc:  # a stream broken by the client: end ours
            log.debug("Telemetry stream of %r ended: %s", client_id, exc)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(_END)


_BAD_PROTOBUF = "Invalid protobuf byte sequence"  # grpc-java's answer to a request that does not parse


async def _parse(cls: Callable[[], M], data: bytes, context: _Context) -> M:
    """``data`` as a ``cls`` message; a request that does not parse ends the call with INTERNAL,
    as the proxy's grpc-java server does."""
    msg = cls()
    try:
        msg.ParseFromString(data)  # type: ignore[attr-defined]
    except Exception:
        await context.abort(grpc.StatusCode.INTERNAL, _BAD_PROTOBUF)
    return msg


def _handlers(door: GrpcDoor) -> grpc.GenericRpcHandler:
    """The method table of ``apache.rocketmq.v2.MessagingService``. Requests arrive as bytes and
    are parsed here (see :func:`_parse`)."""
    core = door.core

    def unary(name: str, fn: Callable[[str, Any, int], Result], req_cls: Callable[[], Any],
              resp_cls: Callable[..., Any]) -> grpc.RpcMethodHandler:
        async def rpc(data: bytes, context: _Context) -> Any:
            req = await _parse(req_cls, data, context)
            if (no := door.refused(name, req, context)) is not None:
                return resp_cls(status=no)
            return await door.unary(fn, req, context, resp_cls)
        return grpc.unary_unary_rpc_method_handler(rpc, response_serializer=_serialize)

    def unsupported(resp_cls: Callable[..., Any]) -> grpc.RpcMethodHandler:
        async def rpc(data: bytes, context: _Context) -> Any:
            return resp_cls(status=status(pd.NOT_IMPLEMENTED, "not supported by txmq's gRPC door"))
        return grpc.unary_unary_rpc_method_handler(rpc, response_serializer=_serialize)

    async def send(data: bytes, context: _Context) -> Any:
        req = await _parse(ps.SendMessageRequest, data, context)
        if (no := door.refused("SendMessage", req, context)) is not None:
            return ps.SendMessageResponse(status=no)
        return await door.send(req, context)

    async def telemetry(requests: AsyncIterator[bytes], context: _Context) -> None:
        async def parsed() -> AsyncIterator[ps.TelemetryCommand]:
            async for data in requests:
                cmd = await _parse(ps.TelemetryCommand, data, context)
                if (no := door.refused("Telemetry", cmd, context)) is not None:
                    code = (grpc.StatusCode.PERMISSION_DENIED if no.code == pd.FORBIDDEN
                            else grpc.StatusCode.UNAUTHENTICATED)
                    await context.abort(code, no.message)
                yield cmd
        await door.telemetry(parsed(), context)

    async def receive(data: bytes, context: _Context) -> AsyncIterator[Any]:
        req = await _parse(ps.ReceiveMessageRequest, data, context)
        if (no := door.refused("ReceiveMessage", req, context)) is not None:
            yield ps.ReceiveMessageResponse(status=no)
            return
        async for frame in door.receive(req, context):
            yield frame

    async def pull(data: bytes, context: _Context) -> AsyncIterator[Any]:
        yield ps.PullMessageResponse(status=status(pd.NOT_IMPLEMENTED,
                                                   "PullMessage is not supported by txmq's gRPC door"))

    table: dict[str, grpc.RpcMethodHandler] = {
        "QueryRoute": unary("QueryRoute", core.query_route, ps.QueryRouteRequest,
                            ps.QueryRouteResponse),
        "Heartbeat": unary("Heartbeat", core.heartbeat, ps.HeartbeatRequest,
                           ps.HeartbeatResponse),
        "SendMessage": grpc.unary_unary_rpc_method_handler(send, response_serializer=_serialize),
        "EndTransaction": unary("EndTransaction", core.end_transaction, ps.EndTransactionRequest,
                                ps.EndTransactionResponse),
        "NotifyClientTermination": unary("NotifyClientTermination", core.terminate,
                                         ps.NotifyClientTerminationRequest,
                                         ps.NotifyClientTerminationResponse),
        "Telemetry": grpc.stream_stream_rpc_method_handler(telemetry, response_serializer=_serialize),
        "PullMessage": grpc.unary_stream_rpc_method_handler(pull, response_serializer=_serialize),
        "ReceiveMessage": grpc.unary_stream_rpc_method_handler(receive,
                                                               response_serializer=_serialize),
        "AckMessage": unary("AckMessage", core.consume.ack, ps.AckMessageRequest,
                            ps.AckMessageResponse),
        "ChangeInvisibleDuration": unary("ChangeInvisibleDuration", core.consume.change_invisible,
                                         ps.ChangeInvisibleDurationRequest,
                                         ps.ChangeInvisibleDurationResponse),
        "ForwardMessageToDeadLetterQueue": unary("ForwardMessageToDeadLetterQueue",
                                                 core.consume.forward_to_dlq,
                                                 ps.ForwardMessageToDeadLetterQueueRequest,
                                                 ps.ForwardMessageToDeadLetterQueueResponse),
        "QueryAssignment": unary("QueryAssignment", core.consume.query_assignment,
                                 ps.QueryAssignmentRequest, ps.QueryAssignmentResponse),
        "UpdateOffset": unsupported(ps.UpdateOffsetResponse),
        "GetOffset": unsupported(ps.GetOffsetResponse),
        "QueryOffset": unsupported(ps.QueryOffsetResponse),
        "RecallMessage": unsupported(ps.RecallMessageResponse),
        "SyncLiteSubscription": unsupported(ps.SyncLiteSubscriptionResponse),
    }
    return grpc.method_handlers_generic_handler(SERVICE, table)


def _serialize(msg: Any) -> bytes:
    data: bytes = msg.SerializeToString()
    return data


SERVICE = "apache.rocketmq.v2.MessagingService"
"""The service's full name: clients call ``/apache.rocketmq.v2.MessagingService/<Rpc>``."""
