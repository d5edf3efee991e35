"""Validation at the door (issue 11): hostile but well-formed requests are refused with RocketMQ's
codes, store nothing, leave the connection usable, and never keep the broker from starting again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from txmq import limits
from txmq.errors import ResponseCode, StoreError
from txmq.protocol import (
    ConsumerData,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    HeartbeatData,
    ProducerData,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_offset_msg_id,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.store import FileStore, Record
from txmq.testing import BrokerHarness

OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def _open(path: Path, **cfg: Any) -> BrokerHarness:
    h = BrokerHarness(store=FileStore(path), auto_create_topic_enable=True, **cfg)
    h.heartbeat(1, "p1", ["pg"])
    return h


def _send(h: BrokerHarness, topic: str, body: bytes = b"x", *, queue_id: int = 0,
          props: dict[str, str] | None = None, group: str = "pg", tags: str = "") -> Any:
    props = {**(props or {}), **({"TAGS": tags} if tags else {})}
    text = "".join(f"{k}\u0001{v}\u0002" for k, v in props.items())  # as sent, even if illegal
    ext = to_ext(SendMessageRequestHeader(producer_group=group, topic=topic, queue_id=queue_id,
                                          properties=text, born_timestamp=h.now_ms))
    return h.request(1, RequestCode.SEND_MESSAGE, ext, body)


# (topic, queue id, properties, body, code): each single request bricked the restart of today's main
_REAL = {"REAL_QID": "0", "PGROUP": "pg"}
BRICKS = {
    "topic-dot": (".", 0, {}, b"x", ResponseCode.MESSAGE_ILLEGAL),
    "topic-300-bytes": ("€" * 100, 0, {}, b"x", ResponseCode.MESSAGE_ILLEGAL),
    "half-real-topic-empty": (HALF, 0, {"REAL_TOPIC": "", **_REAL}, b"x", ResponseCode.NO_PERMISSION),
    "half-real-topic-escape": (HALF, 0, {"REAL_TOPIC": "../../../x", **_REAL}, b"x",
                               ResponseCode.NO_PERMISSION),
    "delay-real-topic-empty": (SCHEDULE, 0, {"REAL_TOPIC": "", **_REAL}, b"x", ResponseCode.NO_PERMISSION),
    "delay-real-topic-escape": (SCHEDULE, 0, {"REAL_TOPIC": "../../../x", **_REAL}, b"x",
                                ResponseCode.NO_PERMISSION),
    "op-unparsable-body": (OP, 0, {}, b"not,offsets", ResponseCode.NO_PERMISSION),
}


@pytest.mark.parametrize("case", sorted(BRICKS))
def test_a_request_that_bricked_restart_is_refused_and_the_broker_starts_again(
        case: str, tmp_path: Path) -> None:
    topic, qid, props, body, code = BRICKS[case]
    data = tmp_path / "data" / "store"
    h = _open(data)
    assert _send(h, "t", b"good").code == ResponseCode.SUCCESS
    end = h.store.write_offset
    r = _send(h, topic, body, queue_id=qid, props=props, tags="d" if topic == OP else "")
    stored = h.store.write_offset != end
    after = _send(h, "t", b"after").code  # on the same connection
    h.tick(3_600_000)  # every delay level due: a parked message goes to its REAL_TOPIC
    h.store.close()
    h2 = _open(data)  # recovery indexes what is in the half topic
    if r.code == ResponseCode.SUCCESS and topic == HALF:  # today's main: its commit writes REAL_TOPIC
        h2.end(1, r, "COMMIT")
    h2.store.close()
    again = BrokerHarness(store=FileStore(data), auto_create_topic_enable=True)
    assert [m.body for m in again.pull("t")] == [b"good", b"after"]
    assert not (tmp_path / "x").exists() and not (tmp_path / "data" / "x").exists()
    assert (r.code, bool(r.remark), stored, after) == (code, True, False, ResponseCode.SUCCESS)


@pytest.mark.parametrize(("props", "code"), [
    ({"TRAN_MSG": "true", "REAL_TOPIC": "../../../x"}, ResponseCode.NO_PERMISSION),
    ({"DELAY": "1", "REAL_TOPIC": "../../../x", "REAL_QID": "0"}, ResponseCode.NO_PERMISSION),
    ({"TRAN_PREPARED_QUEUE_OFFSET": "abc"}, ResponseCode.NO_PERMISSION),
    ({"TRAN_MSG": "true", "TXMQ_RESUMED_FROM": "x"}, ResponseCode.NO_PERMISSION),
    ({"DELAY": "abc"}, ResponseCode.INVALID_PARAMETER),
    ({"k\u0001": "v"}, ResponseCode.MESSAGE_ILLEGAL),
], ids=["half-escape", "delay-escape", "prepared-offset", "resumed-from", "delay-abc",
        "separator"])
def test_broker_only_and_unparsable_properties_are_refused(props: dict[str, str], code: ResponseCode,
                                                           tmp_path: Path) -> None:
    h = _open(tmp_path / "s")
    end = h.store.write_offset
    assert _send(h, "t", props=props).code == code
    assert h.store.write_offset == end and not h.broker.tx.index.pending
    assert _send(h, "t", props={"DELAY": "1"}).code == ResponseCode.SUCCESS
    h.tick(3_600_000)
    h.store.close()
    assert [m.body for m in BrokerHarness(store=FileStore(tmp_path / "s")).pull("t")] == [b"x"]


def test_an_empty_reserved_property_never_reaches_the_broker() -> None:
    """``REAL_TOPIC`` with an empty value is dropped by the properties decoder (RocketMQ
    ``MessageDecoder.string2messageProperties`` skips empty values): an ordinary half message."""
    h = BrokerHarness()
    h.heartbeat(1, "p1", ["pg"])
    r = _send(h, "t", props={"TRAN_MSG": "true", "REAL_TOPIC": ""})
    assert r.code == ResponseCode.SUCCESS
    [half] = h.pull(HALF)
    assert half.properties["REAL_TOPIC"] == "t"


def test_a_non_numeric_limit_gets_rocketmqs_header_error() -> None:
    """A header field that does not parse: SYSTEM_ERROR with the field named, as RocketMQ's
    ``NettyRemotingAbstract`` answers a ``RemotingCommandException`` from decoding the header."""
    h = BrokerHarness()
    r = h.request(1, RequestCode.GET_PENDING_TRANSACTIONS, {"limit": "ten"})
    assert r.code == ResponseCode.SYSTEM_ERROR and "limit" in r.remark
    assert h.request(1, RequestCode.GET_PENDING_TRANSACTIONS, {"limit": "5"}).code == ResponseCode.SUCCESS


def test_topic_creation_follows_the_same_rules() -> None:
    h = BrokerHarness()

    def create(topic: str, n: int = 1) -> int:
        ext = to_ext(CreateTopicRequestHeader(topic=topic, read_queue_nums=n, write_queue_nums=n))
        return h.request(1, RequestCode.UPDATE_AND_CREATE_TOPIC, ext).code

    assert create(".") == create("..") == create("€" * 100) == ResponseCode.MESSAGE_ILLEGAL
    assert create(OP) == create(SCHEDULE) == create("TXMQ_SINK_BATCH_TOPIC") == ResponseCode.NO_PERMISSION
    assert create("ok", limits.QUEUE_NUMS_MAX + 1) == ResponseCode.MESSAGE_ILLEGAL
    assert create("ok|1_-%", 2) == ResponseCode.SUCCESS
    assert "." not in h.broker.topics and "ok|1_-%" in h.broker.topics


def test_queue_ids_offsets_and_groups_are_checked_by_every_request_that_names_them() -> None:
    h = BrokerHarness()

    def call(code: int, header: Any) -> int:
        return h.request(1, code, to_ext(header)).code

    illegal = ResponseCode.MESSAGE_ILLEGAL
    assert call(RequestCode.GET_MIN_OFFSET, GetMinOffsetRequestHeader(topic="t", queue_id=7)) == illegal
    assert call(RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic="t", queue_id=-1)) == illegal
    assert call(RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
        consumer_group="g", topic="t", queue_id=2, commit_offset=0)) == illegal
    assert call(RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
        consumer_group="g", topic="t", queue_id=0, commit_offset=-5)) == illegal
    assert call(RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
        consumer_group="g@x", topic="t", queue_id=0, commit_offset=0)) == illegal
    assert call(RequestCode.PULL_MESSAGE, PullMessageRequestHeader(
        consumer_group="../g", topic="t", queue_id=0, queue_offset=0, max_msg_nums=32)) == illegal
    assert call(RequestCode.PULL_MESSAGE, PullMessageRequestHeader(
        consumer_group="g", topic="a/b", queue_id=0, queue_offset=0, max_msg_nums=32)) == illegal
    assert len(h.broker.offsets) == 0
    assert call(RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic="t", queue_id=1)) == \
        ResponseCode.SUCCESS


def test_a_heartbeat_naming_an_illegal_group_creates_no_retry_topic() -> None:
    h = BrokerHarness()
    long_group = "g" * (limits.GROUP_NAME_MAX_CHARS + 1)
    for data in (HeartbeatData(client_id="c", consumer_data_set=[ConsumerData(group_name=long_group)]),
                 HeartbeatData(client_id="c", consumer_data_set=[ConsumerData(group_name="a.b")]),
                 HeartbeatData(client_id="c", producer_data_set=[ProducerData(group_name="a b")])):
        r = h.request(1, RequestCode.HEART_BEAT, body=encode_body(data))
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
    assert not [t for t in h.broker.topics if t.startswith("%RETRY%")]


def test_reading_system_topics_stays_allowed() -> None:
    h = BrokerHarness()
    h.heartbeat(1, "p1", ["pg"])
    assert h.send(1, "t", b"half", transactional=True).code == ResponseCode.SUCCESS
    assert [m.body for m in h.pull(HALF)] == [b"half"]


def test_the_file_store_refuses_a_record_whose_topic_is_not_a_path_it_may_create(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s")
    end = store.write_offset
    for topic, qid in ((".", 0), ("../../x", 0), ("€" * 100, 0), ("t", -1), ("t", limits.QUEUE_NUMS_MAX)):
        with pytest.raises(StoreError):
            store.append([Record(topic=topic, queue_id=qid, body=b"x")])
        with pytest.raises(StoreError):  # a batch is refused whole
            store.append([Record(topic="t", queue_id=0, body=b"ok"),
                          Record(topic=topic, queue_id=qid, body=b"x")])
    assert store.write_offset == end and not (tmp_path / "x").exists()
    store.close()


def test_send_back_names_a_stored_message_of_a_client_topic() -> None:
    h = BrokerHarness()
    h.heartbeat(1, "p1", ["pg"])
    half = h.send(1, "t", b"half", transactional=True)
    plain = h.send(1, "t", b"plain")

    def back(offset: int, group: str = "cg") -> int:
        ext = to_ext(ConsumerSendMsgBackRequestHeader(group=group, offset=offset, delay_level=0))
        return h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, ext).code

    def stored_at(reply: Any) -> int:  # the commit log offset inside the offset msg id
        return decode_offset_msg_id(from_ext(reply.ext, SendMessageResponseHeader).msg_id)[1]

    assert back(10**12) == back(-1) == back(1) == ResponseCode.MESSAGE_ILLEGAL
    assert back(stored_at(half)) == ResponseCode.NO_PERMISSION  # the half record
    assert back(stored_at(plain), "a/b") == ResponseCode.MESSAGE_ILLEGAL
    assert back(stored_at(plain)) == ResponseCode.SUCCESS


def test_unparsable_transaction_ids_and_sink_batches_are_refused() -> None:
    h = BrokerHarness()
    assert h.request(1, RequestCode.QUERY_TRANSACTION, {"id": "half:abc"}).code == \
        ResponseCode.INVALID_PARAMETER
    assert h.request(1, RequestCode.QUERY_TRANSACTION, {"id": "half:7"}).code == ResponseCode.SUCCESS
    r = h.request(1, RequestCode.ABORT_SINK_BATCH, {"batchId": "5"})
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "the custom field <batch> is null")
    assert h.request(1, RequestCode.COMMIT_SINK_BATCH, {"batch": "s/1", "producerGroup": "a b"},
                     encode_body({"0.1": 1})).code == ResponseCode.MESSAGE_ILLEGAL
