"""The consumer's sans-IO core: allocation, process queues, retry bookkeeping, local offsets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.client._core import (
    ConsumeOrderlyStatus,
    ConsumeStatus,
    ProcessQueue,
    allocate,
    allocate_averagely,
    batches,
    decode_local_offsets,
    encode_local_offsets,
    is_consumed,
    local_offset,
    mq_sort_key,
    orderly_failure,
    rebalance_plan,
    restore_retry_topic,
    start_offset_source,
)
from txmq.errors import ConfigError
from txmq.protocol import MessageExt, MessageQueue


def msg(offset: int, body: bytes = b"x", times: int = 0) -> MessageExt:
    return MessageExt(topic="t", body=body, queue_offset=offset, reconsume_times=times)


@given(queues=st.integers(0, 40), members=st.integers(1, 12))
def test_average_allocation_gives_every_queue_to_exactly_one_member(queues: int, members: int) -> None:
    cids = [f"c{i}" for i in range(members)]
    shares = [allocate_averagely(list(range(queues)), cids, c) for c in reversed(cids)]
    flat = sorted(q for s in shares for q in s)
    assert flat == list(range(queues))
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


def _queues(topic: str, brokers: dict[str, int]) -> list[MessageQueue]:
    return [MessageQueue(topic, i, b) for b, n in brokers.items() for i in range(n)]


def test_allocate_covers_retry_topic_and_broadcasting_takes_everything() -> None:
    nums = {"t": _queues("t", {"broker-a": 2, "broker-b": 2}),
            "%RETRY%g": _queues("%RETRY%g", {"broker-a": 1})}
    a = allocate(nums, ["a", "b"], "a", "CLUSTERING")
    b = allocate(nums, ["a", "b"], "b", "CLUSTERING")
    assert a.isdisjoint(b) and len(a | b) == 5
    assert len(allocate(nums, ["a", "b"], "b", "BROADCASTING")) == 5
    drop, add = rebalance_plan({MessageQueue("t", 0), MessageQueue("t", 1)},
                               {MessageQueue("t", 1), MessageQueue("t", 2)})
    assert (drop, add) == ([MessageQueue("t", 0)], [MessageQueue("t", 2)])


def test_a_member_not_listed_owns_nothing() -> None:
    """Defect 2 of issue 23: a member the broker's list lacks (dropped after its heartbeat died)
    must not keep its queues."""
    nums = {"t": _queues("t", {"broker-a": 4})}
    assert allocate(nums, ["b", "c"], "a", "CLUSTERING") == set()
    assert allocate(nums, [], "a", "CLUSTERING") == set()
    assert len(allocate(nums, [], "a", "BROADCASTING")) == 4


def test_allocation_sorts_queues_as_rocketmq_topic_broker_then_queue_id() -> None:
    """RocketMQ ``MessageQueue.compareTo`` sorts by topic, broker name, queue id; the struct's own
    order (topic, queue id, broker) would interleave brokers: a-0, b-0, a-1, b-1, ..."""
    mqs = _queues("t", {"broker-b": 3, "broker-a": 3})
    first = allocate({"t": mqs}, ["c1", "c2"], "c1", "CLUSTERING")
    assert first == {MessageQueue("t", i, "broker-a") for i in range(3)}
    assert sorted(mqs, key=mq_sort_key)[:3] == [MessageQueue("t", i, "broker-a") for i in range(3)]


def test_rocketmq_average_allocation_blocks() -> None:
    """AllocateMessageQueueAveragely with 3 brokers x 4 queues over 5 members: 3,3,2,2,2."""
    mqs = _queues("t", {"broker-a": 4, "broker-b": 4, "broker-c": 4})
    cids = [f"c{i}" for i in range(5)]
    shares = [sorted(allocate({"t": mqs}, cids, c, "CLUSTERING"), key=mq_sort_key) for c in cids]
    assert [len(s) for s in shares] == [3, 3, 2, 2, 2]
    assert shares[1] == [MessageQueue("t", 3, "broker-a"), MessageQueue("t", 0, "broker-b"),
                         MessageQueue("t", 1, "broker-b")]


def test_process_queue_never_commits_past_an_unconsumed_message() -> None:
    pq = ProcessQueue()
    assert pq.commit_offset() == -1
    pq.next_offset = 10
    msgs = [msg(o, b"ab") for o in range(10, 15)]
    assert pq.put(msgs, 15) == msgs
    assert pq.put(msgs[:2], 15) == []  # already cached
    assert (pq.cached_count, pq.cached_bytes, pq.span) == (5, 10, 4)
    pq.remove([msgs[1], msgs[3]])
    assert pq.commit_offset() == 10  # 10 is still in flight
    pq.remove([msgs[0]])
    assert pq.commit_offset() == 12
    assert [m.queue_offset for m in pq.head(2)] == [12, 14]
    pq.remove([msgs[2], msgs[4]])
    assert pq.commit_offset() == 15 and pq.cached_bytes == 0


def test_flow_control_by_count_bytes_and_span() -> None:
    pq = ProcessQueue(0)
    pq.put([msg(0, b"x" * 60), msg(1, b"x" * 60)], 2)
    assert pq.is_full(2, 10_000)
    assert not pq.is_full(3, 10_000)
    assert pq.is_full(3, 120)
    pq.put([msg(500)], 501)
    assert pq.is_full(10, 10_000, span_max=500)
    assert not pq.is_full(10, 10_000, span_max=0)


def test_lock_validity_needs_the_same_connection_and_a_recent_renewal() -> None:
    pq = ProcessQueue(0)
    conn, other = object(), object()
    assert not pq.lock_valid(0, conn)
    pq.on_locked(1_000, conn)
    assert pq.lock_valid(31_000, conn, 30_000)
    assert not pq.lock_valid(31_001, conn, 30_000)
    assert not pq.lock_valid(2_000, other)


def test_orderly_failure_retries_locally_until_max_then_dead_letters() -> None:
    a, b = msg(0, times=15), msg(1, times=16)
    assert orderly_failure([a, b], 16) == [b]
    assert (a.reconsume_times, b.reconsume_times) == (16, 16)
    assert orderly_failure([a], 16) == [a]


def test_statuses_offsets_and_batches() -> None:
    assert is_consumed(ConsumeStatus.CONSUME_SUCCESS) and is_consumed(ConsumeOrderlyStatus.SUCCESS)
    for bad in (ConsumeStatus.RECONSUME_LATER, ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
                None, "CONSUME_SUCCESS"):
        assert not is_consumed(bad)
    assert start_offset_source(7, "t", "CONSUME_FROM_FIRST_OFFSET") == 7
    assert start_offset_source(None, "t", "CONSUME_FROM_FIRST_OFFSET") == "min"
    assert start_offset_source(None, "t", "CONSUME_FROM_LAST_OFFSET") == "max"
    assert start_offset_source(None, "t", "CONSUME_FROM_TIMESTAMP") == "timestamp"
    assert start_offset_source(None, "%RETRY%g", "CONSUME_FROM_LAST_OFFSET") == "min"
    assert [len(b) for b in batches([msg(i) for i in range(7)], 3)] == [3, 3, 1]
    m = MessageExt(topic="%RETRY%g", body=b"", properties={"RETRY_TOPIC": "orders"})
    assert restore_retry_topic(m).topic == "orders"


def test_local_offsets_round_trip_and_garbage_is_an_error() -> None:
    offsets = {MessageQueue("t", 0): 5, MessageQueue("%RETRY%g", 3): 9}
    assert decode_local_offsets(encode_local_offsets(offsets)) == offsets
    with pytest.raises(ConfigError):
        decode_local_offsets(b"{not json")


def test_local_offsets_keyed_by_broker_and_old_files_still_read() -> None:
    offsets = {MessageQueue("t", 0, "broker-a"): 5, MessageQueue("t", 0, "broker-b"): 7,
               MessageQueue("%RETRY%g", 0, "broker-a"): 1}
    data = encode_local_offsets(offsets)
    assert b'"t@broker-a@0":5' in data and b'"t@broker-b@0":7' in data
    assert decode_local_offsets(data) == offsets
    old = decode_local_offsets(b'{"offsetTable":{"t@0":11,"%RETRY%g@0":2}}')
    assert old == {MessageQueue("t", 0): 11, MessageQueue("%RETRY%g", 0): 2}
    # an old file's entry serves the topic's only broker group, never one of several
    assert local_offset(old, MessageQueue("t", 0, "broker-a"), sole_broker=True) == 11
    assert local_offset(old, MessageQueue("t", 0, "broker-a"), sole_broker=False) is None
    assert local_offset(offsets, MessageQueue("t", 0, "broker-b"), sole_broker=False) == 7
