"""The pull consumer, asyncio API, and the pull and offset requests every consumer shares.

:class:`AsyncPullConsumer` reads by explicit offsets (the Spark source does), or keeps positions for
an assigned or subscribed set of queues (RocketMQ ``DefaultLitePullConsumer``): ``assign`` or
``subscribe``, ``poll``, ``seek``, ``commit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any

from txmq import limits
from txmq.client._client import ClientBase, supervised
from txmq.client._connection import AsyncConnection
from txmq.client._core import (
    ConsumeFromWhere,
    PullResult,
    PullStatus,
    RawPullResult,
    allocate,
    check_response,
    consumer_heartbeat,
    mq_sort_key,
    start_offset_source,
)
from txmq.client._pulling import PullNodeTable, pull_result, subscribe_broker_id
from txmq.client._tracing import receive_started, received
from txmq.errors import ConfigError, RemoteError, ResponseCode, TransportError
from txmq.protocol import (
    MASTER_ID,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    Command,
    GetConsumerListByGroupRequestHeader,
    GetConsumerListByGroupResponseBody,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    HeartbeatData,
    MessageExt,
    MessageQueue,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    RequestCode,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_body,
    decode_message_exts_bulk,
    from_ext,
    to_ext,
)
from txmq.tracing import Tracing

__all__ = ["DEFAULT_TIMESTAMP_AGO_MS", "AsyncPullConsumer", "PullMixin", "wall_ms"]

log = logging.getLogger("txmq.client.consumer")

DEFAULT_TIMESTAMP_AGO_MS = 30 * 60_000
"""RocketMQ ``consumeTimestamp`` defaults to half an hour before the consumer starts."""


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def validate_group(group: str) -> None:
    """Raise ConfigError for an empty group name or one holding ``@`` (the offset key separator)."""
    if not group or "@" in group:
        raise ConfigError(f"consumer group {group!r} must be non-empty and hold no '@'")


class PullMixin(ClientBase):
    """Pull and offset requests, each to the broker group of its queue.

    Every queue-addressed method takes ``(topic, queue_id)`` and a keyword ``broker_name``: the
    queue's broker group (``MessageQueue.broker_name``); "" means the topic's only broker group.
    Offset requests go to the group's master; pulls to the member :class:`PullNodeTable` picks.
    """

    group: str

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._pull_nodes = PullNodeTable()

    async def _broker_of(self, topic: str, broker_name: str) -> str:
        """``broker_name``, or for "" the topic's only broker group.

        Raises:
            ConfigError: "" for a topic on several broker groups (they are named).
            RemoteError: TOPIC_NOT_EXIST (with name servers; a client given only a broker's
                address sends to that broker).
        """
        if broker_name:
            return broker_name
        try:
            names = (await self.route(topic)).broker_names()
        except RemoteError as exc:
            if self._namesrvs or exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            return ""  # no route yet: the broker we were given answers (as before routes)
        if len(names) > 1:
            raise ConfigError(f"topic {topic!r} is on broker groups {names}; "
                              "give broker_name= (see queues())")
        return names[0] if names else ""

    async def _mq_of(self, topic: str, queue_id: int, broker_name: str) -> MessageQueue:
        return MessageQueue(topic, queue_id, await self._broker_of(topic, broker_name))

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` over every broker group, in RocketMQ's order (topic,
        broker name, queue id; RocketMQ ``fetchSubscribeMessageQueues``). The route is fetched
        again first. Raises RemoteError(TOPIC_NOT_EXIST), BrokerUnavailable, RequestTimeout."""
        return sorted((await self.route(topic, refresh=True)).subscribe, key=mq_sort_key)

    async def _pull_raw(self, topic: str, queue_id: int, offset: int, max_nums: int,
                        suspend_ms: int = 0, commit_offset: int = -1,
                        subscription: str = "*", *, broker_name: str = "") -> RawPullResult:
        mq = await self._mq_of(topic, queue_id, broker_name)
        bid = self._pull_nodes.choose(mq, self.broker_addresses(mq.broker_name))
        commit = commit_offset >= 0 and bid == MASTER_ID  # a slave takes no offsets (RocketMQ)
        flags = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend_ms > 0 else 0) | (
            PULL_FLAG_COMMIT_OFFSET if commit else 0)
        h = PullMessageRequestHeader(consumer_group=self.group, topic=topic, queue_id=queue_id,
                                     queue_offset=offset, max_msg_nums=max_nums, sys_flag=flags,
                                     suspend_timeout_millis=suspend_ms,
                                     commit_offset=max(commit_offset, 0) if commit else 0,
                                     subscription=subscription)
        timeout = (suspend_ms + self._timeout_ms) / 1000
        try:
            resp = await self.call_broker(mq.broker_name, RequestCode.PULL_MESSAGE, to_ext(h),
                                          timeout_s=timeout, topic=topic, broker_id=bid)
        except TransportError as exc:
            if bid == MASTER_ID:
                raise
            # the suggested slave is gone (killed, or not yet dropped from the routes): the
            # master serves this pull and the next ones until a pull answer suggests otherwise
            log.info("pull of %s from %s id %d failed (%s); pulling from the master", mq,
                     mq.broker_name, bid, exc)
            self._pull_nodes.update(mq, MASTER_ID)
            resp = await self.call_broker(mq.broker_name, RequestCode.PULL_MESSAGE, to_ext(h),
                                          timeout_s=timeout, topic=topic)
        result, suggested = pull_result(resp, offset)
        self._pull_nodes.update(mq, suggested)
        return result

    async def _pull(self, topic: str, queue_id: int, offset: int, max_nums: int,
                    suspend_ms: int = 0, commit_offset: int = -1,
                    subscription: str = "*", *, broker_name: str = "") -> PullResult:
        r = await self._pull_raw(topic, queue_id, offset, max_nums, suspend_ms, commit_offset,
                                 subscription, broker_name=broker_name)
        msgs = decode_message_exts_bulk(r.body) if r.status is PullStatus.FOUND else []
        expr = subscription.strip()
        if msgs and expr not in ("", "*"):
            # the broker filters by tag hash; two tags may share one (RocketMQ
            # PullAPIWrapper.processPullResult checks the tags themselves too)
            wanted = {t.strip() for t in expr.split("||")}
            msgs = [m for m in msgs if m.tags in wanted]
        return PullResult(r.status, msgs, r.next_begin_offset, r.min_offset, r.max_offset)

    async def _call_master(self, topic: str, broker_name: str, code: RequestCode,
                           ext: dict[str, str]) -> Command:
        name = await self._broker_of(topic, broker_name)
        return await self.call_broker(name, code, ext, topic=topic)

    async def _offset_of(self, topic: str, broker_name: str, code: RequestCode,
                         ext: dict[str, str]) -> int:
        resp = check_response(await self._call_master(topic, broker_name, code, ext))
        return from_ext(resp.ext, OffsetResponseHeader).offset

    async def min_offset(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """Smallest readable queue offset (asked of the group's master).

        Raises:
            ConfigError: ``broker_name`` "" for a topic on several broker groups.
            RemoteError, BrokerUnavailable (the group has no master), RequestTimeout.
        """
        h = GetMinOffsetRequestHeader(topic=topic, queue_id=queue_id)
        return await self._offset_of(topic, broker_name, RequestCode.GET_MIN_OFFSET, to_ext(h))

    async def max_offset(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """Next queue offset to be written (exclusive end of what is readable). Raises as
        :meth:`min_offset`."""
        h = GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
        return await self._offset_of(topic, broker_name, RequestCode.GET_MAX_OFFSET, to_ext(h))

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, *,
                            broker_name: str = "") -> int:
        """The first queue offset stored at or after ``timestamp_ms`` (ms since the epoch); the max
        offset when every message is older (RocketMQ ``searchOffset``). Raises as
        :meth:`min_offset`."""
        h = SearchOffsetRequestHeader(topic=topic, queue_id=queue_id, timestamp=timestamp_ms)
        return await self._offset_of(topic, broker_name, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                                     to_ext(h))

    async def fetch_consumer_offset(self, topic: str, queue_id: int, *,
                                    broker_name: str = "") -> int | None:
        """The group's committed offset on the queue's master, or None if it has none. Raises as
        :meth:`min_offset`."""
        h = QueryConsumerOffsetRequestHeader(consumer_group=self.group, topic=topic,
                                             queue_id=queue_id, set_zero_if_not_found=False)
        resp = await self._call_master(topic, broker_name, RequestCode.QUERY_CONSUMER_OFFSET,
                                       to_ext(h))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return from_ext(check_response(resp).ext, OffsetResponseHeader).offset

    async def commit_offset(self, topic: str, queue_id: int, offset: int, *,
                            broker_name: str = "") -> None:
        """Store the group's offset for one queue on its broker group's master (never a slave).
        Raises as :meth:`min_offset`; BrokerUnavailable when the group has no master now."""
        h = UpdateConsumerOffsetRequestHeader(consumer_group=self.group, topic=topic,
                                              queue_id=queue_id, commit_offset=offset)
        check_response(await self._call_master(topic, broker_name,
                                               RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(h)))

    async def consumer_ids(self, topic: str = "") -> list[str]:
        """The group's members as a broker knows them (GET_CONSUMER_LIST_BY_GROUP): with a
        ``topic``, asked of its broker groups in random order until one answers (RocketMQ
        ``findBrokerAddrByTopic``: a random broker of the route, its master else a slave);
        without, of the default broker.

        Raises:
            BrokerUnavailable, RequestTimeout, RemoteError: no broker answered (the last error).
        """
        h = GetConsumerListByGroupRequestHeader(consumer_group=self.group)
        if not topic:
            r = check_response(await self.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, to_ext(h)))
            return decode_body(r.body, GetConsumerListByGroupResponseBody).consumer_id_list
        route = await self.route(topic)
        names = route.broker_names()
        random.shuffle(names)
        last: Exception | None = None
        for name in names:
            addrs = route.brokers[name]
            bid = MASTER_ID if MASTER_ID in addrs else subscribe_broker_id(addrs, MASTER_ID)
            try:
                r = check_response(await self.call_broker(
                    name, RequestCode.GET_CONSUMER_LIST_BY_GROUP, to_ext(h), topic=topic,
                    broker_id=MASTER_ID if bid is None else bid))
                return decode_body(r.body, GetConsumerListByGroupResponseBody).consumer_id_list
            except (TransportError, RemoteError) as exc:
                log.warning("consumer ids of %s from %s: %s", self.group, name, exc)
                last = exc
        if last is None:
            return await self.consumer_ids()
        raise last

    async def _initial_offset(self, mq: MessageQueue, stored: int | None,
                              consume_from_where: ConsumeFromWhere, timestamp_ms: int) -> int:
        src = start_offset_source(stored, mq.topic, consume_from_where)
        b = mq.broker_name
        if src == "min":
            return await self.min_offset(mq.topic, mq.queue_id, broker_name=b)
        if src == "max":
            return await self.max_offset(mq.topic, mq.queue_id, broker_name=b)
        if src == "timestamp":
            return await self.search_offset(mq.topic, mq.queue_id, timestamp_ms, broker_name=b)
        return src


def _mq(q: MessageQueue | tuple[str, int]) -> MessageQueue:
    return q if isinstance(q, MessageQueue) else MessageQueue(q[0], int(q[1]))


class AsyncPullConsumer(PullMixin):
    """Reads queues at offsets the application controls (RocketMQ ``DefaultLitePullConsumer``).

    Three ways to use it:

    - explicit: :meth:`pull` ``(topic, queue, offset, broker_name=)``; nothing is remembered
      (the Spark source); :meth:`queues` lists a topic's queues over every broker group;
    - assign: :meth:`assign` a set of queues, then :meth:`poll`, :meth:`seek`, :meth:`commit`;
    - subscribe: :meth:`subscribe` topics; the group's members share the queues of every broker
      group (average allocation, rebalanced as members come and go) and each polls its share.

    A queue is ``(topic, queue_id)`` plus a keyword ``broker_name`` (its broker group); ""
    means the topic's only broker group (ConfigError naming the groups when it has several).
    A queue's position starts at the group's committed offset, else per ``consume_from_where``.
    Offsets are committed only by :meth:`commit` / :meth:`commit_offset` (at least once: commit
    after processing what :meth:`poll` returned), always to the broker group's master.

    Args:
        endpoints: broker address ``host:port`` ("" with ``namesrv_addr``).
        consumer_group: group name (offsets committed under it).
        consume_from_where: start of a queue with no committed offset.
        consume_timestamp_ms: start time for ``CONSUME_FROM_TIMESTAMP`` (default: 30 min ago).
        pull_batch_size: most messages per queue per poll.
        timeout_ms: request timeout.
        namesrv_addr: name servers ``host:port;host:port``: routes come from there.
        access_key, secret_key: ACL credentials; every request is signed (docs/security.md).
        tls, tls_ca_file, tls_verify_hostname: TLS to the broker (RocketMQ ``tls.enable``; the
            certificate is checked against ``tls_ca_file`` or the system's CAs; docs/security.md).
        tracing: True (the global tracer provider), False, or a :class:`~txmq.tracing.Tracing`:
            a ``pull`` / ``poll`` receive span per call that returned messages, linked to each
            message's creation context (docs/tracing.md; :meth:`pull_raw` is not traced).
    """

    def __init__(self, endpoints: str = "", consumer_group: str = "txmq-pull", *,
                 consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 consume_timestamp_ms: int | None = None,
                 pull_batch_size: int = limits.PULL_BATCH_SIZE,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 access_key: str = "", secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True, tracing: Tracing | bool = True) -> None:
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname, tracing=tracing)
        validate_group(consumer_group)
        self.group = consumer_group
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = (consume_timestamp_ms if consume_timestamp_ms is not None
                                     else wall_ms() - DEFAULT_TIMESTAMP_AGO_MS)
        self.pull_batch_size = max(1, min(pull_batch_size, limits.PULL_BATCH_MAX))
        self.subscriptions: dict[str, str] = {}
        self._positions: dict[MessageQueue, int] = {}  # -1: not resolved yet
        self._mode: str = ""
        self._rebalance_now: asyncio.Event | None = None

    @property
    def _heartbeats_slaves(self) -> bool:
        return True  # a consumer may read from slaves (RocketMQ sendHeartbeatToAllBroker)

    async def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of a topic on one broker group (the route is fetched again first).

        Raises:
            ConfigError: the topic is on several broker groups (use :meth:`queues`).
            RemoteError: TOPIC_NOT_EXIST.
        """
        route = await self.route(topic, refresh=True)
        name = await self._broker_of(topic, "")
        return sorted(mq.queue_id for mq in route.subscribe if mq.broker_name == name)

    async def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32, *,
                   broker_name: str = "") -> PullResult:
        """Up to ``max_nums`` messages from ``offset`` (no waiting, no position kept), from the
        master of ``broker_name`` or the member it suggested.

        Raises:
            ConfigError: ``broker_name`` "" for a topic on several broker groups.
            RemoteError, BrokerUnavailable, RequestTimeout, MalformedMessage (a body that does
                not decode).
        """
        started = receive_started(self.tracing)
        r = await self._pull(topic, queue_id, offset, max(1, min(max_nums, limits.PULL_BATCH_MAX)),
                             broker_name=broker_name)
        received(self.tracing, started, "pull", r.messages, self.group, self.client_id)
        return r

    async def pull_raw(self, topic: str, queue_id: int, offset: int,
                       max_nums: int = 32, *, broker_name: str = "") -> RawPullResult:
        """As :meth:`pull`, but the reply body undecoded (for readers that decode it in bulk,
        such as the Spark source)."""
        return await self._pull_raw(topic, queue_id, offset,
                                    max(1, min(max_nums, limits.PULL_BATCH_MAX)),
                                    broker_name=broker_name)

    # -- assign / subscribe -------------------------------------------------------------------------
    def assign(self, queues: list[MessageQueue] | list[tuple[str, int]]) -> None:
        """Read exactly these queues (replaces any earlier assignment); MessageQueues from
        :meth:`queues` carry their broker group; a ``(topic, queue_id)`` pair (or broker name
        "") means the topic's only broker group. Raises ConfigError after :meth:`subscribe`."""
        if self._mode == "subscribe":
            raise ConfigError("assign() and subscribe() cannot be mixed")
        self._mode = "assign"
        wanted = [_mq(q) for q in queues]
        self._positions = {mq: self._positions.get(mq, -1) for mq in wanted}

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Share ``topic``'s queues with the group's other subscribed members (filtered by a tag
        expression). Call before :meth:`start`. Raises ConfigError after :meth:`assign`."""
        if self._mode == "assign":
            raise ConfigError("assign() and subscribe() cannot be mixed")
        self._mode = "subscribe"
        self.subscriptions[topic] = expression

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer reads now, in RocketMQ's order."""
        return sorted(self._positions, key=mq_sort_key)

    def _heartbeat_data(self) -> HeartbeatData:
        if self._mode != "subscribe":
            return HeartbeatData(client_id=self.client_id)
        return consumer_heartbeat(self.client_id, self.group, "CLUSTERING",
                                  dict(self.subscriptions))

    def _on_request(self, conn: AsyncConnection, cmd: Command) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and self._rebalance_now is not None:
            self._rebalance_now.set()

    async def start(self) -> None:
        """Connect (and join the group when subscribed). Raises BrokerUnavailable, RemoteError."""
        await super().start()
        if self._mode == "subscribe":
            self._rebalance_now = asyncio.Event()
            await self._rebalance()
            self._tasks.append(asyncio.create_task(supervised(
                "rebalance", self._rebalance_round, 0, lambda: self._running, self.loop_errors)))

    async def _rebalance_round(self) -> None:
        assert self._rebalance_now is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limits.REBALANCE_INTERVAL_MS / 1000):
                await self._rebalance_now.wait()
        self._rebalance_now.clear()
        if self._running:
            await self._rebalance()

    async def _rebalance(self) -> None:
        """This member's share of every subscribed topic's queues over all broker groups; none
        when the group's member list lacks it (RocketMQ ``RebalanceImpl.rebalanceByTopic``)."""
        topics = {t: list((await self.route(t, refresh=True)).subscribe) for t in self.subscriptions}
        cids = await self.consumer_ids(next(iter(self.subscriptions)))
        if self.client_id not in cids:
            log.warning("%s is not listed in group %s; it reads nothing until it is",
                        self.client_id, self.group)
        wanted = allocate(topics, cids, self.client_id, "CLUSTERING")
        for mq in set(self._positions) - wanted:
            self._pull_nodes.forget(mq)
        self._positions = {mq: self._positions.get(mq, -1) for mq in sorted(wanted, key=mq_sort_key)}

    # -- positions ----------------------------------------------------------------------------------
    def _find(self, topic: str, queue_id: int, broker_name: str) -> MessageQueue | None:
        """The assigned queue ``(topic, queue_id, broker_name)``; "" matches the only assigned
        queue of that topic and id. Raises ConfigError when "" matches several."""
        found = [mq for mq in self._positions if mq.topic == topic and mq.queue_id == queue_id
                 and (mq.broker_name == broker_name or not broker_name or not mq.broker_name)]
        exact = [mq for mq in found if mq.broker_name == broker_name]
        if exact:
            return exact[0]
        if len(found) > 1:
            raise ConfigError(f"{topic}/{queue_id} is assigned on broker groups "
                              f"{sorted(mq.broker_name for mq in found)}; give broker_name=")
        return found[0] if found else None

    async def _resolve(self, mq: MessageQueue) -> int:
        pos = self._positions.get(mq, -1)
        if pos < 0:
            stored = await self.fetch_consumer_offset(mq.topic, mq.queue_id,
                                                      broker_name=mq.broker_name)
            pos = await self._initial_offset(mq, stored, self.consume_from_where,
                                             self.consume_timestamp_ms)
            if mq in self._positions:
                self._positions[mq] = pos
        return pos

    async def position(self, topic: str, queue_id: int, *, broker_name: str = "") -> int:
        """The offset the next :meth:`poll` reads the queue from. Raises ConfigError (see
        :meth:`pull`), RemoteError, BrokerUnavailable, RequestTimeout."""
        mq = self._find(topic, queue_id, broker_name) or await self._mq_of(topic, queue_id,
                                                                           broker_name)
        return await self._resolve(mq)

    def seek(self, topic: str, queue_id: int, offset: int, *, broker_name: str = "") -> None:
        """Read the queue from ``offset`` next. Raises ConfigError if not assigned (or ""
        matches queues of several broker groups)."""
        mq = self._find(topic, queue_id, broker_name)
        if mq is None:
            raise ConfigError(f"{topic}/{queue_id}@{broker_name or '*'} is not assigned to this "
                              "consumer")
        self._positions[mq] = max(0, offset)

    async def seek_to_begin(self, topic: str, queue_id: int, *, broker_name: str = "") -> None:
        """Read from the queue's min offset next."""
        mq = self._find(topic, queue_id, broker_name)
        b = mq.broker_name if mq is not None else broker_name
        self.seek(topic, queue_id, await self.min_offset(topic, queue_id, broker_name=b),
                  broker_name=broker_name)

    async def seek_to_end(self, topic: str, queue_id: int, *, broker_name: str = "") -> None:
        """Read only messages stored from now on."""
        mq = self._find(topic, queue_id, broker_name)
        b = mq.broker_name if mq is not None else broker_name
        self.seek(topic, queue_id, await self.max_offset(topic, queue_id, broker_name=b),
                  broker_name=broker_name)

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int, *,
                                   broker_name: str = "") -> int:
        """See :meth:`search_offset` (RocketMQ ``offsetForTimestamp``)."""
        return await self.search_offset(topic, queue_id, timestamp_ms, broker_name=broker_name)

    async def transaction_stats(self) -> dict[str, int]:
        """Counts of the default broker's transaction index (PENDING, COMMIT, ROLLBACK, checks …;
        see :meth:`AsyncAdmin.transaction_stats`). Raises RemoteError, BrokerUnavailable,
        RequestTimeout."""
        r = await self.request(RequestCode.GET_TRANSACTION_STATS)
        return decode_body(r.body, dict[str, int])

    async def committed(self, topic: str, queue_id: int, *, broker_name: str = "") -> int | None:
        """The group's committed offset of a queue, or None."""
        return await self.fetch_consumer_offset(topic, queue_id, broker_name=broker_name)

    async def commit(self) -> None:
        """Commit the current position of every assigned queue, each to its broker group's
        master (what :meth:`poll` returned counts as consumed)."""
        for mq, pos in list(self._positions.items()):
            if pos >= 0:
                await self.commit_offset(mq.topic, mq.queue_id, pos, broker_name=mq.broker_name)

    # -- poll ---------------------------------------------------------------------------------------
    def _advance(self, mq: MessageQueue, r: PullResult) -> list[MessageExt]:
        if mq in self._positions:
            if r.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset of %s/%d@%s out of range; moving to %d", mq.topic,
                            mq.queue_id, mq.broker_name, r.next_begin_offset)
            self._positions[mq] = r.next_begin_offset
        return r.messages

    async def _pull_mq(self, mq: MessageQueue, suspend_ms: int) -> tuple[MessageQueue, PullResult]:
        pos = await self._resolve(mq)
        expr = self.subscriptions.get(mq.topic, "*")
        return mq, await self._pull(mq.topic, mq.queue_id, pos, self.pull_batch_size, suspend_ms,
                                    -1, expr, broker_name=mq.broker_name)

    async def poll(self, timeout_ms: int = 5_000) -> list[MessageExt]:
        """Messages from the assigned queues, each queue in offset order; waits up to
        ``timeout_ms`` (long polling) when there are none. Positions move past what is returned.

        Raises:
            BrokerUnavailable, RequestTimeout, RemoteError: the first pull failed.
        """
        started = receive_started(self.tracing)
        out = await self._poll(timeout_ms)
        received(self.tracing, started, "poll", out, self.group, self.client_id)
        return out

    async def _poll(self, timeout_ms: int) -> list[MessageExt]:
        mqs = self.assignment()
        if not mqs:
            await asyncio.sleep(timeout_ms / 1000)
            return []
        out: list[MessageExt] = []
        for mq, r in await asyncio.gather(*(self._pull_mq(mq, 0) for mq in mqs)):
            out += self._advance(mq, r)
        if out or timeout_ms <= 0:
            return out
        tasks = {asyncio.create_task(self._pull_mq(mq, timeout_ms)) for mq in mqs}
        try:
            while tasks and not out:
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.exception() is None:
                        out += self._advance(*t.result())
        finally:
            for t in tasks:  # the broker answers them later; the answers are dropped
                t.cancel()
        return out
