"""Consumer groups on the sans-IO broker, with a hand-driven clock: retry timing and the DLQ, delay
messages across a restart, offset search by time, orderly queue locks, operator requests."""

from __future__ import annotations

import msgspec
import pytest

from txmq.broker import dlq_topic, parse_delay_levels, retry_topic
from txmq.broker._groups import QueueLocks
from txmq.errors import ResponseCode
from txmq.limits import MESSAGE_DELAY_LEVELS, REBALANCE_LOCK_MAX_LIVE_TIME_MS
from txmq.protocol import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_RETRY_TOPIC,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUSPEND,
    ConsumerData,
    ConsumerGroupInfo,
    ConsumerSendMsgBackRequestHeader,
    ConsumeStatsRequestHeader,
    CreateTopicRequestHeader,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageExt,
    MessageQueue,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    QueueConsumeStats,
    RequestCode,
    ResetConsumerClientOffsetBody,
    ResetOffsetEntry,
    ResetOffsetRequestHeader,
    SearchOffsetRequestHeader,
    SubscriptionData,
    UpdateConsumerOffsetRequestHeader,
    decode_body,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness

LEVELS_MS = parse_delay_levels(MESSAGE_DELAY_LEVELS)


def join(h: BrokerHarness, conn: int, client_id: str, group: str = "g",
         subs: dict[str, str] | None = None, model: str = "CLUSTERING") -> None:
    sds = [SubscriptionData(topic=t, sub_string=e) for t, e in (subs or {"t": "*"}).items()]
    cd = ConsumerData(group_name=group, message_model=model, subscription_data_set=sds)
    data = HeartbeatData(client_id=client_id, consumer_data_set=[cd])
    assert h.request(conn, RequestCode.HEART_BEAT, body=encode_body(data)).code == 0


def send_back(h: BrokerHarness, msg: MessageExt, *, max_times: int = 16, dlq: bool = False) -> None:
    back = ConsumerSendMsgBackRequestHeader(
        group="g", offset=msg.commit_log_offset, origin_msg_id=msg.msg_id,
        max_reconsume_times=max_times, delay_level=-1 if dlq else 0)
    assert h.request(1, RequestCode.CONSUMER_SEND_MSG_BACK, to_ext(back)).code == ResponseCode.SUCCESS


def test_retries_follow_the_delay_levels_and_the_17th_failure_lands_in_the_dlq() -> None:
    h = BrokerHarness(topics={"t": 1})
    join(h, 1, "c1")
    h.send(1, "t", b"poison", keys="order-7")
    [msg] = h.pull("t")
    for attempt in range(16):
        send_back(h, msg)
        due = LEVELS_MS[3 + attempt - 1]  # level 3 + reconsume times
        offset = attempt  # one retry message per attempt in %RETRY%g queue 0
        h.tick(due - 1)
        assert h.pull(retry_topic("g"), offset=offset) == [], f"retry {attempt + 1} came early"
        h.tick(1)
        [msg] = h.pull(retry_topic("g"), offset=offset)
        assert (msg.reconsume_times, msg.body, msg.keys) == (attempt + 1, b"poison", "order-7")
        assert msg.properties[PROPERTY_RETRY_TOPIC] == "t"
    send_back(h, msg)  # the 17th failure
    [dead] = h.pull(dlq_topic("g"))
    assert (dead.body, dead.keys, dead.reconsume_times) == (b"poison", "order-7", 17)
    assert dead.properties[PROPERTY_RETRY_TOPIC] == "t"
    assert dead.msg_id == msg.msg_id
    h.tick(10 * 3_600_000)
    assert len(h.pull(retry_topic("g"), offset=0)) == 16  # nothing more was scheduled


def test_max_reconsume_times_is_per_group_and_orderly_goes_straight_to_the_dlq() -> None:
    h = BrokerHarness(topics={"t": 1})
    h.send(1, "t", b"x")
    [msg] = h.pull("t")
    send_back(h, msg, max_times=0)
    [dead] = h.pull(dlq_topic("g"))
    assert dead.reconsume_times == 1
    # An orderly consumer that gave up after its local retries asks for the DLQ (delay level -1)
    # whatever the broker-side count; RocketMQ's header carries no local count, so the DLQ copy
    # counts the stored message's retries plus this one.
    send_back(h, msg, dlq=True)
    [_, dead2] = h.pull(dlq_topic("g"))
    assert (dead2.body, dead2.reconsume_times) == (b"x", 1)
    assert h.pull(retry_topic("g")) == []


def test_delay_message_is_due_after_its_level_and_survives_a_restart() -> None:
    h = BrokerHarness(topics={"t": 1}, message_delay_level="1s 5s 10s")
    h.send(1, "t", b"later", properties={PROPERTY_DELAY_TIME_LEVEL: "2"})
    h.send(1, "t", b"sooner", properties={PROPERTY_DELAY_TIME_LEVEL: "1"})
    h.tick(1_000)
    assert [m.body for m in h.pull("t")] == [b"sooner"]
    h.broker.persist_offsets()
    # restart: a new broker over the same store, 10 s later
    h2 = BrokerHarness(store=h.store, now_ms=h.now_ms + 10_000, topics={"t": 1},
                       message_delay_level="1s 5s 10s")
    h2.tick(0)
    bodies = [m.body for m in h2.pull("t")]
    assert bodies == [b"sooner", b"later"]
    assert PROPERTY_DELAY_TIME_LEVEL not in h2.pull("t")[1].properties


def test_delay_progress_is_saved_only_once_the_delivery_is_durable() -> None:
    h = BrokerHarness(topics={"t": 1}, message_delay_level="1s")
    h.send(1, "t", b"d", properties={PROPERTY_DELAY_TIME_LEVEL: "1"})
    h.now_ms += 1_000
    h.broker.tick(h.now_ms)  # delivered, but not flushed yet
    h.broker.schedule.persist()
    assert h.store.load_meta("delayOffset.json") in (None, b'{"1":0}')
    h.store.flush()
    h.broker.schedule.persist()
    assert msgspec.json.decode(h.store.load_meta("delayOffset.json") or b"") == {"1": 1}


def test_search_offset_by_timestamp_is_a_binary_search_over_store_time() -> None:
    h = BrokerHarness(topics={"t": 1})
    stamps = []
    for i in range(50):
        stamps.append(h.now_ms)
        h.send(1, "t", str(i).encode())
        h.now_ms += 10 if i % 7 else 0  # some messages share a timestamp

    def search(ts: int) -> int:
        hdr = SearchOffsetRequestHeader(topic="t", queue_id=0, timestamp=ts)
        r = h.request(1, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, to_ext(hdr))
        return from_ext(r.ext, OffsetResponseHeader).offset

    for ts in [stamps[0] - 1, *stamps, stamps[-1] + 1, stamps[20] + 3]:
        expected = next((i for i, s in enumerate(stamps) if s >= ts), len(stamps))
        assert search(ts) == expected


def test_queue_locks_expire_are_renewed_and_die_with_the_connection() -> None:
    locks = QueueLocks()
    a, b = MessageQueue("t", 0), MessageQueue("t", 1)
    assert locks.try_lock("g", "A", 1, [a, b], 0) == [a, b]
    assert locks.try_lock("g", "B", 2, [a, b], 1_000) == []
    assert locks.try_lock("other", "B", 2, [a], 1_000) == [a]  # per group
    assert locks.try_lock("g", "A", 1, [a], 30_000) == [a]  # renewed
    assert locks.try_lock("g", "B", 2, [a, b], REBALANCE_LOCK_MAX_LIVE_TIME_MS + 1) == [b]  # b expired
    assert locks.holder("g", a, 60_000) == "A"
    locks.unlock("g", "B", [a])  # not B's: no effect
    assert locks.holder("g", a, 60_000) == "A"
    assert locks.release_conn(1) == 1
    assert locks.try_lock("g", "B", 2, [a], 60_001) == [a]


def test_lock_requests_over_the_wire_and_release_on_disconnect() -> None:
    h = BrokerHarness(topics={"t": 2})
    mqs = [MessageQueue("t", 0), MessageQueue("t", 1)]

    def lock(conn: int, cid: str, code: int = RequestCode.LOCK_BATCH_MQ) -> list[MessageQueue]:
        body = encode_body(LockBatchRequestBody(consumer_group="g", client_id=cid, mq_set=mqs))
        r = h.request(conn, code, body=body)
        assert r.code == ResponseCode.SUCCESS
        return decode_body(r.body, LockBatchResponseBody).lock_ok_mq_set if r.body else []

    join(h, 1, "A")
    join(h, 2, "B")
    assert lock(1, "A") == mqs
    assert lock(2, "B") == []
    h.close(1)
    assert lock(2, "B") == mqs
    lock(2, "B", RequestCode.UNLOCK_BATCH_MQ)
    assert lock(3, "C") == mqs
    r = h.request(3, RequestCode.LOCK_BATCH_MQ, body=b"\xc1")
    assert r.code == ResponseCode.SYSTEM_ERROR and "LockBatchRequestBody" in r.remark


def test_group_list_consume_stats_and_reset_offset_notifies_members() -> None:
    h = BrokerHarness(topics={"t": 2})
    join(h, 7, "member-1")
    for i in range(10):
        h.now_ms += 100
        h.send(1, "t", str(i).encode(), queue_id=i % 2)
    update = UpdateConsumerOffsetRequestHeader(consumer_group="g", topic="t", queue_id=0, commit_offset=3)
    h.request(7, RequestCode.UPDATE_CONSUMER_OFFSET, to_ext(update))

    [info] = decode_body(h.request(1, RequestCode.GET_CONSUMER_GROUPS).body,
                         list[ConsumerGroupInfo])
    assert (info.group, info.message_model, info.client_ids) == ("g", "CLUSTERING", ["member-1"])
    assert info.offset_topics == ["t"]

    stats_req = to_ext(ConsumeStatsRequestHeader(consumer_group="g", topic="t"))
    stats = decode_body(h.request(1, RequestCode.GET_CONSUME_STATS, stats_req).body,
                        list[QueueConsumeStats])
    assert [(s.queue_id, s.broker_offset, s.consumer_offset, s.lag) for s in stats] == [
        (0, 5, 3, 2), (1, 5, -1, 5)]

    h.sent.clear()
    reset = ResetOffsetRequestHeader(consumer_group="g", topic="t", offset=1)
    entries = decode_body(h.request(1, RequestCode.RESET_OFFSET, to_ext(reset)).body,
                          list[ResetOffsetEntry])
    assert [(e.queue_id, e.old_offset, e.new_offset) for e in entries] == [(0, 3, 1), (1, -1, 1)]
    [note] = [s for s in h.sent if s.command.code == RequestCode.RESET_CONSUMER_OFFSETS]
    assert note.conn == 7
    assert decode_body(note.command.body, ResetConsumerClientOffsetBody).offsets == {0: 1, 1: 1}

    ts = h.store.read_queue("t", 1, 3, 1, 1)[0].store_timestamp_ms
    by_time = ResetOffsetRequestHeader(consumer_group="g", topic="t", timestamp_ms=ts, queue_id=1)
    [e] = decode_body(h.request(1, RequestCode.RESET_OFFSET, to_ext(by_time)).body,
                      list[ResetOffsetEntry])
    assert (e.queue_id, e.new_offset) == (1, 3)
    both = ResetOffsetRequestHeader(consumer_group="g", topic="t", timestamp_ms=ts, offset=1)
    assert h.request(1, RequestCode.RESET_OFFSET,
                     to_ext(both)).code == ResponseCode.INVALID_PARAMETER


def test_a_held_pull_does_not_commit_its_offset_again_when_woken() -> None:
    h = BrokerHarness(topics={"t": 1})
    pull = PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=0, queue_offset=0,
                                    max_msg_nums=32, sys_flag=PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUSPEND,
                                    suspend_timeout_millis=15_000, commit_offset=0)
    from txmq.broker import Hold
    from txmq.protocol import Command

    [hold] = h.broker.handle(5, Command(code=RequestCode.PULL_MESSAGE, opaque=9, ext=to_ext(pull)),
                             h.now_ms)
    assert isinstance(hold, Hold)
    held = from_ext(hold.request.ext, PullMessageRequestHeader)
    assert held.sys_flag == PULL_FLAG_SUSPEND  # the commit flag is cleared, the rest kept
    assert h.broker.offsets.get("g", "t", 0) == 0


def test_a_pull_committing_past_the_queue_end_stores_the_end() -> None:
    # seed 2027: after a failover truncated a message the consumer had read on the old master,
    # its first pull to the new master committed end + 1, then (moved back) the end: the stored
    # offset went 4847 -> 4846
    h = BrokerHarness(topics={"t": 1})
    for _ in range(3):
        h.send(1, "t", b"x", queue_id=0)
    pull = PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=0, queue_offset=4,
                                    max_msg_nums=32, sys_flag=PULL_FLAG_COMMIT_OFFSET,
                                    commit_offset=4)
    r = h.request(1, RequestCode.PULL_MESSAGE, to_ext(pull))
    assert r.code == ResponseCode.PULL_OFFSET_MOVED
    assert h.broker.offsets.get("g", "t", 0) == 3
    within = msgspec.structs.replace(pull, queue_offset=2, commit_offset=2)
    h.request(1, RequestCode.PULL_MESSAGE, to_ext(within))
    assert h.broker.offsets.get("g", "t", 0) == 2


def test_membership_changes_are_counted_by_client_id() -> None:
    h = BrokerHarness(topics={"t": 2})
    join(h, 1, "A")
    join(h, 2, "B")
    h.sent.clear()
    join(h, 3, "A")  # A reconnected over a new connection
    h.close(1)  # ... and its old connection closes later
    assert h.sent == []
    h.close(3)
    assert [s.conn for s in h.sent] == [2]


@pytest.mark.parametrize("name", ["a@b", "with space", ""])
def test_topic_names_that_would_break_offset_keys_are_refused(name: str) -> None:
    h = BrokerHarness()
    hdr = CreateTopicRequestHeader(topic=name, read_queue_nums=1, write_queue_nums=1)
    r = h.request(1, RequestCode.UPDATE_AND_CREATE_TOPIC, to_ext(hdr))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL


@pytest.mark.parametrize("max_times", [0, 3, 16])
def test_an_orderly_dead_letter_send_lands_in_the_dlq_with_its_local_retry_count(max_times: int) -> None:
    """RocketMQ ConsumeMessageOrderlyService.sendMessageBack: a send to the retry topic whose
    reconsumeTimes exceeds maxReconsumeTimes is stored in the DLQ (handleRetryAndDLQ), with that
    count; a maxReconsumeTimes of 0 is a limit, not "use the default"."""
    from txmq.client._core import dead_letter_header

    h = BrokerHarness(topics={"t": 1})
    h.send(1, "t", b"x", keys="k")
    [msg] = h.pull("t")
    msg.reconsume_times = max_times  # the orderly consumer's local retries
    ext = dead_letter_header(msg, "g", max_times, h.now_ms)
    assert h.request(1, RequestCode.SEND_MESSAGE_V2, ext, msg.body).code == ResponseCode.SUCCESS
    [dead] = h.pull(dlq_topic("g"))
    assert (dead.body, dead.keys, dead.reconsume_times, dead.msg_id) == (b"x", "k", max_times + 1,
                                                                          msg.msg_id)
    assert dead.properties[PROPERTY_RETRY_TOPIC] == "t"
    assert h.pull(retry_topic("g")) == []
