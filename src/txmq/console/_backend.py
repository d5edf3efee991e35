"""The console's one entry to the brokers: :class:`Backend`, over ``txmq.client.AsyncAdmin``.

Every page and every API endpoint calls it. It validates input before it asks a broker (so a bad
request changes nothing) and raises the ``txmq.errors`` tree: ``InvalidRequest`` for bad input
(``response_code`` says which: MESSAGE_ILLEGAL / INVALID_PARAMETER → 400, QUERY_NOT_FOUND /
TOPIC_NOT_EXIST / TRANSACTION_NOT_FOUND / SUBSCRIPTION_GROUP_NOT_EXIST → 404, TOPIC_EXIST_ALREADY /
ILLEGAL_OPERATION → 409), ``RemoteError`` for the broker's refusals (same codes),
``BrokerUnavailable`` / ``RequestTimeout`` when a broker cannot be reached.

With several brokers, lists are merged (topics and groups by name, queues tagged with their
broker) and an id is looked up on each broker in turn.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from txmq import limits
from txmq.client import AsyncAdmin, AsyncConnection, AsyncPullConsumer
from txmq.console import _convert, _msgtrace, _trace, _tx_life
from txmq.console._backend_common import BrokerClients, bad, check_ident, check_page, or_empty
from txmq.console._history import History, Sample
from txmq.console._models import (
    BrokerInfo,
    ConsumerMember,
    DlqPage,
    DlqSummary,
    GroupDetail,
    GroupQueue,
    GroupSummary,
    MessageDetail,
    MessageList,
    MessageTrace,
    OutboxSummary,
    Overview,
    ReplicaMember,
    ResendPage,
    ResendResultModel,
    ResetOffsetResult,
    ResetQueue,
    Subscription,
    TopicDeleted,
    TopicDetail,
    TopicQueue,
    TopicQueues,
    TopicSummary,
)
from txmq.console._trace import read_queue
from txmq.console._transactions import TransactionDesk
from txmq.console._user import Credentials, current_credentials
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, ResponseCode
from txmq.protocol import (
    DEFAULT_TOPIC,
    DLQ_PREFIX,
    RETRY_PREFIX,
    BrokerRuntimeInfo,
    ClusterInfo,
    ConsumerGroupInfo,
    MessageExt,
    QueueConsumeStats,
    RequestCode,
    check_group,
    check_send_topic,
    check_timestamp,
    check_topic,
    decode_cluster_info,
    dlq_topic,
    is_broker_topic,
    is_trace_topic,
    retry_topic,
)

__all__ = ["Backend", "BrokerClients", "ConsoleConfig"]

T = TypeVar("T")
READER_GROUP = "TXMQ_CONSOLE"
"""The group the console reads system and DLQ topics as (it never commits an offset)."""
@dataclass
class ConsoleConfig:
    """What the console talks to.

    Attributes:
        brokers: broker addresses ``host:port``; found on the name servers when empty.
        namesrv_addr: name servers ``host:port[;host:port]``.
        outbox_url: SQLAlchemy URL of an outbox database ("" = the outbox page answers 404).
        outbox_prefix: the outbox tables' name prefix.
        sample_interval_ms: History sampling period (ms).
        history_samples: points the History keeps.
        acl: require a login (users of the brokers' ACL); every request is then made with the
            logged-in user's keys (docs/console.md "Login").
        access_key, secret_key: the console's own keys, for its background reads (the History
            sampler) and, without ``acl``, for every request.
        tls, tls_ca_file: reach the brokers over TLS, their certificates checked against
            ``tls_ca_file`` (default: the system's CAs) (docs/security.md "TLS").
        cluster: with ``namesrv_addr`` and no ``brokers``: only the master brokers of this
            cluster (default: every master the name servers list).
    """

    brokers: list[str] = field(default_factory=list)
    namesrv_addr: str = ""
    outbox_url: str = ""
    outbox_prefix: str = "txmq_"
    sample_interval_ms: int = limits.CONSOLE_SAMPLE_INTERVAL_MS
    history_samples: int = limits.CONSOLE_HISTORY_SAMPLES
    acl: bool = False
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    tls: bool = False
    tls_ca_file: str = ""
    cluster: str = ""


def is_system_topic(topic: str) -> bool:
    """Broker, retry, DLQ and message trace topics: hidden from the topic list unless asked for."""
    return (is_broker_topic(topic) or topic.startswith((RETRY_PREFIX, DLQ_PREFIX)) or topic == DEFAULT_TOPIC
            or is_trace_topic(topic))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_queues(queues: int) -> None:
    if not 0 < queues <= limits.QUEUE_NUMS_MAX:
        raise bad(f"queue count {queues} not in 1..{limits.QUEUE_NUMS_MAX}", ResponseCode.MESSAGE_ILLEGAL)


def _check_send_topic(topic: str) -> None:
    check_send_topic(topic)
    if topic == DEFAULT_TOPIC:
        raise bad(f"{DEFAULT_TOPIC} is the broker's default topic", ResponseCode.NO_PERMISSION)


async def _on_all(brokers: list[BrokerClients], fn: Callable[[BrokerClients], Awaitable[T]],
                  what: str) -> list[T]:
    """``fn`` on every broker at once; their answers in broker order. When some fail: the first
    failure if all did, else BrokerUnavailable naming the brokers done and those that failed (name,
    address, reason), so a partial change is never reported as done."""
    got = await asyncio.gather(*(fn(b) for b in brokers), return_exceptions=True)
    failed = [(b, g) for b, g in zip(brokers, got, strict=True) if isinstance(g, BaseException)]
    if not failed:
        return [g for g in got if not isinstance(g, BaseException)]
    if len(failed) == len(brokers):
        raise failed[0][1]
    done = ", ".join(b.name or b.addr for b, g in zip(brokers, got, strict=True)
                     if not isinstance(g, BaseException))
    why = "; ".join(f"{b.name or b.addr} ({b.addr}): {g}" for b, g in failed)
    raise BrokerUnavailable(f"{what}: done on {done}; failed on {why}")


class Backend:
    """Every operation of the console (see the module docstring for errors); the transactions'
    are on :attr:`tx`.

    Args:
        config: brokers, name servers, outbox database, sampling.

    Raises:
        ConfigError: neither brokers nor name servers given.
    """

    def __init__(self, config: ConsoleConfig) -> None:
        if not config.brokers and not config.namesrv_addr:
            raise ConfigError("give broker addresses or a name server address")
        if bool(config.access_key) != bool(config.secret_key):
            raise ConfigError("give both access_key and secret_key, or neither")
        self.config = config
        self.history = History(self.sample, config.sample_interval_ms, config.history_samples)
        self._brokers: list[BrokerClients] = []
        self._users: OrderedDict[Credentials, list[BrokerClients]] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._outbox: Any = None
        self.tx = TransactionDesk(self)
        """Pending and parked transactions, resume, operator decisions and their audit log."""

    # -- lifecycle ------------------------------------------------------------------------------
    async def open(self) -> None:
        """Create the clients (they connect on first use: a broker that is down answers 502 then,
        not here) and the outbox engine."""
        for addr in self.config.brokers:
            self._add(addr)
        if self.config.outbox_url and self._outbox is None:
            from txmq.console._outbox import OutboxReader

            self._outbox = OutboxReader(self.config.outbox_url, self.config.outbox_prefix)

    def _add(self, addr: str, name: str = "") -> None:
        if any(b.addr == addr for b in self._brokers):
            return
        self._brokers.append(self._clients(addr, Credentials(self.config.access_key,
                                                             self.config.secret_key), name))

    def _clients(self, addr: str, creds: Credentials, name: str = "") -> BrokerClients:
        kw: dict[str, Any] = {"namesrv_addr": self.config.namesrv_addr, "access_key": creds.user,
                              "secret_key": creds.secret_key}
        if self.config.tls or self.config.tls_ca_file:
            kw |= {"tls": True, "tls_ca_file": self.config.tls_ca_file}
        return BrokerClients(addr, AsyncAdmin(addr, **kw), AsyncPullConsumer(addr, READER_GROUP, **kw),
                             name)

    def _user_clients(self, creds: Credentials, base: list[BrokerClients]) -> list[BrokerClients]:
        """The clients of one logged-in user (created on its first request, the least recently
        used user's closed beyond ``CONSOLE_USER_CLIENTS_MAX``)."""
        clients = self._users.get(creds)
        if clients is None or [c.addr for c in clients] != [b.addr for b in base]:
            if clients is not None:
                self._close_later(clients)
            clients = [self._clients(b.addr, creds, b.name) for b in base]
            self._users[creds] = clients
            while len(self._users) > limits.CONSOLE_USER_CLIENTS_MAX:
                self._close_later(self._users.popitem(last=False)[1])
        self._users.move_to_end(creds)
        return clients

    def _close_later(self, clients: list[BrokerClients]) -> None:
        async def close() -> None:
            for b in clients:
                await b.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every client and the outbox engine."""
        brokers, self._brokers = self._brokers, []
        users, self._users = list(self._users.values()), OrderedDict()
        for b in [*brokers, *(c for clients in users for c in clients)]:
            await b.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None

    async def brokers(self) -> list[BrokerClients]:
        """The brokers, found on the name servers (masters) the first time when none was given;
        their clients sign with the logged-in user's keys when :data:`current_credentials` is set.

        Raises:
            BrokerUnavailable: no name server answers, or it knows no master.
        """
        if not self._brokers:
            async with self._lock:
                if not self._brokers:
                    for name, addr in (await self._discover()).items():
                        self._add(addr, name)
        creds = current_credentials.get()
        return self._brokers if creds is None else self._user_clients(creds, self._brokers)

    async def addresses(self) -> list[str]:
        """The brokers' addresses (``host:port``), as :meth:`brokers` finds them."""
        token = current_credentials.set(None)
        try:
            return [b.addr for b in await self.brokers()]
        finally:
            current_credentials.reset(token)

    async def _discover(self) -> dict[str, str]:
        """Broker name → master address of every broker group the first name server that answers
        lists (of ``config.cluster`` when given; possibly none). Raises BrokerUnavailable (no name
        server answered), ConfigError (no such cluster)."""
        last: Exception | None = None
        for ns in self.config.namesrv_addr.split(";"):
            conn = AsyncConnection(ns.strip(), None, limits.REQUEST_TIMEOUT_MS)
            try:
                await conn.connect()
                r = await conn.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                if r.code != ResponseCode.SUCCESS:
                    raise RemoteError.of(r.code, r.remark or "")
                info = decode_cluster_info(r.body) if r.body else ClusterInfo()
                return info.masters(self.config.cluster)
            except ConfigError:
                raise
            except Exception as exc:
                last = exc
            finally:
                await conn.close()
        raise BrokerUnavailable(f"no master broker found on {self.config.namesrv_addr}: {last}")

    async def refresh_brokers(self) -> list[BrokerClients]:
        """With name servers and no fixed broker list: the masters they list now (brokers that
        registered since are added, those no longer listed are dropped), then :meth:`brokers`.
        What a topic is created on, so that it reaches every master of the cluster."""
        if self.config.namesrv_addr and not self.config.brokers:
            masters = await self._discover()
            async with self._lock:
                gone = [b for b in self._brokers if b.addr not in masters.values()]
                self._brokers = [b for b in self._brokers if b not in gone]
                for name, addr in masters.items():
                    self._add(addr, name)
                self._brokers.sort(key=lambda b: b.name or b.addr)
                if gone:
                    self._close_later(gone)
        return await self.brokers()

    async def each(self, fn: Callable[[BrokerClients], Awaitable[T]]) -> list[T]:
        """``fn`` on every broker, concurrently; answers in broker order."""
        return list(await asyncio.gather(*(fn(b) for b in await self.brokers())))

    # -- overview -------------------------------------------------------------------------------
    async def overview(self) -> Overview:
        """Brokers, current rates and backlogs, and the History."""
        infos = await self.each(self._broker_info)
        tx_counts = await self.each(lambda b: b.admin.transaction_stats())
        groups = await self.each(self._replication)
        last = self.history.latest()
        return Overview(brokers=[i for i, _ in infos],
                        in_per_s=last.in_per_s if last else 0.0,
                        out_per_s=last.out_per_s if last else 0.0,
                        half_backlog=sum(r.pending_transactions for _, r in infos),
                        discarded=sum(c.get("PARKED", 0) for c in tx_counts),
                        parked=sum(r.parked_stored for _, r in infos),
                        history=self.history.snapshot(),
                        replication=[m for g in groups for m in g])

    async def _replication(self, b: BrokerClients) -> list[ReplicaMember]:
        """The broker group as broker ``b`` sees it (GET_BROKER_HA_STATUS)."""
        ha = await b.admin.ha_status()
        return [ReplicaMember(group=ha.broker_name, seen_by=b.addr,
                              **msgspec.structs.asdict(m)) for m in ha.members(b.addr)]

    async def _broker_info(self, b: BrokerClients) -> tuple[BrokerInfo, BrokerRuntimeInfo]:
        r = await b.admin.call(RequestCode.GET_BROKER_RUNTIME_INFO)
        if r.code != ResponseCode.SUCCESS:
            raise RemoteError.of(r.code, r.remark or "")
        info = BrokerRuntimeInfo.decode(r.body)
        table = msgspec.json.decode(r.body, type=dict[str, dict[str, str]]).get("table", {})
        version = table.get("brokerVersionDesc") or f"remoting v{r.version}"
        if not b.name:
            b.name = await self._broker_name(b)
        return BrokerInfo(name=b.name, addr=b.addr, version=version,
                          store_bytes=info.commit_log_max_offset - info.commit_log_min_offset,
                          disk_ratio=round(info.commit_log_disk_ratio, 4),
                          commitlog_max_offset=info.commit_log_max_offset,
                          uptime_ms=max(0, info.now_ms - info.boot_ms)), info

    async def _broker_name(self, b: BrokerClients) -> str:
        """The broker's name as its routes give it (its address when it has no topic)."""
        for topic in sorted((await b.admin.topic_configs()).topic_config_table):
            try:
                route = await b.admin.topic_route(topic)
            except RemoteError:
                continue
            for bd in route.broker_datas:
                if b.addr in bd.broker_addrs.values() or len(route.broker_datas) == 1:
                    return bd.broker_name
        return b.addr

    async def sample(self) -> Sample:
        """One History sample over every broker (the History calls it)."""
        parts = await self.each(self._sample_one)
        lag: dict[str, int] = {}
        for _, _, _, per_group in parts:
            for g, n in per_group.items():
                lag[g] = lag.get(g, 0) + n
        return Sample(t_ms=_now_ms(), produced={k: v for p in parts for k, v in p[0].items()},
                      consumed={k: v for p in parts for k, v in p[1].items()},
                      half_backlog=sum(p[2] for p in parts), lag=lag)

    async def _sample_one(self, b: BrokerClients
                          ) -> tuple[dict[Any, int], dict[Any, int], int, dict[str, int]]:
        cfgs = (await b.admin.topic_configs()).topic_config_table
        topics = [t for t in sorted(cfgs) if not is_system_topic(t)]
        stats = await asyncio.gather(*(or_empty(self._queue_stats(b, t)) for t in topics))
        produced = {(b.addr, t, q.queue_id): q.max_offset
                    for t, qs in zip(topics, stats, strict=True) for q in qs}
        groups = (await b.admin.groups())[: limits.CONSOLE_SAMPLE_GROUPS_MAX]
        per_group = await asyncio.gather(*(or_empty(b.admin.consume_stats(g.group)) for g in groups))
        consumed: dict[Any, int] = {}
        lag: dict[str, int] = {}
        for g, qs in zip(groups, per_group, strict=True):
            lag[g.group] = sum(q.lag for q in qs)
            for q in qs:
                if q.consumer_offset >= 0 and not q.topic.startswith(RETRY_PREFIX):
                    consumed[(b.addr, g.group, q.topic, q.queue_id)] = q.consumer_offset
        half = (await b.admin.runtime_info()).pending_transactions
        return produced, consumed, half, lag

    async def _queue_stats(self, b: BrokerClients, topic: str) -> list[TopicQueue]:
        table = await b.admin.topic_stats(topic)
        return [TopicQueue(queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset,
                           last_update_ms=q.last_update_timestamp, broker=b.name or b.addr)
                for q in table.offset_table]

    # -- topics ---------------------------------------------------------------------------------
    async def topics(self, system: bool = False) -> list[TopicSummary]:
        """Every topic (system, retry and DLQ topics only with ``system``), offsets summed."""
        merged: dict[str, TopicSummary] = {}
        for rows in await self.each(lambda b: self._topic_rows(b, system)):
            for r in rows:
                cur = merged.get(r.topic)
                merged[r.topic] = r if cur is None else TopicSummary(
                    topic=r.topic, queues=cur.queues + r.queues, perm=cur.perm | r.perm,
                    min_offset=cur.min_offset + r.min_offset, max_offset=cur.max_offset + r.max_offset,
                    messages=cur.messages + r.messages)
        return [merged[t] for t in sorted(merged)]

    async def _topic_rows(self, b: BrokerClients, system: bool) -> list[TopicSummary]:
        cfgs = (await b.admin.topic_configs()).topic_config_table
        names = [t for t in sorted(cfgs) if system or not is_system_topic(t)]
        stats = await asyncio.gather(*(or_empty(self._queue_stats(b, t)) for t in names))
        out = []
        for t, qs in zip(names, stats, strict=True):
            lo, hi = sum(q.min_offset for q in qs), sum(q.max_offset for q in qs)
            out.append(TopicSummary(topic=t, queues=cfgs[t].write_queue_nums, perm=cfgs[t].perm,
                                    min_offset=lo, max_offset=hi, messages=hi - lo))
        return out

    async def _queue_counts(self, topic: str) -> dict[str, int]:
        """Broker address → queue count of ``topic``, for the brokers that have it."""
        cfgs = await self.each(lambda b: b.admin.topic_configs())
        return {b.addr: c.topic_config_table[topic].write_queue_nums
                for b, c in zip(await self.brokers(), cfgs, strict=True) if topic in c.topic_config_table}

    async def topic(self, topic: str) -> TopicDetail:
        """One topic's queues and route. Raises InvalidRequest (bad name), TOPIC_NOT_EXIST."""
        check_topic(topic)
        have = await self._queue_counts(topic)
        if not have:
            raise bad(f"topic {topic!r} does not exist", ResponseCode.TOPIC_NOT_EXIST)
        queues = [q for qs in await self.each(lambda b: or_empty(self._queue_stats(b, topic)))
                  for q in qs]
        brokers = await self.brokers()
        try:
            route: dict[str, Any] = msgspec.to_builtins(await brokers[0].admin.topic_route(topic))
        except RemoteError as exc:
            route = {"error": str(exc)}
        return TopicDetail(topic=topic, queues=queues, route=route)

    async def create_topic(self, topic: str, queues: int) -> TopicQueues:
        """Create ``topic`` with ``queues`` queues on every broker: with name servers, every
        master they list now (mqadmin ``updateTopic -c``). Raises InvalidRequest: an illegal or
        reserved name, a queue count out of range, TOPIC_EXIST_ALREADY; BrokerUnavailable naming
        the brokers that failed (and those where it was created) when some did."""
        _check_send_topic(topic)
        _check_queues(queues)
        brokers = await self.refresh_brokers()
        if have := await self._queue_counts(topic):
            raise bad(f"topic {topic} exists ({max(have.values())} queues); update it instead",
                      ResponseCode.TOPIC_EXIST_ALREADY)
        made = await _on_all(brokers, lambda b: b.admin.update_topic(topic, queues), f"topic {topic}")
        return TopicQueues(topic=topic, queues=min(made))

    async def update_topic(self, topic: str, queues: int) -> TopicQueues:
        """Widen ``topic`` to ``queues`` queues (txmq never takes queues away: fewer is refused).
        Raises InvalidRequest: bad name or count, TOPIC_NOT_EXIST, fewer queues than now."""
        _check_send_topic(topic)
        _check_queues(queues)
        await self.refresh_brokers()
        have = await self._queue_counts(topic)
        if not have:
            raise bad(f"topic {topic} does not exist; create it first", ResponseCode.TOPIC_NOT_EXIST)
        if queues < max(have.values()):
            raise bad(f"topic {topic} has {max(have.values())} queues; txmq cannot shrink a topic",
                      ResponseCode.MESSAGE_ILLEGAL)
        made = await asyncio.gather(*(b.admin.update_topic(topic, queues)
                                      for b in await self.brokers() if b.addr in have))
        return TopicQueues(topic=topic, queues=min(made))

    async def delete_topic(self, topic: str) -> TopicDeleted:
        """Delete ``topic`` from every broker that has it (and the name servers' routes)."""
        _check_send_topic(topic)
        have = await self._queue_counts(topic)
        if not have:
            raise bad(f"topic {topic} does not exist", ResponseCode.TOPIC_NOT_EXIST)
        remarks = await asyncio.gather(*(b.admin.delete_topic(topic)
                                         for b in await self.brokers() if b.addr in have))
        return TopicDeleted(topic=topic, deleted=True, detail="; ".join(remarks))

    # -- groups ---------------------------------------------------------------------------------
    async def _group_infos(self) -> dict[str, ConsumerGroupInfo]:
        merged: dict[str, ConsumerGroupInfo] = {}
        for infos in await self.each(lambda b: b.admin.groups()):
            for g in infos:
                cur = merged.setdefault(g.group, ConsumerGroupInfo(group=g.group))
                cur.message_model = cur.message_model or g.message_model
                cur.client_ids = sorted(set(cur.client_ids) | set(g.client_ids))
                cur.subscriptions = cur.subscriptions | g.subscriptions
                cur.offset_topics = sorted(set(cur.offset_topics) | set(g.offset_topics))
        return merged

    async def _consume_stats(self, group: str, topic: str = "") -> list[GroupQueue]:
        async def one(b: BrokerClients) -> list[GroupQueue]:
            stats: list[QueueConsumeStats] = await or_empty(b.admin.consume_stats(group, topic))
            return [GroupQueue(topic=s.topic, queue_id=s.queue_id, broker_offset=s.broker_offset,
                               consumer_offset=s.consumer_offset, lag=s.lag, broker=b.name or b.addr)
                    for s in stats]
        return [q for qs in await self.each(one) for q in qs]

    async def groups(self) -> list[GroupSummary]:
        """Every consumer group with its lag. ``inflight`` is 0: the broker does not report
        messages pulled but not yet acknowledged."""
        infos = await self._group_infos()
        stats = await asyncio.gather(*(self._consume_stats(g) for g in infos))
        return [GroupSummary(group=g.group, model=g.message_model, members=len(g.client_ids),
                             subscriptions=_user_topics(g),
                             lag=sum(q.lag for q in qs), inflight=0)
                for g, qs in zip(infos.values(), stats, strict=True)]

    async def group(self, group: str) -> GroupDetail:
        """One group: members, subscriptions, per-queue lag and its lag history. Raises
        InvalidRequest: bad name, SUBSCRIPTION_GROUP_NOT_EXIST."""
        check_group(group)
        info = (await self._group_infos()).get(group)
        if info is None:
            raise bad(f"consumer group {group} is neither online nor has offsets",
                      ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
        queues = await self._consume_stats(group)
        members = [ConsumerMember(client_id=c, addr=c.split("@", 1)[0], language="", version="")
                   for c in info.client_ids]
        subs = [Subscription(topic=t, expression=info.subscriptions.get(t, "")) for t in _user_topics(info)]
        return GroupDetail(group=group, model=info.message_model, members=members, subscriptions=subs,
                           queues=queues, lag=sum(q.lag for q in queues),
                           lag_history=self.history.lag_history(group))

    async def reset_offset(self, group: str, topic: str, timestamp_ms: int) -> ResetOffsetResult:
        """Move ``group``'s offsets of ``topic`` to the first message stored at or after
        ``timestamp_ms``. Raises InvalidRequest: bad names or time, unknown group or topic."""
        check_group(group)
        check_topic(topic)
        check_timestamp(timestamp_ms)
        if group not in await self._group_infos():
            raise bad(f"consumer group {group} is neither online nor has offsets",
                      ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
        have = await self._queue_counts(topic)
        if not have:
            raise bad(f"topic {topic} does not exist", ResponseCode.TOPIC_NOT_EXIST)
        entries = await asyncio.gather(*(b.admin.reset_offset(group, topic, timestamp_ms=timestamp_ms)
                                         for b in await self.brokers() if b.addr in have))
        return ResetOffsetResult(group=group, topic=topic, queues=[
            ResetQueue(queue_id=e.queue_id, offset=e.new_offset) for es in entries for e in es])

    # -- dead-letter queues ---------------------------------------------------------------------
    async def dlqs(self) -> list[DlqSummary]:
        """Every group's DLQ that exists, with its message count."""
        counts: dict[str, int] = {}
        for rows in await self.each(lambda b: self._topic_rows(b, True)):
            for r in rows:
                if r.topic.startswith(DLQ_PREFIX):
                    counts[r.topic] = counts.get(r.topic, 0) + r.messages
        return [DlqSummary(group=t[len(DLQ_PREFIX):], topic=t, messages=n) for t, n in sorted(counts.items())]

    async def dlq(self, group: str, page: int = 0, size: int = 50) -> DlqPage:
        """Page ``page`` (``size`` messages, oldest first) of ``%DLQ%<group>``; empty when the
        group has no DLQ."""
        check_group(group)
        check_page(size, "size")
        if page < 0:
            raise bad(f"page {page} is negative")
        topic = dlq_topic(group)
        ranges = [(b, q) for b, qs in zip(await self.brokers(),
                                          await self.each(lambda b: or_empty(self._queue_stats(b, topic))),
                                          strict=True) for q in qs]
        total = sum(q.max_offset - q.min_offset for _, q in ranges)
        skip, items = page * size, list[MessageExt]()
        for b, q in ranges:
            n = q.max_offset - q.min_offset
            if skip >= n:
                skip -= n
                continue
            want = size - len(items)
            items += await read_queue(b.reader, topic, q.queue_id, q.min_offset + skip, want)
            skip = 0
            if len(items) >= size:
                break
        return DlqPage(group=group, total=total, items=[_convert.message_summary(m) for m in items])

    async def dlq_message(self, group: str, msg_id: str) -> MessageDetail:
        """The newest DLQ entry of ``msg_id`` in ``%DLQ%<group>``. Raises QUERY_NOT_FOUND."""
        check_group(group)
        check_ident(msg_id)
        found = [m for ms in await self.each(lambda b: or_empty(b.admin.view_message(msg_id)))
                 for m in ms if m.topic == dlq_topic(group)]
        if not found:
            raise bad(f"{msg_id} is not in {dlq_topic(group)}", ResponseCode.QUERY_NOT_FOUND)
        return _convert.message_detail(max(found, key=lambda m: m.store_timestamp_ms))

    async def resend_dlq(self, group: str, msg_ids: list[str]) -> ResendPage:
        """Put DLQ messages back in ``%RETRY%<group>`` (retry count reset); ``msg_ids`` empty =
        every id. Raises QUERY_NOT_FOUND (nothing resent) when an id is not in the DLQ. The resent
        copy keeps its message id (``new_msg_id``)."""
        check_group(group)
        held = await self.each(lambda b: b.admin.dlq_messages(group, limits.CONSOLE_EXPORT_MESSAGES_MAX))
        ids_at = [{m.msg_id for m in ms} for ms in held]
        wanted = list(dict.fromkeys(msg_ids)) or list(dict.fromkeys(m.msg_id for ms in held for m in ms))
        unknown = [i for i in wanted if not any(i in ids for ids in ids_at)]
        if unknown:
            raise bad(f"not in {dlq_topic(group)}: {', '.join(unknown[:10])}", ResponseCode.QUERY_NOT_FOUND)
        results: dict[str, ResendResultModel] = {}
        for b, ids in zip(await self.brokers(), ids_at, strict=True):
            mine = [i for i in wanted if i in ids and i not in results]
            if mine:
                for r in await b.admin.resend_dlq(group, mine):
                    results[r.msg_id] = ResendResultModel(
                        msg_id=r.msg_id, ok=r.status == "OK", error="" if r.status == "OK" else
                        (r.detail or r.status), new_msg_id=r.msg_id if r.status == "OK" else "")
        return ResendPage(results=[results[i] for i in wanted])

    async def export_dlq(self, group: str, fmt: str = "json") -> tuple[str, bytes]:
        """The whole DLQ (at most ``CONSOLE_EXPORT_MESSAGES_MAX``) as ``(media type, bytes)``:
        JSON (a list of records) or CSV (properties as a JSON column)."""
        check_group(group)
        if fmt not in ("json", "csv"):
            raise bad(f"format {fmt!r} is not json or csv")
        msgs = [m for ms in await self.each(
            lambda b: b.admin.dlq_messages(group, limits.CONSOLE_EXPORT_MESSAGES_MAX)) for m in ms]
        if fmt == "csv":
            return "text/csv", _convert.export_csv(msgs)
        return "application/json", _convert.export_json(msgs)

    # -- messages -------------------------------------------------------------------------------
    async def messages(self, topic: str = "", key: str = "", begin_ms: int = 0,
                       end_ms: int = 0, msg_id: str = "", trace_id: str = "") -> MessageList:
        """By ``msg_id`` (the message and its half, retry and DLQ copies), by ``topic`` and
        ``key`` stored in ``[begin_ms, end_ms]`` (``end_ms`` 0 = now), or by W3C ``trace_id``
        (the transactions the brokers recorded in that trace: :mod:`._tx_life`), newest first,
        at most ``QUERY_MESSAGE_MAX_NUM`` per broker."""
        if trace_id:
            trace_id = trace_id.strip().lower()
            if len(trace_id) != 32 or not all(c in "0123456789abcdef" for c in trace_id):
                raise bad(f"trace id {trace_id[:40]!r} is not 32 hex digits")
            found = [m for b in await self.brokers() for m in await _traced(b, trace_id)]
        elif msg_id:
            check_ident(msg_id)
            found = [m for ms in await self.each(lambda b: or_empty(b.admin.view_message(msg_id)))
                     for m in ms]
        else:
            if not topic or not key:
                raise bad("give msg_id, or topic and key")
            check_topic(topic)
            end = end_ms or _now_ms()
            check_timestamp(begin_ms, "begin_ms")
            check_timestamp(end, "end_ms")
            if begin_ms > end:
                raise bad(f"begin_ms {begin_ms} is after end_ms {end}")
            if not await self._queue_counts(topic):
                raise bad(f"topic {topic} does not exist", ResponseCode.TOPIC_NOT_EXIST)
            found = [m for ms in await self.each(lambda b: or_empty(b.admin.query_messages(
                topic, key, begin_ms=begin_ms, end_ms=end, max_num=limits.QUERY_MESSAGE_MAX_NUM)))
                for m in ms]
        found.sort(key=lambda m: -m.store_timestamp_ms)
        return MessageList(items=[_convert.message_summary(m) for m in found])

    async def message(self, msg_id: str) -> MessageTrace:
        """``msg_id`` and its trace (see :func:`txmq.console._trace.message_trace`). Raises
        QUERY_NOT_FOUND."""
        check_ident(msg_id)
        return await _trace.message_trace(await self.brokers(), msg_id)

    async def msg_trace(self, msg_id: str, trace_topics: list[str] | None = None) -> _msgtrace.MsgTracePage:
        """``msg_id``'s RocketMQ message trace records (:func:`txmq.console._msgtrace.msg_trace`;
        ``trace_topics``: custom trace topics). Raises InvalidRequest (bad id or topic)."""
        check_ident(msg_id)
        return await _msgtrace.msg_trace(await self.brokers(), msg_id, trace_topics)

    # -- outbox ---------------------------------------------------------------------------------
    async def outbox(self) -> OutboxSummary:
        """The outbox tables' counts. Raises QUERY_NOT_FOUND when no ``outbox_url`` was given."""
        if self._outbox is None:
            raise bad("no outbox database: start the console with --outbox-url", ResponseCode.QUERY_NOT_FOUND)
        summary: OutboxSummary = await asyncio.to_thread(self._outbox.summary, _now_ms())
        return summary


def _user_topics(g: ConsumerGroupInfo) -> list[str]:
    """The topics a group subscribes to or has offsets of, without its own retry topic."""
    return sorted(t for t in set(g.subscriptions) | set(g.offset_topics) if t != retry_topic(g.group))


async def _traced(b: BrokerClients, trace_id: str) -> list[MessageExt]:
    """One stored copy (the committed message, else its half) of each transaction broker ``b``
    recorded in W3C trace ``trace_id``."""
    out = []
    for i in await _tx_life.trace_msg_ids(b, trace_id):
        copies = [m for m in await or_empty(b.admin.view_message(i)) if m.msg_id == i]
        out += ([m for m in copies if not is_system_topic(m.topic)] or copies)[:1]
    return out
