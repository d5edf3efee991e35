"""Consumers against a real cluster: a name server and three broker processes (issue 23).

A push group consumes every message stored on every broker and rebalances when a member leaves,
when the broker drops a member, and when a broker is SIGKILLed and restarted; a pull consumer reads
every broker's queues and commits offsets to each broker. One cluster serves the module; each test
uses its own consumer group.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.client import (
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
)
from txmq.errors import ConfigError, TransportError
from txmq.protocol import RequestCode, to_ext
from txmq.testing import ClusterProcess, run_cluster, wait_until

pytestmark = pytest.mark.slow

BROKERS = ["broker-a", "broker-b", "broker-c"]
QUEUES = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    with run_cluster(brokers=3, data_dir=Path(tmp_path_factory.mktemp("cluster")),
                     topics={"t": QUEUES, "k": QUEUES, "u": QUEUES, "p": QUEUES}) as c:
        yield c


def all_queues(topic: str) -> set[MessageQueue]:
    return {MessageQueue(topic, q, b) for b in BROKERS for q in range(QUEUES)}


def send(cluster: ClusterProcess, topic: str, n: int, tag: str = "") -> dict[str, str]:
    """Send ``n`` messages over the name server; {msg id: broker name} of those acknowledged."""
    out: dict[str, str] = {}
    with Producer("p", namesrv_addr=cluster.namesrv_addr) as p:
        for i in range(n):
            try:
                r = p.send(Message(topic=topic, body=f"{tag}{i}".encode()))
            except TransportError:
                continue  # not acknowledged: a broker died under it
            out[r.msg_id] = r.broker_name
    return out


class Group:
    """Push consumers of one group; what each member received, by msg id."""

    def __init__(self, cluster: ClusterProcess, group: str, topic: str, members: int) -> None:
        self.cluster, self.group, self.topic = cluster, group, topic
        self.lock = threading.Lock()
        self.got: dict[str, Counter[str]] = {}
        self.members: list[PushConsumer] = []
        for _ in range(members):
            self.add()

    def add(self) -> PushConsumer:
        received: Counter[str] = Counter()

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            with self.lock:
                received.update(m.msg_id for m in msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        c = PushConsumer(self.group, "", listener, namesrv_addr=self.cluster.namesrv_addr,
                         consume_from_where="CONSUME_FROM_FIRST_OFFSET", suspend_ms=1_000)
        c.subscribe(self.topic)
        c.start()
        self.got[c.client_id] = received
        self.members.append(c)
        return c

    def ids(self, member: PushConsumer | None = None) -> set[str]:
        with self.lock:
            if member is not None:
                return set(self.got[member.client_id])
            return {i for r in self.got.values() for i in r}

    def owned(self, member: PushConsumer) -> set[MessageQueue]:
        return {mq for mq in member.assignment() if mq.topic == self.topic}

    def shares_cover_everything(self) -> bool:
        shares = [self.owned(m) for m in self.members]
        return set().union(*shares) == all_queues(self.topic) and sum(map(len, shares)) == len(
            all_queues(self.topic))

    def close(self) -> None:
        for m in self.members:
            m.shutdown()


def test_a_push_group_consumes_every_broker_and_takes_over_a_leaving_members_queues(
        cluster: ClusterProcess) -> None:
    sent = send(cluster, "t", 150)
    assert set(sent.values()) == set(BROKERS)  # the producer spread them over all three
    g = Group(cluster, "g-leave", "t", 3)
    try:
        wait_until(g.shares_cover_everything)
        assert all(len(g.owned(m)) == QUEUES for m in g.members)  # 12 queues / 3 members
        wait_until(lambda: g.ids() >= set(sent))
        leaving = g.members.pop()
        leaving.shutdown()  # commits its offsets, unlocks, unregisters: the others are notified
        wait_until(g.shares_cover_everything)
        more = send(cluster, "t", 150, "after-")
        wait_until(lambda: g.ids() >= set(sent) | set(more))
        assert g.ids() == set(sent) | set(more)  # nothing lost, nothing foreign
        assert set(more.values()) == set(BROKERS)
        for m in g.members:  # each consumed what was sent to the queues it owns now
            mine = {b for b in BROKERS if any(q.broker_name == b for q in g.owned(m))}
            assert {b for i, b in more.items() if i in g.ids(m)} == mine
    finally:
        g.close()


def test_a_member_the_broker_drops_owns_nothing_until_its_heartbeat_rejoins_it(
        cluster: ClusterProcess) -> None:
    """Defect 2 of issue 23: a member not listed kept consuming its queues."""
    g = Group(cluster, "g-dropped", "k", 2)
    a, b = g.members
    try:
        wait_until(g.shares_cover_everything)
        assert g.owned(a) and g.owned(b)

        async def unregister_everywhere() -> None:  # as a broker expiring a silent client does
            ext = to_ext(a._a._unregister_header())
            for conn in list(a._a._conns.values()):
                await conn.request(RequestCode.UNREGISTER_CLIENT, ext)
            assert a._a._rebalance_now is not None
            a._a._rebalance_now.set()  # its rebalance round (every 20 s) comes now

        a._run(unregister_everywhere())
        wait_until(lambda: not g.owned(a) and g.owned(b) == all_queues("k"), 30)
        sent = send(cluster, "k", 90)
        wait_until(lambda: g.ids(b) >= set(sent))
        assert not g.ids(a) & set(sent)  # it consumed none of them
        a._run(a._a._heartbeat_all())  # registered again: the brokers notify the group
        wait_until(lambda: bool(g.owned(a)) and g.shares_cover_everything(), 30)
        more = send(cluster, "k", 90, "again-")
        wait_until(lambda: g.ids() >= set(more))
        assert g.ids() == set(sent) | set(more)
    finally:
        g.close()


def test_consumption_goes_on_when_a_broker_dies_and_catches_up_after_its_restart(
        cluster: ClusterProcess) -> None:
    g = Group(cluster, "g-kill", "u", 2)
    try:
        wait_until(g.shares_cover_everything)
        before = send(cluster, "u", 90)
        wait_until(lambda: g.ids() >= set(before))
        stranded = send(cluster, "u", 90, "stranded-")  # some still unconsumed on broker-b
        cluster.kill("broker-b")
        during = send(cluster, "u", 90, "during-")
        assert during and "broker-b" not in set(during.values())
        wait_until(lambda: g.ids() >= set(during), 60)  # the other brokers go on
        cluster.restart("broker-b")
        after = send(cluster, "u", 90, "after-")
        acknowledged = set(before) | set(stranded) | set(during) | set(after)
        wait_until(lambda: g.ids() >= acknowledged, 90)
        assert "broker-b" in set(after.values())
        wait_until(g.shares_cover_everything, 60)
    finally:
        g.close()


def test_a_pull_consumer_reads_every_brokers_queues_and_commits_to_each_broker(
        cluster: ClusterProcess) -> None:
    sent = send(cluster, "p", 120)
    with PullConsumer(namesrv_addr=cluster.namesrv_addr, consumer_group="pc") as pc:
        mqs = pc.queues("p")
        assert mqs == sorted(all_queues("p"), key=lambda q: (q.topic, q.broker_name, q.queue_id))
        with pytest.raises(ConfigError, match="broker-a"):
            pc.min_offset("p", 0)  # "" names no group of a topic on three
        got: set[str] = set()
        ends: dict[MessageQueue, int] = {}
        for mq in mqs:
            b = mq.broker_name
            off = pc.min_offset("p", mq.queue_id, broker_name=b)
            end = pc.max_offset("p", mq.queue_id, broker_name=b)
            while off < end:
                r = pc.pull("p", mq.queue_id, off, 32, broker_name=b)
                got |= {m.msg_id for m in r.messages}
                off = r.next_begin_offset
            ends[mq] = end
            pc.commit_offset("p", mq.queue_id, end, broker_name=b)
        assert got == set(sent)
        for mq, end in ends.items():
            assert pc.committed("p", mq.queue_id, broker_name=mq.broker_name) == end
    for name, bp in cluster.brokers.items():  # each broker holds its own queues' offsets
        with PullConsumer(bp.endpoints, "pc") as direct:
            for q in range(QUEUES):
                assert direct.fetch_consumer_offset("p", q) == ends[MessageQueue("p", q, name)]
    with PullConsumer(namesrv_addr=cluster.namesrv_addr, consumer_group="pc2",
                      consume_from_where="CONSUME_FROM_FIRST_OFFSET") as pc:
        pc.assign(list(all_queues("p")))
        polled: set[str] = set()
        deadline = time.monotonic() + 30
        while polled < set(sent) and time.monotonic() < deadline:
            polled |= {m.msg_id for m in pc.poll(1000)}
        assert polled == set(sent)
        pc.commit()
        assert pc.committed("p", 0, broker_name="broker-c") == ends[MessageQueue("p", 0, "broker-c")]

