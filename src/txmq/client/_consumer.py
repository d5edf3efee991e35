"""The push consumer, asyncio API: rebalance, long polling, a listener thread pool, batches, flow
control, retries through ``%RETRY%<group>``, orderly consumption under broker-side queue locks, and
local offsets for broadcasting.

Decisions that need no IO (allocation, offsets safe to commit, retry bookkeeping) live in
:mod:`txmq.client._core`; this module only waits, calls and schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txmq import limits
from txmq.client._client import supervised
from txmq.client._connection import AsyncConnection
from txmq.client._core import (
    ConsumeFromWhere,
    MessageModel,
    ProcessQueue,
    PullStatus,
    allocate,
    batches,
    check_response,
    consumer_heartbeat,
    dead_letter_header,
    decode_local_offsets,
    encode_local_offsets,
    is_consumed,
    local_offset,
    orderly_failure,
    rebalance_plan,
)
from txmq.client._dispatch import ConsumePool
from txmq.client._msgtrace import msg_tracer
from txmq.client._pull import (
    DEFAULT_TIMESTAMP_AGO_MS,
    PullMixin,
    validate_group,
    wall_ms,
)
from txmq.client._route import master_may_have_moved
from txmq.client._tracing import process_span, send_back_span
from txmq.errors import ConfigError, RemoteError, ResponseCode, TransportError
from txmq.protocol import (
    MASTER_ID,
    Command,
    ConsumerSendMsgBackRequestHeader,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageExt,
    MessageQueue,
    RequestCode,
    ResetConsumerClientOffsetBody,
    UnlockBatchRequestBody,
    decode_body,
    dlq_topic,
    encode_body,
    retry_topic,
    to_ext,
)
from txmq.tracing import Tracing, error_type, set_error

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["AsyncPushConsumer", "MessageListener"]

log = logging.getLogger("txmq.client.consumer")

MessageListener = Callable[[list[MessageExt]], Any]
"""``listener(msgs) -> ConsumeStatus`` (or ``ConsumeOrderlyStatus``), or a coroutine function
returning one. Sync listeners run in the consumer's thread pool. An exception counts as
``RECONSUME_LATER``."""

_NETWORK_ERRORS = (TransportError, RemoteError)
_PULL_RETRY_AFTER_ERROR_S = 1.0
_FLOW_CONTROL_RECHECK_S = 1.0


def _name(mq: MessageQueue) -> str:
    return f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"


def _mono_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write a temporary file, fsync, rename, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _QueueWorker:
    """One consumed queue: its process queue and the tasks pulling and (orderly) consuming it."""

    def __init__(self, mq: MessageQueue) -> None:
        self.mq = mq
        self.pq = ProcessQueue()
        self.pull_task: asyncio.Task[None] | None = None
        self.consume_task: asyncio.Task[None] | None = None
        self.room = asyncio.Event()  # set when consumption made room in the cache
        self.arrived = asyncio.Event()  # orderly: set when messages were cached
        self.stopped = asyncio.Event()  # set when the queue is dropped


class AsyncPushConsumer(PullMixin):
    """Consumes subscribed topics with a listener (RocketMQ ``DefaultMQPushConsumer``).

    Clustering (default): the group's members share the queues, average allocation, rebalanced
    when members join, leave or die; offsets are stored on the broker. A message whose listener
    returns ``RECONSUME_LATER``, raises, or runs past ``consume_timeout_ms`` goes to
    ``%RETRY%<group>`` at delay level ``3 + reconsume times``, and after ``max_reconsume_times``
    retries to ``%DLQ%<group>``. Broadcasting: every member gets every message; offsets are stored
    in a local file; failed messages are dropped (as in RocketMQ).

    Orderly (``orderly=True``): each queue is consumed by one listener call at a time, in offset
    order; in clustering mode only while this member holds the queue's lock on the broker. A failed
    call is retried locally after ``suspend_current_queue_time_ms``; after ``max_reconsume_times``
    retries the message goes to the DLQ so it no longer blocks its queue. A call is never timed out
    (that would let the next message overtake it).

    Args:
        group: consumer group (no ``@``).
        endpoints: broker address ``host:port``.
        listener: see :data:`MessageListener`.
        message_model: ``CLUSTERING`` or ``BROADCASTING``.
        consume_from_where: start of a queue the group has no offset for.
        consume_timestamp_ms: start time for ``CONSUME_FROM_TIMESTAMP`` (default 30 min ago).
        orderly: consume each queue in order (RocketMQ ``MessageListenerOrderly``).
        consume_threads: listener calls running at once (the thread pool size).
        pull_batch_size: messages per pull.
        consume_message_batch_max_size: messages per listener call (1..1024).
        pull_threshold_for_queue: cached messages per queue before pulling pauses.
        pull_threshold_size_for_queue: cached body bytes per queue before pulling pauses.
        consume_concurrently_max_span: cached offset span per queue before pulling pauses.
        max_reconsume_times: retries before the DLQ (RocketMQ 16).
        consume_timeout_ms: a concurrent listener call running longer counts as RECONSUME_LATER;
            its thread keeps its pool slot until it returns.
        suspend_current_queue_time_ms: orderly pause after a failed call.
        suspend_ms: long-polling hold time of an empty pull.
        offset_store_dir: broadcasting: root of the local offset files
            (``<dir>/<host>@<instance_name>/<group>/offsets.json``; default ``~/.txmq_offsets``).
        instance_name: broadcasting: tells consumers of one group on one host apart.
        timeout_ms: request timeout.
        access_key, secret_key: ACL credentials; every request is signed (docs/security.md).
        tls, tls_ca_file, tls_verify_hostname: TLS to the broker (RocketMQ ``tls.enable``; the
            certificate is checked against ``tls_ca_file`` or the system's CAs; docs/security.md).
        enable_msg_trace: write RocketMQ message trace records (``SubBefore`` and ``SubAfter``
            around each listener call) to the trace topic, asynchronously (RocketMQ
            ``enableMsgTrace``; docs/tracing.md).
        custom_trace_topic: the trace topic (RocketMQ ``customizedTraceTopic``; default
            ``RMQ_SYS_TRACE_TOPIC``).
        tracing: True (the global tracer provider), False, or a :class:`~txmq.tracing.Tracing`:
            a ``process`` span per listener call (current while it runs; a single message's
            continues the producer's trace), and ``retry`` / ``dead_letter`` spans
            (docs/tracing.md).

    Raises:
        ConfigError: a bad argument.
    """

    def __init__(self, group: str, endpoints: str, listener: MessageListener, *,
                 message_model: MessageModel = "CLUSTERING",
                 consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
                 consume_timestamp_ms: int | None = None,
                 orderly: bool = False,
                 consume_threads: int = limits.CONSUME_THREADS,
                 pull_batch_size: int = limits.PULL_BATCH_SIZE,
                 consume_message_batch_max_size: int = limits.CONSUME_BATCH_MAX_SIZE,
                 pull_threshold_for_queue: int = limits.PULL_THRESHOLD_FOR_QUEUE,
                 pull_threshold_size_for_queue: int = limits.PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES,
                 consume_concurrently_max_span: int = limits.CONSUME_CONCURRENTLY_MAX_SPAN,
                 max_reconsume_times: int = limits.MAX_RECONSUME_TIMES,
                 consume_timeout_ms: int = limits.CONSUME_TIMEOUT_MS,
                 suspend_current_queue_time_ms: int = limits.SUSPEND_CURRENT_QUEUE_TIME_MS,
                 suspend_ms: int = limits.PULL_SUSPEND_MS,
                 offset_store_dir: str | os.PathLike[str] | None = None,
                 instance_name: str = "DEFAULT",
                 timeout_ms: int = limits.REQUEST_TIMEOUT_MS, namesrv_addr: str = "",
                 access_key: str = "", secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True,
                 enable_msg_trace: bool = False, custom_trace_topic: str = "",
                 tracing: Tracing | bool = True) -> None:
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname, tracing=tracing)
        validate_group(group)
        if message_model not in ("CLUSTERING", "BROADCASTING"):
            raise ConfigError(f"message_model {message_model!r} is not CLUSTERING or BROADCASTING")
        if not 1 <= consume_message_batch_max_size <= limits.CONSUME_BATCH_SIZE_MAX:
            raise ConfigError(f"consume_message_batch_max_size not in 1..{limits.CONSUME_BATCH_SIZE_MAX}")
        if consume_threads < 1 or pull_batch_size < 1 or max_reconsume_times < 0:
            raise ConfigError("consume_threads and pull_batch_size must be >= 1, "
                              "max_reconsume_times >= 0")
        self.group = group
        self.listener = listener
        self.message_model: MessageModel = message_model
        self.consume_from_where: ConsumeFromWhere = consume_from_where
        self.consume_timestamp_ms = (consume_timestamp_ms if consume_timestamp_ms is not None
                                     else wall_ms() - DEFAULT_TIMESTAMP_AGO_MS)
        self.orderly = orderly
        self.pull_batch_size = min(pull_batch_size, limits.PULL_BATCH_MAX)
        self.batch_size = consume_message_batch_max_size
        self.thresholds = (pull_threshold_for_queue, pull_threshold_size_for_queue,
                           0 if orderly else consume_concurrently_max_span)
        self.max_reconsume_times = max_reconsume_times
        self.consume_timeout_ms = consume_timeout_ms
        self.suspend_current_queue_time_ms = suspend_current_queue_time_ms
        self.suspend_ms = suspend_ms
        root = Path(offset_store_dir) if offset_store_dir else Path.home() / ".txmq_offsets"
        self.offset_file = root / f"{socket.gethostname()}@{instance_name}" / group / "offsets.json"
        self._threads = consume_threads
        self.subscriptions: dict[str, str] = {}
        self._workers: dict[MessageQueue, _QueueWorker] = {}
        self._dropping: dict[MessageQueue, asyncio.Task[None]] = {}
        self._consuming: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._local_offsets: dict[MessageQueue, int] = {}
        self._local_dirty = False
        self._pool: ConsumePool | None = None
        self._rebalance_now: asyncio.Event | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._stopping = False
        self.msg_trace = msg_tracer(self, enable_msg_trace, custom_trace_topic, group, "CONSUME")

    @property
    def _clustering(self) -> bool:
        return self.message_model == "CLUSTERING"

    @property
    def _locking(self) -> bool:
        return self.orderly and self._clustering

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` filtered by a tag expression (``*`` or ``TagA || TagB``)."""
        if not topic:
            raise ConfigError("topic must not be empty")
        self.subscriptions[topic] = expression.strip() or "*"

    def _heartbeat_data(self) -> HeartbeatData:
        subs = dict(self.subscriptions)
        if self._clustering:
            subs[retry_topic(self.group)] = "*"
        return consumer_heartbeat(self.client_id, self.group, self.message_model, subs,
                                  self.consume_from_where)

    def _on_request(self, conn: AsyncConnection, cmd: Command) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and self._rebalance_now is not None:
            self._rebalance_now.set()
        elif cmd.code == RequestCode.RESET_CONSUMER_OFFSETS and self._running:
            self._spawn(self._on_reset(conn.addr, cmd))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._consuming.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._consuming.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("consumer task of %s failed", self.group, exc_info=task.exception())

    def assignment(self) -> list[MessageQueue]:
        """The queues this member consumes now (call on the consumer's event loop)."""
        return sorted(self._workers)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, join the group and start consuming.

        Raises:
            ConfigError: no subscription, or an unreadable local offset file.
            BrokerUnavailable, RemoteError: the broker cannot be reached or refuses (unknown topic).
        """
        if not self.subscriptions:
            raise ConfigError("subscribe to at least one topic before start()")
        listener = self.listener if self.msg_trace is None else self.msg_trace.wrap_listener(
            self.listener, self.consume_timeout_ms)
        self._pool = ConsumePool(listener, self._threads, f"txmq-consume-{self.group}",
                                 self.group, self._process_span)
        self._pool.start(self.consume_timeout_ms / 1000)
        self._rebalance_now = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._stopping = False
        if not self._clustering and self.offset_file.exists():
            self._local_offsets = decode_local_offsets(self.offset_file.read_bytes())
        await super().start()
        await self._rebalance()
        running = self._loops_running
        loops = [supervised("rebalance", self._rebalance_round, 0, running, self.loop_errors),
                 supervised("persist", self._persist_round, 0, running, self.loop_errors)]
        if self._locking:
            loops.append(supervised("lock", self._lock_round, 0, running, self.loop_errors))
        self._background = [asyncio.create_task(c) for c in loops]

    def _process_span(self, msgs: list[MessageExt]) -> AbstractContextManager[Span | None]:
        return process_span(self.tracing, msgs, self.group, self.client_id, self.message_model)

    def _loops_running(self) -> bool:
        return self._running and not self._stopping

    @property
    def _heartbeats_slaves(self) -> bool:
        return True  # a consumer may read from slaves (RocketMQ sendHeartbeatToAllBroker)

    async def shutdown(self) -> None:
        """Stop pulling, let running listener calls finish (up to 30 s), commit offsets, release
        queue locks and leave the group."""
        self._stopping = True
        if self._rebalance_now is not None:
            self._rebalance_now.set()
        for t in self._background:
            t.cancel()
        for t in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        workers = list(self._workers.values())
        for w in workers:
            w.stopped.set()
            w.arrived.set()
            await _cancel(w.pull_task)
        wait_s = limits.CONSUME_SHUTDOWN_WAIT_MS / 1000
        if self._pool is not None:
            await self._pool.wait_idle(wait_s)
        running = [t for t in [*self._consuming, *(w.consume_task for w in workers),
                               *self._dropping.values()] if t is not None and not t.done()]
        if running:
            await asyncio.wait(running, timeout=wait_s)
        await self._persist_offsets()
        if self._locking and workers:
            await self._unlock([w.mq for w in workers])
        self._workers.clear()
        if self._pool is not None:
            self._pool.shutdown()
        await super().shutdown()

    # -- rebalance ----------------------------------------------------------------------------------
    async def _rebalance_round(self) -> None:
        assert self._rebalance_now is not None
        await wait_event(self._rebalance_now, limits.REBALANCE_INTERVAL_MS / 1000)
        self._rebalance_now.clear()
        if not self._stopping:
            await self._rebalance()

    async def _topic_queues(self, topic: str, *, missing_ok: bool = False) -> list[MessageQueue]:
        """``topic``'s subscribe queues over every broker group (route fetched again); [] for a
        retry topic no broker has yet (``missing_ok``)."""
        try:
            return list((await self.route(topic, refresh=True)).subscribe)
        except RemoteError as exc:
            if missing_ok and exc.response_code == ResponseCode.TOPIC_NOT_EXIST:
                return []
            raise

    async def _rebalance(self) -> None:
        """Work out this member's queues over every broker group and start or stop workers
        (RocketMQ ``RebalanceImpl``): the subscribed topics' queues and, clustering, the retry
        topic's, shared by ``AllocateMessageQueueAveragely``. A member the group's list lacks
        owns nothing: it commits and drops every queue, and rejoins once its heartbeat has
        registered it again."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            topics = {t: await self._topic_queues(t) for t in self.subscriptions}
            cids: list[str] = []
            if self._clustering:
                retry = retry_topic(self.group)
                topics[retry] = await self._topic_queues(retry, missing_ok=True)
                cids = await self.consumer_ids(next(iter(self.subscriptions)))
                if self.client_id not in cids:
                    log.warning("%s is not listed in group %s; it owns no queue until it is",
                                self.client_id, self.group)
            wanted = allocate(topics, cids, self.client_id, self.message_model)
            drop, add = rebalance_plan(set(self._workers), wanted)
            for mq in drop:
                self._stop_worker(self._workers.pop(mq), commit=True)
            for mq in add:
                self._start_worker(mq)
            if drop or add:
                log.info("%s in %s: -%s +%s", self.client_id, self.group,
                         [_name(q) for q in drop], [_name(q) for q in add])

    def _start_worker(self, mq: MessageQueue) -> None:
        w = _QueueWorker(mq)
        self._workers[mq] = w
        w.pull_task = asyncio.create_task(self._run_queue(w, self._dropping.get(mq)))
        if self.orderly:
            w.consume_task = asyncio.create_task(self._consume_orderly(w))

    def _stop_worker(self, w: _QueueWorker, *, commit: bool) -> None:
        """Drop a queue: in the background, so an orderly listener call still running does not
        hold up the rebalance; a later worker of the same queue waits for it."""
        task = asyncio.create_task(self._drop(w, commit=commit))
        self._dropping[w.mq] = task
        task.add_done_callback(lambda t: self._forget_drop(w.mq, t))

    def _forget_drop(self, mq: MessageQueue, task: asyncio.Task[None]) -> None:
        if self._dropping.get(mq) is task:
            del self._dropping[mq]

    async def _drop(self, w: _QueueWorker, *, commit: bool, unlock: bool = True) -> None:
        """Stop a queue: no more pulls; orderly: wait for the running call, so the next owner
        starts after it; then commit the offset and release the lock (RocketMQ
        ``removeUnnecessaryMessageQueue``)."""
        w.pq.dropped = True
        self._pull_nodes.forget(w.mq)
        w.stopped.set()
        w.arrived.set()
        w.room.set()
        await _cancel(w.pull_task)
        if w.consume_task is not None and not w.consume_task.done():
            await asyncio.wait({w.consume_task}, timeout=self.consume_timeout_ms / 1000)
            if not w.consume_task.done():
                log.error("orderly call on %s/%d still running; its lock is left to expire",
                          w.mq.topic, w.mq.queue_id)
                return
        if commit and w.pq.next_offset >= 0:
            await self._commit_queue(w)
        if unlock and self._locking:
            await self._unlock([w.mq])

    # -- pulling ------------------------------------------------------------------------------------
    async def _run_queue(self, w: _QueueWorker, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait({previous})
        if self._locking and not await self._lock_until_held(w):
            return
        await supervised("pull", partial(self._pull_once, w), 0, lambda: not w.pq.dropped,
                         self.loop_errors, pause=partial(self._pause, w))

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self._clustering:
            stored = await self.fetch_consumer_offset(mq.topic, mq.queue_id,
                                                      broker_name=mq.broker_name)
        else:
            route = self._routes.get(mq.topic)
            sole = route is not None and len(route.brokers) == 1
            stored = local_offset(self._local_offsets, mq, sole)
        return await self._initial_offset(mq, stored, self.consume_from_where,
                                          self.consume_timestamp_ms)

    async def _pull_once(self, w: _QueueWorker) -> None:
        """One step of a queue's pull loop (run by :func:`supervised`: an unexpected error,
        such as a body that does not decode, is logged and counted, and pulling goes on)."""
        pq, mq = w.pq, w.mq
        if pq.next_offset < 0:
            try:
                pq.next_offset = await self._start_offset(mq)
            except _NETWORK_ERRORS as exc:
                log.warning("start offset of %s: %s", _name(mq), exc)
                await self._pause(w, _PULL_RETRY_AFTER_ERROR_S)
                return
            log.info("%s: consuming %s from offset %d", self.client_id, _name(mq), pq.next_offset)
        if pq.is_full(*self.thresholds):  # flow control (RocketMQ pullThreshold*ForQueue)
            w.room.clear()
            if pq.is_full(*self.thresholds):
                await wait_event(w.room, _FLOW_CONTROL_RECHECK_S)
                return
        commit = pq.commit_offset() if self._clustering else -1
        # a pull to a slave carries no offset (RocketMQ PullSysFlag.clearCommitOffsetFlag)
        to_master = self._pull_nodes.choose(mq, self.broker_addresses(mq.broker_name)) == MASTER_ID
        try:
            r = await self._pull(mq.topic, mq.queue_id, pq.next_offset, self.pull_batch_size,
                                 self.suspend_ms, commit, self.subscriptions.get(mq.topic, "*"),
                                 broker_name=mq.broker_name)
        except _NETWORK_ERRORS as exc:
            log.warning("pull %s failed: %s", _name(mq), exc)
            if master_may_have_moved(exc):  # a failover: the next pull goes to the new master
                await self._refresh_route_soon(mq.topic)
            await self._pause(w, _PULL_RETRY_AFTER_ERROR_S)
            return
        if commit >= 0 and to_master:
            pq.committed_offset = commit
        if pq.dropped:
            return
        if r.status is PullStatus.FOUND:
            self._dispatch(w, pq.put(r.messages, r.next_begin_offset))
        else:
            if r.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset %d of %s out of range; moving to %d", pq.next_offset,
                            _name(mq), r.next_begin_offset)
            pq.next_offset = r.next_begin_offset

    def _dispatch(self, w: _QueueWorker, msgs: list[MessageExt]) -> None:
        if self.orderly:
            w.arrived.set()
            return
        for chunk in batches(msgs, self.batch_size):
            self._submit(w, chunk)

    def _submit(self, w: _QueueWorker, msgs: list[MessageExt]) -> None:
        assert self._pool is not None
        pq = w.pq
        self._pool.submit(msgs, lambda: pq.dropped or self._stopping,
                          partial(self._concurrent_done, w, msgs), self.consume_timeout_ms / 1000)

    async def _pause(self, w: _QueueWorker, seconds: float) -> None:
        """Sleep, unless the queue is dropped first."""
        await wait_event(w.stopped, seconds)

    # -- concurrent consumption --------------------------------------------------------------------
    def _concurrent_done(self, w: _QueueWorker, msgs: list[MessageExt], status: object) -> None:
        """A listener call ended (on the loop): forget consumed messages, send back failed ones
        (RocketMQ ``ConsumeMessageConcurrentlyService.processConsumeResult``)."""
        pq = w.pq
        if status is None or pq.dropped:
            return  # skipped, or the queue moved to another member, which consumes these again
        if is_consumed(status) or not self._clustering:
            if not is_consumed(status):
                log.warning("broadcast messages %s failed and are dropped", [m.msg_id for m in msgs])
            pq.remove(msgs)
            w.room.set()
            return
        self._spawn(self._send_back_failed(w, msgs))

    async def _send_back_failed(self, w: _QueueWorker, msgs: list[MessageExt]) -> None:
        kept = [m for m in msgs if not await self._send_back(w.mq, m)]
        kept_ids = {id(m) for m in kept}
        w.pq.remove([m for m in msgs if id(m) not in kept_ids])
        w.room.set()
        if kept:  # the retry topic is unreachable: consume them again here later (RocketMQ)
            for m in kept:
                m.reconsume_times += 1
            await self._pause(w, limits.CONSUME_RETRY_LOCALLY_MS / 1000)
            if not w.pq.dropped:
                self._submit(w, kept)

    async def _send_back(self, mq: MessageQueue, msg: MessageExt, *, dlq: bool = False) -> bool:
        """CONSUMER_SEND_MSG_BACK to the master of ``mq``'s broker group (it holds ``msg`` at its
        commit log offset; RocketMQ ``sendMessageBack`` to ``findBrokerAddressInPublish``): park
        ``msg`` in the retry topic; with ``dlq`` (orderly, out of local retries) a send of it to
        the DLQ with its local retry count (:func:`dead_letter_header`). False on failure."""
        if dlq:
            ext = dead_letter_header(msg, self.group, self.max_reconsume_times, wall_ms())
            req = (RequestCode.SEND_MESSAGE_V2, ext, msg.body)
        else:
            h = ConsumerSendMsgBackRequestHeader(
                group=self.group, offset=msg.commit_log_offset, delay_level=0,
                origin_msg_id=msg.msg_id, origin_topic=msg.topic,
                max_reconsume_times=self.max_reconsume_times)
            req = (RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(h), b"")
        # the broker moves it to the DLQ once it was retried max_reconsume_times (RocketMQ
        # SendMessageProcessor: reconsumeTimes >= maxReconsumeTimes)
        dead = dlq or msg.reconsume_times >= self.max_reconsume_times
        with send_back_span(self.tracing, msg, (dlq_topic if dead else retry_topic)(self.group),
                            dead, self.group, self.client_id) as span:
            try:
                check_response(await self.call_broker(mq.broker_name, *req, topic=mq.topic))
                return True
            except _NETWORK_ERRORS as exc:
                log.warning("send back of %s failed: %s", msg.msg_id, exc)
                set_error(span, error_type(exc), str(exc))
                return False

    # -- orderly ------------------------------------------------------------------------------------
    async def _consume_orderly(self, w: _QueueWorker) -> None:
        """One listener call at a time, in offset order (RocketMQ ``ConsumeMessageOrderlyService``)."""
        pq = w.pq
        while not pq.dropped and not self._stopping:
            msgs = pq.head(self.batch_size)
            if not msgs:
                w.arrived.clear()
                if not pq.head(1) and not pq.dropped:
                    await w.arrived.wait()
                continue
            if self._locking and not pq.lock_valid(_mono_ms(), self._lock_token(w.mq)):
                # Messages are cached only once locked, so the lock was lost (expired, or the
                # connection changed): another member may have moved on; restart from the broker.
                self._spawn(self._requeue(w))
                return
            assert self._pool is not None
            status = await self._pool.call(
                msgs, lambda: pq.dropped or self._stopping or (
                    self._locking and not pq.lock_valid(_mono_ms(), self._lock_token(w.mq))), None)
            if status is None:
                continue
            if is_consumed(status):
                pq.remove(msgs)
                w.room.set()
                continue
            await self._orderly_failed(w, msgs)

    async def _requeue(self, w: _QueueWorker) -> None:
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            if self._workers.get(w.mq) is not w or self._stopping:
                return
            log.warning("%s lost the lock of %s/%d; restarting it", self.client_id, w.mq.topic,
                        w.mq.queue_id)
            del self._workers[w.mq]
            await self._drop(w, commit=True, unlock=False)
            self._start_worker(w.mq)

    async def _orderly_failed(self, w: _QueueWorker, msgs: list[MessageExt]) -> None:
        dead = orderly_failure(msgs, self.max_reconsume_times)
        if dead:
            gone = [m for m in dead
                    if not self._clustering or await self._send_back(w.mq, m, dlq=True)]
            if not self._clustering:
                log.warning("orderly broadcast messages %s failed too often and are dropped",
                            [m.msg_id for m in gone])
            w.pq.remove(gone)
            w.room.set()
            if len(gone) == len(msgs):
                return
        await self._pause(w, self.suspend_current_queue_time_ms / 1000)

    def _master_addr(self, broker_name: str) -> str:
        addr = self.broker_addresses(broker_name).get(MASTER_ID)
        return addr or (self.endpoints if not broker_name else "")

    def _lock_token(self, mq: MessageQueue) -> object:
        """The connection to the master of ``mq``'s broker group: a lock holds while it does."""
        return self._conns.get(self._master_addr(mq.broker_name))

    async def _lock(self, workers: list[_QueueWorker]) -> bool:
        """LOCK_BATCH_MQ to the master of each queue's broker group, one batch per group
        (RocketMQ ``RebalanceImpl.lockAll``: ``findBrokerAddressInSubscribe(name, MASTER_ID,
        true)``); records the outcome. True if all are locked."""
        by_broker: dict[str, list[_QueueWorker]] = {}
        for w in workers:
            by_broker.setdefault(w.mq.broker_name, []).append(w)
        ok = True
        for name, ws in sorted(by_broker.items()):
            ok = await self._lock_broker(name, ws) and ok
        return ok

    async def _lock_broker(self, name: str, workers: list[_QueueWorker]) -> bool:
        try:
            conn = await self.connection(await self.master_address(name, workers[0].mq.topic))
            body = LockBatchRequestBody(consumer_group=self.group, client_id=self.client_id,
                                        mq_set=[w.mq for w in workers])
            resp = check_response(await conn.request(RequestCode.LOCK_BATCH_MQ, body=encode_body(body)))
        except _NETWORK_ERRORS as exc:
            log.warning("lock of %d queues on %s failed: %s", len(workers), name or "broker", exc)
            for w in workers:
                w.pq.locked = False
            return False
        locked = {(m.topic, m.queue_id)
                  for m in decode_body(resp.body, LockBatchResponseBody).lock_ok_mq_set}
        now = _mono_ms()
        for w in workers:
            if (w.mq.topic, w.mq.queue_id) in locked:
                w.pq.on_locked(now, conn)
            else:
                w.pq.locked = False
        return all((w.mq.topic, w.mq.queue_id) in locked for w in workers)

    async def _lock_until_held(self, w: _QueueWorker) -> bool:
        """Wait until this member holds ``w``'s queue lock; False if the queue was dropped first."""
        while not w.pq.dropped:
            if await self._lock([w]):
                return True
            await self._pause(w, limits.ORDERLY_LOCK_RETRY_INTERVAL_MS / 1000)
        return False

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        """UNLOCK_BATCH_MQ to the master of each queue's broker group, one batch per group; a
        failure is logged (the locks expire)."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for name, batch in sorted(by_broker.items()):
            body = UnlockBatchRequestBody(consumer_group=self.group, client_id=self.client_id,
                                          mq_set=batch)
            try:
                check_response(await self.call_broker(name, RequestCode.UNLOCK_BATCH_MQ,
                                                      body=encode_body(body), topic=batch[0].topic))
            except _NETWORK_ERRORS as exc:
                log.warning("unlock on %s failed (the locks expire): %s", name or "broker", exc)

    async def _lock_round(self) -> None:
        """Renew every held lock (RocketMQ ``lockAll`` every 20 s)."""
        await asyncio.sleep(limits.REBALANCE_LOCK_INTERVAL_MS / 1000)
        workers = [w for w in self._workers.values() if not w.pq.dropped]
        if workers and not self._stopping:
            await self._lock(workers)

    # -- offsets ------------------------------------------------------------------------------------
    async def _commit_queue(self, w: _QueueWorker) -> None:
        """Commit ``w``'s offset to the master of its broker group (broadcasting: note it for the
        local file). A group the routes show without a master is skipped: the persist loop tries
        again once a route names one (offsets never go to a slave)."""
        off = w.pq.commit_offset()
        if self._clustering:
            addrs = self.broker_addresses(w.mq.broker_name)
            if addrs and MASTER_ID not in addrs:
                log.debug("offset of %s not committed: its group has no master now", _name(w.mq))
                return
            try:
                await self.commit_offset(w.mq.topic, w.mq.queue_id, off,
                                         broker_name=w.mq.broker_name)
                w.pq.committed_offset = off
            except _NETWORK_ERRORS as exc:  # e.g. no master now: the persist loop tries again
                log.warning("offset commit of %s failed: %s", _name(w.mq), exc)
        elif self._local_offsets.get(w.mq) != off:
            self._local_offsets[w.mq] = off
            self._local_dirty = True

    async def _persist_round(self) -> None:
        await asyncio.sleep(limits.OFFSET_PERSIST_INTERVAL_MS / 1000)
        if not self._stopping:
            await self._persist_offsets()

    async def _persist_offsets(self) -> None:
        """Commit every queue's offset that moved; broadcasting: rewrite the local file."""
        for w in list(self._workers.values()):
            if w.pq.next_offset >= 0 and w.pq.commit_offset() != w.pq.committed_offset:
                await self._commit_queue(w)
        if self._local_dirty:
            self._local_dirty = False
            data = encode_local_offsets(self._local_offsets)
            try:
                await asyncio.to_thread(_write_atomically, self.offset_file, data)
            except OSError as exc:
                self._local_dirty = True
                log.error("cannot write local offsets %s: %s", self.offset_file, exc)

    def _broker_names_at(self, addr: str) -> set[str]:
        """The broker groups with a member at ``addr``."""
        return {name for name, addrs in self._brokers.items() if addr in addrs.values()}

    async def _on_reset(self, addr: str, cmd: Command) -> None:
        """An operator reset the group's offsets of a topic on the broker at ``addr``: restart
        the topic's queues of that broker group there."""
        body = decode_body(cmd.body, ResetConsumerClientOffsetBody)
        names = self._broker_names_at(addr)
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            mine = [w for mq, w in self._workers.items()
                    if mq.topic == body.topic and (not names or mq.broker_name in names)]
            for w in mine:
                del self._workers[w.mq]
                await self._drop(w, commit=False, unlock=False)
            default = min(names) if names else ""
            for qid, off in body.offsets.items():
                owned = [w.mq for w in mine if w.mq.queue_id == qid]
                if not self._clustering:
                    mq = owned[0] if owned else MessageQueue(body.topic, qid, default)
                    self._local_offsets[mq] = off
                    self._local_dirty = True
                for mq in owned if self._clustering else []:  # overrides a stale commit in flight
                    with contextlib.suppress(*_NETWORK_ERRORS):
                        await self.commit_offset(mq.topic, mq.queue_id, off,
                                                 broker_name=mq.broker_name)
            for w in mine:
                self._start_worker(w.mq)
        log.info("%s: offsets of %s on %s reset to %s", self.client_id, body.topic,
                 sorted(names) or addr, body.offsets)


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``event`` is set or ``timeout_s`` passed. (``asyncio.wait_for`` of Python 3.11
    can swallow a cancellation that arrives as the event is set; ``asyncio.timeout`` does not.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
