"""Consumers, asyncio API: the push consumer (rebalance, long polling, retries) and the pull
consumer (explicit offsets; the Spark source reads through it)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal

from txmq import limits
from txmq.client._async import _call_listener, _Client
from txmq.client._core import (
    ConsumeStatus,
    ProcessQueue,
    PullResult,
    PullStatus,
    allocate_averagely,
    check_response,
    restore_retry_topic,
)
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, RequestTimeout, ResponseCode
from txmq.protocol import (
    Command,
    ConsumerData,
    ConsumerSendMsgBackRequestHeader,
    HeartbeatData,
    MessageExt,
    OffsetRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    RequestCode,
    decode_messages,
    from_ext,
    to_ext,
)

__all__ = ["AsyncPullConsumer", "AsyncPushConsumer", "MessageListener"]

log = logging.getLogger("txmq.client.consumer")

MessageListener = Callable[[list[MessageExt]], Any]
"""``listener(msgs) -> ConsumeStatus`` (or a coroutine function returning one)."""

ConsumeFromWhere = Literal["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET"]


class _PullMixin(_Client):
    group: str

    async def _pull(self, topic: str, queue_id: int, offset: int, max_nums: int,
                    suspend_ms: int = 0, commit_offset: int = -1,
                    subscription: str = "*") -> PullResult:
        h = PullMessageRequestHeader(consumer_group=self.group, topic=topic, queue_id=queue_id,
                                     queue_offset=offset, max_msg_nums=max_nums,
                                     suspend_timeout_ms=suspend_ms, commit_offset=commit_offset,
                                     subscription=subscription)
        timeout = (suspend_ms + self._timeout_ms) / 1000
        resp = check_response(await self.call(RequestCode.PULL_MESSAGE, to_ext(h), timeout_s=timeout),
                              ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED)
        r = from_ext(resp.ext, PullMessageResponseHeader)
        if resp.code == ResponseCode.SUCCESS:
            msgs = decode_messages(resp.body)
            assert all(isinstance(m, MessageExt) for m in msgs)
            return PullResult(PullStatus.FOUND, msgs, r.next_begin_offset, r.min_offset,  # type: ignore[arg-type]
                              r.max_offset)
        status = PullStatus.OFFSET_ILLEGAL if resp.code == ResponseCode.PULL_OFFSET_MOVED else (
            PullStatus.NO_MATCHED_MSG if r.next_begin_offset != offset else PullStatus.NO_NEW_MSG)
        return PullResult(status, [], r.next_begin_offset, r.min_offset, r.max_offset)

    async def _offset_of(self, code: RequestCode, topic: str, queue_id: int) -> int:
        r = check_response(await self.call(code, {"topic": topic, "queue_id": queue_id}))
        return int(r.ext["offset"])

    async def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest readable queue offset."""
        return await self._offset_of(RequestCode.GET_MIN_OFFSET, topic, queue_id)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (exclusive end of what is readable)."""
        return await self._offset_of(RequestCode.GET_MAX_OFFSET, topic, queue_id)

    async def fetch_consumer_offset(self, topic: str, queue_id: int) -> int | None:
        """The group's committed offset on the broker, or None if it has none."""
        h = OffsetRequestHeader(consumer_group=self.group, topic=topic, queue_id=queue_id)
        resp = await self.call(RequestCode.QUERY_CONSUMER_OFFSET, to_ext(h))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        return int(check_response(resp).ext["offset"])

    async def commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        """Store the group's offset for one queue on the broker."""
        h = OffsetRequestHeader(consumer_group=self.group, topic=topic, queue_id=queue_id,
                                commit_offset=offset)
        check_response(await self.call(RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(h)))


class AsyncPullConsumer(_PullMixin):
    """Reads queues by explicit offset (RocketMQ ``DefaultLitePullConsumer`` in assign mode).

    Args:
        endpoints: broker address ``host:port``.
        consumer_group: group name (offsets committed under it).
    """

    def __init__(self, endpoints: str, consumer_group: str = "txmq-pull", *,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS) -> None:
        super().__init__(endpoints, timeout_ms)
        self.group = consumer_group

    async def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of ``topic``. Raises RemoteError(TOPIC_NOT_EXIST)."""
        return list(range(await self.queue_nums(topic, refresh=True)))

    async def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> PullResult:
        """Up to ``max_nums`` messages from ``offset`` (no waiting)."""
        return await self._pull(topic, queue_id, offset, max(1, min(max_nums, limits.PULL_BATCH_MAX)))


class _QueueWorker:
    def __init__(self, topic: str, queue_id: int, pq: ProcessQueue) -> None:
        self.topic, self.queue_id, self.pq = topic, queue_id, pq
        self.task: asyncio.Task[None] | None = None


class AsyncPushConsumer(_PullMixin):
    """Consumes subscribed topics with a listener (RocketMQ ``DefaultMQPushConsumer``, concurrent).

    In clustering mode the group's members share the queues (average allocation, rebalanced when
    members come and go); a message whose listener returns RECONSUME_LATER or raises goes to
    ``%RETRY%<group>`` with growing delay, and after ``max_reconsume_times`` to ``%DLQ%<group>``.

    Args:
        group: consumer group.
        endpoints: broker address.
        listener: ``listener(msgs) -> ConsumeStatus``; sync listeners run in worker threads.
        message_model: "CLUSTERING" or "BROADCASTING".
        consume_from_where: start of a group with no stored offset (RocketMQ default: last offset).
        consume_threads: listener calls running at once.
        max_reconsume_times: retries before the DLQ (RocketMQ ``maxReconsumeTimes`` 16).
    """

    def __init__(self, group: str, endpoints: str, listener: MessageListener, *,
                 message_model: Literal["CLUSTERING", "BROADCASTING"] = "CLUSTERING",
                 consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 consume_threads: int = limits.CONSUME_THREADS,
                 pull_batch_size: int = limits.PULL_BATCH_SIZE,
                 max_reconsume_times: int = limits.MAX_RECONSUME_TIMES,
                 suspend_ms: int = limits.PULL_SUSPEND_MS,
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS) -> None:
        super().__init__(endpoints, timeout_ms)
        if not group:
            raise ConfigError("consumer group must not be empty")
        self.group = group
        self.listener = listener
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.pull_batch_size = pull_batch_size
        self.max_reconsume_times = max_reconsume_times
        self.suspend_ms = suspend_ms
        self._threads = consume_threads
        self._sem: asyncio.Semaphore | None = None
        self.subscriptions: dict[str, str] = {}
        self._workers: dict[tuple[str, int], _QueueWorker] = {}
        self._rebalance_now: asyncio.Event | None = None
        self._consuming: set[asyncio.Task[None]] = set()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` filtered by a tag expression (``*`` or ``TagA || TagB``)."""
        self.subscriptions[topic] = expression

    def _heartbeat_data(self) -> HeartbeatData:
        subs = dict(self.subscriptions)
        if self.message_model == "CLUSTERING":
            subs[f"%RETRY%{self.group}"] = "*"
        cd = ConsumerData(group=self.group, message_model=self.message_model, subscriptions=subs)
        return HeartbeatData(client_id=self.client_id, consumer_groups=[cd])

    def _on_request(self, cmd: Command) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and self._rebalance_now is not None:
            self._rebalance_now.set()

    async def start(self) -> None:
        """Connect, join the group and start consuming. Raises BrokerUnavailable, RemoteError."""
        if not self.subscriptions:
            raise ConfigError("subscribe to at least one topic before start()")
        self._sem = asyncio.Semaphore(self._threads)
        self._rebalance_now = asyncio.Event()
        await super().start()
        await self._rebalance()
        self._tasks.append(asyncio.create_task(self._rebalance_loop()))
        self._tasks.append(asyncio.create_task(self._persist_loop()))

    async def shutdown(self) -> None:
        """Stop pulling, let running listeners finish, commit offsets, leave the group."""
        for w in list(self._workers.values()):
            await self._drop(w)
        if self._consuming:
            await asyncio.wait(self._consuming, timeout=30)
        await self._persist_offsets()
        await super().shutdown()

    # -- rebalance --------------------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        assert self._rebalance_now is not None
        while self._running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rebalance_now.wait(), limits.REBALANCE_INTERVAL_MS / 1000)
            self._rebalance_now.clear()
            try:
                await self._rebalance()
            except (BrokerUnavailable, RequestTimeout, RemoteError) as exc:
                log.warning("rebalance of %s failed: %s", self.group, exc)
                await asyncio.sleep(1)

    async def _rebalance(self) -> None:
        topics = list(self.subscriptions)
        if self.message_model == "CLUSTERING":
            topics.append(f"%RETRY%{self.group}")
            r = check_response(await self.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                               {"consumer_group": self.group}))
            cids = list(r.ext["client_ids"]) or [self.client_id]
        wanted: set[tuple[str, int]] = set()
        for topic in topics:
            queues = list(range(await self.queue_nums(topic, refresh=True)))
            mine = (allocate_averagely(queues, cids, self.client_id)
                    if self.message_model == "CLUSTERING" else queues)
            wanted.update((topic, q) for q in mine)
        for key in [k for k in self._workers if k not in wanted]:
            await self._drop(self._workers.pop(key))
        for key in sorted(wanted - set(self._workers)):
            start = await self._start_offset(*key)
            w = _QueueWorker(key[0], key[1], ProcessQueue(start))
            w.task = asyncio.create_task(self._pull_loop(w))
            self._workers[key] = w
            log.info("%s: consuming %s/%d from offset %d", self.client_id, key[0], key[1], start)

    async def _start_offset(self, topic: str, queue_id: int) -> int:
        if self.message_model == "CLUSTERING":
            stored = await self.fetch_consumer_offset(topic, queue_id)
            if stored is not None:
                return stored
        if self.consume_from_where == "CONSUME_FROM_FIRST_OFFSET" or topic.startswith("%RETRY%"):
            return await self.min_offset(topic, queue_id)
        return await self.max_offset(topic, queue_id)

    async def _drop(self, w: _QueueWorker) -> None:
        w.pq.dropped = True
        if w.task is not None:
            w.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w.task
        if self.message_model == "CLUSTERING":
            with contextlib.suppress(BrokerUnavailable, RequestTimeout, RemoteError):
                await self.commit_offset(w.topic, w.queue_id, w.pq.commit_offset())

    # -- pulling and consuming --------------------------------------------------------------------
    async def _pull_loop(self, w: _QueueWorker) -> None:
        pq = w.pq
        expr = self.subscriptions.get(w.topic, "*")
        while not pq.dropped:
            if pq.cached_count >= limits.PULL_THRESHOLD_FOR_QUEUE:
                await asyncio.sleep(0.05)  # flow control (RocketMQ pullThresholdForQueue)
                continue
            commit = pq.commit_offset() if self.message_model == "CLUSTERING" else -1
            try:
                r = await self._pull(w.topic, w.queue_id, pq.next_offset, self.pull_batch_size,
                                     self.suspend_ms, commit, expr)
            except (BrokerUnavailable, RequestTimeout, RemoteError) as exc:
                log.warning("pull %s/%d failed: %s", w.topic, w.queue_id, exc)
                await asyncio.sleep(1)
                continue
            if r.status is PullStatus.FOUND:
                pq.put(r.messages, r.next_begin_offset)
                for m in r.messages:
                    await self._dispatch(pq, m)
            else:
                pq.next_offset = r.next_begin_offset

    async def _dispatch(self, pq: ProcessQueue, msg: MessageExt) -> None:
        assert self._sem is not None
        await self._sem.acquire()
        task = asyncio.create_task(self._consume(pq, msg))
        self._consuming.add(task)
        task.add_done_callback(self._consuming.discard)

    async def _consume(self, pq: ProcessQueue, msg: MessageExt) -> None:
        assert self._sem is not None
        try:
            while True:
                status = await self._call(restore_retry_topic(msg))
                if status is ConsumeStatus.CONSUME_SUCCESS or await self._send_back(msg):
                    break
                await asyncio.sleep(1)  # could not reach the retry topic: consume again locally
        finally:
            pq.remove(msg.queue_offset)
            self._sem.release()

    async def _call(self, msg: MessageExt) -> ConsumeStatus:
        try:
            status = await _call_listener(self.listener, [msg])
        except Exception:
            log.exception("listener of %s raised on %s; will retry", self.group, msg.msg_id)
            return ConsumeStatus.RECONSUME_LATER
        if inspect.isawaitable(status):
            status = await status
        return status if isinstance(status, ConsumeStatus) else ConsumeStatus.RECONSUME_LATER

    async def _send_back(self, msg: MessageExt) -> bool:
        if self.message_model == "BROADCASTING":
            return True  # RocketMQ drops failed broadcast messages
        h = ConsumerSendMsgBackRequestHeader(
            group=self.group, commit_log_offset=msg.commit_log_offset, origin_msg_id=msg.msg_id,
            origin_topic=msg.topic, max_reconsume_times=self.max_reconsume_times)
        try:
            check_response(await self.call(RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(h)))
            return True
        except (BrokerUnavailable, RequestTimeout, RemoteError) as exc:
            log.warning("send back of %s failed: %s", msg.msg_id, exc)
            return False

    async def _persist_loop(self) -> None:
        while self._running:
            await asyncio.sleep(limits.OFFSET_PERSIST_INTERVAL_MS / 1000)
            await self._persist_offsets()

    async def _persist_offsets(self) -> None:
        if self.message_model != "CLUSTERING":
            return
        for w in list(self._workers.values()):
            try:
                await self.commit_offset(w.topic, w.queue_id, w.pq.commit_offset())
            except (BrokerUnavailable, RequestTimeout, RemoteError) as exc:
                log.warning("offset commit failed: %s", exc)
                return
