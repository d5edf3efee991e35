"""The broker core's traffic counters and lag computation (sans-IO, ``txmq.broker.TrafficStats``
and ``consumer_lag``), and the metric families built from them, on a hand-driven broker."""

from __future__ import annotations

from prometheus_client.core import Metric

from txmq.broker import MESSAGE_TYPES, TrafficStats, consumer_lag
from txmq.broker._metrics import broker_metrics
from txmq.errors import ResponseCode
from txmq.protocol import (
    Command,
    ConsumerSendMsgBackRequestHeader,
    RequestCode,
    SendMessageResponseHeader,
    decode_offset_msg_id,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness


def _sample(families: list[Metric], name: str, **labels: str) -> float | None:
    for f in families:
        for s in f.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return s.value
    return None


def _offset(reply: Command) -> int:
    h = from_ext(reply.ext, SendMessageResponseHeader)
    return decode_offset_msg_id(h.msg_id)[1]


def test_each_send_is_counted_by_kind_with_its_stored_size() -> None:
    hb = BrokerHarness(topics={"t": 2, "u": 1}, message_delay_level="1s")
    at = [_offset(hb.send(1, "t", b"a" * 10)),
          _offset(hb.send(1, "t", b"b" * 2000, properties={"__SHARDINGKEY": "k"})),
          _offset(hb.send(1, "t", b"c", properties={"DELAY": "1"})),
          _offset(hb.send(1, "u", b"d", transactional=True))]
    c = hb.broker.traffic.messages_in["t"]
    assert [c[k][0] for k in range(4)] == [1, 1, 1, 0]
    assert c[0][1] == at[1] - at[0] and c[1][1] == at[2] - at[1]  # bytes: the records' sizes
    assert hb.broker.traffic.messages_in["u"][MESSAGE_TYPES.index("transaction")][0] == 1
    fams = broker_metrics(hb.broker, hb.now_ms)
    assert _sample(fams, "rocketmq_messages_in_total", topic="t", message_type="fifo") == 1
    assert _sample(fams, "rocketmq_message_size_bucket", topic="t", message_type="fifo",
                   le="1024.0") == 0
    assert _sample(fams, "rocketmq_message_size_bucket", topic="t", message_type="fifo",
                   le="4096.0") == 1
    assert _sample(fams, "rocketmq_messages_in_total", topic="u", message_type="transaction") == 1
    assert _sample(fams, "rocketmq_half_messages", topic="u") == 1


def test_a_failed_send_is_not_counted() -> None:
    hb = BrokerHarness(topics={"t": 1})
    assert hb.send(1, "t", b"x", queue_id=5).code != ResponseCode.SUCCESS
    assert hb.broker.traffic.messages_in == {}


def test_lag_inflight_and_ready_follow_pulls_and_commits() -> None:
    hb = BrokerHarness(topics={"t": 2})
    for i in range(5):
        hb.send(1, "t", b"m%d" % i, queue_id=i % 2)  # queue 0: 3, queue 1: 2
    b = hb.broker
    assert consumer_lag(b, b.traffic, hb.now_ms) == []  # no group knows the topic yet
    b.set_offset("g", "t", 0, 0)  # queue 1 has no offset: it counts 0, as in RocketMQ
    [row] = consumer_lag(b, b.traffic, hb.now_ms + 50)
    assert (row.lag, row.inflight, row.ready, row.lag_latency_ms) == (3, 0, 0, 50)
    assert len(hb.pull("t", 0, 0, group="g", max_nums=2)) == 2
    [row] = consumer_lag(b, b.traffic, hb.now_ms)
    assert (row.lag, row.inflight, row.ready) == (3, 2, 1)
    b.set_offset("g", "t", 0, 2)
    b.set_offset("g", "t", 1, 0)
    [row] = consumer_lag(b, b.traffic, hb.now_ms)
    assert (row.lag, row.inflight, row.ready) == (3, 0, 1)
    assert b.traffic.messages_out == {"g": {"t": [2, b.traffic.messages_out["g"]["t"][1]]}}
    fams = broker_metrics(b, hb.now_ms)
    assert _sample(fams, "rocketmq_consumer_lag_messages", consumer_group="g", topic="t") == 3
    assert _sample(fams, "rocketmq_messages_out_total", consumer_group="g", topic="t") == 2


def test_retry_and_dlq_topics_are_not_counted_as_traffic() -> None:
    t = TrafficStats()
    t.sent("%RETRY%g", 0, 10)
    t.delivered("g", "%DLQ%g", 1, 10)
    t.sent("t", 0, 10)
    hb = BrokerHarness(topics={"t": 1})
    hb.broker.traffic = t
    fams = broker_metrics(hb.broker, hb.now_ms)
    assert _sample(fams, "rocketmq_messages_in_total", topic="t") == 1
    assert _sample(fams, "rocketmq_messages_in_total", topic="%RETRY%g") is None
    assert _sample(fams, "rocketmq_messages_out_total", topic="%DLQ%g") is None


def test_rpc_latency_buckets_and_names() -> None:
    hb = BrokerHarness(topics={"t": 1})
    t = hb.broker.traffic
    t.answered(RequestCode.SEND_MESSAGE_V2, ResponseCode.SUCCESS, 0.5, count=3)
    t.answered(RequestCode.SEND_MESSAGE_V2, ResponseCode.SUCCESS, 4.0)
    t.answered(RequestCode.PULL_MESSAGE, ResponseCode.PULL_NOT_FOUND, 5000.0, long_polling=True)
    t.answered(99_999, 98_765, 1.0)
    fams = broker_metrics(hb.broker, hb.now_ms)
    send = {"request_code": "send_message_v2", "response_code": "success"}
    assert _sample(fams, "rocketmq_rpc_latency_bucket", **send, le="1.0") == 3
    assert _sample(fams, "rocketmq_rpc_latency_bucket", **send, le="5.0") == 4
    assert _sample(fams, "rocketmq_rpc_latency_sum", **send) == 5.5
    assert _sample(fams, "rocketmq_rpc_latency_bucket", request_code="pull_message",
                   response_code="pull_not_found", is_long_polling="true", le="3000.0") == 0
    assert _sample(fams, "rocketmq_rpc_latency_count", request_code="99999",
                   response_code="98765") == 1


def test_a_message_sent_back_past_max_reconsume_times_counts_as_dlq() -> None:
    hb = BrokerHarness(topics={"t": 1})
    hb.send(1, "t", b"x")
    [m] = hb.pull("t")
    h = ConsumerSendMsgBackRequestHeader(offset=m.commit_log_offset, group="g", delay_level=-1,
                                         origin_msg_id=m.msg_id, origin_topic="t")
    assert hb.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(h)).code == ResponseCode.SUCCESS
    fams = broker_metrics(hb.broker, hb.now_ms)
    assert _sample(fams, "rocketmq_send_to_dlq_messages_total", consumer_group="g", topic="t") == 1
