"""The broker's logic over a store, sans-IO: ``handle(conn, command, now_ms) -> actions``.

The asyncio shell (:mod:`txmq.broker.server`) owns sockets, timers and fsync; this class only turns
requests into records, responses and follow-up actions. Time comes in as ``now_ms``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import lru_cache

import msgspec

from txmq import limits
from txmq.broker._actions import Action, Fail, Hold, Reply, SendTo, failure, ok_reply
from txmq.broker._clients import ClientRegistry
from txmq.broker._config import BrokerConfig, parse_delay_levels
from txmq.broker._groups import GroupService
from txmq.broker._health import TimerHealth, destination_problem
from txmq.broker._meta_log import MetaLog
from txmq.broker._offset_table import OffsetTable
from txmq.broker._pop import build_pop_service
from txmq.broker._retry import retry_record
from txmq.broker._role_state import RoleState
from txmq.broker._schedule import SCHEDULE_TOPIC, ScheduleService
from txmq.broker._send import SendOutcome, SendPath, SendRequest
from txmq.broker._slave_read import SlaveRead
from txmq.broker._topic_admin import TopicAdmin
from txmq.broker._topic_table import TopicTable
from txmq.broker._traffic import TrafficStats
from txmq.broker._tx_requests import TransactionRequests
from txmq.broker.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    SINK_BATCH_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TransactionService,
    TransactionTraces,
)
from txmq.errors import (
    CorruptRecord,
    ResponseCode,
    StoreError,
)
from txmq.limits import AUTO_CREATE_TOPIC_QUEUE_NUMS
from txmq.namesrv import topic_not_exist_remark
from txmq.protocol import (
    DEFAULT_TOPIC,
    FLAG_ONEWAY,
    MASTER_ID,
    PARK_SOURCES,
    PARKED_TOPIC,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    PROPERTY_RETRY_TOPIC,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUSPEND,
    RETRY_PREFIX,
    BrokerRuntimeInfo,
    Command,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    ExchangeHaInfoRequestHeader,
    ExchangeHaInfoResponseHeader,
    GetConsumerListByGroupRequestHeader,
    GetConsumerListByGroupResponseBody,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    GetRouteInfoRequestHeader,
    HaRuntimeInfo,
    HeartbeatData,
    MessageExt,
    NotifyConsumerIdsChangedRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    RequestCode,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageByUniqKeyRequestHeader,
    ViewMessageRequestHeader,
    broker_route,
    check_group,
    check_offset,
    check_queue_id,
    check_timestamp,
    check_topic,
    decode_body,
    dlq_topic,
    encode_body,
    encode_message_exts,
    encode_route,
    from_ext,
    is_broker_topic,
    retry_topic,
    to_ext,
    wants_standard_json,
)
from txmq.store import AppendResult, Record, Store, tag_hash

__all__ = ["SLAVE_PUT_REMARK", "Broker", "dlq_topic", "retry_topic"]

SLAVE_PUT_REMARK = ("service not available now. It may be caused by one of the following reasons: "
                    "the broker's disk is full, messages are put to the slave, message store has "
                    "been shut down, etc.")
"""What a SLAVE answers a send with (SERVICE_NOT_AVAILABLE; RocketMQ 4.9.7
``SendMessageProcessor.handlePutMessageResult``'s remark for ``PutMessageStatus.SERVICE_NOT_AVAILABLE``)."""

log = logging.getLogger("txmq.broker")

Handler = Callable[[int, Command, int], list[Action]]


class Broker:
    """One broker's state: topics, consumer offsets, clients, transactions, delay queues.

    Args:
        config: validated :class:`BrokerConfig`.
        store: the commit log and consume queues (``MemoryStore`` or ``FileStore``).
        now_ms: the time at start (recovery timestamps).
    """

    def __init__(self, config: BrokerConfig, store: Store, now_ms: int,
                 mono_ms: Callable[[], int] = lambda: int(time.monotonic() * 1000)) -> None:
        self.config = config
        self.master_addr = ""
        """A SLAVE's master's remoting address, once the shell learned it (docs/replication.md)."""
        self.ha_status: Callable[[int], HaRuntimeInfo] | None = None
        """The replication state at ``now_ms`` (set by the shell's ``txmq.broker.ha.Replication``);
        None: no replication runs (GET_BROKER_HA_STATUS answers the role and end only)."""
        self.ha_addr: Callable[[], str] = lambda: ""
        """``host:port`` of this broker's HA listener now, "" when none (set by the shell)."""
        self.role_notified: Callable[[Command], None] = lambda cmd: None
        """Controller mode: hands NOTIFY_BROKER_ROLE_CHANGED to the replicas manager (shell)."""
        self.ha_told: Callable[[str, str], None] = lambda ha, master: None
        """What a slave does when EXCHANGE_BROKER_HA_INFO names its master (set by the shell)."""
        self.store = store
        self.role = RoleState(config, mono_ms)
        """Master or slave now, the master epoch and fencing (controller mode changes it)."""
        self.clients = ClientRegistry()
        self._touched: set[tuple[str, int]] = set()
        self.peers: dict[int, str] = {}
        """Connection → the remote ``ip:port`` the shell reported (:meth:`connection_opened`)."""
        self.topics = TopicTable(config, store)
        """Topic → queue count; created and widened through it (``topics.json``)."""
        self.offsets = OffsetTable(store)
        """Consumer offsets per (group, topic, queue) (``consumerOffset.json``)."""
        self.boot_ms = now_ms
        self.health = TimerHealth()
        self.traffic = TrafficStats()
        """Messages and bytes in and out, pull offsets, request latencies (``/metrics``)."""
        self.slave_read = SlaveRead(config, self.role)
        """The ``suggestWhichBrokerId`` of pull answers (docs/replication.md)."""
        self.store_host = config.store.store_host or f"{config.host}:{config.port}"
        """``ip:port`` of this broker as stored in its records (and in offset message ids)."""
        self.tx_traces = TransactionTraces(config.transaction_trace_max,
                                           limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS)
        """The transactions' lives (docs/tracing.md); the shell may set its ``listener``."""
        self.tx = TransactionService(config, store, self.append, self.clients,
                                     self.destination_problem, lambda: self.store_host,
                                     self.tx_traces, self.peer)
        self.schedule = ScheduleService(parse_delay_levels(config.message_delay_level), store,
                                        self.append, self.destination_problem)
        self._recover()
        self.tx.trim(store.min_offset)  # retention may have run since the index was saved
        self.meta = MetaLog(store, self.offsets, self.topics, self.schedule, self.append,
                            slave=self.role.slave)
        """Offsets, delay progress and topics as system records of the replicated log."""
        self.meta.recover()
        self.groups = GroupService(self)
        self.tx_requests = TransactionRequests(self)
        self.sender = SendPath(self)
        self.pop = build_pop_service(self)
        """Pop consumption (the gRPC door's consumers), recovered from the revive topic."""
        self._handlers: dict[int, Handler] = {
            **self.groups.handlers(),
            **self.tx_requests.handlers(),
            **TopicAdmin(self).handlers(),
            RequestCode.SEND_MESSAGE: self.sender.handle_send,
            RequestCode.SEND_MESSAGE_V2: self.sender.handle_send,
            RequestCode.SEND_BATCH_MESSAGE: self.sender.handle_batch,
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
            RequestCode.GET_BROKER_HA_STATUS: self._ha_status,
            RequestCode.EXCHANGE_BROKER_HA_INFO: self._exchange_ha_info,
            RequestCode.NOTIFY_BROKER_ROLE_CHANGED: self._role_notified,
        }

    # -- storage helpers --------------------------------------------------------------------------
    def append(self, records: list[Record]) -> list[AppendResult]:
        """Append through the store and remember which queues got data (to wake long polls).
        Raises Fail(SERVICE_NOT_AVAILABLE) on a SLAVE: its log is its master's (RocketMQ 4.9.7
        ``DefaultMessageStore.putMessage`` refuses a put on a slave so)."""
        if (refusal := self.role.write_refusal()) is not None:
            raise Fail(*refusal)
        if self.role.slave:
            raise Fail(ResponseCode.SERVICE_NOT_AVAILABLE, SLAVE_PUT_REMARK)
        results = self.store.append(records)
        if len(records) == 1:
            self._touched.add((records[0].topic, records[0].queue_id))
        else:
            self._touched.update((r.topic, r.queue_id) for r in records)
        return results

    def touch(self, keys: set[tuple[str, int]]) -> None:
        """Queues a replica appended to (a SLAVE's HA client): their held pulls wake as a send's."""
        self._touched |= keys

    def take_touched(self) -> set[tuple[str, int]]:
        """The ``(topic, queue id)`` s appended to since the last call, and forget them (the shell
        wakes the long polls held on them once the data is durable)."""
        touched, self._touched = self._touched, set()
        return touched

    def touched_queues(self) -> set[tuple[str, int]]:
        """A copy of the queues appended to since the last :meth:`take_touched`."""
        return set(self._touched)

    # -- retention floors (the shell registers them as the store's retention hooks) --------------
    def _lowest_commit_log_offset(self, positions: list[tuple[str, int, int]]) -> int | None:
        found = [self.store.commit_log_offset_at(t, q, off) for t, q, off in positions]
        return min((c for c in found if c is not None), default=None)

    def retention_floor_consumers(self) -> int | None:
        """The lowest commit log offset a consumer group has not consumed yet (its committed
        queue offset's record), or None: retention must keep it."""
        return self._lowest_commit_log_offset([(t, q, off) for _, t, q, off in self.offsets.items()])

    def retention_floor_transactions(self) -> int | None:
        """The commit log offset of the oldest pending half message, or None."""
        return min((e.commit_log_offset for e in self.tx.index.pending.values()), default=None)

    def retention_floor_delays(self) -> int | None:
        """The lowest commit log offset of a message still waiting in a delay queue, or None."""
        return self._lowest_commit_log_offset([(SCHEDULE_TOPIC, lvl - 1, off)
                                               for lvl, off in self.schedule.offsets.items()])

    def _recover(self, torn_from: int | None = None) -> None:
        """Rebuild the transaction index without reading the whole commit log (``torn_from``
        given: from the whole log, without the snapshot, scanning for torn batches from there).

        The index snapshot holds the index as of a commit log offset; only records stored after
        it are replayed (O(pending + recent), not O(every transaction ever stored)). Half, op,
        discard and sink batch marker records come through their topics' consume queues. A
        committed real message (it carries ``TRAN_PREPARED_QUEUE_OFFSET``) is appended in one
        batch with its op record, so only where a crash could have torn that batch, the part of
        the log the store re-dispatched on open (from ``store.recovery_offset``), is scanned for
        them.
        """
        start = self.tx.load_snapshot() if torn_from is None else 0
        tx_topics = (HALF_TOPIC, OP_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, SINK_BATCH_TOPIC)
        found = dict(self.store.iter_records(start, topics=tx_topics))
        scan = self.store.recovery_offset if torn_from is None else torn_from
        for offset, rec in self.store.iter_records(max(scan, start)):
            if offset not in found and self.tx.wants(rec):
                found[offset] = rec
        self.tx.recover([(rec, AppendResult(off, rec.queue_offset, 0))
                         for off, rec in sorted(found.items())])
        log.info("transaction index recovered: %s", self.tx.index.counts())

    def take_master_role(self, now_ms: int, torn_from: int) -> int:
        """The role became master (controller mode): system records written here from now on,
        pop state replayed from the revive topic, the transaction index rebuilt from the whole
        log (it replicated halves and ends it did not index; its snapshot may predate a
        truncation), and every pending half checked back
        at the next tick (issue #26: the new master checks back every pending half it holds;
        RocketMQ ``changeSpecialServiceStatus(true)``). ``torn_from``: where the last epoch
        began (a batch torn by the old master's crash can only be after it). Returns how many
        halves are pending."""
        self.meta.set_slave(False)
        self.pop = build_pop_service(self)  # (its checkpoints arrived by replication)
        self.tx_traces.drop_pending()  # (their lives begin again at their next check-back)
        self.tx = TransactionService(self.config, self.store, self.append, self.clients,
                                     self.destination_problem, lambda: self.store_host,
                                     self.tx_traces, self.peer)
        self._recover(torn_from=torn_from)
        pending = list(self.tx.index.pending.values())
        for entry in pending:
            self.tx.index.reschedule(entry, now_ms)
        return len(pending)

    def take_slave_role(self) -> None:
        """The role became slave: system records are applied, not written."""
        self.meta.set_slave(True)

    def persist_offsets(self) -> None:
        """Save consumer offsets, delay progress and the transaction index snapshot if they
        changed, now, on this thread (the shell does at shutdown): :meth:`prepare_persist`'s step
        run at once. Never raises."""
        self.prepare_persist()()

    def prepare_persist(self, pause: Callable[[], None] = lambda: None) -> Callable[[], None]:
        """Copy what changed of the consumer offsets, the delay progress and the transaction index
        (on the event loop: dict copies and references, no encoding, no disk) and return the step
        that encodes, writes and fsyncs each (for the shell's writer thread, one step at a time;
        ``pause`` is called between chunks of a large encode so the loop gets the GIL). Each file
        is replaced atomically (temp, fsync, rename). The step never raises: a failure (a full
        disk) is logged and that part is saved again next time."""
        steps = [(what, step) for what, step in (
            ("consumer offsets", self.offsets.prepare_persist()),
            ("delay progress", self.schedule.prepare_persist()),
            ("transaction index", self.tx.prepare_snapshot(pause))) if step is not None]
        position = self.meta.prepare_persist()  # copied with the tables: saved only after them

        def run() -> None:
            saved = True
            for what, step in [*steps, ("system record position", position)]:
                try:
                    if step is not None and (saved or what != "system record position"):
                        step()
                except StoreError as exc:  # a full disk: retried next time, never fatal
                    log.error("%s not saved: %s", what, exc)
                    saved = False

        return run

    def after_retention(self, min_offset: int) -> None:
        """Retention deleted the commit log below ``min_offset`` (``CleanReport.min_offset``):
        forget the transaction outcomes and discarded transactions it made moot
        (:meth:`TransactionService.trim`)."""
        self.tx.trim(min_offset)

    # -- dispatch ---------------------------------------------------------------------------------
    def request_codes(self) -> frozenset[int]:
        """Every request code :meth:`handle` dispatches (the ACL table must decide each one)."""
        return frozenset(self._handlers)

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
        except Exception as exc:  # the broker never crashes on input
            return self._error(conn, cmd, *failure(exc, f"handling request code {cmd.code}"))

    def handle_sends(self, conn: int, cmds: list[Command], now_ms: int) -> list[Action]:
        """Several SEND_MESSAGE / SEND_MESSAGE_V2 requests that arrived together, in order,
        appended with one store append (one commit log write) through :meth:`send`. Replies,
        offsets and errors are those of calling :meth:`handle` on each in turn. Never raises."""
        try:
            return self.sender.handle_sends(conn, cmds, now_ms)
        except Exception:  # not expected: handle_sends answers each failure in place
            log.exception("unexpected error in a run of %d sends", len(cmds))
            return [a for cmd in cmds if not cmd.is_response
                    for a in self._error(conn, cmd, ResponseCode.SYSTEM_ERROR, "internal error")]

    def handle_ends(self, conn: int, cmds: list[Command], now_ms: int) -> list[Action]:
        """Several END_TRANSACTION requests that arrived together, in order, settled with one
        append (:meth:`TransactionRequests.end_run`); what each is answered is what
        :meth:`handle` answers it. A failure of the whole run (the append: a full disk) answers
        each request with it. Never raises."""
        try:
            return self.tx_requests.end_run(conn, cmds, now_ms)
        except Exception as exc:
            code, remark = failure(exc, f"settling a run of {len(cmds)} ends")
            return [a for cmd in cmds for a in self._error(conn, cmd, code, remark)]

    def _error(self, conn: int, cmd: Command, code: ResponseCode, remark: str) -> list[Action]:
        """The error response to ``cmd`` (none for a one-way request: logged instead)."""
        if cmd.is_oneway:
            log.warning("one-way request code %d failed: %s", cmd.code, remark)
            return []
        return [Reply(conn, cmd.response(code, remark))]

    error_reply = _error

    def peer(self, conn: int) -> str:
        """The remote ``ip:port`` of connection ``conn`` ("" if unknown)."""
        return self.peers.get(conn, "")

    def connection_opened(self, conn: int, peer: str) -> None:
        """Remember a connection's remote ``ip:port``: it is stored as the born host of the
        messages sent over it (RocketMQ ``bornHost``)."""
        self.peers[conn] = peer

    def connection_closed(self, conn: int) -> list[Action]:
        """Forget a connection's client, release the orderly queue locks it holds over that
        connection, and notify the consumer groups it left."""
        self.peers.pop(conn, None)
        self.groups.locks.release_conn(conn)
        return self._notify_groups(self.clients.remove(conn))

    def tick(self, now_ms: int) -> list[Action]:
        """Periodic work: delay queues, expired clients, check-back round. Never raises: each
        part runs guarded (:class:`TimerHealth`), so one failing part stops neither the others
        nor later ticks; each part's last successful run is in ``health.last_tick_ms``."""
        actions: list[Action] = []
        fenced = self.role.write_refusal() is not None  # controller mode: it may not write now
        slave = self.role.slave or fenced  # RocketMQ: only a master checks back,
        if not slave:                      # delivers delays and revives pops
            self.health.run("schedule", now_ms, lambda: self.schedule.tick(now_ms))
        if not fenced or self.role.slave:
            self.health.run("meta", now_ms, lambda: self.meta.tick(now_ms))  # write / follow
        actions += self.health.run("clients", now_ms, lambda: self._expire_clients(now_ms)) or []
        if slave:  # (``BrokerRole.SLAVE != role``)
            return actions
        actions += self.health.run("transaction", now_ms, lambda: self.tx.tick(now_ms)) or []
        self.health.run("pop", now_ms, lambda: self.pop.tick(now_ms))
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
        messages (since start, and stored), pending transactions, the commit log's bounds and
        the disk's used ratio (measured now, as the store's disk check does)."""
        parked = dict.fromkeys(PARK_SOURCES, 0)
        parked.update(self.schedule.parked)
        parked["transaction"] += self.tx.stats["parked"]
        lo, hi = self.store.queue_bounds(PARKED_TOPIC, 0)
        return BrokerRuntimeInfo(
            now_ms=now_ms, boot_ms=self.boot_ms, timers=dict(self.health.last_tick_ms),
            timer_errors=dict(self.health.errors), task_restarts=dict(self.health.restarts),
            parked=parked, parked_stored=hi - lo, pending_transactions=len(self.tx.index.pending),
            commit_log_min_offset=self.store.min_offset, commit_log_max_offset=self.store.write_offset,
            commit_log_disk_ratio=self.store.check_disk().usage_ratio)

    def _runtime_info(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return ok_reply(conn, cmd, body=self.runtime_info(now).encode())

    def _role_notified(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """NOTIFY_BROKER_ROLE_CHANGED (1008, one-way from a controller): to the replicas
        manager, which checks it against what it knows (RocketMQ ``BrokerController``)."""
        self.role_notified(cmd)
        return [] if cmd.is_oneway else ok_reply(conn, cmd)

    def _exchange_ha_info(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """EXCHANGE_BROKER_HA_INFO (906; RocketMQ ``AdminBrokerProcessor.exchangeHAInfo``): with
        ``masterHaAddress``, a slave is told where its master is; without, the broker answers
        its HA address, flushed end and remoting address."""
        h = from_ext(cmd.ext, ExchangeHaInfoRequestHeader)
        if h.master_ha_address:
            self.ha_told(h.master_ha_address, h.master_address or "")
            return ok_reply(conn, cmd)
        return ok_reply(conn, cmd, to_ext(ExchangeHaInfoResponseHeader(
            master_ha_address=self.ha_addr() or None,
            master_flush_offset=self.store.flushed_offset, master_address=self.store_host)))

    def _ha_status(self, conn: int, cmd: Command, now: int) -> list[Action]:
        c = self.config
        info = (self.ha_status(now) if self.ha_status is not None else HaRuntimeInfo(
            master=not self.role.slave, master_commit_log_max_offset=self.store.write_offset,
            broker_name=c.broker_name, broker_id=self.role.broker_id, broker_role=self.role.role))
        return ok_reply(conn, cmd, body=info.encode())

    # -- topics -----------------------------------------------------------------------------------
    def queue_nums(self, topic: str) -> int:
        """Queue count of ``topic`` (created if auto-creation is on); raises the TOPIC_NOT_EXIST
        failure inside a request handler otherwise (:meth:`TopicTable.queue_nums`)."""
        return self.topics.queue_nums(topic)

    def create_topic(self, topic: str, queue_nums: int) -> int:
        """Create (or widen) a topic; returns its queue count (:meth:`TopicTable.create`)."""
        return self.topics.create(topic, queue_nums)

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
            n = self.topics.queue_nums(topic)
        route = broker_route(topic, n, c.broker_name, c.broker_cluster_name, self.store_host,
                             perm=perm)
        return encode_route(route, standard=standard_json)

    def _route(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetRouteInfoRequestHeader)
        standard = wants_standard_json(cmd.version, h.accept_standard_json_only)
        try:
            return ok_reply(conn, cmd, body=self.route(h.topic, standard))
        except Fail as f:  # RocketMQ ClientRequestProcessor's answer and remark
            if f.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            raise Fail(f.response_code, topic_not_exist_remark(h.topic)) from f

    # -- send -------------------------------------------------------------------------------------
    def send(self, conn: int, requests: list[SendRequest], now_ms: int) -> list[SendOutcome]:
        """The one send path (:meth:`SendPath.send`): validate and stage each request, append
        them with ONE store append, one :class:`SendOutcome` per request in order. ``conn``
        names the producer's connection (its client id goes into half messages). Never raises."""
        return self.sender.send(conn, requests, now_ms)

    def set_store_host(self, host: str) -> None:
        """The broker's ``ip:port`` once the shell knows the port it listens on."""
        self.store_host = host
        self.store.set_store_host(host)

    # -- pull -------------------------------------------------------------------------------------
    def _pull(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, PullMessageRequestHeader)
        check_group(h.consumer_group)
        check_queue_id(h.queue_id, self.topics.queue_nums(h.topic), h.topic)
        lo, hi = self.store.queue_bounds(h.topic, h.queue_id)
        if h.sys_flag & PULL_FLAG_COMMIT_OFFSET:
            check_offset(h.commit_offset, "commit offset", none_ok=True)
            if h.commit_offset >= 0:
                # Past the queue's end only after a failover truncated what the consumer read on
                # the old master (never acknowledged to its producer): the end is all there is to
                # have consumed, and the answer below moves the consumer back to it (txmq; else
                # its next commit, the end, would move the offset back).
                # (Past the visible end, the durable end: controller mode's read limit may trail
                # what a consumer read before a restart.)
                end = hi if h.commit_offset <= hi else self.store.queue_durable_max(h.topic,
                                                                                      h.queue_id)
                self.set_offset(h.consumer_group, h.topic, h.queue_id, min(h.commit_offset, end))
        if self.slave_read.refuses:  # a slave that serves no reads: pull from the master
            return self._pull_reply(conn, cmd, ResponseCode.PULL_RETRY_IMMEDIATELY, h.queue_offset,
                                    lo, hi)
        if h.queue_offset < lo:
            return self._pull_reply(conn, cmd, ResponseCode.PULL_OFFSET_MOVED, lo, lo, hi)
        if h.queue_offset > hi and (moved := self._past_end(conn, cmd, h, lo, hi)) is not None:
            return moved
        count_max = max(1, min(h.max_msg_nums, limits.PULL_BATCH_MAX))
        read = self.store.read_queue_raw(h.topic, h.queue_id, h.queue_offset, count_max,
                                         limits.PULL_BATCH_BYTES_MAX,
                                         _subscription_hashes(h.subscription or "*"))
        nxt = read.next_offset
        if nxt == h.queue_offset:  # nothing durable at the offset yet
            if h.sys_flag & PULL_FLAG_SUSPEND and h.suspend_timeout_millis > 0:
                # The commit offset was applied now; a woken hold must not apply it again (it may
                # be stale by then, e.g. after an operator reset the group's offsets).
                again = msgspec.structs.replace(h, sys_flag=h.sys_flag & ~PULL_FLAG_COMMIT_OFFSET)
                held = msgspec.structs.replace(cmd, ext=to_ext(again))
                return [Hold(conn, held, h.topic, h.queue_id, now + h.suspend_timeout_millis,
                             held_at_ms=now)]
            return self._pull_reply(conn, cmd, ResponseCode.PULL_NOT_FOUND, h.queue_offset, lo, hi)
        self.traffic.pulled(h.consumer_group, h.topic, h.queue_id, nxt)
        if not read.count:  # every entry read was filtered out by its tag hash
            return self._pull_reply(conn, cmd, ResponseCode.PULL_NOT_FOUND, nxt, lo, hi)
        self.traffic.delivered(h.consumer_group, h.topic, read.count, len(read.body))
        last = self.store.commit_log_offset_at(h.topic, h.queue_id, nxt - 1)
        suggest = self.slave_read.suggest(self.store.write_offset - (last or 0))
        return self._pull_reply(conn, cmd, ResponseCode.SUCCESS, nxt, lo, hi, read.body, suggest)

    def _past_end(self, conn: int, cmd: Command, h: PullMessageRequestHeader, lo: int,
                  hi: int) -> list[Action] | None:
        """A pull from past the visible end of its queue: None when the offset is durable but
        not visible yet (controller mode's confirm offset: the pull waits, or finds nothing, as
        at the end); else its answer. Past the durable end, a slave that is behind tells the
        consumer to retry at the master with its offset unchanged (RocketMQ
        ``PullMessageProcessor``, ``offsetCheckInSlave`` false); a master moves it to the end."""
        if h.queue_offset <= self.store.queue_durable_max(h.topic, h.queue_id):
            return None
        if self.role.slave:
            return self._pull_reply(conn, cmd, ResponseCode.PULL_RETRY_IMMEDIATELY, h.queue_offset,
                                    lo, hi, suggest=MASTER_ID)
        return self._pull_reply(conn, cmd, ResponseCode.PULL_OFFSET_MOVED, hi, lo, hi)

    def expire_hold(self, conn: int, cmd: Command) -> list[Action]:
        """A held pull reached its deadline with nothing new: answer PULL_NOT_FOUND."""
        h = from_ext(cmd.ext, PullMessageRequestHeader)
        lo, hi = self.store.queue_bounds(h.topic, h.queue_id)
        return self._pull_reply(conn, cmd, ResponseCode.PULL_NOT_FOUND, h.queue_offset, lo, hi)

    @staticmethod
    def _pull_reply(conn: int, cmd: Command, code: ResponseCode, nxt: int, lo: int, hi: int,
                    body: bytes = b"", suggest: int = MASTER_ID) -> list[Action]:
        ext = to_ext(PullMessageResponseHeader(next_begin_offset=nxt, min_offset=lo, max_offset=hi,
                                               suggest_which_broker_id=suggest))
        return [Reply(conn, cmd.response(code, None, ext, body))]

    # -- index queries ----------------------------------------------------------------------------
    def _query_message(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """QUERY_MESSAGE: durable messages of a topic by key in a store-time range (the index)."""
        h = from_ext(cmd.ext, QueryMessageRequestHeader)
        check_timestamp(h.begin_timestamp, "begin timestamp")
        check_timestamp(h.end_timestamp, "end timestamp")
        if check_topic(h.topic) not in self.topics:
            raise Fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {h.topic!r} does not exist")
        if h.begin_timestamp > h.end_timestamp or not h.key:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, "need a key and begin <= end timestamp")
        found = self.store.query_by_key(h.topic, h.key, h.begin_timestamp, h.end_timestamp,
                                        max(1, min(h.max_num, limits.QUERY_MESSAGE_MAX_NUM)))
        if not found:
            raise Fail(ResponseCode.QUERY_NOT_FOUND, f"no message of {h.topic!r} with key {h.key!r}")
        out = QueryMessageResponseHeader(index_last_update_timestamp=now,
                                         index_last_update_phyoffset=self.store.flushed_offset)
        return ok_reply(conn, cmd, to_ext(out), encode_message_exts(found))

    def _view_message(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """VIEW_MESSAGE_BY_ID: the one durable record at a commit log offset."""
        h = from_ext(cmd.ext, ViewMessageRequestHeader)
        if not self.store.min_offset <= h.offset < self.store.flushed_offset:
            raise Fail(ResponseCode.QUERY_NOT_FOUND, f"commit log offset {h.offset} is not stored")
        try:
            found = self.store.read_at(h.offset)
        except CorruptRecord as exc:  # not a record boundary, or damaged
            raise Fail(ResponseCode.QUERY_NOT_FOUND, f"no message at commit log offset {h.offset}: "
                                                      f"{exc}") from exc
        return ok_reply(conn, cmd, body=encode_message_exts([found]))

    def _view_by_uniq_key(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """VIEW_MESSAGE_BY_UNIQ_KEY: every stored copy of a message, newest first."""
        h = from_ext(cmd.ext, ViewMessageByUniqKeyRequestHeader)
        found = self.store.query_by_msg_id(h.msg_id, limits.QUERY_MESSAGE_MAX_NUM)
        if not found:
            raise Fail(ResponseCode.QUERY_NOT_FOUND, f"no message with id {h.msg_id!r}")
        return ok_reply(conn, cmd, body=encode_message_exts(found))

    # -- offsets ----------------------------------------------------------------------------------
    def set_offset(self, group: str, topic: str, qid: int, offset: int) -> None:
        """Store a group's consumer offset of one queue (saved by :meth:`persist_offsets`)."""
        self.offsets.set(group, topic, qid, offset)

    def _query_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, QueryConsumerOffsetRequestHeader)
        check_group(h.consumer_group)
        if self.meta.slave:  # what replication made durable, even between two ticks
            self.meta.follow()
        if check_topic(h.topic) in self.topics:
            check_queue_id(h.queue_id, self.topics[h.topic], h.topic)
        off = self.offsets.get(h.consumer_group, h.topic, h.queue_id)
        if off is None and h.set_zero_if_not_found is not False and h.topic in self.topics:
            # RocketMQ ConsumerManageProcessor.queryConsumerOffset: a group with no offset reads
            # from 0 while the queue still holds offset 0 (for clients that do not ask otherwise)
            lo, hi = self.store.queue_bounds(h.topic, h.queue_id)
            off = 0 if lo == 0 and hi > 0 else None
        if off is None:
            raise Fail(ResponseCode.QUERY_NOT_FOUND,
                        "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return ok_reply(conn, cmd, to_ext(OffsetResponseHeader(offset=off)))

    def _update_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, UpdateConsumerOffsetRequestHeader)
        check_group(h.consumer_group)
        check_queue_id(h.queue_id, self.topics.queue_nums(h.topic), h.topic)
        check_offset(h.commit_offset, "commit offset")
        self.set_offset(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return ok_reply(conn, cmd)

    def _min_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetMinOffsetRequestHeader)
        check_queue_id(h.queue_id, self.topics.queue_nums(h.topic), h.topic)
        lo = self.store.queue_bounds(h.topic, h.queue_id)[0]
        return ok_reply(conn, cmd, to_ext(OffsetResponseHeader(offset=lo)))

    def _max_offset(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetMaxOffsetRequestHeader)
        check_queue_id(h.queue_id, self.topics.queue_nums(h.topic), h.topic)
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
                    self.topics.queue_nums(topic)
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
            raise Fail(ResponseCode.NO_PERMISSION, f"a message of {msg.topic!r} is not sent back")
        done = msg.reconsume_times
        base = retry_record(msg, retry_topic(h.group), now, h.origin_msg_id or "")
        max_times = limits.MAX_RECONSUME_TIMES if h.max_reconsume_times is None else h.max_reconsume_times
        if done >= max_times or h.delay_level < 0:
            base.topic = dlq_topic(h.group)  # RocketMQ: reconsumeTimes >= maxReconsumeTimes
            self.create_topic(base.topic, 1)
            res = self.append([base])[0]
            self.traffic.sent_to_dlq(h.group, base.properties.get(PROPERTY_RETRY_TOPIC, msg.topic))
        else:
            self.create_topic(base.topic, 1)
            level = h.delay_level or limits.RETRY_DELAY_LEVEL_BASE + done
            res = self.append([self.schedule.schedule_record(base, level)])[0]
        return ok_reply(conn, cmd, durable_offset=res.commit_log_offset + res.size)

    def _read_client_offset(self, offset: int) -> MessageExt:
        """The stored message at a commit log offset a client named; MESSAGE_ILLEGAL if none."""
        if not self.store.min_offset <= offset < self.store.flushed_offset:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, f"commit log offset {offset} is not stored")
        try:
            return self.store.read_at(offset)
        except CorruptRecord as exc:  # not a record boundary, or damaged
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, f"no message at commit log offset {offset}: "
                                                      f"{exc}") from exc


def _parse_subscription(expr: str) -> set[str] | None:
    """``*`` or empty → None (everything); ``TagA || TagB`` → {"TagA", "TagB"}."""
    expr = expr.strip()
    if expr in ("", "*"):
        return None
    return {t.strip() for t in expr.split("||") if t.strip()}


@lru_cache(maxsize=1024)
def _subscription_hashes(expr: str) -> frozenset[int] | None:
    """The consume queue tag hashes a pull with subscription ``expr`` delivers (None: all).
    RocketMQ ``SubscriptionData.codeSet``; as in RocketMQ, the consumer checks the tags
    themselves, since two tags can share a hash."""
    tags = _parse_subscription(expr)
    return None if tags is None else frozenset(tag_hash(t) for t in tags)
