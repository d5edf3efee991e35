"""The broker fuzz target: a request program, read from the input bytes, through the wire codec
(JSON or ROCKETMQ headers, one field in four corrupted) and ``Broker.handle`` / ``tick`` on a
MemoryStore, then a reopen over the same store that must recover the same state.

It raises :class:`BrokerFinding` when a request is answered ``SYSTEM_ERROR`` for anything but a
header that does not decode (RocketMQ's answer to that), when an unexpected exception is logged,
when ``tick`` raises, when a reply or check-back does not cross the wire codec or does not decode,
or when the reopened broker differs.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from txmq.broker import Broker, BrokerConfig, Reply, SendTo
from txmq.errors import (
    ProtocolError,
    ResponseCode,
)
from txmq.protocol import (
    FLAG_ONEWAY,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    AdminEndTransactionRequestHeader,
    CheckTransactionStateRequestHeader,
    Command,
    ConsumerData,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    HeartbeatData,
    LockBatchRequestBody,
    Message,
    MessageQueue,
    PendingTransactionsRequestHeader,
    ProducerData,
    PullMessageRequestHeader,
    QueryMessageRequestHeader,
    RequestCode,
    ResetOffsetRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    SubscriptionData,
    TransactionIdRequestHeader,
    TransactionTraceRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageByUniqKeyRequestHeader,
    ViewMessageRequestHeader,
    decode_message_ext,
    decode_offset_msg_id,
    encode_batch,
    encode_body,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.store import MemoryStore
from txmq.testing._fuzz_wire import Source, wire_round_trip

__all__ = [
    "HOSTILE_TOPICS",
    "PROPERTY_VALUES",
    "RESERVED_PROPERTIES",
    "BrokerFinding",
    "UnexpectedErrors",
    "broker_seeds",
    "broker_state",
    "broker_target",
    "is_header_remark",
    "is_valid_topic",
    "reopen",
]

_SYSTEM_TOPICS = ["RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                  "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX", "TXMQ_SYS_SINK_BATCH_TOPIC"]
HOSTILE_TOPICS = [".", "..", "../x", "../../../x", "", "a/b", "a b", "a.b", "€" * 100, "x" * 128,
                  "%RETRY%x", "%DLQ%x", "t@1", "\x00", *_SYSTEM_TOPICS]
"""Topic names a client may send that must never brick the broker (issue 11's trial)."""
RESERVED_PROPERTIES = [PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_TIME_LEVEL,
                       PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP, PROPERTY_UNIQ_KEY,
                       PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS]
PROPERTY_VALUES = ["", "0", "1", "3", "18", "19", "-1", "abc", "true", "false", "1e3", "t", "..",
                   "../../x", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "9" * 25, "€" * 100]
"""Values tried for every reserved property (valid and garbage)."""
_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_HEADER_REMARK = re.compile(r"^(the custom field <[^>]*> is null|bad [\w\[\], ]+?( body)?: )", re.S)


def is_valid_topic(topic: str) -> bool:
    """RocketMQ ``TopicValidator``'s rule: ``^[%|a-zA-Z0-9_-]+$``, at most 127 characters."""
    return len(topic) <= 127 and bool(_TOPIC_RE.match(topic))


def is_header_remark(remark: str | None) -> bool:
    """Whether a SYSTEM_ERROR remark is the broker's answer to a header or body that does not
    decode (:class:`~txmq.errors.MalformedHeader`: ``the custom field <x> is null`` as RocketMQ's
    ``RemotingCommand.decodeCommandCustomHeader``, or ``bad <Class>: ...``), the one SYSTEM_ERROR
    a client's input may cause."""
    return bool(remark and _HEADER_REMARK.match(remark))


class BrokerFinding(AssertionError):
    """The broker target saw something no input may cause (see the module docstring)."""


class UnexpectedErrors(logging.Handler):
    """Collects the broker's "unexpected error" and "store error" log records (``Broker.handle``
    turns an unexpected exception into SYSTEM_ERROR, or for a one-way request only into this log
    line; a MemoryStore never fails).

    Use :meth:`install` / :meth:`uninstall` around the requests; :meth:`take` returns and clears
    ``"<ExceptionType>: <message>"`` (or the log message) of each record.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("unexpected error") and record.exc_info:
            exc = record.exc_info[1]
            self.found.append(f"{type(exc).__name__}: {exc}")
        elif text.startswith(("store error", "cannot encode")):
            self.found.append(text)

    def take(self) -> list[str]:
        out, self.found = self.found, []
        return out

    def install(self) -> UnexpectedErrors:
        logging.getLogger("txmq.broker").addHandler(self)
        return self

    def uninstall(self) -> None:
        logging.getLogger("txmq.broker").removeHandler(self)


_UNEXPECTED = UnexpectedErrors()


# -- broker -------------------------------------------------------------------------------------------
def broker_state(broker: Broker) -> dict[str, Any]:
    """What a restart must keep: topics, every known queue's bounds and messages (id, body),
    consumer offsets, and the transaction index (pending offsets with check counts, outcomes)."""
    store, queues = broker.store, {}
    for topic in sorted(broker.topics):
        for qid in store.queue_ids(topic):
            lo, hi = store.queue_bounds(topic, qid)
            msgs = store.read_queue(topic, qid, lo, hi - lo, 1 << 40) if hi > lo else []
            queues[f"{topic}/{qid}"] = (lo, hi, [(m.msg_id, m.body) for m in msgs])
    idx = broker.tx.index
    return {"topics": dict(sorted(broker.topics.items())), "queues": queues,
            "offsets": dict(sorted(broker.offsets.snapshot().items())),
            "pending": {o: e.check_count for o, e in sorted(idx.pending.items())},
            "settled": dict(sorted(idx.settled.items())),
            "discarded": sorted(idx.discarded)}


def _check_output(code: int, actions: list[Any]) -> list[Command]:
    """The replies among ``actions``; every reply and check-back must cross the wire codec, a
    SYSTEM_ERROR reply must be a header's, a check-back must carry a decodable header and record."""
    for text in _UNEXPECTED.take():  # one-way requests get no reply: the log says it
        raise BrokerFinding(f"request code {code} answered SYSTEM_ERROR: {text}")
    replies = []
    for a in actions:
        if not isinstance(a, Reply | SendTo):
            continue
        out = a.command
        try:
            wire_round_trip(out)
        except (AssertionError, ProtocolError) as exc:
            raise BrokerFinding(f"request code {code}: output does not cross the wire: "
                                f"{type(exc).__name__}: {exc}") from exc
        if isinstance(a, Reply):
            if out.code == ResponseCode.SYSTEM_ERROR and not is_header_remark(out.remark):
                raise BrokerFinding(f"request code {code} answered SYSTEM_ERROR: {out.remark}")
            replies.append(out)
        elif out.code == RequestCode.CHECK_TRANSACTION_STATE:
            try:
                from_ext(out.ext, CheckTransactionStateRequestHeader)
                decode_message_ext(out.body)
            except ProtocolError as exc:
                raise BrokerFinding(f"check-back does not decode: {type(exc).__name__}: {exc}") from exc
    return replies


@dataclass
class _Run:
    broker: Broker
    store: MemoryStore
    config: BrokerConfig
    now: int = 1_000_000
    halves: list[EndTransactionRequestHeader] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    seq: int = 0
    hostile: list[str] = field(default_factory=list)
    """Requests naming a hostile or system topic (or REAL_TOPIC) that were answered SUCCESS."""

    def request(self, src: Source, code: int, ext: dict[str, str], body: bytes = b"",
                flag: int = 0, hostile: str = "") -> Command | None:
        """Send one request through the wire codec (serialize type and a corruption of one ext
        field chosen by ``src``) to ``Broker.handle``; return the reply, None for a one-way one."""
        ext = _corrupt(src, dict(ext))
        kind = src.pick([SERIALIZE_JSON, SERIALIZE_ROCKETMQ])
        cmd = wire_round_trip(Command(int(code), self.seq, flag, ext=ext, body=body,
                                      serialize_type=kind))
        assert cmd is not None
        self.seq += 1
        _UNEXPECTED.take()
        actions = self.broker.handle(1 + self.seq % 2, cmd, self.now)
        self.store.flush()
        replies = _check_output(code, actions)
        if hostile and (not replies or replies[0].code == ResponseCode.SUCCESS):
            self.hostile.append(f"code {code}: {hostile}")
        return replies[0] if replies else None


_GARBAGE = ["", "abc", "1e3", " 1", "9" * 25, "-", "true", "€", "-1", "0x1"]


def _corrupt(src: Source, ext: dict[str, str]) -> dict[str, str]:
    """One in four requests: a field dropped or given a value that may not parse."""
    if ext and src.num() % 4 == 0:
        key = src.pick(sorted(ext))
        if src.num() % 2:
            del ext[key]
        else:
            ext[key] = src.pick(_GARBAGE)
    return ext


def _hostile(topic: str, props: dict[str, str]) -> str:
    """Why a validating broker refuses a send (a bad or system topic, a reserved property)."""
    if not is_valid_topic(topic) or topic in _SYSTEM_TOPICS:
        return f"topic {topic!r}"
    return "REAL_TOPIC" if {PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID} & set(props) else ""


_TOPICS = ["t", "t", "t", "u", *HOSTILE_TOPICS]
_GROUPS = ["pg", "pg", "cg", "other", ""]
_END_TYPES = [TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_NOT_TYPE, 4, 99]


def _props(src: Source, run: _Run) -> dict[str, str]:
    run.seq += 1
    props = {PROPERTY_UNIQ_KEY: f"M{run.seq}"}
    run.ids.append(props[PROPERTY_UNIQ_KEY])
    for _ in range(src.num() % 4):
        props[src.pick(RESERVED_PROPERTIES)] = src.pick(PROPERTY_VALUES)
    return props


def _send(src: Source, run: _Run, half: bool) -> None:
    topic, qid, props = src.pick(_TOPICS), src.pick([0, 1, -1, 7]), _props(src, run)
    if half:
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
    h = SendMessageRequestHeader(producer_group=src.pick(_GROUPS), topic=topic, queue_id=qid,
                                 properties=encode_properties(props), born_timestamp=run.now,
                                 sys_flag=src.pick([0, 0, TRANSACTION_PREPARED_TYPE, 1]))
    ext = to_ext(h) if src.num() % 2 else to_ext(SendMessageRequestHeaderV2.from_v1(h))
    code = RequestCode.SEND_MESSAGE if "producerGroup" in ext else RequestCode.SEND_MESSAGE_V2
    rep = run.request(src, code, ext, src.blob(40), src.pick([0, 0, 0, FLAG_ONEWAY]),
                      _hostile(topic, props))
    if rep is not None and rep.code == 0 and half:
        sent = from_ext(rep.ext, SendMessageResponseHeader)
        run.halves.append(EndTransactionRequestHeader(
            producer_group=h.producer_group, tran_state_table_offset=sent.queue_offset,
            commit_log_offset=decode_offset_msg_id(sent.msg_id)[1], commit_or_rollback=0,
            msg_id=sent.transaction_id or ""))


def _batch_send(src: Source, run: _Run) -> None:
    topic = src.pick(_TOPICS)
    msgs = [Message(topic=topic, body=src.blob(8), properties=_props(src, run))
            for _ in range(1 + src.num() % 3)]
    h = SendMessageRequestHeaderV2(producer_group="pg", topic=topic, queue_id=src.pick([0, 1, -1]),
                                   born_timestamp=run.now, batch=True)
    run.request(src, RequestCode.SEND_BATCH_MESSAGE, to_ext(h), encode_batch(msgs),
                hostile=_hostile(topic, {k: v for m in msgs for k, v in m.properties.items()}))


def _end(src: Source, run: _Run) -> None:
    if run.halves and src.num() % 4:
        h = src.pick(run.halves)
    else:
        h = EndTransactionRequestHeader(producer_group="pg", tran_state_table_offset=src.num(),
                                        commit_log_offset=src.num(2), commit_or_rollback=0,
                                        msg_id=src.pick(["", *run.ids[-2:]]))
    h = msgspec.structs.replace(h, producer_group=src.pick([h.producer_group, *_GROUPS]),
                                commit_or_rollback=src.pick(_END_TYPES),
                                from_transaction_check=bool(src.num() % 2))
    if src.num() % 4:
        run.request(src, RequestCode.END_TRANSACTION, to_ext(h), flag=src.pick([0, FLAG_ONEWAY]))
    else:  # txmq's batch of ends: a JSON list of ext maps
        run.request(src, RequestCode.END_TRANSACTION_BATCH, {}, encode_body([to_ext(h)] * 2))


def _admin(src: Source, run: _Run) -> None:
    ident = src.pick([*run.ids[-4:], "half:0", "half:x", "nope"])
    code = src.pick([RequestCode.ADMIN_END_TRANSACTION, RequestCode.RESUME_CHECK_HALF_MESSAGE,
                     RequestCode.QUERY_TRANSACTION, RequestCode.GET_TRANSACTION_STATS,
                     RequestCode.GET_PENDING_TRANSACTIONS, RequestCode.GET_TRANSACTION_TRACE])
    header: msgspec.Struct = {
        RequestCode.ADMIN_END_TRANSACTION: AdminEndTransactionRequestHeader(
            id=ident, outcome=src.pick(["COMMIT", "ROLLBACK", "X"]), operator="op"),
        RequestCode.GET_TRANSACTION_TRACE: TransactionTraceRequestHeader(
            id=src.pick([ident, ""]), trace_id=src.pick(["", "0" * 31 + "1", "X" * 32, ident]),
            limit=src.pick([1, 16, -1, 2**40])),
        RequestCode.RESUME_CHECK_HALF_MESSAGE: ResumeCheckHalfMessageRequestHeader(msg_id=ident),
        RequestCode.GET_PENDING_TRANSACTIONS: PendingTransactionsRequestHeader(
            limit=src.pick([1, 100, -1]))}.get(code, TransactionIdRequestHeader(id=ident))
    run.request(src, code, to_ext(header))


def _heartbeat(src: Source, run: _Run) -> None:
    group = src.pick(_GROUPS)
    data = HeartbeatData(client_id=f"c{src.num() % 2}", producer_data_set=[ProducerData(group_name=group)],
                         consumer_data_set=[ConsumerData(group_name=src.pick(["cg", "a.b", ""]),
                                                         subscription_data_set=[SubscriptionData(
                                                             topic=src.pick(_TOPICS))])])
    run.request(src, RequestCode.HEART_BEAT, {}, encode_body(data))
    if src.num() % 4 == 0:  # JSON bodies that do not parse (or hold invalid UTF-8)
        body = encode_body([{"clientID": "c"}]).replace(b"c", src.blob(4))
        run.request(src, src.pick([RequestCode.HEART_BEAT, RequestCode.END_TRANSACTION_BATCH,
                                   RequestCode.COMMIT_SINK_BATCH, RequestCode.SEND_BATCH_MESSAGE,
                                   RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ]),
                    {"producerGroup": "pg", "b": "t", "a": "pg", "e": "0", "g": "0", "batch": "s/1"},
                    body)
    else:
        lock = LockBatchRequestBody(consumer_group="cg", client_id="c0",
                                    mq_set=[MessageQueue(src.pick(_TOPICS), src.pick([0, 1, 9]))])
        run.request(src, src.pick([RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ]), {},
                    encode_body(lock))


def _read(src: Source, run: _Run, op: int) -> None:
    topic, qid = src.pick(_TOPICS), src.pick([0, 1, -1, 7])
    if op == 7:
        run.request(src, RequestCode.PULL_MESSAGE, to_ext(PullMessageRequestHeader(
            consumer_group="cg", topic=topic, queue_id=qid, queue_offset=src.pick([0, 1, -1, 5, 2**40]),
            max_msg_nums=src.pick([1, 32, 0]), sys_flag=src.pick([0, 1, 4, 5]),
            commit_offset=src.pick([-1, 0, 3]))))
    elif op == 8:
        run.request(src, RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(UpdateConsumerOffsetRequestHeader(
            consumer_group="cg", topic=topic, queue_id=qid, commit_offset=src.pick([0, 2, -5]))),
            hostile=_hostile(topic, {}))
    elif op == 9:
        ts = src.pick([-1, 0, run.now])
        run.request(src, RequestCode.RESET_OFFSET, to_ext(ResetOffsetRequestHeader(
            consumer_group="cg", topic=topic, queue_id=qid, offset=src.pick([-1, 0, 3]) if ts < 0 else -1,
            timestamp_ms=ts)), hostile=_hostile(topic, {}))
    elif op == 10:
        n = src.pick([1, 2, 0, 5000])
        run.request(src, RequestCode.UPDATE_AND_CREATE_TOPIC, to_ext(CreateTopicRequestHeader(
            topic=topic, read_queue_nums=n, write_queue_nums=n)), hostile=_hostile(topic, {}))
    else:
        code, header = src.pick([
            (RequestCode.VIEW_MESSAGE_BY_ID, ViewMessageRequestHeader(offset=src.pick([0, 1, -1, 200]))),
            (RequestCode.VIEW_MESSAGE_BY_UNIQ_KEY, ViewMessageByUniqKeyRequestHeader(
                msg_id=src.pick(["", *run.ids[-2:]]))),
            (RequestCode.QUERY_MESSAGE, QueryMessageRequestHeader(topic=topic, key="k")),
            (src.num(2) & 0x7FFF, TransactionIdRequestHeader(id="x"))])  # any code (an i16)
        run.request(src, code, to_ext(header))


def _op(src: Source, run: _Run) -> None:
    op = src.num() % 16
    if op <= 3:  # single send: plain, half, or one-way
        _send(src, run, half=op == 1)
    elif op == 4:
        _batch_send(src, run)
    elif op <= 6:  # end transaction, valid or bogus offsets
        _end(src, run)
    elif op <= 10 or op == 13:
        _read(src, run, op)
    elif op == 11:
        _admin(src, run)
    elif op == 12:
        _heartbeat(src, run)
    elif op == 14:  # the clock moves, forward (past check and delay times) or back
        run.now += src.pick([1_000, 10_000, 61_000, 3_600_000, -5_000, -1])
        _UNEXPECTED.take()
        try:
            actions = run.broker.tick(run.now)
        except Exception as exc:
            raise BrokerFinding(f"tick raised {type(exc).__name__}: {exc}") from exc
        run.store.flush()
        _check_output(0, actions)
    else:
        reopen(run)


def reopen(run: _Run) -> None:
    """Persist what the shell persists, open a new broker over the same store, compare states."""
    run.broker.persist_offsets()
    run.store.flush()
    before = broker_state(run.broker)
    try:
        run.broker = Broker(run.config, run.store, run.now)
    except Exception as exc:
        raise BrokerFinding(f"reopen failed: {type(exc).__name__}: {exc}"
                            f"{_after(run)}") from exc
    after = broker_state(run.broker)
    if after != before:
        diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        raise BrokerFinding(f"reopened broker differs: {diff}{_after(run)}")


def _after(run: _Run) -> str:
    return f" (after accepting hostile requests: {run.hostile[:3]})" if run.hostile else ""


_CONFIG = msgspec.convert({"topics": {"t": 2, "u": 1}, "transaction_check_max": 2,
                           "transaction_timeout_ms": 1_000}, BrokerConfig).validate()


def broker_target(data: bytes) -> None:
    store = MemoryStore()
    run = _Run(Broker(_CONFIG, store, 1_000_000), store, _CONFIG)
    src = Source(data)
    _UNEXPECTED.install()
    try:
        while src.left > 0:
            _op(src, run)
        reopen(run)
    finally:
        _UNEXPECTED.uninstall()


def broker_seeds() -> list[bytes]:
    return [bytes([0, 0, 0, 2, 5, 5, 0, 1, 0, 0, 1, 3, 5, 6, 0, 0, 0]),
            bytes([1, 1, 0, 0, 2, 5, 5, 1, 14, 3, 12, 0, 0, 1, 1, 14, 4, 6, 0, 1, 0, 0, 15]),
            bytes([1, 0, 0, 0, 1, 1, 1, 5, 1, 0, 1, 1, 1, 14, 3, 1, 14, 3, 1]),
            bytes([4, 0, 0, 1, 7, 0, 0, 0, 8, 0, 0, 1, 9, 0, 0, 1, 0, 10, 5, 0, 11, 0, 0, 0, 13, 3, 1]),
            bytes([12, 0, 1, 0, 1, 1, 1, 1, 12, 1, 0, 0, 0, 0, 2, 97, 98, 1, 13, 0, 0, 3, 1, 40, 0]),
            # heartbeats, three halves (JSON, ROCKETMQ), commit, rollback, a pull, ticks (a
            # check-back of the third), reopen
            bytes([12, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 12, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1,
                   1, 0, 0, 0, 0, 0, 1, 1, 65, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 66, 0, 1, 1,
                   5, 1, 0, 0, 0, 0, 1, 0, 1, 0, 5, 1, 1, 0, 1, 0, 1, 0, 1, 1,
                   1, 0, 0, 0, 0, 0, 1, 1, 67, 0, 1, 0, 7, 0, 0, 0, 1, 0, 0, 1, 0,
                   14, 2, 14, 2, 14, 3, 15])]


