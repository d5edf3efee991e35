"""Half messages, end transaction and check-back (RocketMQ's transaction model), sans-IO.

Sources: RocketMQ ``TransactionalMessageBridge#parseHalfMessageInner`` (prepare),
``EndTransactionProcessor`` (commit / rollback), ``TransactionalMessageServiceImpl#check`` (check-back),
as summarised in docs/rocketmq.md §1.3–1.6; departures are described in :mod:`._index`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from itertools import count

import msgspec

from txmq import limits
from txmq.broker._actions import SendTo
from txmq.broker._clients import ClientRegistry
from txmq.broker._config import BrokerConfig
from txmq.broker._health import PARK_PROPERTIES, park_properties
from txmq.broker.transaction._index import HalfEntry, LatencyHistogram, Outcome, TransactionIndex
from txmq.broker.transaction._op import REMOVE_TAG, decided_by, op_records
from txmq.broker.transaction._persist import SnapshotKeeper, open_state_table
from txmq.broker.transaction._result import EndResult, end_result
from txmq.broker.transaction._sink import (
    PROPERTY_TXMQ_SINK_BATCH,
    PROPERTY_TXMQ_SINK_TASK,
    SINK_BATCH_TOPIC,
    BatchMarker,
    SinkBatches,
    decode_marker,
    encode_marker,
)
from txmq.broker.transaction._trace import TransactionTraces
from txmq.errors import CorruptRecord, ResponseCode, StoreError
from txmq.protocol import (
    FLAG_ONEWAY,
    HALF_TOPIC,
    OP_TOPIC,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_TXMQ_HALF_OFFSET,
    PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_RESUMED_FROM,
    PROPERTY_TXMQ_SENDER_CLIENT_ID,
    PROPERTY_UNIQ_KEY,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    CheckTransactionStateRequestHeader,
    Command,
    EndTransactionRequestHeader,
    MessageExt,
    RequestCode,
    encode_message_ext,
    offset_msg_id,
    to_ext,
)
from txmq.store import AppendResult, Record, Store

__all__ = [
    "HALF_TOPIC",
    "OP_TOPIC",
    "REMOVE_TAG",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "StoredHalf",
    "TransactionService",
]

log = logging.getLogger("txmq.broker.transaction")

_DECISIONS = (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE)
_RARE_HALF_PROPS = frozenset((PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_TXMQ_RESUMED_FROM,
                              PROPERTY_TXMQ_SINK_BATCH, PROPERTY_TXMQ_SINK_TASK))
"""Half properties that change how a half is indexed (immunity, resume, Spark sink batch)."""
_STATS_KEY = {Outcome.COMMIT: "commits", Outcome.ROLLBACK: "rollbacks", Outcome.DISCARD: "discards"}
_TX_PROPS = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
             PROPERTY_TXMQ_SENDER_CLIENT_ID)

Append = Callable[[list[Record]], list[AppendResult]]


class StoredHalf(msgspec.Struct, frozen=True, kw_only=True):
    """Where a pending half message is stored (:meth:`TransactionService.stored_half`): its half
    queue offset, commit log offset, the real queue the producer sent it to (``REAL_QID``) and the
    commit log offset its record ends at (bytes)."""

    half_offset: int
    commit_log_offset: int
    real_queue_id: int
    end_offset: int


class TransactionService(SnapshotKeeper):
    """Prepare, end and check-back over a store, an index and the client registry.

    Args:
        config: timeouts, check interval and budget (RocketMQ BrokerConfig names).
        store: where half, op, real and discarded messages are written.
        append: appends records through the broker (assigns offsets, wakes long polls).
        clients: live producers, for check-back routing.
        destination_problem: ``(REAL_TOPIC, REAL_QID) -> reason | None``: why a half message can
            never be committed. Such a half message is discarded to TRANS_CHECK_MAX_TIME_TOPIC
            (resumable, I5) with the reason (``TXMQ_PARK_REASON``) when the checker first looks
            at it or when a commit asks for it, and counted in ``stats["parked"]``.
        store_host: the broker's ``ip:port``, for the offset message id of a check-back of a
            half message stored without one (the memory store keeps no host).
        traces: where the transactions' lives are recorded (:mod:`._trace`); a new one of
            ``config.transaction_trace_max`` lives when None.
        peer: connection → its remote ``ip:port`` (who a check-back went to, who answered).
    """

    def __init__(self, config: BrokerConfig, store: Store, append: Append,
                 clients: ClientRegistry,
                 destination_problem: Callable[[str | None, str | None], str | None],
                 store_host: Callable[[], str] = lambda: "",
                 traces: TransactionTraces | None = None,
                 peer: Callable[[int], str] = lambda conn: "") -> None:
        self.config = config
        self.traces = traces if traces is not None else TransactionTraces(
            config.transaction_trace_max, limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS)
        """The transactions' lives (GET_TRANSACTION_TRACE, the OTLP export)."""
        self._peer = peer
        self._store_host = store_host
        self._problem = destination_problem
        self.store = store
        self.index = TransactionIndex(open_state_table(store))
        self._append = append
        self._clients = clients
        self._opaque = count(1 << 30)
        self._in_flight: dict[int, int] = {}  # half offset -> sent at ms
        self._saved_sig: tuple[int, ...] = ()
        self._legacy_counts: dict[str, int] = {}
        self._half_max = 0
        self.sinks = SinkBatches()
        self._half_cache: dict[int, Record] = {}
        """Recently prepared half records by commit log offset (``TRANSACTION_HALF_CACHE_BYTES``)."""
        self._half_cache_bytes = 0
        self._torn: dict[str, tuple[dict[str, int], dict[str, list[int]]]] = {}
        """Recovery: batch → (committed tasks, halves preceding its marker), to settle once."""
        self.stats = {"commits": 0, "rollbacks": 0, "discards": 0, "checks_sent": 0,
                      "checks_answered": 0, "duplicate_ends": 0, "check_errors": 0,
                      "checks_no_producer": 0, "sink_batches": 0, "sink_duplicate_batches": 0,
                      "sink_orphans_rolled_back": 0, "parked": 0, "recovery_skipped": 0,
                      "retried_halves": 0}
        self._last_tick_ms = 0
        self.finish_latency = LatencyHistogram()
        """Prepare-to-finish latency of settled transactions, seconds."""
        self.settled_by_topic: dict[str, dict[str, int]] = {}
        """Real topic → outcome (``stats`` key: commits, rollbacks, discards) → transactions
        settled since start (``rocketmq_commit_messages_total`` and the like)."""

    # -- prepare ----------------------------------------------------------------------------------
    def half_record(self, rec: Record, producer_group: str, client_id: str) -> Record:
        """Turn a ``TRAN_MSG`` send into the half record (``parseHalfMessageInner``; like
        RocketMQ's it keeps the producer's born host, which the committed message inherits)."""
        props = dict(rec.properties)
        props[PROPERTY_REAL_TOPIC] = rec.topic
        props[PROPERTY_REAL_QUEUE_ID] = str(rec.queue_id)
        props[PROPERTY_PRODUCER_GROUP] = producer_group
        props[PROPERTY_TXMQ_SENDER_CLIENT_ID] = client_id
        props[PROPERTY_TRANSACTION_ID] = props.get(PROPERTY_UNIQ_KEY, "")
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        return Record(topic=HALF_TOPIC, queue_id=0, body=rec.body, tags=rec.tags, keys=rec.keys,
                      properties=props, born_timestamp_ms=rec.born_timestamp_ms,
                      store_timestamp_ms=rec.store_timestamp_ms, born_host=rec.born_host)

    def stored_half(self, uniq_key: str, producer_group: str, real_topic: str) -> StoredHalf | None:
        """The pending half message a half send retries, or None: one whose ``UNIQ_KEY``,
        producer group and real topic are the send's. A producer retries a half send to the same
        broker after a timeout or a lost connection; the broker stores a half at most once and
        answers the retry with the stored one (docs/transactions.md, "A retried half is not a
        second transaction"). RocketMQ has no such rule: its retried half may become an orphan
        that is checked back and committed a second time (RocketMQ
        ``DefaultMQProducerImpl.sendMessageInTransaction``).
        Settled halves are not looked at (a retry after the end is a new half). Raises nothing
        but what reading the store raises (StoreError)."""
        if not uniq_key:
            return None
        off = self.index.by_msg_id.get(uniq_key)
        entry = None if off is None else self.index.pending.get(off)
        if entry is None or entry.producer_group != producer_group or entry.real_topic != real_topic:
            return None
        half = self.store.read_at(entry.commit_log_offset)
        self.stats["retried_halves"] += 1
        qid = half.properties.get(PROPERTY_REAL_QUEUE_ID, "")
        return StoredHalf(half_offset=entry.half_offset, commit_log_offset=entry.commit_log_offset,
                          real_queue_id=int(qid) if qid.isascii() and qid.isdigit() else 0,
                          end_offset=entry.commit_log_offset + max(1, half.store_size))

    def on_half_stored(self, rec: Record, res: AppendResult, *, cache: bool = True) -> None:
        """Index a half message once appended (also used by recovery, with ``cache=False``); keep
        the record in memory for its commit (bounded by ``TRANSACTION_HALF_CACHE_BYTES``)."""
        if cache:
            self._cache_half(rec, res.commit_log_offset)
        p = rec.properties
        get = p.get
        first = rec.born_timestamp_ms + self.config.transaction_timeout_ms
        batch = task = ""
        if not _RARE_HALF_PROPS.isdisjoint(p):  # (a set test: the usual half has none of them)
            first = rec.born_timestamp_ms + self._immunity_ms(p)
            resumed_from = get(PROPERTY_TXMQ_RESUMED_FROM, "")
            if resumed_from.isascii() and resumed_from.isdigit():
                self.index.resumed.add(int(resumed_from))
            batch, task = get(PROPERTY_TXMQ_SINK_BATCH, ""), get(PROPERTY_TXMQ_SINK_TASK, "")
            if batch:
                self.sinks.add(batch, task, res.queue_offset)
        entry = HalfEntry(
            half_offset=res.queue_offset, commit_log_offset=res.commit_log_offset,
            producer_group=get(PROPERTY_PRODUCER_GROUP, ""),
            sender_client_id=get(PROPERTY_TXMQ_SENDER_CLIENT_ID, ""),
            msg_id=get(PROPERTY_UNIQ_KEY, ""), real_topic=get(PROPERTY_REAL_TOPIC, ""),
            keys=rec.keys, born_ms=rec.born_timestamp_ms, first_check_ms=first,
            next_check_ms=first, sink_batch=batch, sink_task=task,
        )
        self.index.add(entry)
        if cache and self.traces.enabled:  # (recovery: a pending one's life begins at its check)
            self.traces.half(entry, p, rec.store_timestamp_ms, rec.born_host)

    def _immunity_ms(self, p: dict[str, str]) -> int:
        """The time before a half's first check: the transaction timeout, or the half's
        ``CHECK_IMMUNITY_TIME_IN_SECONDS`` when longer (one that does not parse is ignored)."""
        immunity_ms = self.config.transaction_timeout_ms
        with contextlib.suppress(ValueError):
            immunity_ms = max(immunity_ms,
                              int(p.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "0")) * 1000)
        return immunity_ms

    # -- end transaction --------------------------------------------------------------------------
    def end(self, h: EndTransactionRequestHeader, now_ms: int, conn: int = 0) -> EndResult:
        """Commit or roll back a half message; first decision wins (I4).

        A repeated or conflicting end is answered with the recorded outcome, writes nothing and is
        counted in ``duplicate_ends``. UNKNOWN changes nothing. ``conn``: the connection it came
        on (who answered or ended, in the transaction's life; 0: unknown).
        """
        return self.end_many([h], now_ms, conn)[0]

    def end_many(self, headers: list[EndTransactionRequestHeader], now_ms: int,
                 conn: int = 0) -> list[EndResult]:
        """:meth:`end` for several requests at once, settled with one append: the real records of
        every commit and one op record per outcome (RocketMQ 5.1 batches op messages the same
        way). One result per header, in order; a second end of the same half message in the
        list is answered like a second end request (the first one's outcome, ``duplicate``)."""
        results: list[EndResult | None] = []
        decided: list[tuple[HalfEntry, Outcome]] = []
        first: dict[int, Outcome] = {}
        who = (self._clients.client_id(conn), self._peer(conn)) if self.traces.enabled else ("", "")
        headers = [self._by_commit_log_offset(h) for h in headers]
        for h in headers:
            if h.tran_state_table_offset in first and h.commit_or_rollback in _DECISIONS:
                self.stats["duplicate_ends"] += 1
                results.append(EndResult(ResponseCode.SUCCESS, first[h.tran_state_table_offset].value,
                                         duplicate=True))
                continue
            r = self._decide(h, now_ms, who)
            if isinstance(r, EndResult):
                results.append(r)
            else:
                decided.append(r)
                first[h.tran_state_table_offset] = r[1]
                results.append(None)
        parked: dict[int, str] = {}  # commits that cannot be: discarded instead, with the reason
        checked = frozenset(h.tran_state_table_offset for h in headers if h.from_transaction_check)
        durable = self._finish_many(decided, now_ms, parked=parked, checked=checked,
                                    who=who).durable_offset if decided else 0
        return [end_result(first[h.tran_state_table_offset], durable,
                            parked.get(h.tran_state_table_offset)) if r is None else r
                for h, r in zip(headers, results, strict=True)]

    def half_topic(self, h: EndTransactionRequestHeader) -> str | None:
        """The REAL_TOPIC of the half message end request ``h`` names, found as :meth:`end` finds
        it (by commit log offset, then half queue offset), pending or settled; None when ``h``
        names no half message. What ACL authorizes an end against (Pub on that topic: an end
        cannot borrow a topic its sender may publish to). Raises nothing but what reading the
        store may raise past :class:`~txmq.errors.StoreError` (the ACL check refuses then)."""
        h = self._by_commit_log_offset(h)
        entry = self.index.pending.get(h.tran_state_table_offset)
        if entry is not None:
            return entry.real_topic
        if h.commit_log_offset < self.store.min_offset:
            return None
        try:
            rec = self.store.read_at(h.commit_log_offset)
        except (StoreError, ValueError, IndexError):
            return None
        if rec.topic != HALF_TOPIC or rec.queue_offset != h.tran_state_table_offset:
            return None
        return rec.properties.get(PROPERTY_REAL_TOPIC)

    def _by_commit_log_offset(self, h: EndTransactionRequestHeader) -> EndTransactionRequestHeader:
        """``h`` naming its half message by commit log offset, as RocketMQ's broker finds it
        (``EndTransactionProcessor``: ``lookMessageByOffset(commitLogOffset)``): the C++ client
        sends ``tranStateTableOffset`` 0 on its first end request. When the offsets disagree, the
        half queue offset is read from the record at ``commitLogOffset``, if that is a half."""
        entry = self.index.pending.get(h.tran_state_table_offset)
        if entry is not None and entry.commit_log_offset == h.commit_log_offset:
            return h
        if h.commit_log_offset < self.store.min_offset:
            return h
        try:
            rec = self.store.read_at(h.commit_log_offset)
        except (StoreError, ValueError, IndexError):  # CorruptRecord: not a record boundary
            return h
        if rec.topic != HALF_TOPIC or rec.queue_offset == h.tran_state_table_offset:
            return h
        return msgspec.structs.replace(h, tran_state_table_offset=rec.queue_offset)

    def _duplicate(self, outcome: str) -> EndResult:
        """A repeated end's answer (``outcome``: the recorded one), sent once all appended so far
        is durable and replicated: the decision it repeats may still be on its way there."""
        return EndResult(ResponseCode.SUCCESS, outcome, duplicate=True,
                         durable_offset=self.store.write_offset)

    def _decide(self, h: EndTransactionRequestHeader, now_ms: int, who: tuple[str, str]
                ) -> EndResult | tuple[HalfEntry, Outcome]:
        """Validate one end request: a final answer, or the pending entry and its outcome
        (``who``: the client id and address it came from, for the transaction's life)."""
        if h.from_transaction_check:
            self._in_flight.pop(h.tran_state_table_offset, None)
            self.stats["checks_answered"] += 1
        entry = self.index.pending.get(h.tran_state_table_offset)
        if entry is None:
            recorded = self.index.settled.get(h.tran_state_table_offset)
            if recorded is None:
                return EndResult(ResponseCode.TRANSACTION_NOT_FOUND,
                                 remark=f"no half message at offset {h.tran_state_table_offset}")
            if h.commit_or_rollback in _DECISIONS:
                self.stats["duplicate_ends"] += 1
            return self._duplicate(recorded.value)
        if h.producer_group != entry.producer_group:
            return EndResult(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                             remark=f"producer group {h.producer_group!r} does not match "
                                    f"{entry.producer_group!r}")
        if h.commit_log_offset != entry.commit_log_offset:
            return EndResult(ResponseCode.ILLEGAL_OPERATION,
                             remark="commit log offset does not match the half message")
        if self.traces.enabled and (h.from_transaction_check or h.commit_or_rollback not in _DECISIONS):
            self.traces.answered(entry.half_offset, h.commit_or_rollback, h.from_transaction_check,
                                 now_ms, *who)
        if h.commit_or_rollback == TRANSACTION_COMMIT_TYPE:
            return entry, Outcome.COMMIT
        if h.commit_or_rollback == TRANSACTION_ROLLBACK_TYPE:
            return entry, Outcome.ROLLBACK
        return EndResult(ResponseCode.SUCCESS, Outcome.PENDING.value)

    def _finish(self, entry: HalfEntry, outcome: Outcome, now_ms: int,
                operator: str = "", reason: str = "") -> EndResult:
        return self._finish_many([(entry, outcome)], now_ms, operator, reason)

    def _finish_many(self, items: list[tuple[HalfEntry, Outcome]], now_ms: int,
                     operator: str = "", reason: str = "",
                     parked: dict[int, str] | None = None,
                     checked: frozenset[int] = frozenset(),
                     who: tuple[str, str] = ("", "")) -> EndResult:
        """Settle pending transactions with one append: a real (or discard) record per committed
        (or discarded) message, then op records whose bodies list the settled half offsets per
        outcome, at most ``limits.TRANSACTION_OP_MSG_MAX_SIZE`` characters each (RocketMQ 5.1
        batches op messages the same way).

        ``parked`` (half offset → reason) names discards to mark with a park reason; a commit
        whose half message has no valid real topic or queue is discarded instead and added there.
        ``checked``: half offsets decided by a check-back answer (recorded in the op records).
        ``who``: the client id and address of the request that settles them (their lives), and
        ``reason`` why (recorded in the op records for an operator only).
        """
        parked = {} if parked is None else parked
        records: list[Record] = []
        discard_at: dict[int, int] = {}
        settled: list[tuple[HalfEntry, Outcome]] = []
        problems: dict[tuple[str | None, str | None], str | None] = {}  # (topic, queue) → problem
        for entry, outcome in items:
            cached = self._uncache_half(entry.commit_log_offset)
            if outcome is not Outcome.ROLLBACK:
                half = cached or self.store.read_at(entry.commit_log_offset)
                where = (half.properties.get(PROPERTY_REAL_TOPIC),
                         half.properties.get(PROPERTY_REAL_QUEUE_ID))
                problem = problems[where] if where in problems else \
                    problems.setdefault(where, self._problem(*where))
                if outcome is Outcome.COMMIT and problem is not None:
                    outcome, parked[entry.half_offset] = Outcome.DISCARD, f"cannot be committed: {problem}"
                if outcome is Outcome.DISCARD:
                    discard_at[entry.half_offset] = len(records)
                records.append(self._real_or_discard_record(half, entry, outcome, now_ms,
                                                            parked.get(entry.half_offset)))
            settled.append((entry, outcome))
        records += op_records(settled, now_ms, operator, reason, checked)
        results = self._append(records)
        for entry, outcome in settled:
            if entry.half_offset in discard_at:
                self.index.discard(entry.half_offset,
                                   results[discard_at[entry.half_offset]].commit_log_offset,
                                   entry.msg_id)
            if entry.half_offset in parked:
                self.stats["parked"] += 1
                log.warning("half message %s (offset %d) discarded: %s", entry.msg_id,
                            entry.half_offset, parked[entry.half_offset])
            self._settled(entry, outcome, now_ms)
            if self.traces.enabled:
                self.traces.ended(entry, outcome._value_, now_ms,  # (_value_: no property call)
                                  decided_by(entry, outcome, operator, checked), *who, operator,
                                  parked.get(entry.half_offset, reason))
        last = results[-1]
        return EndResult(ResponseCode.SUCCESS, settled[-1][1].value,
                         durable_offset=last.commit_log_offset + last.size)

    def _cache_half(self, rec: Record, commit_log_offset: int) -> None:
        self._half_cache[commit_log_offset] = rec
        self._half_cache_bytes += len(rec.body)
        while self._half_cache_bytes > limits.TRANSACTION_HALF_CACHE_BYTES:
            oldest = next(iter(self._half_cache))
            self._half_cache_bytes -= len(self._half_cache.pop(oldest).body)

    def _uncache_half(self, commit_log_offset: int) -> Record | None:
        rec = self._half_cache.pop(commit_log_offset, None)
        if rec is not None:
            self._half_cache_bytes -= len(rec.body)
        return rec

    def _settled(self, entry: HalfEntry, outcome: Outcome, now_ms: int) -> None:
        settled = self.index.settle(entry.half_offset, outcome)
        assert settled, "a pending transaction is settled exactly once"
        if entry.sink_batch:
            self.sinks.remove(entry.sink_batch, entry.sink_task, entry.half_offset)
        self._in_flight.pop(entry.half_offset, None)
        key = _STATS_KEY[outcome]
        self.stats[key] += 1
        by_outcome = self.settled_by_topic.setdefault(entry.real_topic, {})
        by_outcome[key] = by_outcome.get(key, 0) + 1
        self.finish_latency.observe(max(0, now_ms - entry.born_ms) / 1000)

    def _real_or_discard_record(self, half: MessageExt | Record, entry: HalfEntry, outcome: Outcome,
                                now_ms: int, park_reason: str | None = None) -> Record:
        props = dict(half.properties)
        if outcome is Outcome.DISCARD:
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(entry.check_count)
            props[PROPERTY_TXMQ_HALF_OFFSET] = str(entry.half_offset)
            if park_reason is not None:
                origin = MessageExt(topic=HALF_TOPIC, body=b"", queue_offset=entry.half_offset,
                                    commit_log_offset=entry.commit_log_offset)
                props.update(park_properties("transaction", park_reason, origin))
            return Record(topic=TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0, body=half.body,
                          tags=half.tags, keys=half.keys, properties=props,
                          born_timestamp_ms=half.born_timestamp_ms, store_timestamp_ms=now_ms,
                          born_host=half.born_host)
        topic = props[PROPERTY_REAL_TOPIC]
        qid = int(props[PROPERTY_REAL_QUEUE_ID])
        for k in _TX_PROPS:
            props.pop(k, None)
        props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(entry.half_offset)
        # RocketMQ EndTransactionProcessor: a COMMIT-type record (the type follows from the
        # property above) whose preparedTransactionOffset is its half's commit log offset
        return Record(topic=topic, queue_id=qid, body=half.body, tags=half.tags, keys=half.keys,
                      properties=props, born_timestamp_ms=half.born_timestamp_ms,
                      store_timestamp_ms=now_ms, born_host=half.born_host, flag=half.flag,
                      reconsume_times=half.reconsume_times,
                      prepared_transaction_offset=entry.commit_log_offset)

    # -- check-back -------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> list[SendTo]:
        """Run one checker round: due half messages are checked back, discarded or deferred.

        Each message is handled on its own (I6): a failure holds back only that message.
        """
        self._finish_torn_batches(now_ms)
        self._after_clock_back(now_ms)
        for off, sent in list(self._in_flight.items()):
            if now_ms - sent > limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS:
                del self._in_flight[off]
        room = self.config.transaction_checks_in_flight_max - len(self._in_flight)
        out: list[SendTo] = []
        for entry in self.index.due(now_ms, max(room, 0)):
            try:
                action = self._check_one(entry, now_ms)
            except Exception:  # I6: one bad message never stalls the others
                log.exception("check-back of half offset %d failed", entry.half_offset)
                self.stats["check_errors"] += 1
                self.index.reschedule(entry, now_ms + self.config.transaction_check_interval_ms)
                continue
            if action is not None:
                out.append(action)
        return out

    def _after_clock_back(self, now_ms: int) -> None:
        """When the clock went back by more than ``CLOCK_BACK_TOLERANCE_MS`` since the last round,
        bring checks that were scheduled "one interval after" a now in the future back to one
        interval after this now; otherwise they would wait the size of the jump as well (found by
        the chaos run's clock jumps). O(pending), only on a backward jump."""
        last, self._last_tick_ms = self._last_tick_ms, now_ms
        if last - now_ms <= limits.CLOCK_BACK_TOLERANCE_MS:
            return
        latest = now_ms + self.config.transaction_check_interval_ms
        moved = [e for e in self.index.pending.values()
                 if e.check_count > 0 and e.next_check_ms > latest]
        for e in moved:
            self.index.reschedule(e, latest)
        log.warning("clock went back %d ms: %d check-backs rescheduled", last - now_ms, len(moved))

    def _check_one(self, entry: HalfEntry, now_ms: int) -> SendTo | None:
        cfg = self.config
        if entry.check_count >= cfg.transaction_check_max or (
            now_ms - entry.born_ms > cfg.file_reserved_time_ms
        ):
            self._finish(entry, Outcome.DISCARD, now_ms, reason=(
                f"no decision after {entry.check_count} check-backs (transaction_check_max)"
                if entry.check_count >= cfg.transaction_check_max else
                "older than file_reserved_time_ms"))
            log.warning("half message %s (offset %d) discarded after %d checks", entry.msg_id,
                        entry.half_offset, entry.check_count)
            return None
        if entry.sink_batch:  # nobody to ask: its batch was not committed in time (or it is an orphan)
            self._finish(entry, Outcome.ROLLBACK, now_ms)
            self.stats["sink_orphans_rolled_back"] += 1
            return None
        try:
            half = self.store.read_at(entry.commit_log_offset)
        except CorruptRecord:
            self.stats["check_errors"] += 1
            log.error("half message at %d unreadable; will retry", entry.commit_log_offset)
            self.index.reschedule(entry, now_ms + cfg.transaction_check_interval_ms)
            return None
        problem = self._problem(half.properties.get(PROPERTY_REAL_TOPIC),
                                half.properties.get(PROPERTY_REAL_QUEUE_ID))
        if problem is not None:  # it can never be committed: park it resumably (I5, I6)
            self._finish_many([(entry, Outcome.DISCARD)], now_ms,
                              parked={entry.half_offset: f"cannot be committed: {problem}"})
            return None
        conn = self._clients.pick_producer(entry.producer_group, entry.sender_client_id)
        self.index.reschedule(entry, now_ms + cfg.transaction_check_interval_ms)
        if conn is None:
            self.stats["checks_no_producer"] += 1  # retried next round, budget not spent
            return None
        entry.check_count += 1
        self.stats["checks_sent"] += 1
        self._in_flight[entry.half_offset] = now_ms
        if self.traces.enabled:
            self.traces.check_sent(entry, half.properties, half.born_host, now_ms,
                                   self._clients.client_id(conn), self._peer(conn))
        return SendTo(conn, self._check_request(half, entry))

    def _check_request(self, half: MessageExt, entry: HalfEntry) -> Command:
        props = dict(half.properties)
        half.topic = props.get(PROPERTY_REAL_TOPIC, half.topic)
        half.queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(entry.check_count)
        half.properties = props
        header = CheckTransactionStateRequestHeader(
            topic=half.topic, tran_state_table_offset=entry.half_offset,
            commit_log_offset=entry.commit_log_offset, msg_id=entry.msg_id,
            transaction_id=props.get(PROPERTY_TRANSACTION_ID) or entry.msg_id,
            offset_msg_id=offset_msg_id(half.store_host or self._store_host(),
                                        entry.commit_log_offset))
        return Command(code=RequestCode.CHECK_TRANSACTION_STATE, opaque=next(self._opaque),
                       flag=FLAG_ONEWAY, ext=to_ext(header), body=encode_message_ext(half))

    # -- recovery ---------------------------------------------------------------------------------
    @staticmethod
    def wants(rec: Record) -> bool:
        """Whether recovery needs this record (half, op, discard copy, or a committed message)."""
        return rec.topic in (HALF_TOPIC, OP_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, SINK_BATCH_TOPIC) or (
            PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in rec.properties)

    def recover(self, records: list[tuple[Record, AppendResult]]) -> None:
        """Apply stored half, op, discard, sink marker and committed records (commit log order,
        those stored after the snapshot :meth:`load_snapshot` loaded). A record that does not
        parse (an op body that is not offsets, a
        discard copy without its half offset, a marker that does not decode) is logged, counted in
        ``recovery_skipped`` and skipped: recovery never stops on one."""
        self._half_max = self.store.queue_bounds(HALF_TOPIC, 0)[1]
        for rec, res in records:
            try:
                why = self._recover_one(rec, res)
            except Exception as exc:  # the broker always starts again
                why = f"{type(exc).__name__}: {exc}"
            if why:
                self.stats["recovery_skipped"] += 1
                log.warning("recovery skipped the %s record at commit log offset %d: %s",
                            rec.topic[:200], res.commit_log_offset, why)
        for batch in list(self.sinks.pending):  # drop halves settled later in the log
            for task, offs in self.sinks.halves(batch).items():
                for off in offs:
                    if off not in self.index.pending:
                        self.sinks.remove(batch, task, off)
        for key, n in self._legacy_counts.items():
            entry = self.index.pending.get(int(key)) if key.isdigit() else None
            if entry is not None:
                entry.check_count = n
        self._legacy_counts = {}

    def _half_offset(self, text: str) -> int | None:
        """A stored half offset, if ``text`` is one this broker holds (or held)."""
        off = int(text) if text.strip().isascii() and text.strip().isdigit() else -1
        return off if 0 <= off < self._half_max else None

    def _recover_one(self, rec: Record, res: AppendResult) -> str:
        """Apply one record; return why it was skipped ("" if it was not)."""
        p = rec.properties
        if rec.topic == HALF_TOPIC:
            # indexed even without a valid real topic or queue: the checker then parks it with
            # the reason (discard, resumable), rather than leaving it unseen for ever
            self.on_half_stored(rec, res, cache=False)
        elif rec.topic == OP_TOPIC and rec.tags == REMOVE_TAG:
            outcome = p.get(PROPERTY_TXMQ_OUTCOME, Outcome.ROLLBACK.value)
            if outcome not in (Outcome.COMMIT, Outcome.ROLLBACK, Outcome.DISCARD):
                return f"op record with outcome {outcome[:50]!r}"
            toks = [t for t in rec.body.decode("utf-8", "replace").split(",") if t.strip()]
            offs = [self._half_offset(t) for t in toks]
            for off in offs:
                if off is not None:
                    self.index.settle(off, Outcome(outcome))
            if None in offs:
                return f"op record body holds {offs.count(None)} entries that are no half offset"
        elif rec.topic == SINK_BATCH_TOPIC:
            marker = decode_marker(rec.body)
            self.sinks.committed[marker.batch] = marker.tasks
            # the halves before the marker are the ones this commit settles
            self._torn[marker.batch] = (marker.tasks, self.sinks.halves(marker.batch))
        elif rec.topic == TRANS_CHECK_MAX_TIME_TOPIC:
            off = self._half_offset(p.get(PROPERTY_TXMQ_HALF_OFFSET, ""))
            if off is None:
                return "discard copy without a valid TXMQ_HALF_OFFSET"
            self.index.discard(off, res.commit_log_offset, p.get(PROPERTY_UNIQ_KEY, ""))
            self.index.settle(off, Outcome.DISCARD)
        elif PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in p:
            off = self._half_offset(p[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET])
            if off is None:
                return "committed message with an invalid TRAN_PREPARED_QUEUE_OFFSET"
            self.index.settle(off, Outcome.COMMIT)
        return ""

    # -- operators --------------------------------------------------------------------------------
    def lookup(self, ident: str) -> int | None:
        """Half offset of a transaction named by message id or ``half:<offset>``."""
        if ident.startswith("half:"):
            try:
                return int(ident[5:])
            except ValueError:
                return None
        return self.index.by_msg_id.get(ident)

    def describe(self, half_offset: int, now_ms: int) -> dict[str, object]:
        """State of one transaction for ``txmq tx show``; pending ones with age and checks."""
        outcome = self.index.outcome(half_offset)
        info: dict[str, object] = {"half_offset": half_offset,
                                   "state": outcome.value if outcome else "UNKNOWN_OFFSET"}
        e = self.index.pending.get(half_offset)
        if e is not None:
            info.update(msg_id=e.msg_id, topic=e.real_topic, keys=e.keys,
                        producer_group=e.producer_group, sender=e.sender_client_id,
                        age_ms=now_ms - e.born_ms, check_count=e.check_count,
                        next_check_in_ms=max(0, e.next_check_ms - now_ms))
        if half_offset in self.index.discarded:
            info["discard_commit_log_offset"] = self.index.discarded[half_offset]
            info["resumed"] = half_offset in self.index.resumed
        return info

    def pending_list(self, now_ms: int, limit: int) -> list[dict[str, object]]:
        """Oldest pending half messages first, at most ``limit``."""
        oldest = sorted(self.index.pending.values(), key=lambda e: (e.born_ms, e.half_offset))
        return [self.describe(e.half_offset, now_ms) for e in oldest[:limit]]

    def operator_end(self, half_offset: int, outcome: Outcome, operator: str, reason: str,
                     now_ms: int) -> EndResult:
        """An operator's commit or rollback of a pending transaction, recorded with who and why.

        A decided transaction is answered with its recorded outcome (I4), like any end request.
        """
        assert outcome in (Outcome.COMMIT, Outcome.ROLLBACK)
        if not operator:
            return EndResult(ResponseCode.INVALID_PARAMETER, remark="an operator name is required")
        entry = self.index.pending.get(half_offset)
        if entry is None:
            recorded = self.index.settled.get(half_offset)
            if recorded is None:
                return EndResult(ResponseCode.TRANSACTION_NOT_FOUND, remark="no such transaction")
            self.stats["duplicate_ends"] += 1
            return self._duplicate(recorded.value)
        return self._finish(entry, outcome, now_ms, operator, reason)

    def resume(self, half_offset: int, now_ms: int) -> tuple[ResponseCode, str, int]:
        """Put a discarded half message back to be checked again (RocketMQ
        RESUME_CHECK_HALF_MESSAGE, check count reset). Returns (code, remark, new half offset)."""
        clo = self.index.discarded.get(half_offset)
        if clo is None:
            return ResponseCode.TRANSACTION_NOT_FOUND, "not a discarded transaction", -1
        if half_offset in self.index.resumed:
            return ResponseCode.ILLEGAL_OPERATION, "already resumed", -1
        parked = self.store.read_at(clo)
        props = dict(parked.properties)
        props.pop(PROPERTY_TRANSACTION_CHECK_TIMES, None)
        props.pop(PROPERTY_TXMQ_HALF_OFFSET, None)
        for key in PARK_PROPERTIES:  # resumed: no longer parked
            props.pop(key, None)
        props[PROPERTY_TXMQ_RESUMED_FROM] = str(half_offset)
        rec = Record(topic=HALF_TOPIC, queue_id=0, body=parked.body, tags=parked.tags,
                     keys=parked.keys, properties=props, born_timestamp_ms=now_ms,
                     store_timestamp_ms=now_ms)
        res = self._append([rec])[0]
        self.on_half_stored(rec, res)
        return ResponseCode.SUCCESS, "", res.queue_offset

    # -- Spark sink batches -----------------------------------------------------------------------
    def commit_batch(self, batch: str, tasks: dict[str, int], producer_group: str,
                     now_ms: int) -> EndResult:
        """Commit the halves of the named task attempts of ``batch`` and roll back its other
        halves, in one append led by a batch marker (see :mod:`._sink`). Idempotent per batch.

        Returns ``outcome`` "COMMIT" (or "COMMIT" with ``duplicate`` for a batch committed before).
        Errors: TRANSACTION_NOT_FOUND when a task attempt's pending halves do not match its row
        count (they timed out and were rolled back): nothing is written.
        """
        self._finish_torn_batches(now_ms)
        pending = self.sinks.halves(batch)
        if batch in self.sinks.committed:
            self.stats["sink_duplicate_batches"] += 1
            last = self._rollback_all(pending, now_ms)
            return EndResult(ResponseCode.SUCCESS, Outcome.COMMIT.value, duplicate=True,
                             durable_offset=max(last, self.store.write_offset))
        for task, n in tasks.items():
            if len(pending.get(task, ())) != n:
                return EndResult(ResponseCode.TRANSACTION_NOT_FOUND,
                                 remark=f"batch {batch} task {task}: {len(pending.get(task, ()))} "
                                        f"pending halves, expected {n}")
            for off in pending.get(task, ()):
                if self.index.pending[off].producer_group != producer_group:
                    return EndResult(ResponseCode.TRANSACTION_STATE_GROUP_WRONG,
                                     remark=f"half {off} belongs to another producer group")
        marker = Record(topic=SINK_BATCH_TOPIC, queue_id=0,
                        body=encode_marker(BatchMarker(batch, dict(tasks))),
                        born_timestamp_ms=now_ms, store_timestamp_ms=now_ms)
        results = self._append([marker])
        self.sinks.committed[batch] = dict(tasks)
        self.stats["sink_batches"] += 1
        durable = results[-1].commit_log_offset + results[-1].size
        return EndResult(ResponseCode.SUCCESS, Outcome.COMMIT.value,
                         durable_offset=max(durable, self._settle_batch(batch, tasks, now_ms)))

    def _settle_batch(self, batch: str, tasks: dict[str, int], now_ms: int) -> int:
        """Commit the halves of ``tasks`` and roll back the rest of ``batch`` in one append;
        returns the durable offset to wait for (0 if nothing was pending)."""
        items = [(self.index.pending[off], Outcome.COMMIT if task in tasks else Outcome.ROLLBACK)
                 for task, offs in self.sinks.halves(batch).items() for off in offs]
        return self._settle_items(items, now_ms)

    def _settle_items(self, items: list[tuple[HalfEntry, Outcome]], now_ms: int) -> int:
        if not items:
            return 0
        self.stats["sink_orphans_rolled_back"] += sum(o is Outcome.ROLLBACK for _, o in items)
        return self._finish_many(items, now_ms).durable_offset

    def _rollback_all(self, pending: dict[str, list[int]], now_ms: int) -> int:
        items = [(self.index.pending[off], Outcome.ROLLBACK) for offs in pending.values()
                 for off in offs]
        return self._settle_items(items, now_ms)

    def abort_batch(self, batch: str, now_ms: int) -> EndResult:
        """Roll back every pending half of an uncommitted ``batch``; after a commit, change nothing
        (Spark calls abort after a commit that raised, docs/pyspark.md §3)."""
        self._finish_torn_batches(now_ms)
        if batch in self.sinks.committed:
            return self._duplicate(Outcome.COMMIT.value)
        last = self._rollback_all(self.sinks.halves(batch), now_ms)
        return EndResult(ResponseCode.SUCCESS, Outcome.ROLLBACK.value, durable_offset=last)

    def _finish_torn_batches(self, now_ms: int) -> None:
        """After recovery: settle the halves that preceded a batch marker but were still pending
        (the crash cut the commit short). Runs once, before anything else can settle them."""
        torn, self._torn = self._torn, {}
        for batch, (tasks, halves) in torn.items():
            for task, offs in halves.items():
                outcome = Outcome.COMMIT if task in tasks else Outcome.ROLLBACK
                for off in offs:
                    entry = self.index.pending.get(off)
                    if entry is not None:
                        log.warning("sink batch %s: completing %s of half %d after a crash",
                                    batch, outcome.value, off)
                        self._finish(entry, outcome, now_ms)

