"""Bad input gets a clear error response and loses nothing; sends, pulls, offsets, retries."""

from __future__ import annotations

from txmq.broker import dlq_topic, retry_topic
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_TAGS,
    ConsumerSendMsgBackRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    RequestCode,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_message_exts,
    decode_offset_msg_id,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness


def test_unknown_topic_code_and_malformed_header_get_errors() -> None:
    h = BrokerHarness()
    assert h.send(1, "nope", b"x").code == ResponseCode.TOPIC_NOT_EXIST
    assert h.request(1, 9999).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    r = h.request(1, RequestCode.SEND_MESSAGE, {"topic": "t"})  # no producerGroup
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "the custom field <producerGroup> is null"
    r = h.request(1, RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "t", "e": "x", "g": "1"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "SendMessageRequestHeaderV2" in r.remark
    r = h.request(1, RequestCode.HEART_BEAT, body=b"\xc1")
    assert r.code == ResponseCode.SYSTEM_ERROR and "HeartbeatData" in r.remark
    assert h.send(1, "t", b"ok").code == ResponseCode.SUCCESS  # still serving


def test_oversized_message_is_refused_and_nothing_is_stored() -> None:
    h = BrokerHarness(max_message_size=100)
    assert h.send(1, "t", b"x" * 101).code == ResponseCode.MESSAGE_ILLEGAL
    assert h.all_messages("t") == []


def test_bad_queue_id_and_bad_offsets() -> None:
    h = BrokerHarness()
    assert h.send(1, "t", b"x", queue_id=7).code == ResponseCode.MESSAGE_ILLEGAL
    h.send(1, "t", b"a")
    assert h.pull("t", 0, offset=5) == []


def test_consumer_offsets_round_trip() -> None:
    h = BrokerHarness()
    q = QueryConsumerOffsetRequestHeader(consumer_group="g", topic="t", queue_id=1)
    assert h.request(1, RequestCode.QUERY_CONSUMER_OFFSET, to_ext(q)).code == ResponseCode.QUERY_NOT_FOUND
    u = UpdateConsumerOffsetRequestHeader(consumer_group="g", topic="t", queue_id=1, commit_offset=42)
    assert h.request(1, RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(u)).code == ResponseCode.SUCCESS
    r = h.request(1, RequestCode.QUERY_CONSUMER_OFFSET, to_ext(q))
    assert from_ext(r.ext, OffsetResponseHeader).offset == 42


def test_send_back_goes_to_retry_after_the_delay_then_dlq_after_max() -> None:
    h = BrokerHarness(message_delay_level="1s 2s 3s 4s 5s")
    h.create = h.broker.create_topic(retry_topic("g"), 1)
    sent = h.send(1, "t", b"x", keys="k")
    clo = decode_offset_msg_id(from_ext(sent.ext, SendMessageResponseHeader).msg_id)[1]
    back = ConsumerSendMsgBackRequestHeader(group="g", offset=clo, delay_level=0, max_reconsume_times=1)
    assert h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(back)).code == ResponseCode.SUCCESS
    assert h.pull(retry_topic("g")) == []
    h.tick(2_999)
    assert h.pull(retry_topic("g")) == []  # level 3 = 3 s
    h.tick(1)
    [retry] = h.pull(retry_topic("g"))
    assert (retry.body, retry.reconsume_times, retry.properties["RETRY_TOPIC"]) == (b"x", 1, "t")
    back2 = ConsumerSendMsgBackRequestHeader(group="g", offset=retry.commit_log_offset, delay_level=0,
                                             max_reconsume_times=1)
    h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(back2))
    [dead] = h.pull(dlq_topic("g"))
    assert (dead.body, dead.keys, dead.reconsume_times) == (b"x", "k", 2)
    assert dead.properties["RETRY_TOPIC"] == "t"


def test_tag_filter() -> None:
    h = BrokerHarness()
    for tag in ("A", "B", "C"):
        h.send(1, "t", tag.encode(), properties={PROPERTY_TAGS: tag})
    ph = PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=0, queue_offset=0,
                                  max_msg_nums=32, subscription="A || C")
    r = h.request(1, RequestCode.PULL_MESSAGE, to_ext(ph))
    assert [m.tags for m in decode_message_exts(r.body)] == ["A", "C"]
    assert from_ext(r.ext, PullMessageResponseHeader).next_begin_offset == 3
