"""The RocketMQ 4 message trace codec (``txmq.protocol._msg_trace``) against records written the way
RocketMQ's ``TraceDataEncoder`` writes them (docs/tracing.md), the C++ client's captured record, round
trips, and hostile input (a clear MalformedMessage, never another exception)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import MalformedMessage
from txmq.protocol import (
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    EndTransactionRecord,
    PubRecord,
    RecallRecord,
    SubAfterRecord,
    SubBeforeRecord,
    TraceMessageType,
    decode_trace_record,
    decode_trace_records,
    encode_trace_record,
    is_broker_topic,
    is_trace_topic,
    split_trace_records,
    trace_batches,
    trace_keys,
)

CAPTURES = Path(__file__).resolve().parents[1] / "conformance" / "captures" / "index.json"


def java(*fields: str) -> str:
    """A record as Java's ``encoderFromContextBean`` writes it: fields joined by char 1, char 2 after."""
    return CONTENT_SPLITOR.join(fields) + FIELD_SPLITOR


# Records written field by field from RocketMQ TraceDataEncoder.encoderFromContextBean (Java client
# 4.x/5.x, access channel LOCAL): a Pub of a message without tags (Java writes the null as "null"),
# a consumer's SubBefore and SubAfter, an EndTransaction answering a check-back, a Recall.
JAVA_PUB = java("Pub", "1700000000123", "DefaultRegion", "order-producers", "orders",
                "7F0000010B2A18B4AAC25F6E2A0D0000", "null", "order-42 customer-7", "10.0.0.5:10911",
                "37", "4", "0", "0A00000500002A9F0000000000001A2B", "true")
JAVA_SUB_BEFORE = java("SubBefore", "1700000000500", "DefaultRegion", "ledger",
                       "7F0000010B2A18B4AAC25F6E2A100001", "7F0000010B2A18B4AAC25F6E2A0D0000", "2",
                       "order-42 customer-7")
JAVA_SUB_AFTER = java("SubAfter", "7F0000010B2A18B4AAC25F6E2A100001", "7F0000010B2A18B4AAC25F6E2A0D0000",
                      "12", "false", "order-42 customer-7", "4", "1700000000512", "ledger")
JAVA_END = java("EndTransaction", "1700000000200", "DefaultRegion", "order-producers", "orders",
                "7F0000010B2A18B4AAC25F6E2A0D0000", "null", "order-42", "10.0.0.5:10911", "2",
                "7F0000010B2A18B4AAC25F6E2A0D0000", "ROLLBACK_MESSAGE", "true")
JAVA_RECALL = java("Recall", "1700000000900", "DefaultRegion", "order-producers", "orders",
                   "7F0000010B2A18B4AAC25F6E2A0D0000", "true")


def test_java_records_decode_field_by_field() -> None:
    pub, before, after, end, recall = decode_trace_records(
        (JAVA_PUB + JAVA_SUB_BEFORE + JAVA_SUB_AFTER + JAVA_END + JAVA_RECALL).encode())
    assert pub == PubRecord(
        timestamp_ms=1700000000123, region_id="DefaultRegion", group_name="order-producers",
        topic="orders", msg_id="7F0000010B2A18B4AAC25F6E2A0D0000", tags="", keys="order-42 customer-7",
        store_host="10.0.0.5:10911", body_length=37, cost_time_ms=4,
        msg_type=TraceMessageType.Normal_Msg, offset_msg_id="0A00000500002A9F0000000000001A2B",
        success=True)
    assert before == SubBeforeRecord(
        timestamp_ms=1700000000500, region_id="DefaultRegion", group_name="ledger",
        request_id="7F0000010B2A18B4AAC25F6E2A100001", msg_id=pub.msg_id, retry_times=2,
        keys="order-42 customer-7")
    assert after == SubAfterRecord(
        request_id=before.request_id, msg_id=pub.msg_id, cost_time_ms=12, success=False,
        keys="order-42 customer-7", context_code=4, timestamp_ms=1700000000512, group_name="ledger")
    assert end == EndTransactionRecord(
        timestamp_ms=1700000000200, region_id="DefaultRegion", group_name="order-producers",
        topic="orders", msg_id=pub.msg_id, tags="", keys="order-42", store_host="10.0.0.5:10911",
        msg_type=TraceMessageType.Trans_msg_Commit, transaction_id=pub.msg_id,
        transaction_state="ROLLBACK_MESSAGE", from_transaction_check=True)
    assert recall == RecallRecord(timestamp_ms=1700000000900, region_id="DefaultRegion",
                                  group_name="order-producers", topic="orders", msg_id=pub.msg_id)


def test_our_records_are_written_as_java_writes_them() -> None:
    for text in (JAVA_PUB, JAVA_SUB_BEFORE, JAVA_SUB_AFTER, JAVA_END, JAVA_RECALL):
        r = decode_trace_record(text[:-1])
        assert r is not None
        assert encode_trace_record(r) == text


def test_older_and_other_layouts_java_reads_are_read_too() -> None:
    # Pub of 13 fields (no offsetMsgId, old clients), 15 (clientHost); SubAfter of 7 (CLOUD: no time,
    # no group), of 6 (the C++ client), with C++'s "dKey" placeholder kept as written
    base = JAVA_PUB[:-1].split(CONTENT_SPLITOR)
    p13 = decode_trace_record(CONTENT_SPLITOR.join([*base[:12], "false"]))
    assert isinstance(p13, PubRecord) and not p13.success and p13.offset_msg_id == ""
    p15 = decode_trace_record(CONTENT_SPLITOR.join([*base, "10.0.0.9"]))
    assert isinstance(p15, PubRecord) and p15.client_host == "10.0.0.9" and p15.success
    cloud = decode_trace_record(CONTENT_SPLITOR.join(["SubAfter", "r", "m", "3", "true", "k", "0", ""]))
    assert cloud == SubAfterRecord(request_id="r", msg_id="m", cost_time_ms=3, keys="k")
    cpp = decode_trace_record(CONTENT_SPLITOR.join(["SubAfter", "r", "m", "3", "true", "dKey"]))
    assert cpp == SubAfterRecord(request_id="r", msg_id="m", cost_time_ms=3, keys="dKey")
    # Java's String.split drops a trailing empty keys field (Java then fails); read as keys ""
    short = decode_trace_record(CONTENT_SPLITOR.join(["SubBefore", "1", "R", "g", "q", "m", "0"]))
    assert isinstance(short, SubBeforeRecord) and short.keys == ""


def test_the_cpp_clients_captured_record_decodes() -> None:
    """The SubBefore the RocketMQ C++ client (core 2.1.0) really sent (tests/conformance/captures)."""
    frame = json.loads(CAPTURES.read_text())["310-trace-record-send"]
    [r] = decode_trace_records(frame["body_text"])
    assert isinstance(r, SubBeforeRecord)
    assert (r.group_name, r.region_id, r.retry_times, r.keys) == ("CapCG", "DEFAULT_REGION", 0, "c-1")
    assert frame["header"]["extFields"]["b"] == "rmq_sys_TRACE_DATA_DEFAULT_REGION"
    assert r.msg_id in frame["header"]["extFields"]["i"]  # the trace message's KEYS hold the id


def test_unknown_types_and_empty_records_are_skipped() -> None:
    text = "Future\u0001x\u0002\u0002" + JAVA_RECALL + "\u0002"
    assert [type(r) for r in decode_trace_records(text)] == [RecallRecord]
    assert split_trace_records(b"") == []


@pytest.mark.parametrize(("text", "says"), [
    ("Pub\u00011\u0001R\u0001g", "has 4 fields, needs at least 12"),
    (JAVA_PUB[:-1].replace("\u00010\u00010A0000", "\u00019\u00010A0000"), "msgType 9"),
    (JAVA_END[:-1].replace("ROLLBACK_MESSAGE", "UNKNOWN"), "transactionState 'UNKNOWN'"),
    (JAVA_SUB_BEFORE[:-1].replace("\u00011700000000500\u0001", "\u0001soon\u0001"), "timestamp 'soon'"),
    (JAVA_SUB_AFTER[:-1].replace("\u000112\u0001", "\u00012147483648\u0001"), "costTime '2147483648'"),
    ("SubAfter\u0001r", "needs at least 6"),
])
def test_malformed_records_say_which_field(text: str, says: str) -> None:
    with pytest.raises(MalformedMessage, match=says):
        decode_trace_record(text)
    with pytest.raises(MalformedMessage):
        decode_trace_records(text.encode() + b"\x02")


def test_a_field_holding_a_separator_is_refused_when_written() -> None:
    with pytest.raises(MalformedMessage, match="separator"):
        encode_trace_record(SubBeforeRecord(timestamp_ms=1, region_id="R", group_name="g\u0002",
                                            request_id="q", msg_id="m"))
    with pytest.raises(MalformedMessage, match="transaction state"):
        encode_trace_record(EndTransactionRecord(timestamp_ms=1, region_id="R", group_name="g", topic="t",
                                                 msg_id="m", transaction_state="COMMIT"))


def test_keys_and_batches() -> None:
    pub = PubRecord(timestamp_ms=1, region_id="R", group_name="g", topic="t", msg_id="M1", keys="a b")
    assert trace_keys(pub) == ["M1", "a", "b"]
    recall = RecallRecord(timestamp_ms=1, region_id="R", group_name="g", topic="t", msg_id="M2")
    assert trace_keys(recall) == ["M2"]
    one = len(encode_trace_record(pub).encode())
    # cut once a body reaches the size (RocketMQ flushData), keys deduplicated per message
    batches = trace_batches([pub] * 5, max_msg_size=2 * one)
    assert [len(b.body) for b in batches] == [2 * one, 2 * one, one]
    assert all(b.keys == ["M1", "a", "b"] for b in batches)
    # txmq: cut before the keys would pass the broker's property value limit
    many = [PubRecord(timestamp_ms=1, region_id="R", group_name="g", topic="t", msg_id=f"M{i:03}")
            for i in range(10)]
    cut = trace_batches(many, keys_max_chars=20)
    assert all(len(" ".join(b.keys)) <= 20 for b in cut)
    assert [r for b in cut for r in decode_trace_records(b.body)] == many


def test_trace_topics() -> None:
    assert is_trace_topic("RMQ_SYS_TRACE_TOPIC") and is_trace_topic("rmq_sys_TRACE_DATA_DefaultRegion")
    assert not is_trace_topic("orders")
    # a region's trace topic is written by clients (the C++ client), unlike other rmq_sys_ topics
    assert not is_broker_topic("rmq_sys_TRACE_DATA_DEFAULT_REGION")
    assert is_broker_topic("rmq_sys_REVIVE_LOG_DefaultCluster")


# -- properties -------------------------------------------------------------------------------------
_TEXT = st.text(st.characters(blacklist_characters="\u0001\u0002", blacklist_categories=("Cs",)),
                max_size=12)
_OPT = _TEXT.filter(lambda s: s != "null")  # tags and keys: Java's null reads back as ""
_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)
_RECORDS = st.one_of(
    st.builds(PubRecord, timestamp_ms=_I64, region_id=_TEXT, group_name=_TEXT, topic=_TEXT, msg_id=_TEXT,
              tags=_OPT, keys=_OPT, store_host=_TEXT, body_length=_I32, cost_time_ms=_I32,
              msg_type=st.sampled_from(TraceMessageType), offset_msg_id=_TEXT, success=st.booleans(),
              client_host=_TEXT),
    st.builds(SubBeforeRecord, timestamp_ms=_I64, region_id=_TEXT, group_name=_TEXT, request_id=_TEXT,
              msg_id=_TEXT, retry_times=_I32, keys=_OPT),
    st.builds(SubAfterRecord, request_id=_TEXT, msg_id=_TEXT, cost_time_ms=_I32, success=st.booleans(),
              keys=_OPT, context_code=_I32, timestamp_ms=_I64, group_name=_TEXT),
    st.builds(EndTransactionRecord, timestamp_ms=_I64, region_id=_TEXT, group_name=_TEXT, topic=_TEXT,
              msg_id=_TEXT, tags=_OPT, keys=_OPT, store_host=_TEXT,
              msg_type=st.sampled_from(TraceMessageType), transaction_id=_TEXT,
              transaction_state=st.sampled_from(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]),
              from_transaction_check=st.booleans()),
    st.builds(RecallRecord, timestamp_ms=_I64, region_id=_TEXT, group_name=_TEXT, topic=_TEXT,
              msg_id=_TEXT, success=st.booleans()),
)


@given(st.lists(_RECORDS, max_size=6))
@settings(max_examples=300, deadline=None)
def test_records_round_trip(records: list[object]) -> None:
    body = "".join(encode_trace_record(r) for r in records).encode()  # type: ignore[arg-type]
    assert decode_trace_records(body) == records
    assert [r for b in trace_batches(records, max_msg_size=64)  # type: ignore[arg-type]
            for r in decode_trace_records(b.body)] == records


_HOSTILE = st.lists(st.sampled_from(["\u0001", "\u0002", "Pub", "SubBefore", "SubAfter", "EndTransaction",
                                     "Recall", "0", "9", "-", "99999999999999999999", "true", "UNKNOW",
                                     "null", "x", "\u00e9", "\ud7ff"]), max_size=40).map("".join)


@given(st.one_of(_HOSTILE, st.binary(max_size=200)))
@settings(max_examples=500, deadline=None)
def test_hostile_input_decodes_or_raises_malformed_message(data: str | bytes) -> None:
    try:
        records = decode_trace_records(data)
    except MalformedMessage as exc:
        assert "trace record" in str(exc)
        return
    for r in records:  # whatever decoded writes again
        assert isinstance(encode_trace_record(r), str)
