"""The gRPC door's sans-IO core: ``apache.rocketmq.v2`` requests in, broker calls, responses out.

Every method takes the caller's ``x-mq-client-id`` and ``now_ms`` and returns a :class:`Result`
(the response message, the commit log offset it must wait for, and broker actions for the
shell); the asyncio shell (:mod:`txmq.broker.grpc._server`) owns the grpc.aio server, the
Telemetry streams and the waiting.

Clients. Each client id gets one broker connection id from ``GRPC_CONN_BASE`` up (a range the
remoting door never reaches), so the broker's :class:`ClientRegistry`, check-back routing and
``connection_closed`` work unchanged. A producer registers one producer group per topic of its
``settings.publishing.topics`` (the proxy's producer group is the topic, ``ClientActivity
#registerProducer``) through a remoting HEART_BEAT, so a half message sent with producer group
== topic over either door is checked back on a gRPC producer of that topic as a
``RecoverOrphanedTransactionCommand``. Consumers are not registered as remoting consumers: pop
consumers need no rebalancing, and a gRPC client in a remoting group's member list would be
given queues it never pulls.

Transactions. ``transaction_id`` is the half message's offset message id (store host + commit log
offset), so EndTransaction finds the half without the proxy's 30 s cache.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from itertools import count
from typing import TYPE_CHECKING

from txmq import limits
from txmq.broker import Action, Reply, SendOutcome, SendRequest, parse_delay_levels
from txmq.broker.grpc._consume import Consumption
from txmq.broker.grpc._convert import (
    GrpcError,
    Outgoing,
    Result,
    check_group_name,
    check_topic_name,
    code_of,
    delay_level_for,
    host_port,
    outgoing,
    status,
    to_message,
)
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.errors import MalformedMessage, ProtocolError, ResponseCode
from txmq.protocol import (
    FLAG_RESPONSE,
    PROPERTY_DELAY_TIME_LEVEL,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    CheckTransactionStateRequestHeader,
    Command,
    EndTransactionRequestHeader,
    GetRouteInfoRequestHeader,
    HeartbeatData,
    ProducerData,
    RequestCode,
    decode_message_ext,
    decode_offset_msg_id,
    encode_body,
    from_ext,
    to_ext,
)

if TYPE_CHECKING:
    from txmq.broker import Broker

__all__ = ["GRPC_CONN_BASE", "ClientState", "GrpcCore", "Result", "is_grpc_conn"]

log = logging.getLogger("txmq.broker.grpc")

GRPC_CONN_BASE = 1 << 48
"""First broker connection id of a gRPC client (remoting counts its connections from 1)."""


def is_grpc_conn(conn: int) -> bool:
    """Whether a broker connection id belongs to a gRPC client."""
    return conn >= GRPC_CONN_BASE


class ClientState:
    """One gRPC client (one ``x-mq-client-id``): its broker connection id and last settings."""

    __slots__ = ("client_id", "conn", "last_seen_ms", "settings", "streams")

    def __init__(self, client_id: str, conn: int, now_ms: int) -> None:
        self.client_id, self.conn, self.last_seen_ms = client_id, conn, now_ms
        self.settings: pd.Settings | None = None
        self.streams = 0

    @property
    def topics(self) -> list[str]:
        """Topics of a producer's ``publishing`` settings (its producer groups)."""
        s = self.settings
        if s is None or not s.HasField("publishing"):
            return []
        return sorted({t.name for t in s.publishing.topics})


_RESOLUTIONS = {pd.COMMIT: TRANSACTION_COMMIT_TYPE, pd.ROLLBACK: TRANSACTION_ROLLBACK_TYPE,
                pd.TRANSACTION_RESOLUTION_UNSPECIFIED: TRANSACTION_NOT_TYPE}
_CONSUMER_TYPES = (pd.PUSH_CONSUMER, pd.SIMPLE_CONSUMER, pd.LITE_PUSH_CONSUMER)


class GrpcCore:
    """The gRPC door over one :class:`~txmq.broker.Broker`.

    Args:
        broker: the broker core both doors share.
        endpoints: the door's advertised ``host:port`` (routes and assignments name it).
    """

    def __init__(self, broker: Broker, endpoints: pd.Endpoints) -> None:
        self.b = broker
        self.endpoints = endpoints
        self.clients: dict[str, ClientState] = {}
        self._by_conn: dict[int, ClientState] = {}
        self._conns = count(GRPC_CONN_BASE + 1)  # GRPC_CONN_BASE: the door's own
        self._opaque = count(1)
        self._levels: list[int] | None = None
        self.consume = Consumption(self)
        """ReceiveMessage, AckMessage, ChangeInvisibleDuration, DLQ forwarding, QueryAssignment."""
        self._recent: OrderedDict[tuple[str, str], tuple[ps.SendResultEntry, int, int]] = OrderedDict()

    # -- clients ----------------------------------------------------------------------------------
    def client(self, client_id: str, now_ms: int) -> ClientState:
        """The state of ``client_id``, created on first sight. Raises GrpcError CLIENT_ID_REQUIRED
        (no ``x-mq-client-id``; ``GrpcMessagingApplication#validateContext``) or TOO_MANY_REQUESTS
        (``limits.GRPC_CLIENTS_MAX`` clients known)."""
        if not client_id:
            raise GrpcError(pd.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")
        c = self.clients.get(client_id)
        if c is None:
            if len(self.clients) >= limits.GRPC_CLIENTS_MAX:
                raise GrpcError(pd.TOO_MANY_REQUESTS, f"too many gRPC clients ({len(self.clients)})")
            c = self.clients[client_id] = ClientState(client_id, next(self._conns), now_ms)
            self._by_conn[c.conn] = c
        c.last_seen_ms = now_ms
        return c

    def next_opaque(self) -> int:
        """A fresh opaque for a command the door gives the broker (or awaits durability with)."""
        return next(self._opaque)

    def durable_marker(self, conn: int, durable_offset: int) -> tuple[int, Reply]:
        """A reply to nobody that the shell's group commit releases once the store is durable up
        to ``durable_offset`` (its code turns SYSTEM_ERROR if the fsync fails): ``(opaque, action)``."""
        op = self.next_opaque()
        return op, Reply(conn, Command(code=ResponseCode.SUCCESS, flag=FLAG_RESPONSE, opaque=op),
                         durable_offset)

    def _call(self, conn: int, code: int, ext: dict[str, str], body: bytes, now_ms: int
              ) -> tuple[Command, int, list[Action]]:
        """A remoting request through ``broker.handle``: (the reply, its durable offset, the other
        actions)."""
        cmd = Command(code=code, opaque=self.next_opaque(), ext=ext, body=body)
        reply: Reply | None = None
        others: list[Action] = []
        for a in self.b.handle(conn, cmd, now_ms):
            if isinstance(a, Reply) and a.conn == conn and a.command.opaque == cmd.opaque:
                reply = a
            else:
                others.append(a)
        if reply is None:
            return Command(code=ResponseCode.SYSTEM_ERROR, flag=FLAG_RESPONSE,
                           remark="no reply"), 0, others
        return reply.command, reply.durable_offset, others

    def _register_producer(self, c: ClientState, now_ms: int) -> list[Action]:
        """Tell the broker's client registry that connection ``c.conn`` produces for its topics."""
        data = HeartbeatData(client_id=c.client_id,
                             producer_data_set=[ProducerData(group_name=t) for t in c.topics])
        reply, _, actions = self._call(c.conn, RequestCode.HEART_BEAT, {}, encode_body(data), now_ms)
        if reply.code != ResponseCode.SUCCESS:
            log.warning("gRPC client %s not registered: %s", c.client_id, reply.remark)
        return actions

    def forget(self, client_id: str) -> list[Action]:
        """Drop a client: its settings, and its producer groups from the broker's registry."""
        c = self.clients.pop(client_id, None)
        if c is None:
            return []
        self._by_conn.pop(c.conn, None)
        return self.b.connection_closed(c.conn)

    def expire(self, now_ms: int) -> list[Action]:
        """Forget clients with no Telemetry stream and no call for ``GRPC_CLIENT_IDLE_MS``."""
        idle = [c.client_id for c in self.clients.values()
                if c.streams == 0 and now_ms - c.last_seen_ms > limits.GRPC_CLIENT_IDLE_MS]
        return [a for cid in idle for a in self.forget(cid)]

    # -- telemetry --------------------------------------------------------------------------------
    def settings(self, client_id: str, cmd: ps.TelemetryCommand, now_ms: int) -> Result:
        """One command a client wrote on its Telemetry stream. ``settings``: validated, stored,
        the producer registered, and answered ``{status OK, settings}`` with the server's part
        (``GrpcClientSettingsManager``): backoff policy, ``max_body_size`` = the broker's
        ``max_message_size``, receive batch size, long-polling timeout, ``fifo``. Other commands
        (stack traces, verify results, nothing) are answered with nothing. Raises GrpcError:
        CLIENT_ID_REQUIRED, BAD_REQUEST (no publishing or subscription, or a client type that
        does not match it), ILLEGAL_TOPIC, ILLEGAL_CONSUMER_GROUP."""
        c = self.client(client_id, now_ms)
        if cmd.WhichOneof("command") != "settings":
            return Result(None)
        s = cmd.settings
        kind = s.WhichOneof("pub_sub")
        if kind is None:
            raise GrpcError(pd.BAD_REQUEST, "there is no publishing or subscription data in settings")
        if kind == "publishing":
            if s.client_type != pd.PRODUCER:
                raise GrpcError(pd.BAD_REQUEST, "publishing settings require PRODUCER client type, "
                                f"actual: {pd.ClientType.Name(s.client_type)}")
            for t in s.publishing.topics:
                check_topic_name(t.name)
        else:
            if s.client_type not in _CONSUMER_TYPES:
                raise GrpcError(pd.BAD_REQUEST, "subscription settings require consumer client "
                                f"type, actual: {pd.ClientType.Name(s.client_type)}")
            check_group_name(s.subscription.group.name)
            for e in s.subscription.subscriptions:
                check_topic_name(e.topic.name)
        c.settings = pd.Settings()
        c.settings.CopyFrom(s)
        actions = self._register_producer(c, now_ms) if kind == "publishing" else []
        reply = ps.TelemetryCommand(status=status(pd.OK), settings=self._server_settings(s))
        return Result(reply, actions=actions)

    def _server_settings(self, s: pd.Settings) -> pd.Settings:
        out = pd.Settings()
        out.CopyFrom(s)
        out.metric.on = False
        policy = out.backoff_policy
        if s.HasField("publishing"):
            policy.max_attempts = limits.GRPC_PRODUCER_MAX_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(limits.GRPC_PRODUCER_BACKOFF_INITIAL_MS)
            policy.exponential_backoff.max.FromMilliseconds(limits.GRPC_PRODUCER_BACKOFF_MAX_MS)
            policy.exponential_backoff.multiplier = limits.GRPC_PRODUCER_BACKOFF_MULTIPLIER
            out.publishing.max_body_size = self.b.config.max_message_size
            out.publishing.validate_message_type = True
            return out
        group = s.subscription.group.name
        sub = out.subscription
        sub.fifo = self.is_fifo(group)
        sub.receive_batch_size = limits.GRPC_RECEIVE_BATCH_SIZE
        sub.long_polling_timeout.FromMilliseconds(limits.GRPC_LONG_POLLING_MAX_MS)
        policy.max_attempts = self.max_attempts(group)
        levels = self.delay_levels_ms()[limits.RETRY_DELAY_LEVEL_BASE - 1:] or [1000]
        policy.customized_backoff.SetInParent()
        for ms in levels:
            policy.customized_backoff.next.add().FromMilliseconds(ms)
        return out

    def stream_opened(self, client_id: str, now_ms: int) -> ClientState:
        """A Telemetry stream of ``client_id`` started (raises GrpcError CLIENT_ID_REQUIRED)."""
        c = self.client(client_id, now_ms)
        c.streams += 1
        return c

    def stream_closed(self, client_id: str, now_ms: int) -> list[Action]:
        """A Telemetry stream ended: with the last one, the client stops producing (no check-back
        goes to a client nobody can write to) until it opens a stream and sends settings again
        (``ClientActivity#cleanupClientOnTelemetryClose``)."""
        c = self.clients.get(client_id)
        if c is None:
            return []
        c.streams = max(0, c.streams - 1)
        c.last_seen_ms = now_ms
        if c.streams:
            return []
        c.settings = None
        return self.b.connection_closed(c.conn)

    def check_back(self, conn: int, cmd: Command) -> tuple[str, ps.TelemetryCommand] | None:
        """A broker check-back (CHECK_TRANSACTION_STATE on a gRPC connection) as the client id to
        write to and the ``RecoverOrphanedTransactionCommand{message, transaction_id}`` (the
        proxy's ``GrpcClientChannel#processCheckTransaction``); None for any other command or a
        client gone."""
        c = self._by_conn.get(conn)
        if c is None or cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return None
        try:
            h = from_ext(cmd.ext, CheckTransactionStateRequestHeader)
            msg = to_message(decode_message_ext(cmd.body))
        except (ProtocolError, MalformedMessage) as exc:
            log.error("check-back for gRPC client %s not relayed: %s", c.client_id, exc)
            return None
        tx = h.offset_msg_id or ""
        recover = ps.RecoverOrphanedTransactionCommand(message=msg, transaction_id=tx)
        return c.client_id, ps.TelemetryCommand(recover_orphaned_transaction_command=recover)

    # -- route, heartbeat, termination ------------------------------------------------------------
    def queue_nums(self, conn: int, topic: str, now_ms: int) -> int:
        """Queue count of ``topic`` (created if auto-creation is on, as a remoting route lookup
        does). Raises GrpcError ILLEGAL_TOPIC or TOPIC_NOT_FOUND."""
        check_topic_name(topic)
        n = self.b.topics.get(topic)
        if n is not None:
            return n
        ext = to_ext(GetRouteInfoRequestHeader(topic=topic))
        reply, _, _ = self._call(conn, RequestCode.GET_ROUTEINFO_BY_TOPIC, ext, b"", now_ms)
        n = self.b.topics.get(topic)
        if reply.code != ResponseCode.SUCCESS or n is None:
            raise GrpcError(pd.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return n

    def queue(self, topic: str, qid: int) -> pd.MessageQueue:
        """A readable and writable queue of this broker (id 0, the door's endpoints), accepting
        every message type (the proxy's answer for a MIXED topic; ``RouteActivity``)."""
        return pd.MessageQueue(
            topic=pd.Resource(name=topic), id=qid, permission=pd.READ_WRITE,
            broker=pd.Broker(name=self.b.config.broker_name, id=0, endpoints=self.endpoints),
            accept_message_types=[pd.NORMAL, pd.FIFO, pd.DELAY, pd.TRANSACTION])

    def query_route(self, client_id: str, req: ps.QueryRouteRequest, now_ms: int) -> Result:
        """QueryRoute: one queue per queue id of the topic. TOPIC_NOT_FOUND for an unknown topic."""
        c = self.client(client_id, now_ms)
        n = self.queue_nums(c.conn, req.topic.name, now_ms)
        queues = [self.queue(req.topic.name, q) for q in range(n)]
        return Result(ps.QueryRouteResponse(status=status(pd.OK), message_queues=queues))

    def heartbeat(self, client_id: str, req: ps.HeartbeatRequest, now_ms: int) -> Result:
        """Heartbeat: UNRECOGNIZED_CLIENT_TYPE before any settings (``ClientActivity#heartbeat``);
        a producer's registration is renewed; a consumer's group is checked."""
        c = self.client(client_id, now_ms)
        if c.settings is None:
            return Result(ps.HeartbeatResponse(status=status(
                pd.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client")))
        if c.settings.client_type == pd.PRODUCER:
            actions = self._register_producer(c, now_ms)
            return Result(ps.HeartbeatResponse(status=status(pd.OK)), actions=actions)
        check_group_name(req.group.name)
        return Result(ps.HeartbeatResponse(status=status(pd.OK)))

    def terminate(self, client_id: str, req: ps.NotifyClientTerminationRequest, now_ms: int
                  ) -> Result:
        """NotifyClientTermination: the client is forgotten; UNRECOGNIZED_CLIENT_TYPE if it never
        sent settings."""
        c = self.client(client_id, now_ms)
        if c.settings is None:
            self.forget(client_id)
            return Result(ps.NotifyClientTerminationResponse(status=status(
                pd.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client")))
        return Result(ps.NotifyClientTerminationResponse(status=status(pd.OK)),
                      actions=self.forget(client_id))

    # -- transactions -----------------------------------------------------------------------------
    def end_transaction(self, client_id: str, req: ps.EndTransactionRequest, now_ms: int) -> Result:
        """EndTransaction: COMMIT, ROLLBACK, or UNSPECIFIED (still unknown: the proxy's NOT_TYPE,
        which changes nothing), from the client or a check-back answer (SOURCE_SERVER_CHECK). The
        half message is found by the commit log offset in ``transaction_id``; its producer group
        is the topic. INVALID_TRANSACTION_ID when there is no such half message, or when it is a
        half message of another topic (its REAL_TOPIC): an end authorized for one topic cannot
        settle another's transaction."""
        c = self.client(client_id, now_ms)
        topic = req.topic.name
        check_topic_name(topic)
        try:
            _, clo = decode_offset_msg_id(req.transaction_id)
        except MalformedMessage as exc:
            raise GrpcError(pd.INVALID_TRANSACTION_ID,
                            f"transaction id {req.transaction_id[:80]!r} is not one this broker gave"
                            ) from exc
        if req.resolution not in _RESOLUTIONS:
            raise GrpcError(pd.BAD_REQUEST, f"unknown resolution {req.resolution}")
        h = EndTransactionRequestHeader(
            topic=topic, producer_group=topic, tran_state_table_offset=-1, commit_log_offset=clo,
            commit_or_rollback=_RESOLUTIONS[req.resolution],
            from_transaction_check=req.source == pd.SOURCE_SERVER_CHECK,
            msg_id=req.message_id, transaction_id=req.transaction_id)
        half_topic = self.b.tx.half_topic(h)
        if half_topic is not None and half_topic != topic:  # ACL authorized Pub on ``topic``
            raise GrpcError(pd.INVALID_TRANSACTION_ID,
                            f"transaction id {req.transaction_id[:80]!r} names a half message of "
                            f"another topic than {topic!r}")
        reply, durable, actions = self._call(c.conn, RequestCode.END_TRANSACTION, to_ext(h), b"",
                                             now_ms)
        st = status(code_of(reply.code), reply.remark or "")
        return Result(ps.EndTransactionResponse(status=st), durable, actions)

    # -- send -------------------------------------------------------------------------------------
    def delay_levels_ms(self) -> list[int]:
        """The broker's delay levels in ms, level 1 first (``message_delay_level``)."""
        if self._levels is None:
            self._levels = parse_delay_levels(self.b.config.message_delay_level)
        return self._levels

    def send(self, client_id: str, req: ps.SendMessageRequest, peer: str, now_ms: int) -> Result:
        """One SendMessage (:meth:`send_many` of one call). Raises GrpcError."""
        r = self.send_many([(client_id, req, peer)], now_ms)[0]
        if isinstance(r, GrpcError):
            raise r
        return r

    def send_many(self, calls: list[tuple[str, ps.SendMessageRequest, str]], now_ms: int
                  ) -> list[Result | GrpcError]:
        """SendMessage calls that arrived together (client id, request, grpc peer), in order: each
        message validated (the proxy's codes), then each client's messages stored through the
        broker's one send path together, and each call answered with ``{status, entries}``, an
        entry ``{status, message_id = the client's id, transaction_id = the offset message id of
        a half, offset = queue offset}`` per message; the top status is the entry's for one
        message, else OK or MULTIPLE_RESULTS. A message id sent again to the same topic within
        ``GRPC_SEND_DEDUP_WINDOW_MS`` is answered with the first result and stores nothing
        (clients retry halves). A call with no client id or no message gets its GrpcError."""
        self._forget_old_sends(now_ms)
        out: list[Result | GrpcError] = []
        entries: list[list[ps.SendResultEntry | None]] = []
        durables: list[int] = []
        todo: dict[int, list[tuple[int, int, Outgoing, str]]] = {}  # conn -> (call, index, msg, peer)
        first: dict[tuple[str, str], tuple[int, int]] = {}
        copies: list[tuple[int, int, tuple[int, int]]] = []
        for i, (cid, req, peer) in enumerate(calls):
            entries.append([])
            durables.append(0)
            try:
                c = self.client(cid, now_ms)
                if not req.messages:
                    raise GrpcError(pd.BAD_REQUEST, "no message to send")
                if len(req.messages) > limits.BATCH_MESSAGES_MAX:
                    raise GrpcError(pd.BAD_REQUEST, f"more than {limits.BATCH_MESSAGES_MAX} messages")
            except GrpcError as exc:
                out.append(exc)
                continue
            out.append(Result(None))
            for m in req.messages:
                got = self._prepare(c, m, now_ms)
                if isinstance(got, Outgoing) and (key := (got.topic, got.message_id)) in first:
                    copies.append((i, len(entries[i]), first[key]))  # a retry in the same batch
                    entries[i].append(None)
                elif isinstance(got, Outgoing):
                    first[key] = (i, len(entries[i]))
                    todo.setdefault(c.conn, []).append((i, len(entries[i]), got, peer))
                    entries[i].append(None)
                else:
                    entries[i].append(got[0])
                    durables[i] = max(durables[i], got[1])
        for conn, items in todo.items():
            stored = self._store_all(conn, [(o, p) for _, _, o, p in items], now_ms)
            for (i, j, o, _), (entry, durable) in zip(items, stored, strict=True):
                entries[i][j] = entry
                if entry.status.code == pd.OK:
                    durables[i] = max(durables[i], durable)
                    self._remember((o.topic, o.message_id), entry, durable, now_ms)
        for i, j, (fi, fj) in copies:
            entries[i][j] = entries[fi][fj]
            durables[i] = max(durables[i], durables[fi])
        for i, r in enumerate(out):
            if isinstance(r, Result):
                done = [e for e in entries[i] if e is not None]
                r.response = ps.SendMessageResponse(status=_top_status(done), entries=done)
                r.durable_offset = durables[i]
        return out

    def _prepare(self, c: ClientState, m: pd.Message, now_ms: int
                 ) -> Outgoing | tuple[ps.SendResultEntry, int]:
        """A message validated and ready to store, or its answer now: an error, or the first
        result of a message id sent before."""
        try:
            out = outgoing(m, self.b.config.max_message_size)
            self.queue_nums(c.conn, out.topic, now_ms)
            if out.deliver_at_ms:
                level = delay_level_for(out.deliver_at_ms, now_ms, self.delay_levels_ms())
                if level:
                    out.properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        except GrpcError as exc:
            return ps.SendResultEntry(status=status(exc.status_code, exc.message)), 0
        seen = self._recent.get((out.topic, out.message_id))
        if seen is not None:
            return seen[0], seen[1]
        return out

    def _remember(self, key: tuple[str, str], entry: ps.SendResultEntry, durable: int,
                  now_ms: int) -> None:
        self._recent[key] = (entry, durable, now_ms)
        if len(self._recent) > limits.GRPC_SEND_DEDUP_ENTRIES:
            self._recent.popitem(last=False)

    def _store_all(self, conn: int, outs: list[tuple[Outgoing, str]], now_ms: int
                   ) -> list[tuple[ps.SendResultEntry, int]]:
        """Store validated messages of one client with one ``Broker.send`` (one store append):
        (entry, durable offset) each, in order. The broker picks the queue (the hash of the
        message group of a FIFO message); a half's producer group is its topic."""
        reqs = [SendRequest(topic=o.topic, body=o.body, properties=o.properties,
                            born_timestamp_ms=o.born_ms, born_host=host_port(peer),
                            producer_group=o.topic if o.half else "") for o, peer in outs]
        outcomes = self.b.send(conn, reqs, now_ms)
        return [(_entry(o, r), r.durable_offset) for (o, _), r in zip(outs, outcomes, strict=True)]

    def _forget_old_sends(self, now_ms: int) -> None:
        recent = self._recent
        while recent:
            _, (_, _, at) = next(iter(recent.items()))
            if now_ms - at <= limits.GRPC_SEND_DEDUP_WINDOW_MS:
                return
            recent.popitem(last=False)

    # -- consumer groups (pop) --------------------------------------------------------------------
    def is_fifo(self, group: str) -> bool:
        """Whether ``group`` consumes in order (``consume_message_orderly`` in its config)."""
        return self.b.pop.is_fifo(group)

    def max_attempts(self, group: str) -> int:
        """Deliveries of a message before the DLQ (``retry_max_times + 1``)."""
        return self.b.pop.max_attempts(group)


def _top_status(entries: list[ps.SendResultEntry]) -> pd.Status:
    """A SendMessage's status: OK, the one entry's, or MULTIPLE_RESULTS."""
    codes = {e.status.code for e in entries}
    if codes == {pd.OK}:
        return status(pd.OK)
    return entries[0].status if len(entries) == 1 else status(pd.MULTIPLE_RESULTS,
                                                              "some messages were not sent")


def _entry(out: Outgoing, o: SendOutcome) -> ps.SendResultEntry:
    """A send's result entry: the client's message id, a half's offset message id as its
    transaction id, the queue offset; or the failure."""
    if o.code != ResponseCode.SUCCESS:
        return ps.SendResultEntry(status=status(code_of(o.code), o.remark))
    return ps.SendResultEntry(status=status(pd.OK), message_id=out.message_id,
                              transaction_id=o.msg_id if out.half else "", offset=o.queue_offset)
