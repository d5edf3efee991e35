"""RocketMQ's remoting frame (``RemotingCommand``): both header codecs, incremental decoding,
malformed and oversized frames, the typed headers through ``to_ext`` / ``from_ext``, and golden
vectors taken from RocketMQ's own classes and tests (each cites its source)."""

from __future__ import annotations

import json
import re
import struct
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txmq.protocol as protocol
from txmq.errors import FrameTooLarge, MalformedFrame, MalformedHeader
from txmq.limits import FRAME_HEADER_MAX_BYTES
from txmq.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_CODES,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Command,
    ConsumerData,
    FrameDecoder,
    HeartbeatData,
    LockBatchResponseBody,
    MessageQueue,
    ProducerData,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    SubscriptionData,
    UnregisterClientRequestHeader,
    decode_body,
    encode_body,
    encode_command,
    from_ext,
    to_ext,
)

KINDS = [SERIALIZE_JSON, SERIALIZE_ROCKETMQ]
I16 = st.integers(-(2**15), 2**15 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)


def frame(kind: int, header: bytes, body: bytes = b"", length: int | None = None) -> bytes:
    """A frame around a raw header: ``u32 length | u8 kind, u24 header length | header | body``."""
    total = 4 + len(header) + len(body) if length is None else length
    return struct.pack(">II", total, kind << 24 | len(header)) + header + body


def binary_header(code: int = 103, lang: int = 0, version: int = 2333, opaque: int = 1,
                  flag: int = 0, remark: bytes = b"", ext: bytes = b"") -> bytes:
    """A ROCKETMQ header from raw parts (RocketMQ ``RocketMQSerializable.rocketMQProtocolEncode``)."""
    return struct.pack(">hBhiii", code, lang, version, opaque, flag, len(remark)) + remark + \
        struct.pack(">i", len(ext)) + ext


def ext_entry(k: bytes, v: bytes) -> bytes:
    return struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v


def decode_one(data: bytes) -> Command:
    [cmd] = FrameDecoder().feed(data)
    return cmd


# -- round trips --------------------------------------------------------------------------------------
commands = st.builds(
    Command, code=I16, opaque=I32, flag=I32, version=I16,
    remark=st.none() | st.text(min_size=1, max_size=40),
    ext=st.dictionaries(st.text(max_size=12), st.text(max_size=30), max_size=6),
    body=st.binary(max_size=300), language=st.sampled_from(sorted(LANGUAGE_CODES)),
    serialize_type=st.sampled_from(KINDS))


@given(st.lists(commands, min_size=1, max_size=4), st.integers(1, 50))
def test_commands_round_trip_in_both_codecs_in_any_chunking(cmds: list[Command], chunk: int) -> None:
    wire = b"".join(encode_command(c) for c in cmds)
    dec, got = FrameDecoder(), []
    for i in range(0, len(wire), chunk):
        got += dec.feed(wire[i : i + chunk])
    assert got == cmds and dec.buffered == 0


@pytest.mark.parametrize("kind", KINDS)
def test_byte_by_byte_feeding_yields_each_command_when_its_last_byte_arrives(kind: int) -> None:
    cmds = [Command(RequestCode.SEND_MESSAGE_V2, i, ext={"a": "pg", "b": "t"}, body=b"x" * i,
                    remark="r" if i else None, serialize_type=kind) for i in range(3)]
    frames = [encode_command(c) for c in cmds]
    dec, got, ends = FrameDecoder(), [], []
    wire = b"".join(frames)
    for i in range(len(wire)):
        out = dec.feed(wire[i : i + 1])
        if out:
            ends.append(i + 1)
        got += out
    assert got == cmds
    assert ends == [sum(len(f) for f in frames[: n + 1]) for n in range(3)]


def test_several_frames_of_both_codecs_in_one_feed() -> None:
    cmds = [Command(RequestCode.HEART_BEAT, i, body=b"{}", serialize_type=KINDS[i % 2]) for i in range(5)]
    wire = b"".join(encode_command(c) for c in cmds)
    dec = FrameDecoder()
    assert dec.feed(wire + wire[:7]) == cmds  # and the start of a sixth
    assert dec.buffered == 7 and dec.feed(wire[7 : len(encode_command(cmds[0]))]) == cmds[:1]


def test_a_response_keeps_the_requests_opaque_and_serialize_type() -> None:
    req = Command(RequestCode.PULL_MESSAGE, 42, serialize_type=SERIALIZE_ROCKETMQ)
    resp = req.response(19, "no new message")
    assert (resp.opaque, resp.serialize_type, resp.is_response, req.is_response) == (42, 1, True, False)
    assert decode_one(encode_command(resp)) == resp
    assert Command(1, flag=FLAG_ONEWAY | FLAG_RESPONSE).is_oneway


# -- malformed and oversized frames ---------------------------------------------------------------------
def test_an_oversized_frame_is_refused_from_its_prefix_before_its_body_arrives() -> None:
    dec = FrameDecoder(max_frame_bytes=1024)
    assert dec.feed(struct.pack(">I", 2000)) == []  # only the length so far
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">I", 10))  # the rest of the 8-byte prefix: refused now
    with pytest.raises(FrameTooLarge):  # poisoned: the stream has lost its framing
        dec.feed(encode_command(Command(10)))


def test_the_size_limit_is_inclusive() -> None:
    data = encode_command(Command(10, body=b"x" * 100))
    assert len(FrameDecoder(max_frame_bytes=len(data) - 4).feed(data)) == 1
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame_bytes=len(data) - 5).feed(data)


@pytest.mark.parametrize("kind", [2, 7, 0x80, 0xFF])
def test_an_unknown_serialize_type_is_a_malformed_frame(kind: int) -> None:
    with pytest.raises(MalformedFrame, match="serialize type"):
        FrameDecoder().feed(frame(kind, b"{}"))


def test_a_header_length_larger_than_the_frame_is_refused_before_the_header_arrives() -> None:
    # RocketMQ RemotingCommandTest.testMarkProtocolType_ROCKETMQProtocolType: the second word of a
    # ROCKETMQ frame with a 16777215-byte header is 01 FF FF FF
    with pytest.raises(MalformedFrame, match="header length 16777215"):
        FrameDecoder().feed(struct.pack(">I", 100) + bytes([1, 0xFF, 0xFF, 0xFF]))
    with pytest.raises(MalformedFrame, match="header length 9"):
        FrameDecoder().feed(struct.pack(">II", 4 + 8, 9) + b"x" * 8)  # 9 + 4 > 12
    with pytest.raises(MalformedFrame):  # within the frame, but above the header limit
        FrameDecoder().feed(struct.pack(">II", FRAME_HEADER_MAX_BYTES + 100, FRAME_HEADER_MAX_BYTES + 1))


@pytest.mark.parametrize("header", [
    b"", b"{", b"not json", b"[]", b"null", b'{"code":10', b'{"opaque":1}', b"{}",
    b'{"code":"10"}', b'{"code":10.5}', b'{"code":10,"opaque":"1"}', b'{"code":10,"flag":[]}',
    b'{"code":10,"extFields":[]}', b'{"code":10,"extFields":"a"}', b'{"code":10,"remark":5}',
    b'{"code":10,"extFields":{"a":{"b":"c"}}}', b'{"code":10,"extFields":{"a":[1]}}',
    b'{"code":10,"language":1}', b'{"code":10}\xff', b'{"code":10,"remark":"\xff"}',
    b'{"code":10,"extFields":' + b'[' * 5000 + b']' * 5000 + b'}',
], ids=lambda h: h[:30].decode(errors="replace"))
def test_malformed_json_headers_and_wrong_field_types_are_malformed_frames(header: bytes) -> None:
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(frame(SERIALIZE_JSON, header))


def test_unknown_json_header_fields_are_ignored_as_fastjson_does() -> None:
    cmd = decode_one(frame(0, b'{"code":10,"opaque":3,"suspended":false,"extFields":{},"x":[1]}'))
    assert (cmd.code, cmd.opaque, cmd.ext) == (10, 3, {})


def test_a_binary_header_truncated_at_every_byte_is_a_malformed_frame() -> None:
    whole = binary_header(remark=b"Sample Remark", ext=ext_entry(b"key", b"value") + ext_entry(b"k", b""))
    assert decode_one(frame(1, whole)).ext == {"key": "value", "k": ""}
    for cut in range(len(whole)):
        with pytest.raises(MalformedFrame):
            FrameDecoder().feed(frame(SERIALIZE_ROCKETMQ, whole[:cut]))


@pytest.mark.parametrize("header", [
    binary_header(remark=b"r", ext=b"")[:-4] + struct.pack(">i", -1),  # negative ext length
    struct.pack(">hBhiii", 10, 0, 1, 1, 0, -5) + struct.pack(">i", 0),  # negative remark length
    binary_header(ext=struct.pack(">h", -1) + b"k" + struct.pack(">i", 0)),  # negative key length
    binary_header(ext=struct.pack(">h", 1) + b"k" + struct.pack(">i", 99)),  # value past the end
    binary_header(ext=ext_entry(b"k", b"v") + b"\x00"),  # a stray byte after the last entry
    binary_header(remark=b"\xff\xfe"),  # remark not UTF-8
    binary_header(ext=ext_entry(b"\xc3", b"v")),  # key not UTF-8
])
def test_bad_binary_headers_are_malformed_frames(header: bytes) -> None:
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(frame(SERIALIZE_ROCKETMQ, header))


@pytest.mark.parametrize("field", ["code", "version"])
def test_a_field_too_wide_for_the_binary_header_does_not_encode(field: str) -> None:
    cmd = msgspec.structs.replace(Command(10, serialize_type=SERIALIZE_ROCKETMQ), **{field: 40_000})
    with pytest.raises(MalformedFrame):
        encode_command(cmd)
    assert decode_one(encode_command(msgspec.structs.replace(cmd, serialize_type=0))) == \
        msgspec.structs.replace(cmd, serialize_type=0)  # JSON numbers have no such width


def test_an_unknown_binary_language_code_decodes_as_other() -> None:
    assert decode_one(frame(1, binary_header(lang=99))).language == "OTHER"


# -- the C++ client's JSON: ext values as JSON numbers ----------------------------------------------------
def test_ext_values_sent_as_json_scalars_decode_into_strings() -> None:
    """The C++ client (rocketmq-client-cpp) writes numeric header fields as JSON numbers; Java's
    fastjson reads them into the ``HashMap<String, String>`` as their text."""
    header = (b'{"code":11,"extFields":{"consumerGroup":"g","topic":"t","queueId":3,"queueOffset":'
              b'12345678901,"maxMsgNums":32,"sysFlag":2,"commitOffset":-1,"subVersion":0,'
              b'"unitMode":false,"maxMsgBytes":1.5,"expressionType":null},"flag":0,'
              b'"language":"CPP","opaque":9,"version":399}')
    cmd = decode_one(frame(SERIALIZE_JSON, header, b"body"))
    assert cmd.ext == {"consumerGroup": "g", "topic": "t", "queueId": "3", "queueOffset": "12345678901",
                       "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "-1", "subVersion": "0",
                       "unitMode": "false", "maxMsgBytes": "1.5", "expressionType": ""}
    assert (cmd.language, cmd.opaque, cmd.version, cmd.body) == ("CPP", 9, 399, b"body")
    h = from_ext({k: v for k, v in cmd.ext.items() if k not in ("maxMsgBytes", "expressionType")},
                 PullMessageRequestHeader)
    assert (h.queue_id, h.queue_offset, h.commit_offset, h.max_msg_nums) == (3, 12345678901, -1, 32)


# -- from_ext ---------------------------------------------------------------------------------------------
def test_a_missing_required_field_gets_rocketmqs_remark() -> None:
    """RocketMQ ``RemotingCommand.decodeCommandCustomHeader``: ``the custom field <x> is null``."""
    with pytest.raises(MalformedHeader) as e:
        from_ext({"consumerGroup": "g", "topic": "t", "queueOffset": "0", "maxMsgNums": "1"},
                 PullMessageRequestHeader)
    assert str(e.value) == "the custom field <queueId> is null"
    with pytest.raises(MalformedHeader, match=r"^the custom field <clientID> is null$"):
        from_ext({}, UnregisterClientRequestHeader)
    with pytest.raises(MalformedHeader, match=r"^the custom field <b> is null$"):
        from_ext({"a": "pg", "e": "0", "g": "0"}, SendMessageRequestHeaderV2)


def test_a_json_list_of_ext_fields_reads_as_from_ext_reads_each_entry() -> None:
    """``from_ext_list_json`` (an END_TRANSACTION_BATCH body in one pass) gives the headers
    ``from_ext`` gives for each entry; a missing field, a number that does not parse or fit a
    Java long, or a body that is no JSON list, is a MalformedHeader."""
    from txmq.protocol import EndTransactionRequestHeader, encode_body, from_ext_list_json

    heads = [EndTransactionRequestHeader(producer_group="pg", tran_state_table_offset=i,
                                         commit_log_offset=2**40 + i, commit_or_rollback=8,
                                         from_transaction_check=i == 1, msg_id=f"m{i}",
                                         master_epoch=None if i else 3) for i in range(3)]
    exts = [to_ext(h) for h in heads]
    assert from_ext_list_json(encode_body(exts), EndTransactionRequestHeader) == \
        [from_ext(e, EndTransactionRequestHeader) for e in exts] == heads
    assert from_ext_list_json(b"[]", EndTransactionRequestHeader) == []
    with pytest.raises(MalformedHeader, match=r"^the custom field <producerGroup> is null$"):
        from_ext_list_json(encode_body([exts[0], {k: v for k, v in exts[1].items()
                                                  if k != "producerGroup"}]),
                           EndTransactionRequestHeader)
    for bad in ("abc", str(2**63)):
        with pytest.raises(MalformedHeader, match="EndTransactionRequestHeader"):
            from_ext_list_json(encode_body([{**exts[0], "commitLogOffset": bad}]),
                               EndTransactionRequestHeader)
    for body in (b"[{", b'{"a": 1}', b"\xff", b""):
        with pytest.raises(MalformedHeader, match="EndTransactionRequestHeader"):
            from_ext_list_json(body, EndTransactionRequestHeader)


def _pull_ext(queue_id: str) -> dict[str, str]:
    return {"consumerGroup": "g", "topic": "t", "queueId": queue_id, "queueOffset": "0", "maxMsgNums": "1"}


@pytest.mark.parametrize("value", ["abc", "", "1.5", " 1", "0x10", "1_000", "NaN", "true", "1e400"])
def test_a_number_that_does_not_parse_is_a_malformed_header(value: str) -> None:
    with pytest.raises(MalformedHeader, match="PullMessageRequestHeader"):
        from_ext(_pull_ext(value), PullMessageRequestHeader)


@pytest.mark.parametrize("value", ["9" * 30, str(2**63), str(-(2**63) - 1)])
def test_numbers_must_fit_a_java_long(value: str) -> None:
    """RocketMQ ``RemotingCommand.decodeCommandCustomHeader`` reads numbers with
    ``Long.parseLong``: a number past a Java long is a malformed header, never a Python int that
    a later ``struct.pack`` would choke on."""
    with pytest.raises(MalformedHeader, match=r"9223372036854775807|-9223372036854775808"):
        from_ext(_pull_ext(value), PullMessageRequestHeader)


@pytest.mark.parametrize(("value", "read"), [("1e3", 1000), ("1.0", 1), (str(2**63 - 1), 2**63 - 1)])
def test_integral_numbers_are_read_even_where_java_would_refuse(value: str, read: int) -> None:
    """A documented leniency (docs/protocol.md): msgspec reads an integral float literal as the
    integer, where Java's ``parseLong`` refuses it; the range is still Java's."""
    assert from_ext(_pull_ext(value), PullMessageRequestHeader).queue_id == read


# -- golden vectors from RocketMQ -------------------------------------------------------------------------
def test_rocketmq_serializable_without_remark_without_ext_fields() -> None:
    """RocketMQ RocketMQSerializableTest.testRocketMQProtocolEncodeAndDecode_WithoutRemarkWithoutExtFields:
    REGISTER_BROKER (103), JAVA, version 2333: 21 bytes, code at 0, language at 2, version at 3,
    flag at 9, remark length at 13, ext length at 17; decoded remark null."""
    cmd = Command(103, 0x01020304, version=2333, language="JAVA", serialize_type=SERIALIZE_ROCKETMQ)
    data = encode_command(cmd)
    header = data[8:]
    assert data[:8] == struct.pack(">II", 4 + 21, 1 << 24 | 21)
    assert len(header) == 21
    assert header[0:2] == b"\x00\x67" and header[2] == 0 and header[3:5] == struct.pack(">h", 2333)
    assert header[5:9] == b"\x01\x02\x03\x04"  # opaque
    assert header[9:13] == header[13:17] == header[17:21] == b"\x00" * 4
    got = decode_one(data)
    assert (got.code, got.language, got.version, got.opaque, got.flag, got.remark, got.ext) == \
        (103, "JAVA", 2333, 0x01020304, 0, None, {})


def test_rocketmq_serializable_with_remark_without_ext_fields() -> None:
    """RocketMQSerializableTest.testRocketMQProtocolEncodeAndDecode_WithRemarkWithoutExtFields:
    34 bytes, remark length 13 at 13, "Sample Remark" at 17..30, ext length 0 at 30."""
    header = encode_command(Command(103, version=2333, language="JAVA", remark="Sample Remark",
                                    serialize_type=SERIALIZE_ROCKETMQ))[8:]
    assert len(header) == 34
    assert struct.unpack_from(">i", header, 13)[0] == 13 and header[17:30] == b"Sample Remark"
    assert struct.unpack_from(">i", header, 30)[0] == 0
    assert decode_one(frame(1, header)).remark == "Sample Remark"


def test_rocketmq_serializable_without_remark_with_ext_fields() -> None:
    """RocketMQSerializableTest.testRocketMQProtocolEncodeAndDecode_WithoutRemarkWithExtFields:
    35 bytes, ext length 14 at 17: key length i16 3, "key", value length i32 5, "value"."""
    header = encode_command(Command(103, version=2333, language="JAVA", ext={"key": "value"},
                                    serialize_type=SERIALIZE_ROCKETMQ))[8:]
    assert len(header) == 35
    assert header[17:] == struct.pack(">i", 14) + b"\x00\x03key\x00\x00\x00\x05value"
    assert decode_one(frame(1, header)).ext == {"key": "value"}


def test_rocketmq_serializable_fast_encode() -> None:
    """RocketMQSerializableTest.testFastEncode: code 1, remark "remark", opaque 1001, version 99,
    JAVA, flag 3, header {str: "s1", num: 100} as ext strings."""
    cmd = Command(1, 1001, 3, 99, "remark", {"str": "s1", "num": "100"}, language="JAVA",
                  serialize_type=SERIALIZE_ROCKETMQ)
    got = decode_one(encode_command(cmd))
    assert got == cmd and got.is_response and got.is_oneway


def test_remoting_command_mark_protocol_type() -> None:
    """RocketMQ RemotingCommandTest.testMarkProtocolType_JSONProtocolType: a JSON header of 261
    bytes marks the second word 00 00 01 05."""
    cmd = Command(10, 1, ext={"k": ""})
    pad = 261 - len(encode_command(cmd)[8:])
    data = encode_command(Command(10, 1, ext={"k": "v" * pad}))
    assert data[4:8] == bytes([0, 0, 1, 5])
    assert decode_one(data).ext == {"k": "v" * pad}


FASTJSON_HEADER = (b'{"code":103,"extFields":{"key":"value"},"flag":0,"language":"JAVA","opaque":7,'
                   b'"serializeTypeCurrentRPC":"JSON","version":2333}')
"""What fastjson writes for a RemotingCommand (RocketMQ ``RemotingCommand.headerEncode`` ->
``RemotingSerializable.encode``): the non-transient, non-null fields code, language, version,
opaque, flag, remark, extFields, serializeTypeCurrentRPC, in fastjson's alphabetical order."""


def test_the_json_header_fastjson_writes_decodes() -> None:
    got = decode_one(frame(SERIALIZE_JSON, FASTJSON_HEADER, b"\x00\x01\x02\x03\x04"))
    assert got == Command(103, 7, 0, 2333, None, {"key": "value"}, b"\x00\x01\x02\x03\x04", "JAVA",
                          SERIALIZE_JSON)


def test_the_json_header_is_byte_for_byte_what_fastjson_writes() -> None:
    data = encode_command(Command(103, 7, version=2333, language="JAVA", ext={"key": "value"}))
    assert data[8:] == FASTJSON_HEADER


def test_the_json_header_keeps_fastjsons_field_names_and_order() -> None:
    data = encode_command(Command(310, 7, FLAG_ONEWAY, remark="r", ext={"a": "pg"}, language="GO"))
    keys = list(json.loads(data[8:]))
    assert keys == sorted(keys) and set(keys) <= {"code", "extFields", "flag", "language", "opaque",
                                                  "remark", "serializeTypeCurrentRPC", "version"}
    assert json.loads(data[8:])["extFields"] == {"a": "pg"} and "remark" in keys and "flag" in keys


def test_send_message_request_header_v2_short_names() -> None:
    """RocketMQ SendMessageRequestHeaderV2.createSendMessageRequestHeaderV1: a producerGroup,
    b topic, c defaultTopic, d defaultTopicQueueNums, e queueId, f sysFlag, g bornTimestamp,
    h flag, i properties, j reconsumeTimes, k unitMode, l maxReconsumeTimes, m batch, n brokerName."""
    v1 = SendMessageRequestHeader(
        producer_group="pg", topic="t", default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=3, sys_flag=4, born_timestamp=1700000000000, flag=7, properties="UNIQ_KEY\x01M\x02",
        reconsume_times=1, unit_mode=False, max_reconsume_times=16, batch=True, broker_name="b")
    v2 = to_ext(SendMessageRequestHeaderV2.from_v1(v1))
    assert v2 == {"a": "pg", "b": "t", "c": "TBW102", "d": "4", "e": "3", "f": "4", "g": "1700000000000",
                  "h": "7", "i": "UNIQ_KEY\x01M\x02", "j": "1", "k": "false", "l": "16", "m": "true",
                  "n": "b"}
    assert to_ext(v1) == {"producerGroup": "pg", "topic": "t", "defaultTopic": "TBW102",
                          "defaultTopicQueueNums": "4", "queueId": "3", "sysFlag": "4",
                          "bornTimestamp": "1700000000000", "flag": "7", "properties": "UNIQ_KEY\x01M\x02",
                          "reconsumeTimes": "1", "unitMode": "false", "batch": "true",
                          "maxReconsumeTimes": "16", "bname": "b"}
    assert from_ext(v2, SendMessageRequestHeaderV2).to_v1() == v1


JAVA_HEARTBEAT = (
    b'{"clientID":"10.0.0.1@4242","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
    b'"consumeType":"CONSUME_PASSIVELY","groupName":"cg","messageModel":"CLUSTERING",'
    b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG",'
    b'"subString":"*","subVersion":1700000000000,"tagsSet":[],"topic":"t"}],"unitMode":false}],'
    b'"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"pg"},'
    b'{"groupName":"CLIENT_INNER_PRODUCER"}],"withoutSub":false}')
"""A HeartbeatData as a Java client's fastjson writes it (RocketMQ ``HeartbeatData``: clientID,
producerDataSet, consumerDataSet, heartbeatFingerprint, isWithoutSub; ``ConsumerData``: groupName,
consumeType, messageModel, consumeFromWhere, subscriptionDataSet, unitMode; ``SubscriptionData``:
classFilterMode, topic, subString, tagsSet, codeSet, subVersion, expressionType; ``ProducerData``:
groupName)."""


def test_heartbeat_data_json_field_names() -> None:
    hb = decode_body(JAVA_HEARTBEAT, HeartbeatData)
    assert hb.client_id == "10.0.0.1@4242" and hb.producer_groups == ["pg", "CLIENT_INNER_PRODUCER"]
    [cd] = hb.consumer_data_set
    assert (cd.group_name, cd.consume_type, cd.message_model, cd.consume_from_where, cd.unit_mode) == \
        ("cg", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", False)
    assert cd.subscription_data_set == [SubscriptionData(topic="t", sub_version=1700000000000)]
    out = json.loads(encode_body(HeartbeatData(
        client_id="c", producer_data_set=[ProducerData(group_name="pg")],
        consumer_data_set=[ConsumerData(group_name="cg", subscription_data_set=[
            SubscriptionData(topic="t", sub_string="a || b", tags_set=["a", "b"])])])))
    assert set(out) == {"clientID", "producerDataSet", "consumerDataSet"}
    assert out["producerDataSet"] == [{"groupName": "pg"}]
    sub = out["consumerDataSet"][0]["subscriptionDataSet"][0]
    assert set(out["consumerDataSet"][0]) == {"groupName", "consumeType", "messageModel",
                                              "consumeFromWhere", "subscriptionDataSet", "unitMode"}
    assert set(sub) == {"classFilterMode", "topic", "subString", "tagsSet", "codeSet", "subVersion",
                        "expressionType"}
    assert (sub["subString"], sub["tagsSet"]) == ("a || b", ["a", "b"])


def test_lock_batch_response_body_is_lock_ok_mq_set() -> None:
    """RocketMQ LockBatchResponseBody: ``lockOKMQSet`` (not fastjson's camel case of a Java name),
    of MessageQueue {topic, brokerName, queueId}."""
    body = LockBatchResponseBody(lock_ok_mq_set=[MessageQueue("t", 1, "broker-a")])
    assert json.loads(encode_body(body)) == {
        "lockOKMQSet": [{"topic": "t", "queueId": 1, "brokerName": "broker-a"}]}
    java = b'{"lockOKMQSet":[{"brokerName":"broker-a","queueId":1,"topic":"t"}]}'
    assert decode_body(java, LockBatchResponseBody) == body


def test_unregister_client_request_header_client_id() -> None:
    """RocketMQ UnregisterClientRequestHeader: ``clientID`` (@CFNotNull), producerGroup and
    consumerGroup (@CFNullable)."""
    assert to_ext(UnregisterClientRequestHeader(client_id="c@1", producer_group="pg")) == \
        {"clientID": "c@1", "producerGroup": "pg"}
    assert from_ext({"clientID": "c@1"}, UnregisterClientRequestHeader).consumer_group is None


# -- every header class: to_ext / from_ext and a full frame, in both codecs -------------------------------
HEADER_CLASSES = sorted(
    (obj for name in protocol.__all__
     if isinstance(obj := getattr(protocol, name), type) and issubclass(obj, msgspec.Struct)
     and re.search(r"Header(V\d+)?$", name)),
    key=lambda c: c.__name__)


def _field_strategy(tp: Any) -> st.SearchStrategy[Any]:
    if typing.get_origin(tp) is typing.Annotated:  # JLong: an int within a Java long
        tp = typing.get_args(tp)[0]
    args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
    if args:  # Optional[X]
        return st.none() | _field_strategy(args[0])
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-(2**63), 2**63 - 1)  # Java long
    assert tp is str, tp
    return st.text(max_size=30)


def headers(cls: type[msgspec.Struct]) -> st.SearchStrategy[msgspec.Struct]:
    fields = msgspec.structs.fields(cls)
    return st.builds(cls, **{f.name: _field_strategy(f.type) for f in fields})


def test_the_header_classes_are_found() -> None:
    names = {c.__name__ for c in HEADER_CLASSES}
    assert {"SendMessageRequestHeader", "SendMessageRequestHeaderV2", "PullMessageRequestHeader",
            "EndTransactionRequestHeader", "CheckTransactionStateRequestHeader",
            "UnregisterClientRequestHeader", "RegisterBrokerRequestHeader"} <= names
    assert len(HEADER_CLASSES) >= 35


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_header_round_trips_through_ext_and_both_frame_codecs(
        cls: type[msgspec.Struct], data: st.DataObject) -> None:
    h = data.draw(headers(cls))
    ext = to_ext(h)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in ext.items())
    assert from_ext(ext, cls) == h
    for kind in KINDS:
        cmd = decode_one(encode_command(Command(RequestCode.SEND_MESSAGE, 5, ext=ext, serialize_type=kind)))
        assert cmd.ext == ext and from_ext(cmd.ext, cls) == h
