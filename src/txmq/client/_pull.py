"""The pull consumer, asyncio API, and the pull and offset requests every consumer shares.

:class:`AsyncPullConsumer` reads by explicit offsets (the Spark source does), or keeps positions for
an assigned or subscribed set of queues (RocketMQ ``DefaultLitePullConsumer``): ``assign`` or
``subscribe``, ``poll``, ``seek``, ``commit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from txmq import limits
from txmq.client._async import _Client
from txmq.client._connection import AsyncConnection
from txmq.client._core import (
    ConsumeFromWhere,
    PullResult,
    PullStatus,
    RawPullResult,
    allocate,
    check_response,
    consumer_heartbeat,
    start_offset_source,
)
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, RequestTimeout, ResponseCode
from txmq.protocol import (
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
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    RequestCode,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_body,
    decode_message_exts,
    from_ext,
    to_ext,
)

__all__ = ["AsyncPullConsumer"]

log = logging.getLogger("txmq.client.consumer")

_DEFAULT_TIMESTAMP_AGO_MS = 30 * 60_000
"""RocketMQ ``consumeTimestamp`` defaults to half an hour before the consumer starts."""


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def validate_group(group: str) -> None:
    """Raise ConfigError for an empty group name or one holding ``@`` (the offset key separator)."""
    if not group or "@" in group:
        raise ConfigError(f"consumer group {group!r} must be non-empty and hold no '@'")


class _PullMixin(_Client):
    """Pull and offset requests on the live connection."""

    group: str

    async def _pull_raw(self, topic: str, queue_id: int, offset: int, max_nums: int,
                        suspend_ms: int = 0, commit_offset: int = -1,
                        subscription: str = "*") -> RawPullResult:
        flags = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend_ms > 0 else 0) | (
            PULL_FLAG_COMMIT_OFFSET if commit_offset >= 0 else 0)
        h = PullMessageRequestHeader(consumer_group=self.group, topic=topic, queue_id=queue_id,
                                     queue_offset=offset, max_msg_nums=max_nums, sys_flag=flags,
                                     suspend_timeout_millis=suspend_ms,
                                     commit_offset=max(commit_offset, 0),
                                     subscription=subscription)
        timeout = (suspend_ms + self._timeout_ms) / 1000
        resp = check_response(await self.call(RequestCode.PULL_MESSAGE, to_ext(h), timeout_s=timeout),
                              ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED)
        r = from_ext(resp.ext, PullMessageResponseHeader)
        if resp.code == ResponseCode.SUCCESS:
            return RawPullResult(PullStatus.FOUND, resp.body, r.next_begin_offset, r.min_offset,
                                 r.max_offset)
        status = PullStatus.OFFSET_ILLEGAL if resp.code == ResponseCode.PULL_OFFSET_MOVED else (
            PullStatus.NO_MATCHED_MSG if r.next_begin_offset != offset else PullStatus.NO_NEW_MSG)
        return RawPullResult(status, b"", r.next_begin_offset, r.min_offset, r.max_offset)

    async def _pull(self, topic: str, queue_id: int, offset: int, max_nums: int,
                    suspend_ms: int = 0, commit_offset: int = -1,
                    subscription: str = "*") -> PullResult:
        r = await self._pull_raw(topic, queue_id, offset, max_nums, suspend_ms, commit_offset,
                                 subscription)
        msgs = decode_message_exts(r.body) if r.status is PullStatus.FOUND else []
        return PullResult(r.status, msgs, r.next_begin_offset, r.min_offset, r.max_offset)

    async def _offset_of(self, code: RequestCode, ext: dict[str, str]) -> int:
        return from_ext(check_response(await self.call(code, ext)).ext, OffsetResponseHeader).offset

    async def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest readable queue offset."""
        h = GetMinOffsetRequestHeader(topic=topic, queue_id=queue_id)
        return await self._offset_of(RequestCode.GET_MIN_OFFSET, to_ext(h))

    async def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (exclusive end of what is readable)."""
        h = GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
        return await self._offset_of(RequestCode.GET_MAX_OFFSET, to_ext(h))

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after ``timestamp_ms`` (ms since the epoch); the max
        offset when every message is older (RocketMQ ``searchOffset``)."""
        h = SearchOffsetRequestHeader(topic=topic, queue_id=queue_id, timestamp=timestamp_ms)
        return await self._offset_of(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, to_ext(h))

    async def fetch_consumer_offset(self, topic: str, queue_id: int) -> int | None:
        """The group's committed offset on the broker, or None if it has none."""
        h = QueryConsumerOffsetRequestHeader(consumer_group=self.group, topic=topic,
                                             queue_id=queue_id, set_zero_if_not_found=False)
        resp = await self.call(RequestCode.QUERY_CONSUMER_OFFSET, to_ext(h))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return from_ext(check_response(resp).ext, OffsetResponseHeader).offset

    async def commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        """Store the group's offset for one queue on the broker."""
        h = UpdateConsumerOffsetRequestHeader(consumer_group=self.group, topic=topic,
                                              queue_id=queue_id, commit_offset=offset)
        check_response(await self.call(RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(h)))

    async def consumer_ids(self) -> list[str]:
        """The group's members as the broker knows them (GET_CONSUMER_LIST_BY_GROUP)."""
        h = GetConsumerListByGroupRequestHeader(consumer_group=self.group)
        r = check_response(await self.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, to_ext(h)))
        return decode_body(r.body, GetConsumerListByGroupResponseBody).consumer_id_list

    async def _initial_offset(self, mq: MessageQueue, stored: int | None,
                              consume_from_where: ConsumeFromWhere, timestamp_ms: int) -> int:
        src = start_offset_source(stored, mq.topic, consume_from_where)
        if src == "min":
            return await self.min_offset(mq.topic, mq.queue_id)
        if src == "max":
            return await self.max_offset(mq.topic, mq.queue_id)
        if src == "timestamp":
            return await self.search_offset(mq.topic, mq.queue_id, timestamp_ms)
        return src


def _mq(q: MessageQueue | tuple[str, int]) -> MessageQueue:
    return q if isinstance(q, MessageQueue) else MessageQueue(q[0], int(q[1]))


class AsyncPullConsumer(_PullMixin):
    """Reads queues at offsets the application controls (RocketMQ ``DefaultLitePullConsumer``).

    Three ways to use it:

    - explicit: :meth:`pull` ``(topic, queue, offset)``; nothing is remembered (the Spark source);
    - assign: :meth:`assign` a set of queues, then :meth:`poll`, :meth:`seek`, :meth:`commit`;
    - subscribe: :meth:`subscribe` topics; the group's members share the queues (average
      allocation, rebalanced as members come and go) and each polls its share.

    A queue's position starts at the group's committed offset, else per ``consume_from_where``.
    Offsets are committed only by :meth:`commit` / :meth:`commit_offset` (at least once: commit
    after processing what :meth:`poll` returned).

    Args:
        endpoints: broker address ``host:port``.
        consumer_group: group name (offsets committed under it).
        consume_from_where: start of a queue with no committed offset.
        consume_timestamp_ms: start time for ``CONSUME_FROM_TIMESTAMP`` (default: 30 min ago).
        pull_batch_size: most messages per queue per poll.
        timeout_ms: request timeout.
        access_key, secret_key: ACL credentials; every request is signed (docs/security.md).
        tls, tls_ca_file, tls_verify_hostname: TLS to the broker (RocketMQ ``tls.enable``; the
            certificate is checked against ``tls_ca_file`` or the system's CAs; docs/security.md).
    """

    def __init__(self, endpoints: str = "", consumer_group: str = "txmq-pull", *,
                 consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 consume_timestamp_ms: int | None = None,
                 pull_batch_size: int = limits.PULL_BATCH_SIZE,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 access_key: str = "", secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True) -> None:
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname)
        validate_group(consumer_group)
        self.group = consumer_group
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = (consume_timestamp_ms if consume_timestamp_ms is not None
                                     else _wall_ms() - _DEFAULT_TIMESTAMP_AGO_MS)
        self.pull_batch_size = max(1, min(pull_batch_size, limits.PULL_BATCH_MAX))
        self.subscriptions: dict[str, str] = {}
        self._positions: dict[MessageQueue, int] = {}  # -1: not resolved yet
        self._mode: str = ""
        self._rebalance_now: asyncio.Event | None = None

    async def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of ``topic``. Raises RemoteError(TOPIC_NOT_EXIST)."""
        return list(range(await self.queue_nums(topic, refresh=True)))

    async def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> PullResult:
        """Up to ``max_nums`` messages from ``offset`` (no waiting, no position kept)."""
        return await self._pull(topic, queue_id, offset, max(1, min(max_nums, limits.PULL_BATCH_MAX)))

    async def pull_raw(self, topic: str, queue_id: int, offset: int,
                       max_nums: int = 32) -> RawPullResult:
        """As :meth:`pull`, but the reply body undecoded (for readers that decode it in bulk,
        such as the Spark source)."""
        return await self._pull_raw(topic, queue_id, offset,
                                    max(1, min(max_nums, limits.PULL_BATCH_MAX)))

    # -- assign / subscribe -------------------------------------------------------------------------
    def assign(self, queues: list[MessageQueue] | list[tuple[str, int]]) -> None:
        """Read exactly these queues (replaces any earlier assignment). Raises ConfigError after
        :meth:`subscribe`."""
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
        """The queues this consumer reads now."""
        return sorted(self._positions)

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
            self._tasks.append(asyncio.create_task(self._rebalance_loop()))

    async def _rebalance_loop(self) -> None:
        assert self._rebalance_now is not None
        while self._running:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limits.REBALANCE_INTERVAL_MS / 1000):
                    await self._rebalance_now.wait()
            self._rebalance_now.clear()
            try:
                await self._rebalance()
            except (BrokerUnavailable, RequestTimeout, RemoteError) as exc:
                log.warning("rebalance of %s failed: %s", self.group, exc)
                await asyncio.sleep(1)

    async def _rebalance(self) -> None:
        nums = {t: await self.queue_nums(t, refresh=True) for t in self.subscriptions}
        cids = await self.consumer_ids()
        if cids and self.client_id not in cids:
            return  # our heartbeat is not registered yet; a notification follows when it is
        wanted = allocate(nums, cids, self.client_id, "CLUSTERING")
        self._positions = {mq: self._positions.get(mq, -1) for mq in sorted(wanted)}

    # -- positions ----------------------------------------------------------------------------------
    async def _resolve(self, mq: MessageQueue) -> int:
        pos = self._positions.get(mq, -1)
        if pos < 0:
            stored = await self.fetch_consumer_offset(mq.topic, mq.queue_id)
            pos = await self._initial_offset(mq, stored, self.consume_from_where,
                                             self.consume_timestamp_ms)
            if mq in self._positions:
                self._positions[mq] = pos
        return pos

    async def position(self, topic: str, queue_id: int) -> int:
        """The offset the next :meth:`poll` reads ``(topic, queue_id)`` from."""
        return await self._resolve(MessageQueue(topic, queue_id))

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Read ``(topic, queue_id)`` from ``offset`` next. Raises ConfigError if not assigned."""
        mq = MessageQueue(topic, queue_id)
        if mq not in self._positions:
            raise ConfigError(f"{topic}/{queue_id} is not assigned to this consumer")
        self._positions[mq] = max(0, offset)

    async def seek_to_begin(self, topic: str, queue_id: int) -> None:
        """Read from the queue's min offset next."""
        self.seek(topic, queue_id, await self.min_offset(topic, queue_id))

    async def seek_to_end(self, topic: str, queue_id: int) -> None:
        """Read only messages stored from now on."""
        self.seek(topic, queue_id, await self.max_offset(topic, queue_id))

    async def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """See :meth:`search_offset` (RocketMQ ``offsetForTimestamp``)."""
        return await self.search_offset(topic, queue_id, timestamp_ms)

    async def committed(self, topic: str, queue_id: int) -> int | None:
        """The group's committed offset of a queue, or None."""
        return await self.fetch_consumer_offset(topic, queue_id)

    async def commit(self) -> None:
        """Commit the current position of every assigned queue (what :meth:`poll` returned counts
        as consumed)."""
        for mq, pos in list(self._positions.items()):
            if pos >= 0:
                await self.commit_offset(mq.topic, mq.queue_id, pos)

    # -- poll ---------------------------------------------------------------------------------------
    def _advance(self, mq: MessageQueue, r: PullResult) -> list[MessageExt]:
        if mq in self._positions:
            if r.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset of %s/%d out of range; moving to %d", mq.topic, mq.queue_id,
                            r.next_begin_offset)
            self._positions[mq] = r.next_begin_offset
        return r.messages

    async def _pull_mq(self, mq: MessageQueue, suspend_ms: int) -> tuple[MessageQueue, PullResult]:
        pos = await self._resolve(mq)
        expr = self.subscriptions.get(mq.topic, "*")
        return mq, await self._pull(mq.topic, mq.queue_id, pos, self.pull_batch_size, suspend_ms,
                                    -1, expr)

    async def poll(self, timeout_ms: int = 5_000) -> list[MessageExt]:
        """Messages from the assigned queues, each queue in offset order; waits up to
        ``timeout_ms`` (long polling) when there are none. Positions move past what is returned.

        Raises:
            BrokerUnavailable, RequestTimeout, RemoteError: the first pull failed.
        """
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
