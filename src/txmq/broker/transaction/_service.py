"""Half messages, end transaction and check-back (RocketMQ's transaction model), sans-IO.

Sources: RocketMQ ``TransactionalMessageBridge#parseHalfMessageInner`` (prepare),
``EndTransactionProcessor`` (commit / rollback), ``TransactionalMessageServiceImpl#check`` (check-back),
as summarised in reference/rocketmq.md §1.3–1.6; departures are described in :mod:`._index`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from itertools import count

from txmq import limits
from txmq.broker._actions import SendTo
from txmq.broker._clients import ClientRegistry
from txmq.broker._config import BrokerConfig
from txmq.broker.transaction._index import HalfEntry, Outcome, TransactionIndex
from txmq.errors import CorruptRecord, ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_SENDER_CLIENT_ID,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    CheckTransactionStateRequestHeader,
    Command,
    EndTransactionRequestHeader,
    MessageExt,
    RequestCode,
    encode_message_ext,
    to_ext,
)
from txmq.store import AppendResult, Record, Store

__all__ = [
    "HALF_TOPIC",
    "OP_TOPIC",
    "REMOVE_TAG",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "EndResult",
    "TransactionService",
]

log = logging.getLogger("txmq.broker.transaction")

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
REMOVE_TAG = "d"
_TX_PROPS = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
             PROPERTY_TXMQ_SENDER_CLIENT_ID)

Append = Callable[[list[Record]], list[AppendResult]]


class EndResult:
    """What END_TRANSACTION decided: response code, recorded outcome, and durability target."""

    __slots__ = ("code", "duplicate", "durable_offset", "outcome", "remark")

    def __init__(self, code: ResponseCode, outcome: str = "", *, duplicate: bool = False,
                 durable_offset: int = 0, remark: str = "") -> None:
        self.code, self.outcome, self.duplicate = code, outcome, duplicate
        self.durable_offset, self.remark = durable_offset, remark


class TransactionService:
    """Prepare, end and check-back over a store, an index and the client registry.

    Args:
        config: timeouts, check interval and budget (RocketMQ BrokerConfig names).
        store: where half, op, real and discarded messages are written.
        append: appends records through the broker (assigns offsets, wakes long polls).
        clients: live producers, for check-back routing.
    """

    def __init__(self, config: BrokerConfig, store: Store, append: Append,
                 clients: ClientRegistry) -> None:
        self.config = config
        self.store = store
        self.index = TransactionIndex()
        self._append = append
        self._clients = clients
        self._opaque = count(1 << 30)
        self._in_flight: dict[int, int] = {}  # half offset -> sent at ms
        self.stats = {"commits": 0, "rollbacks": 0, "discards": 0, "checks_sent": 0,
                      "checks_answered": 0, "duplicate_ends": 0, "check_errors": 0,
                      "checks_no_producer": 0}
        self.finish_latency_s: list[float] = []

    # -- prepare ----------------------------------------------------------------------------------
    def half_record(self, rec: Record, producer_group: str, client_id: str) -> Record:
        """Turn a ``TRAN_MSG`` send into the half record (``parseHalfMessageInner``)."""
        props = dict(rec.properties)
        props[PROPERTY_REAL_TOPIC] = rec.topic
        props[PROPERTY_REAL_QUEUE_ID] = str(rec.queue_id)
        props[PROPERTY_PRODUCER_GROUP] = producer_group
        props[PROPERTY_TXMQ_SENDER_CLIENT_ID] = client_id
        props[PROPERTY_TRANSACTION_ID] = props.get(PROPERTY_UNIQ_KEY, "")
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        return Record(topic=HALF_TOPIC, queue_id=0, body=rec.body, tags=rec.tags, keys=rec.keys,
                      properties=props, born_timestamp_ms=rec.born_timestamp_ms,
                      store_timestamp_ms=rec.store_timestamp_ms)

    def on_half_stored(self, rec: Record, res: AppendResult) -> None:
        """Index a half message once appended (also used by recovery)."""
        p = rec.properties
        immunity_ms = self.config.transaction_timeout_ms
        with contextlib.suppress(ValueError):
            immunity_ms = max(immunity_ms,
                              int(p.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "0")) * 1000)
        first = rec.born_timestamp_ms + immunity_ms
        self.index.add(HalfEntry(
            half_offset=res.queue_offset, commit_log_offset=res.commit_log_offset,
            producer_group=p.get(PROPERTY_PRODUCER_GROUP, ""),
            sender_client_id=p.get(PROPERTY_TXMQ_SENDER_CLIENT_ID, ""),
            msg_id=p.get(PROPERTY_UNIQ_KEY, ""), real_topic=p.get(PROPERTY_REAL_TOPIC, ""),
            keys=rec.keys, born_ms=rec.born_timestamp_ms, first_check_ms=first,
            next_check_ms=first,
        ))

    # -- end transaction --------------------------------------------------------------------------
    def end(self, h: EndTransactionRequestHeader, now_ms: int) -> EndResult:
        """Commit or roll back a half message; first decision wins (I4).

        A repeated or conflicting end is answered with the recorded outcome, writes nothing and is
        counted in ``duplicate_ends``. UNKNOWN changes nothing.
        """
        if h.from_transaction_check:
            self._in_flight.pop(h.tran_state_table_offset, None)
            self.stats["checks_answered"] += 1
        entry = self.index.pending.get(h.tran_state_table_offset)
        if entry is None:
            recorded = self.index.settled.get(h.tran_state_table_offset)
            if recorded is None:
                return EndResult(ResponseCode.TRANSACTION_NOT_FOUND,
                                 remark=f"no half message at offset {h.tran_state_table_offset}")
            if h.commit_or_rollback in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
                self.stats["duplicate_ends"] += 1
            return EndResult(ResponseCode.SUCCESS, recorded.value, duplicate=True)
        if h.producer_group != entry.producer_group:
            return EndResult(ResponseCode.PRODUCER_GROUP_MISMATCH,
                             remark=f"producer group {h.producer_group!r} does not match "
                                    f"{entry.producer_group!r}")
        if h.commit_log_offset != entry.commit_log_offset:
            return EndResult(ResponseCode.ILLEGAL_OPERATION,
                             remark="commit log offset does not match the half message")
        if h.commit_or_rollback == TRANSACTION_COMMIT_TYPE:
            return self._finish(entry, Outcome.COMMIT, now_ms, h.operator)
        if h.commit_or_rollback == TRANSACTION_ROLLBACK_TYPE:
            return self._finish(entry, Outcome.ROLLBACK, now_ms, h.operator)
        return EndResult(ResponseCode.SUCCESS, Outcome.PENDING.value)

    def _finish(self, entry: HalfEntry, outcome: Outcome, now_ms: int,
                operator: str = "") -> EndResult:
        records: list[Record] = []
        if outcome is not Outcome.ROLLBACK:
            half = self.store.read_at(entry.commit_log_offset)
            records.append(self._real_or_discard_record(half, entry, outcome, now_ms))
        op_props = {PROPERTY_TXMQ_OUTCOME: outcome.value}
        if operator:
            op_props["TXMQ_OPERATOR"] = operator
        records.append(Record(topic=OP_TOPIC, queue_id=0, body=f"{entry.half_offset},".encode(),
                              tags=REMOVE_TAG, properties=op_props, born_timestamp_ms=now_ms,
                              store_timestamp_ms=now_ms))
        results = self._append(records)
        settled = self.index.settle(entry.half_offset, outcome)
        assert settled, "a pending transaction is settled exactly once"
        self._in_flight.pop(entry.half_offset, None)
        key = {Outcome.COMMIT: "commits", Outcome.ROLLBACK: "rollbacks",
               Outcome.DISCARD: "discards"}[outcome]
        self.stats[key] += 1
        self.finish_latency_s.append(max(0, now_ms - entry.born_ms) / 1000)
        last = results[-1]
        return EndResult(ResponseCode.SUCCESS, outcome.value,
                         durable_offset=last.commit_log_offset + last.size)

    def _real_or_discard_record(self, half: MessageExt, entry: HalfEntry, outcome: Outcome,
                                now_ms: int) -> Record:
        props = dict(half.properties)
        if outcome is Outcome.DISCARD:
            props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(entry.check_count)
            return Record(topic=TRANS_CHECK_MAX_TIME_TOPIC, queue_id=0, body=half.body,
                          tags=half.tags, keys=half.keys, properties=props,
                          born_timestamp_ms=half.born_timestamp_ms, store_timestamp_ms=now_ms)
        topic = props[PROPERTY_REAL_TOPIC]
        qid = int(props[PROPERTY_REAL_QUEUE_ID])
        for k in _TX_PROPS:
            props.pop(k, None)
        props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(entry.half_offset)
        return Record(topic=topic, queue_id=qid, body=half.body, tags=half.tags, keys=half.keys,
                      properties=props, born_timestamp_ms=half.born_timestamp_ms,
                      store_timestamp_ms=now_ms)

    # -- check-back -------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> list[SendTo]:
        """Run one checker round: due half messages are checked back, discarded or deferred.

        Each message is handled on its own (I6): a failure holds back only that message.
        """
        for off, sent in list(self._in_flight.items()):
            if now_ms - sent > limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS:
                del self._in_flight[off]
        room = limits.TRANSACTION_CHECKS_IN_FLIGHT_MAX - len(self._in_flight)
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

    def _check_one(self, entry: HalfEntry, now_ms: int) -> SendTo | None:
        cfg = self.config
        if entry.check_count >= cfg.transaction_check_max or (
            now_ms - entry.born_ms > cfg.file_reserved_time_ms
        ):
            self._finish(entry, Outcome.DISCARD, now_ms)
            log.warning("half message %s (offset %d) discarded after %d checks", entry.msg_id,
                        entry.half_offset, entry.check_count)
            return None
        conn = self._clients.pick_producer(entry.producer_group, entry.sender_client_id)
        self.index.reschedule(entry, now_ms + cfg.transaction_check_interval_ms)
        if conn is None:
            self.stats["checks_no_producer"] += 1  # retried next round, budget not spent
            return None
        try:
            half = self.store.read_at(entry.commit_log_offset)
        except CorruptRecord:
            self.stats["check_errors"] += 1
            log.error("half message at %d unreadable; will retry", entry.commit_log_offset)
            return None
        entry.check_count += 1
        self.stats["checks_sent"] += 1
        self._in_flight[entry.half_offset] = now_ms
        return SendTo(conn, self._check_request(half, entry))

    def _check_request(self, half: MessageExt, entry: HalfEntry) -> Command:
        props = dict(half.properties)
        half.topic = props.get(PROPERTY_REAL_TOPIC, half.topic)
        half.queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(entry.check_count)
        half.properties = props
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=entry.half_offset, commit_log_offset=entry.commit_log_offset,
            msg_id=entry.msg_id, transaction_id=entry.msg_id, producer_group=entry.producer_group)
        return Command(code=RequestCode.CHECK_TRANSACTION_STATE, opaque=next(self._opaque),
                       flags=FLAG_ONEWAY, ext=to_ext(header), body=encode_message_ext(half))

    # -- recovery ---------------------------------------------------------------------------------
    def recover(self, records: list[tuple[Record, AppendResult]]) -> None:
        """Rebuild the index from stored half, op and committed records (commit log order)."""
        for rec, res in records:
            if rec.topic == HALF_TOPIC:
                self.on_half_stored(rec, res)
            elif rec.topic == OP_TOPIC and rec.tags == REMOVE_TAG:
                outcome = Outcome(rec.properties.get(PROPERTY_TXMQ_OUTCOME, "ROLLBACK"))
                for tok in rec.body.decode().split(","):
                    if tok.strip():
                        self.index.settle(int(tok), outcome)
            elif PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in rec.properties:
                self.index.settle(int(rec.properties[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET]),
                                  Outcome.COMMIT)
