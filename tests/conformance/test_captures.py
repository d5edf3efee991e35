"""txmq's codecs read the frames the RocketMQ C++ client core really sent (``captures/``, recorded by
``captures/record_captures.py``; what each holds is in ``captures/README.md``).

These are the third-party bytes the broker will get: a JSON header with some ext values as JSON
numbers, ``"0"``/``"1"`` booleans, heartbeat enums as integers, bodies ending in a newline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from txmq.protocol import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    SERIALIZE_JSON,
    CheckTransactionStateRequestHeader,
    Command,
    ConsumerSendMsgBackRequestHeader,
    EndTransactionRequestHeader,
    FrameDecoder,
    GetConsumerListByGroupRequestHeader,
    GetConsumerListByGroupResponseBody,
    GetMaxOffsetRequestHeader,
    HeartbeatData,
    LockBatchRequestBody,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    UnlockBatchRequestBody,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_body,
    decode_message_ext,
    decode_message_exts,
    decode_offset_msg_id,
    decode_properties,
    decode_route,
    from_ext,
)

CAPTURES = Path(__file__).resolve().parent / "captures"
INDEX: dict[str, Any] = json.loads((CAPTURES / "index.json").read_text())
CLIENT_FRAMES = sorted(n for n, v in INDEX.items() if v["direction"] == "client->server")
AUTH_EXT = {"AccessKey", "Signature", "OnsChannel"}  # sent even with ACL off


def frame(name: str) -> Command:
    data = (CAPTURES / f"{name}.bin").read_bytes()
    cmds = FrameDecoder().feed(data)
    assert len(cmds) == 1, name
    return cmds[0]


def test_every_capture_is_listed_and_present() -> None:
    assert sorted(p.stem for p in CAPTURES.glob("*.bin")) == sorted(INDEX)
    assert len(CLIENT_FRAMES) >= 20


@pytest.mark.parametrize("name", CLIENT_FRAMES)
def test_client_frames_decode_as_json_requests_from_cpp(name: str) -> None:
    cmd = frame(name)
    assert cmd.code == int(name.split("-")[0])
    assert cmd.serialize_type == SERIALIZE_JSON
    assert cmd.language == "CPP" and cmd.version == 333
    assert cmd.flag == 0 and not cmd.is_response and not cmd.is_oneway, "C++ requests all carry flag 0"
    assert set(cmd.ext) >= AUTH_EXT
    assert all(isinstance(v, str) for v in cmd.ext.values()), "JSON-number ext values read as strings"


def test_send_v2_numbers_and_zero_one_booleans() -> None:
    h = from_ext(frame("310-send-sync").ext, SendMessageRequestHeaderV2)
    assert (h.producer_group, h.topic, h.default_topic) == ("CapPG", "CapT", "TBW102")
    assert h.default_topic_queue_nums == 4
    assert h.sys_flag == 0 and h.flag == 0 and h.reconsume_times == 0 and h.max_reconsume_times == 16
    assert h.unit_mode is False and h.batch is False, 'the C++ core writes booleans as "0"/"1"'
    assert h.broker_name is None
    props = decode_properties(h.properties or "")
    assert props["KEYS"] == "sync-0" and props["TAGS"] == "cpp" and props["WAIT"] == "true"
    assert props["origin"] == "cpp" and len(props["UNIQ_KEY"]) == 32
    assert frame("310-send-sync").body == b"sync:0"


def test_send_half_and_sharding_key() -> None:
    half = from_ext(frame("310-send-half-prepared").ext, SendMessageRequestHeaderV2)
    assert half.sys_flag == 4  # MessageSysFlag.TRANSACTION_PREPARED_TYPE
    props = decode_properties(half.properties or "")
    assert props["TRAN_MSG"] == "true" and props["PGROUP"] == half.producer_group
    orderly = from_ext(frame("310-send-orderly-sharding-key").ext, SendMessageRequestHeaderV2)
    assert decode_properties(orderly.properties or "")["__SHARDINGKEY"] == "shard-0"


def test_end_transaction_fields_before_and_after_a_check_back() -> None:
    ends = {n: from_ext(frame(n).ext, EndTransactionRequestHeader)
            for n in ("37-end-commit", "37-end-rollback", "37-end-unknown", "37-end-commit-after-check")}
    kinds = [ends[n].commit_or_rollback for n in ("37-end-commit", "37-end-rollback", "37-end-unknown")]
    assert kinds == [8, 12, 0]
    first = ends["37-end-commit"]
    assert first.from_transaction_check is False and first.transaction_id == ""
    assert first.tran_state_table_offset == 0 and len(first.msg_id) == 32
    after = ends["37-end-commit-after-check"]
    assert after.from_transaction_check is True, 'fromTransactionCheck is "1"'
    check = from_ext(frame("39-check-request-from-server").ext, CheckTransactionStateRequestHeader)
    assert after.commit_log_offset == check.commit_log_offset
    assert after.tran_state_table_offset == check.tran_state_table_offset
    assert after.transaction_id == check.transaction_id and after.msg_id == check.transaction_id
    msg = decode_message_ext(frame("39-check-request-from-server").body)
    assert msg.commit_log_offset == check.commit_log_offset


def test_heartbeats_with_integer_enums_and_missing_sets() -> None:
    producer = decode_body(frame("34-heartbeat-producer").body, HeartbeatData)
    assert producer.producer_groups == ["CapTPG"] and producer.consumer_data_set == []
    assert producer.client_id.endswith("#DEFAULT")
    consumer = decode_body(frame("34-heartbeat-consumer").body, HeartbeatData)
    (data,) = consumer.consumer_data_set
    assert data.group_name == "CapCG"
    assert data.subscriptions == {"CapC": "*", "%RETRY%CapCG": "*"}
    raw = json.loads(frame("34-heartbeat-consumer").body)["consumerDataSet"][0]
    assert (raw["consumeFromWhere"], raw["consumeType"], raw["messageModel"]) == (0, 1, 1)


def test_consumer_requests() -> None:
    q = from_ext(frame("14-query-consumer-offset").ext, QueryConsumerOffsetRequestHeader)
    assert (q.consumer_group, q.topic, q.queue_id) == ("CapCG", "%RETRY%CapCG", 0)
    u = from_ext(frame("15-update-consumer-offset").ext, UpdateConsumerOffsetRequestHeader)
    assert u.consumer_group == "CapCG" and u.commit_offset >= 0
    m = from_ext(frame("30-get-max-offset").ext, GetMaxOffsetRequestHeader)
    assert (m.topic, m.queue_id) == ("CapN", 0)
    g = from_ext(frame("38-consumer-list-request").ext, GetConsumerListByGroupRequestHeader)
    assert g.consumer_group == "CapCG"
    first = from_ext(frame("11-pull-first").ext, PullMessageRequestHeader)
    assert first.sys_flag == PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION
    assert (first.max_msg_nums, first.suspend_timeout_millis, first.subscription) == (32, 15000, "*")
    assert first.expression_type is None and first.sub_version > 0
    committing = from_ext(frame("11-pull-with-commit-offset").ext, PullMessageRequestHeader)
    assert committing.sys_flag & PULL_FLAG_COMMIT_OFFSET and committing.commit_offset == 1
    back = from_ext(frame("36-consumer-send-msg-back").ext, ConsumerSendMsgBackRequestHeader)
    assert back.group == "CapCG" and back.delay_level == 0 and back.max_reconsume_times == 16
    assert back.unit_mode is False and back.origin_topic == "CapC" and len(back.origin_msg_id or "") == 32
    for name in ("35-unregister-producer", "35-unregister-consumer"):
        un = from_ext(frame(name).ext, UnregisterClientRequestHeader)
        assert un.client_id.endswith("#DEFAULT")


def test_lock_and_unlock_bodies() -> None:
    lock = decode_body(frame("41-lock-batch-mq").body, LockBatchRequestBody)
    assert lock.consumer_group == "CapOG" and len(lock.mq_set) == 1 and lock.mq_set[0].broker_name == "b"
    unlock = decode_body(frame("42-unlock-batch-mq").body, UnlockBatchRequestBody)
    assert len(unlock.mq_set) >= 4 and {mq.topic for mq in unlock.mq_set} == {"CapO", "%RETRY%CapOG"}


def test_answers_the_client_accepted_decode() -> None:
    route = decode_route(frame("105-route-response-from-server").body)
    assert route.queue_datas[0].write_queue_nums == 4
    sent = from_ext(frame("310-send-response-from-server").ext, SendMessageResponseHeader)
    _, offset = decode_offset_msg_id(sent.msg_id)
    assert offset == 0
    pulled = frame("11-pull-found-response-from-server")
    h = from_ext(pulled.ext, PullMessageResponseHeader)
    assert h.next_begin_offset == 1
    (msg,) = decode_message_exts(pulled.body)
    assert msg.topic == "CapC"
    ids = decode_body(frame("38-consumer-list-response-from-server").body,
                      GetConsumerListByGroupResponseBody)
    assert len(ids.consumer_id_list) == 1
