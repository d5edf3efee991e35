"""The sans-IO parts of the SDK's RocketMQ message trace (``txmq.client._msgtrace``): record building
as RocketMQ's trace hooks build them, and the buffer's batching (RocketMQ ``AsyncTraceDispatcher``
defaults)."""

from __future__ import annotations

import threading

import pytest

from txmq import limits
from txmq.client import ConsumeOrderlyStatus, ConsumeStatus, LocalTransactionState, SendResult
from txmq.client._core import SendStatus
from txmq.client._msgtrace import (
    TraceBuffer,
    end_record,
    pub_record,
    return_type,
    sub_after_records,
    sub_before_records,
)
from txmq.errors import ConfigError
from txmq.protocol import (
    ConsumeReturnType,
    Message,
    MessageExt,
    SubBeforeRecord,
    TraceMessageType,
    decode_trace_records,
    encode_trace_record,
)


def result(**kw: object) -> SendResult:
    args: dict[str, object] = {"msg_id": "M1", "topic": "t", "queue_id": 0, "queue_offset": 5,
                               "commit_log_offset": 100, "offset_msg_id": "7F00000100002A9F0000000000000064"}
    return SendResult(**{**args, **kw})  # type: ignore[arg-type]


def test_pub_record_as_send_message_trace_hook_builds_it() -> None:
    msg = Message(topic="t", body=b"12345", tags="A", keys="k1 k2")
    r = pub_record(msg, result(region_id="east"), "pg", "10.0.0.1:10911", 1_000, 1_007)
    assert r is not None
    assert (r.timestamp_ms, r.region_id, r.group_name, r.topic, r.msg_id, r.tags, r.keys) == (
        1_000, "east", "pg", "t", "M1", "A", "k1 k2")
    assert (r.store_host, r.body_length, r.cost_time_ms, r.msg_type, r.success) == (
        "10.0.0.1:10911", 5, 7, TraceMessageType.Normal_Msg, True)
    assert r.offset_msg_id == "7F00000100002A9F0000000000000064"
    # a broker that sent no region: RocketMQ's default; a weaker status is not a success
    weak = pub_record(msg, result(status=SendStatus.FLUSH_DISK_TIMEOUT), "pg", "", 1, 1)
    assert weak is not None and weak.region_id == "DefaultRegion" and not weak.success
    # TRACE_ON false from the broker: no record (RocketMQ SendResult.isTraceOn)
    assert pub_record(msg, result(trace_on=False), "pg", "", 1, 2) is None


@pytest.mark.parametrize(("props", "kind"), [
    ({"TRAN_MSG": "true"}, TraceMessageType.Trans_Msg_Half),
    ({"DELAY": "3"}, TraceMessageType.Delay_Msg),
    ({"__STARTDELIVERTIME": "1"}, TraceMessageType.Delay_Msg),
    ({}, TraceMessageType.Normal_Msg),
])
def test_message_type_of_a_pub(props: dict[str, str], kind: TraceMessageType) -> None:
    r = pub_record(Message(topic="t", body=b"", properties=props), result(), "g", "", 0, 0)
    assert r is not None and r.msg_type is kind


def test_end_record_is_trans_msg_commit_whatever_the_state() -> None:
    r = end_record(topic="t", msg_id="M", transaction_id="M", state=LocalTransactionState.UNKNOWN,
                   group="tg", store_host="b:1", now_ms=9, from_transaction_check=True)
    assert r.msg_type is TraceMessageType.Trans_msg_Commit
    assert (r.transaction_state, r.from_transaction_check, r.region_id) == ("UNKNOW", True, "DefaultRegion")
    assert decode_trace_records(encode_trace_record(r)) == [r]


def test_sub_records_per_message_of_a_call() -> None:
    msgs = [MessageExt(topic="t", body=b"a", keys="k", reconsume_times=2,
                       properties={"UNIQ_KEY": "U1", "MSG_REGION": "west"}),
            MessageExt(topic="t", body=b"b", properties={"UNIQ_KEY": "U2", "TRACE_ON": "false"}),
            MessageExt(topic="t", body=b"c", properties={"UNIQ_KEY": "U3"})]
    before = sub_before_records(msgs, "cg", "REQ", 1_000)
    assert [(b.msg_id, b.retry_times, b.region_id, b.keys) for b in before] == [
        ("U1", 2, "west", "k"), ("U3", 0, "DefaultRegion", "")]
    after = sub_after_records(before, 3, ConsumeStatus.CONSUME_SUCCESS, ConsumeReturnType.SUCCESS, 1_030)
    # the call's 30 ms over its 3 messages (RocketMQ consumeMessageAfter)
    assert [(a.msg_id, a.cost_time_ms, a.success, a.request_id, a.group_name, a.timestamp_ms)
            for a in after] == [("U1", 10, True, "REQ", "cg", 1_030), ("U3", 10, True, "REQ", "cg", 1_030)]
    assert sub_after_records([], 1, None, ConsumeReturnType.RETURNNULL, 5) == []


@pytest.mark.parametrize(("status", "raised", "elapsed", "code"), [
    (ConsumeStatus.CONSUME_SUCCESS, False, 5, ConsumeReturnType.SUCCESS),
    (ConsumeOrderlyStatus.SUCCESS, False, 5, ConsumeReturnType.SUCCESS),
    (ConsumeStatus.RECONSUME_LATER, False, 5, ConsumeReturnType.FAILED),
    (None, False, 5, ConsumeReturnType.RETURNNULL),
    (None, True, 5, ConsumeReturnType.EXCEPTION),
    (ConsumeStatus.CONSUME_SUCCESS, False, 100, ConsumeReturnType.TIME_OUT),
])
def test_consume_return_type(status: object, raised: bool, elapsed: int, code: ConsumeReturnType) -> None:
    assert return_type(status, raised, elapsed, 100) is code


def _rec(i: int) -> SubBeforeRecord:
    return SubBeforeRecord(timestamp_ms=i, region_id="R", group_name="g", request_id="q", msg_id=f"M{i}")


def test_buffer_sends_full_batches_at_once_and_the_rest_after_the_interval() -> None:
    b = TraceBuffer(0, batch_num=3, queue_size=10, flush_interval_ms=5_000)
    b.append([_rec(i) for i in range(4)])
    assert b.due(1) and [r.msg_id for r in b.take(1)] == ["M0", "M1", "M2"]
    assert not b.due(2) and b.take(2) == []  # one left, the interval runs from the last take
    assert [r.msg_id for r in b.take(2, force=True)] == ["M3"]  # shutdown
    b.append([_rec(9)])
    assert not b.due(5_002) and b.due(5_003)  # more than the interval after the take at 2
    assert [r.msg_id for r in b.take(5_003)] == ["M9"]


def test_buffer_drops_and_counts_what_does_not_fit() -> None:
    b = TraceBuffer(0, batch_num=2, queue_size=3)
    assert b.append([_rec(0), _rec(1)])
    assert not b.append([_rec(2), _rec(3), _rec(4)])
    assert (len(b), b.discarded) == (3, 2)
    # RocketMQ caps the batch at 20 records
    assert TraceBuffer(0, batch_num=500).batch_num == limits.TRACE_MSG_BATCH_NUM_MAX
    with pytest.raises(ConfigError):
        TraceBuffer(0, batch_num=0)


def test_buffer_appends_from_many_threads() -> None:
    b = TraceBuffer(0, queue_size=1_000)

    def add() -> None:
        for i in range(300):
            b.append([_rec(i)])

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(b) + b.discarded == 1_200 and len(b) == 1_000
