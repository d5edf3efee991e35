"""Fuzz targets: each turns one input (bytes) into calls of one decoder, or a request sequence
through the sans-IO broker (:mod:`txmq.testing._fuzz_broker`), and raises only its *expected*
exceptions (the documented error types). Anything else a target raises is a finding.

The codec targets cover RocketMQ's remoting frame in both serialize types (JSON and ROCKETMQ
headers), the typed headers (``from_ext`` / ``to_ext``) and JSON bodies, txmq's store records, and
RocketMQ's binary message encodings (MessageExt records, batch bodies, properties, message ids).
"""

from __future__ import annotations

import contextlib
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import msgspec

import txmq.protocol as _protocol
from txmq.errors import (
    CorruptRecord,
    FrameTooLarge,
    HaProtocolError,
    MalformedFrame,
    MalformedHeader,
    MalformedMessage,
    ProtocolError,
    ResponseCode,
)
from txmq.protocol import (
    BORNHOST_V6_FLAG,
    CRC32_RESERVED_LEN,
    FLAG_ONEWAY,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Command,
    ConsumerData,
    EndTransactionRequestHeader,
    FrameDecoder,
    HeartbeatData,
    LockBatchRequestBody,
    Message,
    MessageExt,
    MessageQueue,
    ProducerData,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeaderV2,
    SubscriptionData,
    decode_batch,
    decode_body,
    decode_cluster_info,
    decode_message_ext,
    decode_message_exts,
    decode_offset_msg_id,
    decode_properties,
    decode_register_body,
    decode_route,
    decode_topic_list,
    decode_trace_records,
    encode_batch,
    encode_body,
    encode_command,
    encode_message_ext,
    encode_message_exts,
    encode_trace_record,
    from_ext,
    offset_msg_id,
    to_ext,
    uniq_key_time_ms,
    unwrap_inner_batch,
)
from txmq.protocol import __all__ as _protocol_names
from txmq.store import Record
from txmq.store.codec import (
    RECORD_MAGICS,
    RECORD_SIZE_MIN,
    Checkpoint,
    decode_checkpoint,
    decode_message,
    decode_record,
    encode_checkpoint,
    encode_record,
    place_record,
)
from txmq.testing._fuzz_broker import (
    HOSTILE_TOPICS,
    PROPERTY_VALUES,
    RESERVED_PROPERTIES,
    BrokerFinding,
    UnexpectedErrors,
    broker_seeds,
    broker_state,
    broker_target,
    is_header_remark,
    is_valid_topic,
)
from txmq.testing._fuzz_ha import ha_seeds, ha_target
from txmq.testing._fuzz_wire import Source, Target, json_frame, wire_round_trip

__all__ = [
    "HEADER_CLASSES",
    "HEADER_STRUCTS",
    "HOSTILE_TOPICS",
    "PROPERTY_VALUES",
    "RESERVED_PROPERTIES",
    "TARGETS",
    "BrokerFinding",
    "Target",
    "UnexpectedErrors",
    "broker_state",
    "is_header_remark",
    "is_valid_topic",
    "wire_round_trip",
]

def _frame(data: bytes) -> None:
    step = 1 + (data[0] if data else 0) * 37
    dec = FrameDecoder()
    cmds: list[Command] = []
    for i in range(0, len(data), step):
        cmds += dec.feed(data[i : i + step])
    for cmd in cmds:  # what decodes re-encodes to the same command, in both serialize types
        wire_round_trip(cmd)
        wire_round_trip(cmd, SERIALIZE_ROCKETMQ - cmd.serialize_type)


def _frame_seeds() -> list[bytes]:
    send = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic="t", queue_id=0,
                                             born_timestamp=5, properties="UNIQ_KEY\x01M\x02"))
    pull = to_ext(PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=1,
                                           queue_offset=0, max_msg_nums=32, sys_flag=2))
    out = []
    for kind in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        cmds = [Command(RequestCode.SEND_MESSAGE_V2, 7, ext=send, body=b"hello", serialize_type=kind),
                Command(RequestCode.PULL_MESSAGE, 8, FLAG_ONEWAY, remark="r€", ext=pull,
                        language="CPP", serialize_type=kind),
                Command(ResponseCode.SYSTEM_ERROR, 8, 1, remark="the custom field <topic> is null",
                        serialize_type=kind)]
        out += [encode_command(c) for c in cmds] + [b"".join(encode_command(c) for c in cmds)]
    # the C++ client's JSON header: ext values as JSON numbers and booleans
    out.append(json_frame(b'{"code":11,"extFields":{"queueId":3,"sysFlag":2,"commitOffset":-1,'
                           b'"unitMode":false,"x":null,"y":1.5},"flag":0,"language":"CPP",'
                           b'"opaque":1,"serializeTypeCurrentRPC":"JSON","version":399}', b"b"))
    return out


# -- headers --------------------------------------------------------------------------------------
HEADER_STRUCTS: list[type[msgspec.Struct]] = sorted(
    (obj for name in _protocol_names  # vars(): not the names txmq.protocol imports with numpy on access
     if isinstance(obj := vars(_protocol).get(name), type)
     and issubclass(obj, msgspec.Struct) and obj not in (Command, Message, MessageExt)),
    key=lambda c: c.__name__)
"""Every header and body struct of :mod:`txmq.protocol` (``from_ext`` / ``decode_body`` targets)."""
HEADER_CLASSES: list[type[msgspec.Struct]] = [
    c for c in HEADER_STRUCTS if re.search(r"Header(V\d+)?$", c.__name__)]
"""The header classes (names ending ``Header`` or ``HeaderV2``): what travels as ``extFields``, round-tripped
through :func:`~txmq.protocol.to_ext` / :func:`~txmq.protocol.from_ext`."""
_WIRE_NAMES = sorted({f.encode_name for cls in HEADER_CLASSES for f in msgspec.structs.fields(cls)})
_STRINGS = ["", "0", "1", "-1", "7", "t", "pg", "true", "false", "TRUE", "1.5", "1e3", " 1", "1 ",
            "+1", "-0", "0x10", "1_000", "\u0663", "9" * 19, "9" * 25, "-9223372036854775808",
            "9223372036854775808", "18446744073709551616", "NaN", "null", "€" * 50, "\x00",
            "COMMIT", "*", "%RETRY%g", "half:0", "[]", "{}", "a\u0001b\u0002"]
_BODY_DECODERS: list[Callable[[bytes], object]] = [
    decode_route, decode_cluster_info, decode_topic_list, decode_register_body,
    lambda d: decode_register_body(d, compressed=True),
    lambda d: decode_body(d, list[dict[str, str]]), lambda d: decode_body(d, dict[str, int])]


def _headers(data: bytes) -> None:
    mode, rest = (data[0] % 3 if data else 0), data[1:]
    if mode == 0:  # structured: known wire names with values of every shape
        src = Source(rest)
        ext = {src.pick(_WIRE_NAMES): src.pick(_STRINGS) for _ in range(src.num() % 12)}
        for kind in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
            sent = wire_round_trip(Command(RequestCode.SEND_MESSAGE, ext=ext, serialize_type=kind))
            assert sent is not None and sent.ext == ext, (sent, ext)
        _all_headers(ext)
    elif mode == 1:  # raw bytes as the extFields of a JSON header and of a ROCKETMQ header
        for frame in (json_frame(b'{"code":10,"extFields":' + rest + b',"opaque":1}'),
                      _binary_frame(rest)):
            try:
                cmds = FrameDecoder().feed(frame)
            except MalformedFrame:
                continue
            for cmd in cmds:
                _all_headers(cmd.ext)
    else:  # raw bytes as a JSON body of every body class, and the route / registration bodies
        for cls in HEADER_STRUCTS:
            _quiet(decode_body, rest, cls)
        for dec in _BODY_DECODERS:
            _quiet(dec, rest)


def _binary_frame(ext: bytes) -> bytes:
    """A ROCKETMQ-header frame (code 10, no remark) whose ext section is ``ext``."""
    header = bytes([0, 10, 3, 1, 223]) + bytes(12) + len(ext).to_bytes(4, "big") + ext
    return (4 + len(header)).to_bytes(4, "big") + (1 << 24 | len(header)).to_bytes(4, "big") + header


def _quiet(fn: Callable[..., object], *args: Any) -> None:
    with contextlib.suppress(MalformedHeader):
        fn(*args)


def _all_headers(ext: dict[str, str]) -> None:
    for cls in HEADER_CLASSES:
        try:
            h = from_ext(dict(ext), cls)
        except MalformedHeader:
            continue
        again = to_ext(h)
        assert all(isinstance(v, str) for v in again.values()), again
        assert from_ext(again, cls) == h, (cls, ext, h)


def _header_seeds() -> list[bytes]:
    send = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic="t", queue_id=0, born_timestamp=1))
    end = to_ext(EndTransactionRequestHeader(producer_group="pg", tran_state_table_offset=3,
                                             commit_log_offset=4, commit_or_rollback=8, msg_id="M"))
    hb = HeartbeatData(client_id="c", producer_data_set=[ProducerData(group_name="pg")],
                       consumer_data_set=[ConsumerData(group_name="g", subscription_data_set=[
                           SubscriptionData(topic="t")])])
    lock = LockBatchRequestBody(consumer_group="g", client_id="c", mq_set=[MessageQueue("t", 0, "b")])
    return [b"\x00" + bytes(range(64)), b"\x01" + msgspec.json.encode(send),
            b"\x01" + msgspec.json.encode(end), b"\x02" + encode_body(hb), b"\x02" + encode_body(lock),
            b"\x02" + encode_body([end, end])]


# -- store records and checkpoints ------------------------------------------------------------------
def _fix_record(data: bytes, offset: int) -> bytes:
    """Give random bytes a valid size, magic, physical offset and CRC property, so field parsing
    is reached."""
    buf = bytearray(data) + bytearray(CRC32_RESERVED_LEN)
    # layout (store/_codec.py): total i32 @0, magic u32 @4, physical offset i64 @28, CRC at the end
    buf[0:4] = len(buf).to_bytes(4, "big")
    buf[4:8] = RECORD_MAGICS[0].to_bytes(4, "big")
    buf[28:36] = offset.to_bytes(8, "big", signed=True)
    place_record(buf, 0, len(buf), offset)
    return bytes(buf)


def _record(data: bytes) -> None:
    mode, body = (data[0] % 4 if data else 0), data[1:]
    if mode == 2:
        return _checkpoint(body)
    if mode == 3:
        return _checkpoint(_fix_checkpoint(body))
    offset = int.from_bytes(body[28:36], "big", signed=True) if len(body) >= 36 else 0
    if mode == 1 and len(body) >= RECORD_SIZE_MIN:
        body = _fix_record(body, offset)
    view = memoryview(body)
    try:
        rec, _ = decode_record(view, 0, offset)
    except CorruptRecord:
        return
    msg = decode_message(view, 0, offset)
    assert msg.body == rec.body and msg.properties == rec.properties, (msg, rec)
    try:
        again_bytes = encode_record(rec, rec.store_host)
    except ValueError:
        return  # properties RocketMQ's decoder reads but no encoder writes (a \u0001 in a value)
    place_record(again_bytes, 0, len(again_bytes), offset)
    again, _ = decode_record(memoryview(again_bytes), 0, offset)
    # the store sets the transaction type and the V6 bits itself (from properties and hosts)
    kept = ~(_V6 | TRANSACTION_ROLLBACK_TYPE)
    assert msgspec.structs.replace(again, sys_flag=again.sys_flag & kept) == \
        msgspec.structs.replace(rec, sys_flag=rec.sys_flag & kept), (again, rec)


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
    buf = encode_record(rec, "10.0.0.1:10911")
    place_record(buf, 0, len(buf), 4096)
    enc = bytes(buf)
    cp = encode_checkpoint(Checkpoint(dispatched=10, last_record=0, queues=[("t", 0, 0, 1)],
                                      index_files=[("f", 1, 2, 3, 4, 5, 6)]))
    return [b"\x00" + enc, b"\x01" + enc, b"\x02" + cp, b"\x03" + cp[12:]]


# -- RocketMQ's binary message codecs -----------------------------------------------------------------
_V6 = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG


def _norm(m: MessageExt) -> MessageExt:
    """What an encode does not keep: the record size and CRC (computed) and the V6 bits (from
    the hosts; an IPv4-mapped or all-zero IPv6 host comes back as IPv4)."""
    return msgspec.structs.replace(m, body_crc=0, store_size=0, sys_flag=m.sys_flag & ~_V6)


def _fix_ext(data: bytes) -> bytes:
    """Give random bytes a MessageExt record's total size, magic code and body CRC, so the decoder
    gets past its first checks (flag byte: bit 0 picks the v2 magic)."""
    buf = bytearray(data[1:])
    if len(buf) < 88:
        return bytes(buf)
    buf[0:4] = len(buf).to_bytes(4, "big")
    buf[4:8] = (MESSAGE_MAGIC_CODE_V2 if data[0] & 1 else MESSAGE_MAGIC_CODE).to_bytes(4, "big")
    head = 88 + 12 * bin(int.from_bytes(buf[36:40], "big") >> 4 & 3).count("1")
    if len(buf) >= head:
        n = int.from_bytes(buf[head - 4 : head], "big", signed=True)
        if 0 <= n <= len(buf) - head:
            buf[8:12] = (zlib.crc32(buf[head : head + n]) & 0x7FFFFFFF).to_bytes(4, "big")
    return bytes(buf)


def _message_ext(data: bytes) -> None:
    for raw in (data, _fix_ext(data)):
        for crc, inflate in ((True, True), (False, False), (True, False)):
            try:
                msgs = decode_message_exts(raw, check_crc=crc, inflate=inflate)
            except ProtocolError:
                continue
            for m in msgs:
                with contextlib.suppress(ProtocolError):
                    unwrap_inner_batch(m)
                if not inflate:
                    _ext_round_trip(m)
        try:
            one = decode_message_ext(raw, check_crc=False, inflate=False)
        except ProtocolError:
            pass
        else:
            _ext_round_trip(one)
    _batch(data)
    text = data.decode(errors="replace")
    decode_properties(text)
    for fn in (decode_offset_msg_id, lambda t: uniq_key_time_ms(t, 1 << 40)):
        with contextlib.suppress(ProtocolError):
            fn(text[:56])


def _encodable(m: Message) -> bool:
    """Whether ``m``'s properties re-encode: the decoder keeps a ``\\u0001`` inside a value, as
    RocketMQ's ``string2messageProperties`` does, but the encoder refuses one."""
    return not any(NAME_VALUE_SEPARATOR in v for v in (*m.properties.values(), m.tags, m.keys))


def _ext_round_trip(m: MessageExt) -> None:
    if not _encodable(m):
        return
    enc = encode_message_ext(m)
    [again] = decode_message_exts(enc, inflate=False)
    assert _norm(again) == _norm(m), (again, m)
    assert encode_message_ext(again) == enc
    assert encode_message_exts([m, again]) == enc * 2


def _batch(data: bytes) -> None:
    try:
        msgs = decode_batch(data, topic="t")
    except ProtocolError:
        return
    msgs = [m for m in msgs if _encodable(m)]
    for m in msgs:
        unwrap_inner_batch(MessageExt(topic="t", body=encode_batch([m]), sys_flag=0xC0))
    assert decode_batch(encode_batch(msgs), topic="t") == msgs


def _message_ext_seeds() -> list[bytes]:
    m = MessageExt(topic="t", body=b"x", tags="a", keys="k", properties={"UNIQ_KEY": "M"},
                   queue_id=1, queue_offset=2, commit_log_offset=3, born_host="1.2.3.4:5",
                   store_host="[::1]:10911", sys_flag=TRANSACTION_PREPARED_TYPE)
    z = msgspec.structs.replace(m, body=b"z" * 64, sys_flag=1, topic="T" * 200, born_host="")
    batch = encode_batch([Message(topic="t", body=b"y", properties={"a": "b"}),
                          Message(topic="t", body=b"", tags="x")])
    inner = msgspec.structs.replace(m, body=batch, sys_flag=0xC0)
    return [encode_message_exts([m, m]), encode_message_ext(z, compress=True),
            encode_message_ext(inner), batch, offset_msg_id("10.0.0.1:10911", 77).encode(),
            b"\x00" + encode_message_ext(m)]


def _msg_trace(data: bytes) -> None:
    """RocketMQ message trace bodies: what decodes writes again and reads back the same."""
    for r in decode_trace_records(data):
        assert decode_trace_records(encode_trace_record(r)) == [r], r


def _msg_trace_seeds() -> list[bytes]:
    """Records as RocketMQ's Java client (``TraceDataEncoder``) and C++ client write them."""
    def rec(*fields: str) -> bytes:
        return ("\u0001".join(fields) + "\u0002").encode()

    pub = rec("Pub", "1700000000123", "DefaultRegion", "pg", "t", "M1", "null", "k1 k2", "10.0.0.5:10911",
              "37", "4", "1", "0A00000500002A9F0000000000001A2B", "true")
    subs = rec("SubBefore", "1700000000500", "DefaultRegion", "cg", "R1", "M1", "2", "k1") + rec(
        "SubAfter", "R1", "M1", "12", "false", "k1", "4", "1700000000512", "cg")
    end = rec("EndTransaction", "1700000000200", "DefaultRegion", "pg", "t", "M1", "null", "k1",
              "10.0.0.5:10911", "2", "M1", "UNKNOW", "true")
    cpp = rec("SubAfter", "R1", "M1", "3", "true", "dKey")
    return [pub, subs, end, cpp + rec("Recall", "1", "R", "g", "t", "M1", "false")]


def _targets() -> Iterator[Target]:
    yield Target("frame", _frame, (FrameTooLarge, MalformedFrame), _frame_seeds,
                 "FrameDecoder.feed in chunks, both serialize types; decoded commands re-encode "
                 "to the same command in their own and in the other serialize type")
    yield Target("header", _headers, (MalformedFrame, MalformedHeader), _header_seeds,
                 "from_ext of every header class on maps of wire names with hostile strings and "
                 "on raw extFields of JSON and ROCKETMQ headers (round trip through to_ext); "
                 "decode_body of every struct and the route / registration decoders on raw bytes")
    yield Target("record", _record, (CorruptRecord,), _record_seeds,
                 "decode_record / decode_message on raw and CRC-fixed records, decode_checkpoint; "
                 "round trip")
    yield Target("message-ext", _message_ext, (), _message_ext_seeds,
                 "RocketMQ's binary MessageExt records (raw and with size, magic and CRC fixed), "
                 "batch bodies, inner batches, properties strings, offset msg ids and UNIQ_KEYs: "
                 "every input decodes or raises a ProtocolError; round trips")
    yield Target("ha", ha_target, (HaProtocolError,), ha_seeds,
                 "RocketMQ's HA stream (replication): TransferDecoder, ReportDecoder, SlaveCore and "
                 "the ACL handshake (HelloDecoder, challenge) on raw bytes in chunks; decoded "
                 "frames re-encode to the input")
    yield Target("msg-trace", _msg_trace, (MalformedMessage,), _msg_trace_seeds,
                 "RocketMQ message trace bodies (Pub, SubBefore, SubAfter, EndTransaction, Recall "
                 "records): every input decodes or raises MalformedMessage; decoded records "
                 "re-encode and read back the same")
    yield Target("broker", broker_target, (), broker_seeds,
                 "a request program through the wire codec (JSON or ROCKETMQ headers, corrupted "
                 "fields) and Broker.handle/tick on a MemoryStore, then a reopen that must recover "
                 "the same state; replies and check-backs must encode and decode")


TARGETS: dict[str, Target] = {t.name: t for t in _targets()}
