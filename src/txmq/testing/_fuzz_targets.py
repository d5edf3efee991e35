"""Fuzz targets: each turns one input (bytes) into calls of one decoder, or a request sequence
through the sans-IO broker, and raises only its *expected* exceptions (the documented error types).

Anything else a target raises is a finding. The broker target raises :class:`BrokerFinding` when a
request is answered ``SYSTEM_ERROR`` by an unexpected exception, when ``tick`` raises, or when a
broker reopened over the same store does not recover the same state.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import crc32c
import msgspec

import txmq.protocol as _protocol
from txmq.broker import Broker, BrokerConfig, Reply
from txmq.errors import CorruptRecord, FrameTooLarge, MalformedFrame, ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    Command,
    FrameDecoder,
    HeartbeatData,
    Message,
    MessageExt,
    RequestCode,
    decode_body,
    decode_message_ext_msgpack,
    decode_messages,
    encode_command,
    encode_message_ext_msgpack,
    encode_messages,
    from_ext,
    to_ext,
)
from txmq.protocol import __all__ as _protocol_names
from txmq.store import MemoryStore, Record
from txmq.store.codec import (
    RECORD_HEAD_SIZE,
    RECORD_MAGIC,
    Checkpoint,
    decode_checkpoint,
    decode_message,
    decode_record,
    encode_checkpoint,
    encode_record,
    host_bytes,
)

__all__ = [
    "HEADER_STRUCTS",
    "HOSTILE_TOPICS",
    "PROPERTY_VALUES",
    "RESERVED_PROPERTIES",
    "TARGETS",
    "BrokerFinding",
    "Target",
    "UnexpectedErrors",
    "broker_state",
    "is_valid_topic",
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


def is_valid_topic(topic: str) -> bool:
    """RocketMQ ``TopicValidator``'s rule: ``^[%|a-zA-Z0-9_-]+$``, at most 127 characters."""
    return len(topic) <= 127 and bool(_TOPIC_RE.match(topic))


class BrokerFinding(AssertionError):
    """The broker target saw something no input may cause (see the module docstring)."""


class UnexpectedErrors(logging.Handler):
    """Collects the broker's "unexpected error" log records (``Broker.handle`` turns an unexpected
    exception into SYSTEM_ERROR, or for a one-way request only into this log line).

    Use :meth:`install` / :meth:`uninstall` around the requests; :meth:`take` returns and clears
    ``"<ExceptionType>: <message>"`` of each record.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("unexpected error") and record.exc_info:
            exc = record.exc_info[1]
            self.found.append(f"{type(exc).__name__}: {exc}")

    def take(self) -> list[str]:
        out, self.found = self.found, []
        return out

    def install(self) -> UnexpectedErrors:
        logging.getLogger("txmq.broker").addHandler(self)
        return self

    def uninstall(self) -> None:
        logging.getLogger("txmq.broker").removeHandler(self)


_UNEXPECTED = UnexpectedErrors()


@dataclass
class Target:
    """One fuzz target: ``run(data)`` may raise only ``expected``; ``seeds()`` are valid inputs."""

    name: str
    run: Callable[[bytes], None]
    expected: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    doc: str = ""


class _Source:
    """Reads typed choices from the input bytes; an exhausted input reads as zeros."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def num(self, nbytes: int = 1) -> int:
        chunk = self.data[self.pos : self.pos + nbytes]
        self.pos += nbytes
        return int.from_bytes(chunk, "big") if chunk else 0

    def pick(self, seq: list[Any]) -> Any:
        return seq[self.num() % len(seq)]

    def blob(self, nmax: int) -> bytes:
        n = self.num() % (nmax + 1)
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk


# -- frame ----------------------------------------------------------------------------------------
def _frame(data: bytes) -> None:
    step = 1 + (data[0] if data else 0) * 37
    dec = FrameDecoder()
    cmds: list[Command] = []
    for i in range(0, len(data), step):
        cmds += dec.feed(data[i : i + step])
    for cmd in cmds:  # what decodes, re-encodes to the same command (compared as bytes: a NaN
        try:            # in ext is never == itself)
            frame = encode_command(cmd)
            again = FrameDecoder().feed(frame)
        except FrameTooLarge:
            continue
        assert len(again) == 1 and encode_command(again[0]) == frame, (again, cmd)


def _frame_seeds() -> list[bytes]:
    cmds = [Command(code=RequestCode.SEND_MESSAGE, opaque=7, ext={"topic": "t", "queue_id": 0},
                    body=b"hello"),
            Command(code=RequestCode.PULL_MESSAGE, flags=FLAG_ONEWAY, remark="r",
                    ext={"consumer_group": "g", "properties": {"a": "b"}, "n": [1, 2.5, None]})]
    return [encode_command(c) for c in cmds] + [b"".join(encode_command(c) for c in cmds)]


# -- headers --------------------------------------------------------------------------------------
HEADER_STRUCTS: list[type[msgspec.Struct]] = sorted(
    (obj for name in _protocol_names
     if isinstance(obj := getattr(_protocol, name), type)
     and issubclass(obj, msgspec.Struct) and obj not in (Command, Message, MessageExt)),
    key=lambda c: c.__name__)
"""Every header and body struct of :mod:`txmq.protocol` (``from_ext`` / ``decode_body`` targets)."""
_FIELDS = sorted({f for cls in HEADER_STRUCTS for f in cls.__struct_fields__})
_VALUES: list[Any] = [0, 1, -1, 2**63, -(2**63) - 1, 2**64, 1.5, float("nan"), "", "t", "€" * 50,
                      "x", True, False, None, b"\xff", [], [1], {}, {"a": "b"},
                      {"1": 2}, [["t", 0]], {"t": "*"}, [{"group": "g"}], "COMMIT", "CLUSTERING"]


def _value(src: _Source, depth: int = 0) -> Any:
    k = src.num()
    if depth < 3 and k % 16 == 14:
        return [_value(src, depth + 1) for _ in range(src.num() % 4)]
    if depth < 3 and k % 16 == 15:
        return {src.pick(_FIELDS): _value(src, depth + 1) for _ in range(src.num() % 4)}
    return _VALUES[k % len(_VALUES)]


def _headers(data: bytes) -> None:
    if data[:1] == b"\x00":  # raw bytes: as msgpack map (ext) and as a msgpack body
        try:
            raw = msgspec.msgpack.decode(data[1:])
        except (msgspec.DecodeError, UnicodeDecodeError):  # the harness's own decode
            raw = None
        for cls in HEADER_STRUCTS:
            if isinstance(raw, dict):
                _one_header(raw, cls)
            _body(data[1:], cls)
        return
    src = _Source(data[1:])  # structured: known field names with values of every type
    ext = {src.pick(_FIELDS): _value(src) for _ in range(src.num() % 12)}
    for cls in HEADER_STRUCTS:
        _one_header(dict(ext), cls)


def _one_header(ext: dict[Any, Any], cls: type[msgspec.Struct]) -> None:
    try:
        h = from_ext(ext, cls)
    except MalformedFrame:
        return
    assert from_ext(to_ext(h), cls) == h, h


def _body(data: bytes, cls: type[msgspec.Struct]) -> None:
    try:
        decode_body(data, cls)
    except MalformedFrame:
        return


def _header_seeds() -> list[bytes]:
    out = []
    for ext in ({"producer_group": "pg", "topic": "t", "queue_id": 0, "properties": {"a": "b"}},
                {"consumer_group": "g", "topic": "t", "queue_id": 1, "queue_offset": 0},
                {"client_id": "c", "consumer_groups": [{"group": "g", "subscriptions": {"t": "*"}}]},
                {"consumer_group": "g", "client_id": "c", "mqs": [["t", 0]]}):
        out.append(b"\x00" + msgspec.msgpack.encode(ext))
    return [*out, b"\x01" + bytes(range(64))]


# -- store records and checkpoints ------------------------------------------------------------------
def _fix_record(data: bytes, offset: int) -> bytes:
    """Give random bytes a valid size, magic, offset and CRC32C, so field parsing is reached."""
    buf = bytearray(data)
    # layout (store/_codec.py): total u32 @0, magic u32 @4, crc32c u32 @8, commit log offset u64 @32
    buf[0:4] = len(buf).to_bytes(4, "big")
    buf[4:8] = RECORD_MAGIC.to_bytes(4, "big")
    buf[32:40] = offset.to_bytes(8, "big")
    buf[8:12] = crc32c.crc32c(bytes(buf[12:])).to_bytes(4, "big")
    return bytes(buf)


def _record(data: bytes) -> None:
    mode, body = (data[0] % 4 if data else 0), data[1:]
    if mode == 2:
        return _checkpoint(body)
    if mode == 3:
        return _checkpoint(_fix_checkpoint(body))
    offset = int.from_bytes(body[32:40], "big") if len(body) >= 40 else 0
    if mode == 1 and len(body) >= RECORD_HEAD_SIZE:
        body = _fix_record(body, offset)
    view = memoryview(body)
    try:
        rec, _ = decode_record(view, 0, offset)
    except CorruptRecord:
        return
    msg = decode_message(view, 0, offset)
    assert msg.body == rec.body and msg.properties == rec.properties, (msg, rec)
    again, _ = decode_record(memoryview(encode_record(rec, offset, host_bytes(rec.store_host))), 0,
                             offset)
    assert again == rec, (again, rec)


def _fix_checkpoint(payload: bytes) -> bytes:
    return (0x54584D43).to_bytes(4, "big") + crc32c.crc32c(payload).to_bytes(4, "big") + \
        len(payload).to_bytes(4, "big") + payload


def _checkpoint(data: bytes) -> None:
    try:
        cp = decode_checkpoint(data)
    except CorruptRecord:
        return
    assert decode_checkpoint(encode_checkpoint(cp)) == cp


def _record_seeds() -> list[bytes]:
    rec = Record(topic="t", queue_id=1, body=b"body", tags="tag", keys="k1 k2",
                 properties={"UNIQ_KEY": "M1", "TRAN_MSG": "true"}, born_timestamp_ms=5,
                 store_timestamp_ms=6, queue_offset=3, born_host="127.0.0.1:5")
    enc = encode_record(rec, 4096, host_bytes("10.0.0.1:10911"))
    cp = encode_checkpoint(Checkpoint(dispatched=10, last_record=0, queues=[("t", 0, 0, 1)],
                                      index_files=[("f", 1, 2, 3, 4, 5, 6)]))
    return [b"\x00" + enc, b"\x01" + enc, b"\x02" + cp, b"\x03" + cp[12:]]


# -- MessageExt ---------------------------------------------------------------------------------------
def _message_ext(data: bytes) -> None:
    for ext in (True, False):
        try:
            msgs = decode_messages(data, ext=ext)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        assert decode_messages(encode_messages(msgs), ext=ext) == msgs
    try:
        one = decode_message_ext_msgpack(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    assert decode_message_ext_msgpack(encode_message_ext_msgpack(one)) == one


def _message_ext_seeds() -> list[bytes]:
    m = MessageExt(topic="t", body=b"x", tags="a", keys="k", properties={"UNIQ_KEY": "M"},
                   queue_id=1, queue_offset=2, commit_log_offset=3, born_host="1.2.3.4:5")
    return [encode_messages([m, m]), encode_message_ext_msgpack(m),
            encode_messages([Message(topic="t", body=b"y")])]


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
            "offsets": dict(sorted(broker.offsets.items())),
            "pending": {o: e.check_count for o, e in sorted(idx.pending.items())},
            "settled": dict(sorted(idx.settled.items())),
            "discarded": sorted(idx.discarded)}


@dataclass
class _Run:
    broker: Broker
    store: MemoryStore
    config: BrokerConfig
    now: int = 1_000_000
    halves: list[tuple[int, int]] = field(default_factory=list)  # (queue offset, commit log offset)
    ids: list[str] = field(default_factory=list)
    seq: int = 0
    hostile: list[str] = field(default_factory=list)
    """Requests naming a hostile or system topic (or REAL_TOPIC) that were answered SUCCESS."""

    def request(self, code: int, ext: dict[str, Any], body: bytes = b"", flags: int = 0) -> Command | None:
        cmd = Command(code=int(code), opaque=self.seq, flags=flags, ext=ext, body=body)
        _UNEXPECTED.take()
        actions = self.broker.handle(1 + self.seq % 2, cmd, self.now)
        self.store.flush()
        for text in _UNEXPECTED.take():  # one-way requests get no reply: the log says it
            raise BrokerFinding(f"request code {code} answered SYSTEM_ERROR: {text}")
        for a in actions:
            if isinstance(a, Reply) and a.command.code == ResponseCode.SYSTEM_ERROR:
                raise BrokerFinding(f"request code {code} answered SYSTEM_ERROR: {a.command.remark}")
        replies = [a.command for a in actions if isinstance(a, Reply)]
        if (not replies or replies[0].code == ResponseCode.SUCCESS) and _is_hostile(ext, body):
            self.hostile.append(f"code {code} topic {ext.get('topic')!r}")
        return replies[0] if replies else None


def _is_hostile(ext: dict[str, Any], body: bytes) -> bool:
    """A request a validating broker refuses: a bad or system topic, or a reserved property."""
    topic = ext.get("topic")
    if isinstance(topic, str) and (not is_valid_topic(topic) or topic in _SYSTEM_TOPICS):
        return True
    props = ext.get("properties") or {}
    return any(k in props for k in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)) or (
        body[:1] in (b"\x91", b"\x92", b"\x93") and b"REAL_" in body)


_TOPICS = ["t", "t", "t", "u", *HOSTILE_TOPICS]
_GROUPS = ["pg", "pg", "cg", "other", ""]


def _props(src: _Source, run: _Run) -> dict[str, str]:
    run.seq += 1
    props = {PROPERTY_UNIQ_KEY: f"M{run.seq}"}
    run.ids.append(props[PROPERTY_UNIQ_KEY])
    for _ in range(src.num() % 4):
        props[src.pick(RESERVED_PROPERTIES)] = src.pick(PROPERTY_VALUES)
    return props


def _op(src: _Source, run: _Run) -> None:
    op, r = src.num() % 16, run.request
    topic = src.pick(_TOPICS)
    qid = src.pick([0, 1, -1, 7])
    if op <= 3:  # single send, plain or half
        props = _props(src, run)
        if op == 1:
            props[PROPERTY_TRANSACTION_PREPARED] = "true"
        h = {"producer_group": src.pick(_GROUPS), "topic": topic, "queue_id": qid,
             "properties": props, "born_timestamp_ms": run.now}
        rep = r(RequestCode.SEND_MESSAGE, h, src.blob(40), src.pick([0, 0, 0, FLAG_ONEWAY]))
        if rep is not None and rep.code == 0 and props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
            run.halves.append((rep.ext["queue_offset"], rep.ext["commit_log_offset"]))
    elif op == 4:  # batch
        msgs = [Message(topic=topic, body=src.blob(8), properties=_props(src, run))
                for _ in range(1 + src.num() % 3)]
        r(RequestCode.SEND_BATCH_MESSAGE, {"producer_group": "pg", "topic": topic, "queue_id": qid},
          encode_messages(msgs))
    elif op <= 6:  # end transaction, valid or bogus offsets
        qo, clo = src.pick(run.halves) if run.halves and src.num() % 4 else (src.num(), src.num(2))
        r(RequestCode.END_TRANSACTION, {
            "producer_group": src.pick(_GROUPS), "tran_state_table_offset": qo,
            "commit_log_offset": clo, "commit_or_rollback": src.pick([0, 8, 12, 4, 99]),
            "from_transaction_check": bool(src.num() % 2)})
    elif op == 7:
        r(RequestCode.PULL_MESSAGE, {"consumer_group": "cg", "topic": topic, "queue_id": qid,
                                     "queue_offset": src.pick([0, 1, -1, 5, 2**40]),
                                     "commit_offset": src.pick([-1, 0, 3])})
    elif op == 8:
        r(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumer_group": "cg", "topic": topic,
                                               "queue_id": qid, "commit_offset": src.pick([0, 2, -5])})
    elif op == 9:
        r(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {
            "consumer_group": "cg", "topic": topic, "queue_id": qid,
            "offset": src.pick([-1, 0, 3]), "timestamp_ms": src.pick([-1, 0, run.now])})
    elif op == 10:
        r(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "queue_nums": src.pick([1, 2, 0, 5000])})
    elif op == 11:  # operator requests on transactions
        ident = src.pick([*run.ids[-4:], "half:0", "half:x", "nope"]) if run.ids else "half:0"
        code = src.pick([RequestCode.ADMIN_END_TRANSACTION, RequestCode.RESUME_CHECK_HALF_MESSAGE,
                         RequestCode.QUERY_TRANSACTION, RequestCode.GET_TRANSACTION_STATS,
                         RequestCode.GET_PENDING_TRANSACTIONS])
        r(code, {"id": ident, "outcome": src.pick(["COMMIT", "ROLLBACK", "X"]), "operator": "op",
                 "limit": src.pick([1, 100, -1])})
    elif op == 12:
        data = HeartbeatData(client_id=f"c{src.num() % 2}", producer_groups=[src.pick(_GROUPS)])
        r(RequestCode.HEART_BEAT, {}, msgspec.msgpack.encode(data))
        if src.num() % 4 == 0:  # msgpack bodies that do not parse (or hold invalid UTF-8)
            body = msgspec.msgpack.encode([{"client_id": "c"}]).replace(b"c", src.blob(4))
            r(src.pick([RequestCode.HEART_BEAT, RequestCode.END_TRANSACTION_BATCH,
                        RequestCode.COMMIT_SINK_BATCH, RequestCode.SEND_BATCH_MESSAGE,
                        RequestCode.LOCK_BATCH_MQ]),
              {"producer_group": "pg", "topic": "t", "batch": "b", "consumer_group": "cg"}, body)
    elif op == 13:
        r(RequestCode.VIEW_MESSAGE_BY_ID, {"msg_id": src.pick(["", *run.ids[-2:]]),
                                           "offset": src.pick([0, 1, -1])})
    elif op == 14:  # the clock moves, forward (past check and delay times) or back
        run.now += src.pick([1_000, 10_000, 61_000, 3_600_000, -5_000, -1])
        run.broker.tick(run.now)
        run.store.flush()
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


def _broker(data: bytes) -> None:
    store = MemoryStore()
    run = _Run(Broker(_CONFIG, store, 1_000_000), store, _CONFIG)
    src = _Source(data)
    _UNEXPECTED.install()
    try:
        while src.left > 0:
            _op(src, run)
        reopen(run)
    finally:
        _UNEXPECTED.uninstall()


def _broker_seeds() -> list[bytes]:
    return [bytes([0, 0, 0, 2, 5, 5, 0, 1, 0, 0, 1, 3, 5, 6, 0, 0, 0]),
            bytes([1, 1, 0, 0, 2, 5, 5, 14, 3, 12, 0, 0, 14, 4, 6, 0, 1, 0, 0, 15]),
            bytes([4, 0, 0, 1, 7, 0, 0, 0, 8, 0, 0, 1, 9, 0, 0, 1, 0, 10, 5, 0, 11, 0, 0, 0])]


def _targets() -> Iterator[Target]:
    yield Target("frame", _frame, (FrameTooLarge, MalformedFrame), _frame_seeds,
                 "FrameDecoder.feed in chunks; decoded commands re-encode to the same command")
    yield Target("header", _headers, (MalformedFrame,), _header_seeds,
                 "from_ext and decode_body of every header/body struct, on raw msgpack and on "
                 "maps of known field names with values of every type; round trip")
    yield Target("record", _record, (CorruptRecord,), _record_seeds,
                 "decode_record / decode_message on raw and CRC-fixed records, decode_checkpoint; "
                 "round trip")
    yield Target("message-ext", _message_ext, (), _message_ext_seeds,
                 "decode_messages / decode_message_ext_msgpack (msgspec errors expected); round trip")
    yield Target("broker", _broker, (), _broker_seeds,
                 "a request program through Broker.handle/tick on a MemoryStore, then a reopen "
                 "that must recover the same state; SYSTEM_ERROR replies are findings")


TARGETS: dict[str, Target] = {t.name: t for t in _targets()}
