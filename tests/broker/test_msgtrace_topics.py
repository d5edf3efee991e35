"""The broker's part in RocketMQ message trace: the trace topics ``trace_topic_enable`` creates
(RocketMQ ``TopicConfigManager``: ``msgTraceTopicName``, 1 queue; txmq adds the region topics the C++
client writes), clients may write a region's trace topic, and with ``trace_topic_enable`` every send
response carries ``MSG_REGION`` and ``TRACE_ON`` (RocketMQ ``SendMessageProcessor``, always there) and
every stored message does too (RocketMQ ``AbstractSendMessageProcessor.buildMsgContext``)."""

from __future__ import annotations

import pytest

from txmq.broker import BrokerConfig
from txmq.errors import ConfigError, ResponseCode
from txmq.protocol import (
    RMQ_SYS_TRACE_TOPIC,
    Message,
    RequestCode,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    encode_batch,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness


def test_no_trace_topic_unless_enabled_as_in_rocketmq() -> None:
    h = BrokerHarness()
    assert not [t for t in h.broker.topics if "TRACE" in t]


def test_trace_topics_created_at_start_with_one_queue() -> None:
    h = BrokerHarness(trace_topic_enable=True)
    assert {t: h.broker.topics[t] for t in h.broker.topics if "TRACE" in t} == {
        RMQ_SYS_TRACE_TOPIC: 1, "rmq_sys_TRACE_DATA_DefaultRegion": 1,
        "rmq_sys_TRACE_DATA_DEFAULT_REGION": 1}
    custom = BrokerHarness(trace_topic_enable=True, msg_trace_topic_name="audit-trace", region_id="eu")
    assert {t for t in custom.broker.topics if "trace" in t.lower()} == {
        "audit-trace", "rmq_sys_TRACE_DATA_eu", "rmq_sys_TRACE_DATA_DEFAULT_REGION"}


@pytest.mark.parametrize("bad", [{"msg_trace_topic_name": "RMQ_SYS_TRANS_HALF_TOPIC"},
                                 {"msg_trace_topic_name": "no/slash"}, {"region_id": "a b"}])
def test_illegal_trace_topic_settings_are_refused(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="trace topic"):
        BrokerConfig(**bad).validate()  # type: ignore[arg-type]


def test_clients_write_the_trace_topics_and_read_records_by_key() -> None:
    h = BrokerHarness(trace_topic_enable=True)
    for topic in (RMQ_SYS_TRACE_TOPIC, "rmq_sys_TRACE_DATA_DEFAULT_REGION"):
        r = h.send(1, topic, b"SubBefore\x01...\x02", keys="M1 k")
        assert r.code == ResponseCode.SUCCESS, r.remark
        [m] = h.all_messages(topic)
        assert m.keys == "M1 k"
    # other rmq_sys_ topics stay the broker's own
    assert h.send(1, "rmq_sys_REVIVE_LOG_DefaultCluster", b"x").code == ResponseCode.NO_PERMISSION


def test_send_responses_carry_the_region_and_the_trace_switch_when_the_broker_hosts_trace() -> None:
    h = BrokerHarness(trace_topic_enable=True)
    sent = from_ext(h.send(1, "t", b"x").ext, SendMessageResponseHeader)
    assert (sent.msg_region, sent.trace_on) == ("DefaultRegion", True)
    assert h.send(1, "t", b"x").ext["TRACE_ON"] == "true"
    # not hosting it (the default): neither (Java clients default them, DefaultRegion and on)
    assert not {"MSG_REGION", "TRACE_ON"} & BrokerHarness().send(1, "t", b"x").ext.keys()
    # trace_on false is always said, so that clients stop tracing
    off = BrokerHarness(region_id="eu", trace_on=False)
    r = off.send(1, "t", b"x", transactional=True)
    assert (r.ext["MSG_REGION"], r.ext["TRACE_ON"]) == ("eu", "false")
    header = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic="t", queue_id=0, born_timestamp=1,
                                               batch=True))
    batch = off.request(1, RequestCode.SEND_BATCH_MESSAGE, header,
                        encode_batch([Message(topic="t", body=b"1"), Message(topic="t", body=b"2")]))
    assert batch.code == ResponseCode.SUCCESS and batch.ext["MSG_REGION"] == "eu"


def test_stored_messages_carry_the_region_when_the_broker_hosts_message_trace() -> None:
    h = BrokerHarness(trace_topic_enable=True, region_id="eu")
    h.send(1, "t", b"plain")
    half = h.send(1, "t", b"half", transactional=True)
    assert h.end(1, half, "COMMIT").code == ResponseCode.SUCCESS
    stored = h.all_messages("t")
    assert [(m.properties["MSG_REGION"], m.properties["TRACE_ON"]) for m in stored] == [("eu", "true")] * 2
    # off (the default): stored as sent
    plain = BrokerHarness()
    plain.send(1, "t", b"x")
    assert "MSG_REGION" not in plain.all_messages("t")[0].properties
