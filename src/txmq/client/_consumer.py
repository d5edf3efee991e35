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
from functools import partial
from pathlib import Path
from typing import Any

from txmq import limits
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
    orderly_failure,
    rebalance_plan,
)
from txmq.client._dispatch import ConsumePool
from txmq.client._pull import _DEFAULT_TIMESTAMP_AGO_MS, _PullMixin, _wall_ms, validate_group
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, RequestTimeout
from txmq.protocol import (
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
    encode_body,
    retry_topic,
    to_ext,
)

__all__ = ["AsyncPushConsumer", "MessageListener"]

log = logging.getLogger("txmq.client.consumer")

MessageListener = Callable[[list[MessageExt]], Any]
"""``listener(msgs) -> ConsumeStatus`` (or ``ConsumeOrderlyStatus``), or a coroutine function
returning one. Sync listeners run in the consumer's thread pool. An exception counts as
``RECONSUME_LATER``."""

_NETWORK_ERRORS = (BrokerUnavailable, RequestTimeout, RemoteError)
_PULL_RETRY_AFTER_ERROR_S = 1.0
_FLOW_CONTROL_RECHECK_S = 1.0


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


class AsyncPushConsumer(_PullMixin):
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
                 tls_verify_hostname: bool = True) -> None:
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname)
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
                                     else _wall_ms() - _DEFAULT_TIMESTAMP_AGO_MS)
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
            self._spawn(self._on_reset(cmd))

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
        self._pool = ConsumePool(self.listener, self._threads, f"txmq-consume-{self.group}", self.group)
        self._pool.start(self.consume_timeout_ms / 1000)
        self._rebalance_now = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._stopping = False
        if not self._clustering and self.offset_file.exists():
            self._local_offsets = decode_local_offsets(self.offset_file.read_bytes())
        await super().start()
        await self._rebalance()
        loops = [self._rebalance_loop(), self._persist_loop()]
        if self._locking:
            loops.append(self._lock_loop())
        self._background = [asyncio.create_task(c) for c in loops]

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
    async def _rebalance_loop(self) -> None:
        assert self._rebalance_now is not None
        while self._running and not self._stopping:
            await wait_event(self._rebalance_now, limits.REBALANCE_INTERVAL_MS / 1000)
            self._rebalance_now.clear()
            if self._stopping:
                return
            try:
                await self._rebalance()
            except _NETWORK_ERRORS as exc:
                log.warning("rebalance of %s failed: %s", self.group, exc)
                await asyncio.sleep(1)

    async def _rebalance(self) -> None:
        """Work out this member's queues and start or stop workers (RocketMQ ``RebalanceImpl``)."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            nums = {t: await self.queue_nums(t, refresh=True) for t in self.subscriptions}
            cids: list[str] = []
            if self._clustering:
                retry = retry_topic(self.group)
                nums[retry] = await self.queue_nums(retry, refresh=True)
                cids = await self.consumer_ids()
                if cids and self.client_id not in cids:
                    log.debug("%s not yet listed in %s; rebalance later", self.client_id, self.group)
                    return
            wanted = allocate(nums, cids, self.client_id, self.message_model)
            drop, add = rebalance_plan(set(self._workers), wanted)
            for mq in drop:
                self._stop_worker(self._workers.pop(mq), commit=True)
            for mq in add:
                self._start_worker(mq)
            if drop or add:
                log.info("%s in %s: -%s +%s", self.client_id, self.group,
                         [f"{q.topic}/{q.queue_id}" for q in drop], [f"{q.topic}/{q.queue_id}" for q in add])

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
        while not w.pq.dropped:
            try:
                w.pq.next_offset = await self._start_offset(w.mq)
                break
            except _NETWORK_ERRORS as exc:
                log.warning("start offset of %s/%d: %s", w.mq.topic, w.mq.queue_id, exc)
                await self._pause(w, _PULL_RETRY_AFTER_ERROR_S)
        log.info("%s: consuming %s/%d from offset %d", self.client_id, w.mq.topic, w.mq.queue_id,
                 w.pq.next_offset)
        await self._pull_loop(w)

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self._clustering:
            stored = await self.fetch_consumer_offset(mq.topic, mq.queue_id)
        else:
            stored = self._local_offsets.get(mq)
        return await self._initial_offset(mq, stored, self.consume_from_where,
                                          self.consume_timestamp_ms)

    async def _pull_loop(self, w: _QueueWorker) -> None:
        pq, mq = w.pq, w.mq
        expr = self.subscriptions.get(mq.topic, "*")
        while not pq.dropped:
            if pq.is_full(*self.thresholds):  # flow control (RocketMQ pullThreshold*ForQueue)
                w.room.clear()
                if pq.is_full(*self.thresholds):
                    await wait_event(w.room, _FLOW_CONTROL_RECHECK_S)
                    continue
            commit = pq.commit_offset() if self._clustering else -1
            try:
                r = await self._pull(mq.topic, mq.queue_id, pq.next_offset, self.pull_batch_size,
                                     self.suspend_ms, commit, expr)
            except _NETWORK_ERRORS as exc:
                log.warning("pull %s/%d failed: %s", mq.topic, mq.queue_id, exc)
                await self._pause(w, _PULL_RETRY_AFTER_ERROR_S)
                continue
            if commit >= 0:
                pq.committed_offset = commit
            if pq.dropped:
                return
            if r.status is PullStatus.FOUND:
                self._dispatch(w, pq.put(r.messages, r.next_begin_offset))
            else:
                if r.status is PullStatus.OFFSET_ILLEGAL:
                    log.warning("offset %d of %s/%d out of range; moving to %d", pq.next_offset,
                                mq.topic, mq.queue_id, r.next_begin_offset)
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
        kept = [m for m in msgs if not await self._send_back(m)]
        kept_ids = {id(m) for m in kept}
        w.pq.remove([m for m in msgs if id(m) not in kept_ids])
        w.room.set()
        if kept:  # the retry topic is unreachable: consume them again here later (RocketMQ)
            for m in kept:
                m.reconsume_times += 1
            await self._pause(w, limits.CONSUME_RETRY_LOCALLY_MS / 1000)
            if not w.pq.dropped:
                self._submit(w, kept)

    async def _send_back(self, msg: MessageExt, *, dlq: bool = False) -> bool:
        """CONSUMER_SEND_MSG_BACK: park ``msg`` in the retry topic; with ``dlq`` (orderly, out of
        local retries) a send of it to the DLQ with its local retry count
        (:func:`dead_letter_header`). False on failure."""
        if dlq:
            ext = dead_letter_header(msg, self.group, self.max_reconsume_times, _wall_ms())
            req = (RequestCode.SEND_MESSAGE_V2, ext, msg.body)
        else:
            h = ConsumerSendMsgBackRequestHeader(
                group=self.group, offset=msg.commit_log_offset, delay_level=0,
                origin_msg_id=msg.msg_id, origin_topic=msg.topic,
                max_reconsume_times=self.max_reconsume_times)
            req = (RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(h), b"")
        try:
            check_response(await self.call(*req))
            return True
        except _NETWORK_ERRORS as exc:
            log.warning("send back of %s failed: %s", msg.msg_id, exc)
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
            if self._locking and not pq.lock_valid(_mono_ms(), self._conns.get(self.endpoints)):
                # Messages are cached only once locked, so the lock was lost (expired, or the
                # connection changed): another member may have moved on; restart from the broker.
                self._spawn(self._requeue(w))
                return
            assert self._pool is not None
            status = await self._pool.call(
                msgs, lambda: pq.dropped or self._stopping or (
                    self._locking and not pq.lock_valid(_mono_ms(), self._conns.get(self.endpoints))), None)
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
            gone = [m for m in dead if not self._clustering or await self._send_back(m, dlq=True)]
            if not self._clustering:
                log.warning("orderly broadcast messages %s failed too often and are dropped",
                            [m.msg_id for m in gone])
            w.pq.remove(gone)
            w.room.set()
            if len(gone) == len(msgs):
                return
        await self._pause(w, self.suspend_current_queue_time_ms / 1000)

    async def _lock(self, workers: list[_QueueWorker]) -> bool:
        """LOCK_BATCH_MQ for these queues; records the outcome. True if all are locked."""
        try:
            conn = await self._connection()
            body = LockBatchRequestBody(consumer_group=self.group, client_id=self.client_id,
                                        mq_set=[w.mq for w in workers])
            resp = check_response(await conn.request(RequestCode.LOCK_BATCH_MQ, body=encode_body(body)))
        except _NETWORK_ERRORS as exc:
            log.warning("lock of %d queues failed: %s", len(workers), exc)
            return False
        locked = {MessageQueue(m.topic, m.queue_id)
                  for m in decode_body(resp.body, LockBatchResponseBody).lock_ok_mq_set}
        now = _mono_ms()
        for w in workers:
            if w.mq in locked:
                w.pq.on_locked(now, conn)
            else:
                w.pq.locked = False
        return all(w.mq in locked for w in workers)

    async def _lock_until_held(self, w: _QueueWorker) -> bool:
        """Wait until this member holds ``w``'s queue lock; False if the queue was dropped first."""
        while not w.pq.dropped:
            if await self._lock([w]):
                return True
            await self._pause(w, limits.ORDERLY_LOCK_RETRY_INTERVAL_MS / 1000)
        return False

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        body = UnlockBatchRequestBody(consumer_group=self.group, client_id=self.client_id,
                                      mq_set=mqs)
        try:
            check_response(await self.call(RequestCode.UNLOCK_BATCH_MQ, body=encode_body(body)))
        except _NETWORK_ERRORS as exc:
            log.warning("unlock failed (the locks expire): %s", exc)

    async def _lock_loop(self) -> None:
        """Renew every held lock (RocketMQ ``lockAll`` every 20 s)."""
        while self._running and not self._stopping:
            await asyncio.sleep(limits.REBALANCE_LOCK_INTERVAL_MS / 1000)
            workers = [w for w in self._workers.values() if not w.pq.dropped]
            if workers:
                await self._lock(workers)

    # -- offsets ------------------------------------------------------------------------------------
    async def _commit_queue(self, w: _QueueWorker) -> None:
        off = w.pq.commit_offset()
        if self._clustering:
            try:
                await self.commit_offset(w.mq.topic, w.mq.queue_id, off)
                w.pq.committed_offset = off
            except _NETWORK_ERRORS as exc:
                log.warning("offset commit of %s/%d failed: %s", w.mq.topic, w.mq.queue_id, exc)
        elif self._local_offsets.get(w.mq) != off:
            self._local_offsets[w.mq] = off
            self._local_dirty = True

    async def _persist_loop(self) -> None:
        while self._running and not self._stopping:
            await asyncio.sleep(limits.OFFSET_PERSIST_INTERVAL_MS / 1000)
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

    async def _on_reset(self, cmd: Command) -> None:
        """An operator reset the group's offsets of a topic: restart its queues there."""
        body = decode_body(cmd.body, ResetConsumerClientOffsetBody)
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            mine = [w for mq, w in self._workers.items() if mq.topic == body.topic]
            for w in mine:
                del self._workers[w.mq]
                await self._drop(w, commit=False, unlock=False)
            for qid, off in body.offsets.items():
                mq = MessageQueue(body.topic, qid)
                if not self._clustering:
                    self._local_offsets[mq] = off
                    self._local_dirty = True
                elif any(w.mq == mq for w in mine):  # overrides any stale commit still in flight
                    with contextlib.suppress(*_NETWORK_ERRORS):
                        await self.commit_offset(mq.topic, mq.queue_id, off)
            for w in mine:
                self._start_worker(w.mq)
        log.info("%s: offsets of %s reset to %s", self.client_id, body.topic, body.offsets)


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
