"""The broker's logic over a store, sans-IO: ``handle(conn, command, now_ms) -> actions``.

The asyncio shell (:mod:`txmq.broker.server`) owns sockets, timers and fsync; this class only turns
requests into records, responses and follow-up actions. Time comes in as ``now_ms``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import count

import msgspec

from txmq import limits
from txmq.broker._actions import Action, Hold, Reply, SendTo, ok_reply
from txmq.broker._clients import ClientRegistry
from txmq.broker._config import BrokerConfig, parse_delay_levels
from txmq.broker._groups import GroupService
from txmq.broker._health import TimerHealth, destination_problem
from txmq.broker._meta import load_json_meta
from txmq.broker._schedule import SCHEDULE_TOPIC, ScheduleService
from txmq.broker._tx_requests import TransactionRequests
from txmq.broker.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    SINK_BATCH_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TransactionService,
)
from txmq.errors import (
    CorruptRecord,
    DiskFull,
    InvalidRequest,
    MalformedHeader,
    MalformedMessage,
    ProtocolError,
    ResponseCode,
    StoreError,
)
from txmq.limits import AUTO_CREATE_TOPIC_QUEUE_NUMS
from txmq.namesrv import topic_not_exist_remark
from txmq.protocol import (
    COMPRESSED_FLAG,
    DEFAULT_TOPIC,
    FLAG_ONEWAY,
    PARK_SOURCES,
    PARKED_TOPIC,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUSPEND,
    RETRY_PREFIX,
    BrokerRuntimeInfo,
    Command,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetConsumerListByGroupResponseBody,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetRouteInfoRequestHeader,
    HeartbeatData,
    Message,
    MessageExt,
    NotifyConsumerIdsChangedRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    RequestCode,
    SendHeader,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageByUniqKeyRequestHeader,
    ViewMessageRequestHeader,
    broker_route,
    check_group,
    check_offset,
    check_queue_id,
    check_send_properties,
    check_send_topic,
    check_timestamp,
    check_topic,
    decode_batch,
    decode_body,
    decode_properties,
    delay_level,
    dlq_topic,
    encode_body,
    encode_message_exts,
    encode_route,
    from_ext,
    inflate_body,
    is_broker_topic,
    offset_msg_id,
    retry_topic,
    send_header,
    to_ext,
    wants_standard_json,
)
from txmq.store import AppendResult, Record, Store

__all__ = ["Broker", "dlq_topic", "retry_topic"]

log = logging.getLogger("txmq.broker")

_TOPICS_META = "topics.json"
_OFFSETS_META = "consumerOffset.json"
_SYSTEM_TOPICS = {HALF_TOPIC: 1, OP_TOPIC: 1, TRANS_CHECK_MAX_TIME_TOPIC: 1, SINK_BATCH_TOPIC: 1,
                  PARKED_TOPIC: 1}
assert all(is_broker_topic(t) for t in (*_SYSTEM_TOPICS, SCHEDULE_TOPIC))
Handler = Callable[[int, Command, int], list[Action]]


class _Fail(Exception):
    def __init__(self, code: ResponseCode, remark: str) -> None:
        super().__init__(remark)
        self.code, self.remark = code, remark


class Broker:
    """One broker's state: topics, consumer offsets, clients, transactions, delay queues.

    Args:
        config: validated :class:`BrokerConfig`.
        store: the commit log and consume queues (``MemoryStore`` or ``FileStore``).
        now_ms: the time at start (recovery timestamps).
    """

    def __init__(self, config: BrokerConfig, store: Store, now_ms: int) -> None:
        self.config = config
        self.store = store
        self.clients = ClientRegistry()
        self.touched: set[tuple[str, int]] = set()
        self._peers: dict[int, str] = {}
        self._rr = count()
        saved = load_json_meta(store, _TOPICS_META, dict[str, int],
                               "topics are re-derived from the stored consume queues")
        self.topics: dict[str, int] = dict(saved) if saved is not None else store.topic_queues()
        self.topics.update(_SYSTEM_TOPICS)
        self.topics[SCHEDULE_TOPIC] = len(parse_delay_levels(config.message_delay_level))
        for name, n in config.topics.items():
            self.topics.setdefault(name, n)
        if self.topics != saved:  # a full disk must not stop the start (issue 11)
            try:
                self._save_topics()
            except StoreError as exc:
                log.error("topics not saved at start (%s); they are saved with the next change",
                          exc)
        self.offsets: dict[str, int] = load_json_meta(
            store, _OFFSETS_META, dict[str, int],
            "consumer offsets start EMPTY: consumer groups restart from their configured "
            "position (CONSUME_FROM_*), and may receive messages again") or {}
        self._offsets_dirty = False
        self.boot_ms = now_ms
        self.health = TimerHealth()
        self.store_host = config.store.store_host or f"{config.host}:{config.port}"
        """``ip:port`` of this broker as stored in its records (and in offset message ids)."""
        self.tx = TransactionService(config, store, self.append, self.clients,
                                     self.destination_problem, lambda: self.store_host)
        self.schedule = ScheduleService(parse_delay_levels(config.message_delay_level), store,
                                        self.append, self.destination_problem)
        self._recover()
        self.groups = GroupService(self)
        self.tx_requests = TransactionRequests(self)
        self._handlers: dict[int, Handler] = {
            **self.groups.handlers(),
            **self.tx_requests.handlers(),
            RequestCode.SEND_MESSAGE: self._send, RequestCode.SEND_MESSAGE_V2: self._send,
            RequestCode.SEND_BATCH_MESSAGE: self._send_batch,
            RequestCode.PULL_MESSAGE: self._pull, RequestCode.HEART_BEAT: self._heartbeat,
            RequestCode.UNREGISTER_CLIENT: self._unregister,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_offset,
            RequestCode.GET_MIN_OFFSET: self._min_offset, RequestCode.GET_MAX_OFFSET: self._max_offset,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._create_topic,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self._send_back,
            RequestCode.QUERY_MESSAGE: self._query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: self._view_message,
            RequestCode.VIEW_MESSAGE_BY_UNIQ_KEY: self._view_by_uniq_key,
            RequestCode.GET_BROKER_RUNTIME_INFO: self._runtime_info,
        }

    # -- storage helpers --------------------------------------------------------------------------
    def append(self, records: list[Record]) -> list[AppendResult]:
        """Append through the store and remember which queues got data (to wake long polls)."""
        results = self.store.append(records)
        if len(records) == 1:
            self.touched.add((records[0].topic, records[0].queue_id))
        else:
            self.touched.update((r.topic, r.queue_id) for r in records)
        return results

    def _recover(self) -> None:
        """Rebuild the transaction index without reading the whole commit log.

        The index snapshot holds the index as of a commit log offset; only records stored after
        it are replayed (O(pending + recent), not O(every transaction ever stored)). Half, op,
        discard and sink batch marker records come through their topics' consume queues. A
        committed real message (it carries ``TRAN_PREPARED_QUEUE_OFFSET``) is appended in one
        batch with its op record, so only where a crash could have torn that batch, the part of
        the log the store re-dispatched on open (from ``store.recovery_offset``), is scanned for
        them.
        """
        start = self.tx.load_snapshot()
        tx_topics = (HALF_TOPIC, OP_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, SINK_BATCH_TOPIC)
        found = dict(self.store.iter_records(start, topics=tx_topics))
        for offset, rec in self.store.iter_records(max(self.store.recovery_offset, start)):
            if offset not in found and self.tx.wants(rec):
                found[offset] = rec
        self.tx.recover([(rec, AppendResult(off, rec.queue_offset, 0))
                         for off, rec in sorted(found.items())])
        log.info("transaction index recovered: %s", self.tx.index.counts())

    def _save_topics(self) -> None:
        self.store.save_meta(_TOPICS_META, msgspec.json.encode(self.topics))

    def persist_offsets(self) -> None:
        """Save consumer offsets and delay progress if they changed (the shell calls it)."""
        try:
            if self._offsets_dirty:
                self.store.save_meta(_OFFSETS_META, msgspec.json.encode(self.offsets))
                self._offsets_dirty = False
            self.schedule.persist()
        except StoreError as exc:  # a full disk: retried next time, never fatal
            log.error("consumer offsets or delay progress not saved: %s", exc)
        self.tx.save_snapshot()

    # -- dispatch ---------------------------------------------------------------------------------
    def handle(self, conn: int, cmd: Command, now_ms: int) -> list[Action]:
        """Process one request. Never raises: every failure becomes an error response."""
        handler = self._handlers.get(cmd.code)
        if handler is None:
            return self._error(conn, cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                               f"request code {cmd.code} not supported")
        return self._guarded(conn, cmd, lambda: handler(conn, cmd, now_ms))

    def _guarded(self, conn: int, cmd: Command, fn: Callable[[], list[Action]]) -> list[Action]:
        """``fn()``, with every failure turned into the error response to ``cmd``."""
        try:
            return fn()
        except _Fail as f:
            return self._error(conn, cmd, f.code, f.remark)
        except InvalidRequest as exc:
            return self._error(conn, cmd, exc.response_code, str(exc))
        except MalformedMessage as exc:  # a batch body, a compressed body, a property
            return self._error(conn, cmd, ResponseCode.MESSAGE_ILLEGAL, str(exc))
        except MalformedHeader as exc:  # RocketMQ NettyRemotingAbstract.processRequestCommand
            return self._error(conn, cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except DiskFull as exc:  # RocketMQ's answer to PutMessageStatus.SERVICE_NOT_AVAILABLE
            return self._error(conn, cmd, ResponseCode.SERVICE_NOT_AVAILABLE,
                               f"service not available now: the broker's disk is full ({exc})")
        except StoreError as exc:
            log.error("store error handling code %d: %s", cmd.code, exc)
            return self._error(conn, cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except Exception as exc:  # the broker never crashes on input
            log.exception("unexpected error handling request code %d", cmd.code)
            return self._error(conn, cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    def handle_sends(self, conn: int, cmds: list[Command], now_ms: int) -> list[Action]:
        """Several SEND_MESSAGE requests that arrived together, in order, appended with one store
        append (one commit log write) instead of one each. Replies, offsets and errors are those
        of calling :meth:`handle` on each in turn; delay messages, which go through the schedule
        topic, and requests whose header does not decode are handled one by one. Never raises."""
        actions: list[Action] = []
        run: list[tuple[Command, SendHeader, dict[str, str]]] = []
        for cmd in cmds:
            if cmd.is_response:
                continue
            try:
                h: SendHeader | None = send_header(cmd)
                props = decode_properties(h.properties or "") if h is not None else {}
                delayed = PROPERTY_DELAY_TIME_LEVEL in props and delay_level(props) > 0
            except (ProtocolError, InvalidRequest):  # answered by handle(), one by one
                h, delayed = None, True
            if h is None or delayed:
                actions += self._send_run(conn, run, now_ms)
                run = []
                actions += self.handle(conn, cmd, now_ms)
            else:
                run.append((cmd, h, props))
        return actions + self._send_run(conn, run, now_ms)

    def _send_run(self, conn: int, sends: list[tuple[Command, SendHeader, dict[str, str]]],
                  now: int) -> list[Action]:
        if len(sends) == 1:  # its header and properties are parsed already: not again
            cmd, h, props = sends[0]
            return self._guarded(conn, cmd, lambda: self._send_parsed(conn, cmd, h, props, now))
        if not sends:
            return []
        cmds = [cmd for cmd, _, _ in sends]
        out: list[list[Action]] = [[] for _ in cmds]
        staged: list[tuple[int, Record, Record]] = []  # (index, record sent, record stored)
        peer = self._peers.get(conn, "")

        def stage(i: int, h: SendHeader, props: dict[str, str]) -> list[Action]:
            rec = self._record(h, cmds[i].body, now, peer, props)
            staged.append((i, rec, self._half_or_plain(conn, rec, h.producer_group)))
            return []

        for i, (cmd, h, props) in enumerate(sends):
            out[i] = self._guarded(conn, cmd, lambda i=i, h=h, p=props: stage(i, h, p))  # type: ignore[misc]
        try:
            results = self.append([stored for _, _, stored in staged]) if staged else []
        except Exception as exc:  # nothing of the run was written: each send fails alike
            def fail(e: Exception = exc) -> list[Action]:
                raise e
            return [a for i, cmd in enumerate(cmds) for a in (out[i] or self._guarded(conn, cmd, fail))]
        for (i, rec, stored), res in zip(staged, results, strict=True):
            if stored is not rec:
                self.tx.on_half_stored(stored, res)
            out[i] = self._send_reply(conn, cmds[i], rec, res)
        return [a for acts in out for a in acts]

    def _error(self, conn: int, cmd: Command, code: ResponseCode, remark: str) -> list[Action]:
        if cmd.is_oneway:
            log.warning("one-way request code %d failed: %s", cmd.code, remark)
            return []
        return [Reply(conn, cmd.response(code, remark))]


    def connection_opened(self, conn: int, peer: str) -> None:
        """Remember a connection's remote ``ip:port``: it is stored as the born host of the
        messages sent over it (RocketMQ ``bornHost``)."""
        self._peers[conn] = peer

    def connection_closed(self, conn: int) -> list[Action]:
        """Forget a connection's client, release the orderly queue locks it holds over that
        connection, and notify the consumer groups it left."""
        self._peers.pop(conn, None)
        self.groups.locks.release_conn(conn)
        return self._notify_groups(self.clients.remove(conn))

    def tick(self, now_ms: int) -> list[Action]:
        """Periodic work: delay queues, expired clients, check-back round. Never raises: each
        part runs guarded (:class:`TimerHealth`), so one failing part stops neither the others
        nor later ticks; each part's last successful run is in ``health.last_tick_ms``."""
        actions: list[Action] = []
        self.health.run("schedule", now_ms, lambda: self.schedule.tick(now_ms))
        actions += self.health.run("clients", now_ms, lambda: self._expire_clients(now_ms)) or []
        actions += self.health.run("transaction", now_ms, lambda: self.tx.tick(now_ms)) or []
        return actions

    def _expire_clients(self, now_ms: int) -> list[Action]:
        actions: list[Action] = []
        for conn in self.clients.expired(now_ms, limits.CLIENT_EXPIRED_MS):
            actions += self.connection_closed(conn)
        return actions

    def destination_problem(self, topic: str | None, queue_id: str | None) -> str | None:
        """Why a scheduled or half message cannot go to its real ``topic`` / ``queue_id`` (the
        ``REAL_TOPIC`` / ``REAL_QID`` properties), or None (see :func:`destination_problem`)."""
        return destination_problem(topic, queue_id, self.topics)

    def runtime_info(self, now_ms: int) -> BrokerRuntimeInfo:
        """The health check: each timer's last successful tick, failures, restarts, parked
        messages (since start, and stored) and pending transactions."""
        parked = dict.fromkeys(PARK_SOURCES, 0)
        parked.update(self.schedule.parked)
        parked["transaction"] += self.tx.stats["parked"]
        lo, hi = self.store.queue_bounds(PARKED_TOPIC, 0)
        return BrokerRuntimeInfo(
            now_ms=now_ms, boot_ms=self.boot_ms, timers=dict(self.health.last_tick_ms),
            timer_errors=dict(self.health.errors), task_restarts=dict(self.health.restarts),
            parked=parked, parked_stored=hi - lo, pending_transactions=len(self.tx.index.pending))

    def _runtime_info(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return ok_reply(conn, cmd, body=self.runtime_info(now).encode())

    # -- topics -----------------------------------------------------------------------------------
    def _queue_nums(self, topic: str) -> int:
        check_topic(topic)
        n = self.topics.get(topic)
        if n is None:
            if not self.config.auto_create_topic_enable or topic.startswith("%"):
                raise _Fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
            n = self.create_topic(topic, self.config.default_topic_queue_nums)
        return n

    def queue_nums(self, topic: str) -> int:
        """Queue count of ``topic`` (created if auto-creation is on); raises the TOPIC_NOT_EXIST
        failure inside a request handler otherwise."""
        return self._queue_nums(topic)

    def create_topic(self, topic: str, queue_nums: int) -> int:
        """Create (or widen) a topic; returns its queue count. The name must pass
        :func:`~txmq.protocol.check_send_topic` (its charset has no ``@``, which separates the
        parts of a consumer offset key, and no ``.`` or ``/``); broker topics are refused."""
        check_send_topic(topic)
        if not 0 < queue_nums <= limits.QUEUE_NUMS_MAX:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL,
                        f"queue count {queue_nums} not in 1..{limits.QUEUE_NUMS_MAX}")
        if self.topics.get(topic, 0) < queue_nums:
            self.topics[topic] = queue_nums
            self._save_topics()
        return self.topics[topic]

    def _create_topic(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, CreateTopicRequestHeader)
        self.create_topic(h.topic, max(h.read_queue_nums, h.write_queue_nums))
        return ok_reply(conn, cmd)

    def route(self, topic: str, standard_json: bool = False) -> bytes:
        """The ``TopicRouteData`` JSON this broker answers for ``topic`` when clients use it as
        their name server (``namesrvAddr = broker``); ``standard_json`` quotes the integer keys
        (ClientRequestProcessor: clients from V4_9_4 on, or ``acceptStandardJsonOnly``). A topic
        that does not exist yet is created when auto-create is on; so is the default topic
        ``TBW102`` answered (perm 7, as RocketMQ's ``TopicConfigManager`` registers it), which
        clients look up for a topic with no route (RocketMQ ``BrokerConfig.autoCreateTopicEnable``).
        Raises the TOPIC_NOT_EXIST failure otherwise."""
        c = self.config
        perm = PERM_READ | PERM_WRITE
        if topic == DEFAULT_TOPIC and c.auto_create_topic_enable:
            n, perm = AUTO_CREATE_TOPIC_QUEUE_NUMS, perm | PERM_INHERIT
        else:
            n = self._queue_nums(topic)
        route = broker_route(topic, n, c.broker_name, c.broker_cluster_name, self.store_host,
                             perm=perm)
        return encode_route(route, standard=standard_json)

    def _route(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetRouteInfoRequestHeader)
        standard = wants_standard_json(cmd.version, h.accept_standard_json_only)
        try:
            return ok_reply(conn, cmd, body=self.route(h.topic, standard))
        except _Fail as f:  # RocketMQ ClientRequestProcessor's answer and remark
            if f.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            raise _Fail(f.code, topic_not_exist_remark(h.topic)) from f

    # -- send -------------------------------------------------------------------------------------
    def _record(self, h: SendHeader, body: bytes, now: int, born_host: str = "",
                props: dict[str, str] | None = None) -> Record:
        """The record a client's send stores, after validating all it names: the topic (not a
        broker topic), the properties (:func:`~txmq.protocol.check_send_properties`), the queue,
        the producer group of a half message, the born timestamp and the body size. A body the
        client compressed (``sysFlag`` COMPRESSED) is stored inflated. A send to a retry topic
        past ``maxReconsumeTimes`` goes to the group's DLQ (RocketMQ
        ``SendMessageProcessor.handleRetryAndDLQ``)."""
        if h.sys_flag & COMPRESSED_FLAG:
            body = inflate_body(body, h.sys_flag, self.config.max_message_size)
        if len(body) > self.config.max_message_size:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, "the message body size over max value, "
                        f"MAX: {self.config.max_message_size} (body of {len(body)} bytes)")
        props = decode_properties(h.properties or "") if props is None else props
        tags, keys = props.pop(PROPERTY_TAGS, ""), props.pop(PROPERTY_KEYS, "")
        check_send_topic(h.topic)
        if check_send_properties(props) or h.producer_group:
            check_group(h.producer_group)
        check_timestamp(h.born_timestamp, "born timestamp")
        topic, reconsumed = h.topic, h.reconsume_times or 0
        max_times = limits.MAX_RECONSUME_TIMES if h.max_reconsume_times is None else h.max_reconsume_times
        if topic.startswith(RETRY_PREFIX) and reconsumed > max_times:
            topic = dlq_topic(topic[len(RETRY_PREFIX):])
            self.create_topic(topic, 1)
        n = self._queue_nums(topic)
        qid = h.queue_id if h.queue_id >= 0 and topic == h.topic else next(self._rr) % n
        if h.queue_id < -1 or qid >= n:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, f"queue {h.queue_id} not in topic {topic!r} ({n})")
        return Record(topic=topic, queue_id=qid, body=body, tags=tags, keys=keys,
                      properties=props, born_timestamp_ms=h.born_timestamp or now,
                      store_timestamp_ms=now, reconsume_times=reconsumed, flag=h.flag,
                      born_host=born_host)

    def _half_or_plain(self, conn: int, rec: Record, producer_group: str) -> Record:
        """What a send stores: ``rec`` itself, or for a ``TRAN_MSG`` send its half record."""
        if rec.properties.get(PROPERTY_TRANSACTION_PREPARED) != "true":
            return rec
        if self.config.reject_transaction_message:
            raise _Fail(ResponseCode.NO_PERMISSION, "this broker rejects transaction messages")
        return self.tx.half_record(rec, producer_group, self.clients.client_id(conn))

    def _send_reply(self, conn: int, cmd: Command, rec: Record, res: AppendResult) -> list[Action]:
        half = rec.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true"
        out = SendMessageResponseHeader(
            msg_id=offset_msg_id(self.store_host, res.commit_log_offset), queue_id=rec.queue_id,
            queue_offset=res.queue_offset,
            transaction_id=rec.properties.get(PROPERTY_UNIQ_KEY) if half else None)
        return ok_reply(conn, cmd, to_ext(out), durable_offset=res.commit_log_offset + res.size)

    def set_store_host(self, host: str) -> None:
        """The broker's ``ip:port`` once the shell knows the port it listens on."""
        self.store_host = host
        self.store.set_store_host(host)

    def _send(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return self._send_parsed(conn, cmd, send_header(cmd), None, now)

    def _send_parsed(self, conn: int, cmd: Command, h: SendHeader, props: dict[str, str] | None,
                     now: int) -> list[Action]:
        """One send whose header (and maybe properties string) the caller decoded already."""
        rec = self._record(h, cmd.body, now, self._peers.get(conn, ""), props)
        stored = self._half_or_plain(conn, rec, h.producer_group)
        if stored is not rec:
            res = self.append([stored])[0]
            self.tx.on_half_stored(stored, res)
        elif (level := delay_level(rec.properties)) > 0:
            res = self.append([self.schedule.schedule_record(rec, level)])[0]
        else:
            res = self.append([rec])[0]
        return self._send_reply(conn, cmd, rec, res)

    def _send_batch(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = send_header(cmd)
        try:
            msgs = decode_batch(cmd.body)
        except ProtocolError as exc:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, f"batch body does not decode: {exc}") from exc
        if not 0 < len(msgs) <= limits.BATCH_MESSAGES_MAX:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL,
                        f"batch of {len(msgs)} not in 1..{limits.BATCH_MESSAGES_MAX}")
        tx = [m.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true" for m in msgs]
        if any(tx) and not all(tx):
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, "a batch is all half messages or all plain")
        peer = self._peers.get(conn, "")
        recs = [self._batch_record(h, m, now, peer) for m in msgs]
        qid = recs[0].queue_id
        for r in recs:
            r.queue_id = qid
        if tx[0]:  # half messages, contiguous in the half queue (the Spark sink sends these)
            if self.config.reject_transaction_message:
                raise _Fail(ResponseCode.NO_PERMISSION, "this broker rejects transaction messages")
            client = self.clients.client_id(conn)
            recs = [self.tx.half_record(r, h.producer_group, client) for r in recs]
            results = self.append(recs)
            for r, res in zip(recs, results, strict=True):
                self.tx.on_half_stored(r, res)
        else:
            results = self.append(recs)
        first, last = results[0], results[-1]
        ids = ",".join(offset_msg_id(self.store_host, r.commit_log_offset) for r in results)
        out = SendMessageResponseHeader(msg_id=ids, queue_id=qid, queue_offset=first.queue_offset)
        return ok_reply(conn, cmd, to_ext(out), durable_offset=last.commit_log_offset + last.size)

    def _batch_record(self, h: SendHeader, m: Message, now: int, born_host: str) -> Record:
        """One message of a batch (RocketMQ ``MessageDecoder.decodeMessages``: body, flag and
        properties per message; topic and the rest from the request header)."""
        if m.topic and m.topic != h.topic:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, "a batch holds messages of the request's topic only")
        props = dict(m.properties)
        if m.tags:
            props[PROPERTY_TAGS] = m.tags
        if m.keys:
            props[PROPERTY_KEYS] = m.keys
        if PROPERTY_DELAY_TIME_LEVEL in props:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, "delay messages cannot be batched")
        hh = msgspec.structs.replace(h, flag=m.flag, sys_flag=h.sys_flag & ~COMPRESSED_FLAG)
        return self._record(hh, m.body, now, born_host, props)

    # -- pull -------------------------------------------------------------------------------------
    def _pull(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, PullMessageRequestHeader)
        check_group(h.consumer_group)
        check_queue_id(h.queue_id, self._queue_nums(h.topic), h.topic)
        if h.sys_flag & PULL_FLAG_COMMIT_OFFSET:
            check_offset(h.commit_offset, "commit offset", none_ok=True)
            if h.commit_offset >= 0:
                self.set_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        lo, hi = self.store.queue_bounds(h.topic, h.queue_id)
        if h.queue_offset < lo or h.queue_offset > hi:
            nxt = lo if h.queue_offset < lo else hi
            return self._pull_reply(conn, cmd, ResponseCode.PULL_OFFSET_MOVED, nxt, lo, hi)
        count_max = max(1, min(h.max_msg_nums, limits.PULL_BATCH_MAX))
        msgs = self.store.read_queue(h.topic, h.queue_id, h.queue_offset, count_max,
                                     limits.PULL_BATCH_BYTES_MAX)
        if not msgs:
            if h.sys_flag & PULL_FLAG_SUSPEND and h.suspend_timeout_millis > 0:
                # The commit offset was applied now; a woken hold must not apply it again (it may
                # be stale by then, e.g. after an operator reset the group's offsets).
                again = msgspec.structs.replace(h, sys_flag=h.sys_flag & ~PULL_FLAG_COMMIT_OFFSET)
                held = msgspec.structs.replace(cmd, ext=to_ext(again))
                return [Hold(conn, held, h.topic, h.queue_id, now + h.suspend_timeout_millis)]
            return self._pull_reply(conn, cmd, ResponseCode.PULL_NOT_FOUND, h.queue_offset, lo, hi)
        nxt = msgs[-1].queue_offset + 1
        tags = _parse_subscription(h.subscription or "*")
        if tags is not None:
            msgs = [m for m in msgs if m.tags in tags]
            if not msgs:
                return self._pull_reply(conn, cmd, ResponseCode.PULL_NOT_FOUND, nxt, lo, hi)
        body = encode_message_exts(msgs)
        return self._pull_reply(conn, cmd, ResponseCode.SUCCESS, nxt, lo, hi, body)

    def expire_hold(self, conn: int, cmd: Command) -> list[Action]:
        """A held pull reached its deadline with nothing new: answer PULL_NOT_FOUND."""
        h = from_ext(cmd.ext, PullMessageRequestHeader)
        lo, hi = self.store.queue_bounds(h.topic, h.queue_id)
        return self._pull_reply(conn, cmd, ResponseCode.PULL_NOT_FOUND, h.queue_offset, lo, hi)

    @staticmethod
    def _pull_reply(conn: int, cmd: Command, code: ResponseCode, nxt: int, lo: int, hi: int,
                    body: bytes = b"") -> list[Action]:
        ext = to_ext(PullMessageResponseHeader(next_begin_offset=nxt, min_offset=lo, max_offset=hi))
        return [Reply(conn, cmd.response(code, None, ext, body))]

    # -- index queries ----------------------------------------------------------------------------
    def _query_message(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """QUERY_MESSAGE: durable messages of a topic by key in a store-time range (the index)."""
        h = from_ext(cmd.ext, QueryMessageRequestHeader)
        check_timestamp(h.begin_timestamp, "begin timestamp")
        check_timestamp(h.end_timestamp, "end timestamp")
        if check_topic(h.topic) not in self.topics:
            raise _Fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {h.topic!r} does not exist")
        if h.begin_timestamp > h.end_timestamp or not h.key:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, "need a key and begin <= end timestamp")
        found = self.store.query_by_key(h.topic, h.key, h.begin_timestamp, h.end_timestamp,
                                        max(1, min(h.max_num, limits.QUERY_MESSAGE_MAX_NUM)))
        if not found:
            raise _Fail(ResponseCode.QUERY_NOT_FOUND, f"no message of {h.topic!r} with key {h.key!r}")
        out = QueryMessageResponseHeader(index_last_update_timestamp=now,
                                         index_last_update_phyoffset=self.store.flushed_offset)
        return ok_reply(conn, cmd, to_ext(out), encode_message_exts(found))

    def _view_message(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """VIEW_MESSAGE_BY_ID: the one durable record at a commit log offset."""
        h = from_ext(cmd.ext, ViewMessageRequestHeader)
        if not self.store.min_offset <= h.offset < self.store.flushed_offset:
            raise _Fail(ResponseCode.QUERY_NOT_FOUND, f"commit log offset {h.offset} is not stored")
        try:
            found = self.store.read_at(h.offset)
        except CorruptRecord as exc:  # not a record boundary, or damaged
            raise _Fail(ResponseCode.QUERY_NOT_FOUND, f"no message at commit log offset {h.offset}: "
                                                      f"{exc}") from exc
        return ok_reply(conn, cmd, body=encode_message_exts([found]))

    def _view_by_uniq_key(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """VIEW_MESSAGE_BY_UNIQ_KEY: every stored copy of a message, newest first."""
        h = from_ext(cmd.ext, ViewMessageByUniqKeyRequestHeader)
        found = self.store.query_by_msg_id(h.msg_id, limits.QUERY_MESSAGE_MAX_NUM)
        if not found:
            raise _Fail(ResponseCode.QUERY_NOT_FOUND, f"no message with id {h.msg_id!r}")
        return ok_reply(conn, cmd, body=encode_message_exts(found))

    # -- offsets ----------------------------------------------------------------------------------
    def set_offset(self, group: str, topic: str, qid: int, offset: int) -> None:
        """Store a group's consumer offset of one queue (saved by :meth:`persist_offsets`)."""
        key = f"{group}@{topic}@{qid}"
        if self.offsets.get(key) != offset:
            self.offsets[key] = offset
            self._offsets_dirty = True

    def _query_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, QueryConsumerOffsetRequestHeader)
        check_group(h.consumer_group)
        if check_topic(h.topic) in self.topics:
            check_queue_id(h.queue_id, self.topics[h.topic], h.topic)
        off = self.offsets.get(f"{h.consumer_group}@{h.topic}@{h.queue_id}")
        if off is None and h.set_zero_if_not_found is not False and h.topic in self.topics:
            # RocketMQ ConsumerManageProcessor.queryConsumerOffset: a group with no offset reads
            # from 0 while the queue still holds offset 0 (for clients that do not ask otherwise)
            lo, hi = self.store.queue_bounds(h.topic, h.queue_id)
            off = 0 if lo == 0 and hi > 0 else None
        if off is None:
            raise _Fail(ResponseCode.QUERY_NOT_FOUND,
                        "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return ok_reply(conn, cmd, to_ext(OffsetResponseHeader(offset=off)))

    def _update_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, UpdateConsumerOffsetRequestHeader)
        check_group(h.consumer_group)
        check_queue_id(h.queue_id, self._queue_nums(h.topic), h.topic)
        check_offset(h.commit_offset, "commit offset")
        self.set_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return ok_reply(conn, cmd)

    def _min_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetMinOffsetRequestHeader)
        check_queue_id(h.queue_id, self._queue_nums(h.topic), h.topic)
        lo = self.store.queue_bounds(h.topic, h.queue_id)[0]
        return ok_reply(conn, cmd, to_ext(OffsetResponseHeader(offset=lo)))

    def _max_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetMaxOffsetRequestHeader)
        check_queue_id(h.queue_id, self._queue_nums(h.topic), h.topic)
        hi = self.store.queue_bounds(h.topic, h.queue_id)[1]
        return ok_reply(conn, cmd, to_ext(OffsetResponseHeader(offset=hi)))

    # -- clients ----------------------------------------------------------------------------------
    def _heartbeat(self, conn: int, cmd: Command, now: int) -> list[Action]:
        data = decode_body(cmd.body, HeartbeatData)
        for g in data.producer_groups:
            check_group(g)
        for cd in data.consumer_data_set:
            check_group(cd.group_name)
            if cd.message_model == "CLUSTERING" and retry_topic(cd.group_name) not in self.topics:
                self.create_topic(retry_topic(cd.group_name), 1)
            for topic in cd.subscriptions:
                if not topic.startswith(RETRY_PREFIX):
                    self._queue_nums(topic)
        changed = self.clients.heartbeat(conn, data, now)
        return ok_reply(conn, cmd) + self._notify_groups(changed)

    def _unregister(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return ok_reply(conn, cmd) + self.connection_closed(conn)

    def _notify_groups(self, groups: set[str]) -> list[Action]:
        out: list[Action] = []
        for g in groups:
            ext = to_ext(NotifyConsumerIdsChangedRequestHeader(consumer_group=g))
            for c in self.clients.consumer_conns(g).values():
                out.append(SendTo(c, Command(code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                             flag=FLAG_ONEWAY, ext=ext)))
        return out

    def _consumer_list(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetConsumerListByGroupRequestHeader)
        check_group(h.consumer_group)
        ids = sorted(self.clients.consumer_conns(h.consumer_group))
        return ok_reply(conn, cmd, body=encode_body(GetConsumerListByGroupResponseBody(
            consumer_id_list=ids)))

    # -- retries ----------------------------------------------------------------------------------
    def _send_back(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, ConsumerSendMsgBackRequestHeader)
        check_group(h.group)
        msg = self._read_client_offset(h.offset)
        if is_broker_topic(msg.topic):
            raise _Fail(ResponseCode.NO_PERMISSION, f"a message of {msg.topic!r} is not sent back")
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, h.origin_msg_id or props.get(PROPERTY_UNIQ_KEY, ""))
        done = msg.reconsume_times
        base = Record(topic=retry_topic(h.group), queue_id=0, body=msg.body, tags=msg.tags,
                      keys=msg.keys, properties=props, born_timestamp_ms=msg.born_timestamp_ms,
                      store_timestamp_ms=now, reconsume_times=done + 1)
        max_times = limits.MAX_RECONSUME_TIMES if h.max_reconsume_times is None else h.max_reconsume_times
        if done >= max_times or h.delay_level < 0:
            base.topic = dlq_topic(h.group)  # RocketMQ: reconsumeTimes >= maxReconsumeTimes
            self.create_topic(base.topic, 1)
            res = self.append([base])[0]
        else:
            self.create_topic(base.topic, 1)
            level = h.delay_level or limits.RETRY_DELAY_LEVEL_BASE + done
            res = self.append([self.schedule.schedule_record(base, level)])[0]
        return ok_reply(conn, cmd, durable_offset=res.commit_log_offset + res.size)

    def _read_client_offset(self, offset: int) -> MessageExt:
        """The stored message at a commit log offset a client named; MESSAGE_ILLEGAL if none."""
        if not self.store.min_offset <= offset < self.store.flushed_offset:
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, f"commit log offset {offset} is not stored")
        try:
            return self.store.read_at(offset)
        except CorruptRecord as exc:  # not a record boundary, or damaged
            raise _Fail(ResponseCode.MESSAGE_ILLEGAL, f"no message at commit log offset {offset}: "
                                                      f"{exc}") from exc


def _parse_subscription(expr: str) -> set[str] | None:
    """``*`` or empty → None (everything); ``TagA || TagB`` → {"TagA", "TagB"}."""
    expr = expr.strip()
    if expr in ("", "*"):
        return None
    return {t.strip() for t in expr.split("||") if t.strip()}
