"""Bad input gets a clear error response and loses nothing; sends, pulls, offsets, retries."""

from __future__ import annotations

from txmq.broker import dlq_topic, retry_topic
from txmq.errors import ResponseCode
from txmq.protocol import (
    ConsumerSendMsgBackRequestHeader,
    OffsetRequestHeader,
    RequestCode,
    to_ext,
)
from txmq.testing import BrokerHarness


def test_unknown_topic_code_and_malformed_header_get_errors() -> None:
    h = BrokerHarness()
    assert h.send(1, "nope", b"x").code == ResponseCode.TOPIC_NOT_EXIST
    assert h.request(1, 9999).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    r = h.request(1, RequestCode.SEND_MESSAGE, {"topic": 5})
    assert r.code == ResponseCode.INVALID_PARAMETER and "SendMessageRequestHeader" in r.remark
    assert h.request(1, RequestCode.HEART_BEAT, body=b"\xc1").code == ResponseCode.INVALID_PARAMETER
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
    q = OffsetRequestHeader(consumer_group="g", topic="t", queue_id=1)
    assert h.request(1, RequestCode.QUERY_CONSUMER_OFFSET, to_ext(q)).code == ResponseCode.QUERY_NOT_FOUND
    u = OffsetRequestHeader(consumer_group="g", topic="t", queue_id=1, commit_offset=42)
    assert h.request(1, RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(u)).code == ResponseCode.SUCCESS
    assert h.request(1, RequestCode.QUERY_CONSUMER_OFFSET, to_ext(q)).ext["offset"] == 42


def test_send_back_goes_to_retry_after_the_delay_then_dlq_after_max() -> None:
    h = BrokerHarness(message_delay_level="1s 2s 3s 4s 5s")
    h.create = h.broker.create_topic(retry_topic("g"), 1)
    sent = h.send(1, "t", b"x", keys="k")
    clo = int(sent.ext["commit_log_offset"])
    back = ConsumerSendMsgBackRequestHeader(group="g", commit_log_offset=clo, max_reconsume_times=1)
    assert h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(back)).code == ResponseCode.SUCCESS
    assert h.pull(retry_topic("g")) == []
    h.tick(2_999)
    assert h.pull(retry_topic("g")) == []  # level 3 = 3 s
    h.tick(1)
    [retry] = h.pull(retry_topic("g"))
    assert (retry.body, retry.reconsume_times, retry.properties["RETRY_TOPIC"]) == (b"x", 1, "t")
    back2 = ConsumerSendMsgBackRequestHeader(group="g", commit_log_offset=retry.commit_log_offset,
                                             max_reconsume_times=1)
    h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(back2))
    [dead] = h.pull(dlq_topic("g"))
    assert (dead.body, dead.keys, dead.reconsume_times) == (b"x", "k", 2)
    assert dead.properties["RETRY_TOPIC"] == "t"


def test_tag_filter() -> None:
    h = BrokerHarness()
    for tag in ("A", "B", "C"):
        h.request(1, RequestCode.SEND_MESSAGE, {"producer_group": "p", "topic": "t", "queue_id": 0,
                                                "tags": tag}, tag.encode())
    from txmq.protocol import PullMessageRequestHeader, decode_messages

    ph = PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=0, queue_offset=0,
                                  subscription="A || C")
    r = h.request(1, RequestCode.PULL_MESSAGE, to_ext(ph))
    assert [m.tags for m in decode_messages(r.body)] == ["A", "C"]
    assert r.ext["next_begin_offset"] == 3
