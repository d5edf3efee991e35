"""Push and pull consumers against a real broker process: tags, retries into the DLQ and resend,
consume timeout, batches, flow control, broadcasting with local offsets, ConsumeFromWhere, orderly
local retries, offset reset, pull consumer assign/subscribe/seek/commit, delay messages."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from txmq.client import (
    Admin,
    AsyncPushConsumer,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
)
from txmq.testing import BrokerProcess, run_broker, wait_until

LEVELS = [20 * k for k in range(1, 19)]  # level k waits 20·k ms
LEVEL_SPEC = " ".join(f"{ms}ms" for ms in LEVELS)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"t": 4, "one": 1},
                    message_delay_level=LEVEL_SPEC) as b:
        yield b




def send(endpoints: str, n: int, topic: str = "t", **kw: object) -> list[str]:
    with Producer("p", endpoints) as p:
        return [p.send(Message(topic=topic, body=f"{i}".encode(), keys=f"k{i}", **kw)).msg_id  # type: ignore[arg-type]
                for i in range(n)]


def consumer(endpoints: str, group: str, listener: Callable[[list[MessageExt]], object],
             topic: str = "t", expression: str = "*", **kw: object) -> PushConsumer:
    kw.setdefault("consume_from_where", "CONSUME_FROM_FIRST_OFFSET")
    c = PushConsumer(group, endpoints, listener, suspend_ms=1_000, **kw)
    c.subscribe(topic, expression)
    c.start()
    return c


def test_tag_expression_filters_what_the_listener_sees(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        for i in range(30):
            p.send(Message(topic="t", body=str(i).encode(), tags="ABC"[i % 3]))
    got: list[tuple[str, int]] = []
    c = consumer(broker.endpoints, "tags", lambda ms: (
        got.extend((m.tags, int(m.body)) for m in ms), ConsumeStatus.CONSUME_SUCCESS)[1],
        expression="A || C")
    try:
        wait_until(lambda: len(got) >= 20)
        with Admin(broker.endpoints) as adm:  # filtered-out messages still count as consumed
            wait_until(lambda: sum(s.lag for s in adm.consume_stats("tags", "t")) == 0)
    finally:
        c.shutdown()
    assert sorted(got, key=lambda x: x[1]) == [("ABC"[i % 3], i) for i in range(30) if i % 3 != 1]


def test_seventeen_failures_follow_the_levels_into_the_dlq_and_resend_works(
        broker: BrokerProcess) -> None:
    [sent_id] = send(broker.endpoints, 1, topic="one")
    calls: list[tuple[float, int, str, str]] = []
    succeed = threading.Event()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        m = msgs[0]
        calls.append((time.monotonic(), m.reconsume_times, m.topic, m.keys))
        return ConsumeStatus.CONSUME_SUCCESS if succeed.is_set() else ConsumeStatus.RECONSUME_LATER

    c = consumer(broker.endpoints, "dlqg", listener, topic="one")
    try:
        wait_until(lambda: len(calls) >= 17)
        with Admin(broker.endpoints) as adm:
            wait_until(lambda: len(adm.dlq_messages("dlqg")) == 1)
            [dead] = adm.dlq_messages("dlqg")
            assert (dead.msg_id, dead.keys, dead.reconsume_times) == (sent_id, "k0", 17)
            assert dead.properties["RETRY_TOPIC"] == "one"
            assert len(calls) == 17  # nothing more after the DLQ
            succeed.set()
            results = adm.resend_dlq("dlqg", [sent_id, "no-such-id"])
            assert [(r.msg_id, r.status) for r in results] == [(sent_id, "OK"), ("no-such-id", "NOT_FOUND")]
            wait_until(lambda: len(calls) == 18)
    finally:
        c.shutdown()
    assert [t for _, t, _, _ in calls] == [*range(17), 0]
    assert {(topic, keys) for _, _, topic, keys in calls} == {("one", "k0")}
    for i in range(16):  # retry i+1 waits at least level 3+i (the broker never delivers early)
        assert calls[i + 1][0] - calls[i][0] >= LEVELS[3 + i - 1] / 1000 - 0.005


def test_a_listener_call_past_the_consume_timeout_counts_as_reconsume_later(
        broker: BrokerProcess) -> None:
    send(broker.endpoints, 1, topic="one")
    release = threading.Event()
    seen: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.append(msgs[0].reconsume_times)
        if len(seen) == 1:
            release.wait(30)  # hangs past the consume timeout
        return ConsumeStatus.CONSUME_SUCCESS

    c = consumer(broker.endpoints, "slow", listener, topic="one", consume_timeout_ms=200,
                 consume_threads=2)
    try:
        wait_until(lambda: len(seen) >= 2)
        release.set()
    finally:
        c.shutdown()
    assert seen[:2] == [0, 1]


def test_batches_and_flow_control_bound_what_is_cached(broker: BrokerProcess) -> None:
    send(broker.endpoints, 400, topic="one")
    sizes: list[int] = []
    cached: list[tuple[int, int]] = []
    holder: list[PushConsumer] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        sizes.append(len(msgs))
        if holder:
            for w in list(holder[0]._a._workers.values()):
                cached.append((w.pq.cached_count, w.pq.cached_bytes))
        time.sleep(0.002)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer("batches", broker.endpoints, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     consume_message_batch_max_size=8, pull_batch_size=16, pull_threshold_for_queue=40,
                     pull_threshold_size_for_queue=1 << 20, consume_threads=2)
    holder.append(c)
    c.subscribe("one")
    c.start()
    try:
        wait_until(lambda: sum(sizes) >= 400)
    finally:
        c.shutdown()
    assert max(sizes) == 8 and min(sizes) >= 1
    assert max(n for n, _ in cached) < 40 + 16  # never pulls while at the threshold


def test_broadcasting_delivers_everything_to_every_member_and_keeps_offsets_locally(
        broker: BrokerProcess, tmp_path: Path) -> None:
    send(broker.endpoints, 20)
    got: dict[str, list[int]] = {"a": [], "b": []}

    def member(name: str) -> PushConsumer:
        return consumer(broker.endpoints, "bc", lambda ms: (
            got[name].extend(int(m.body) for m in ms), ConsumeStatus.CONSUME_SUCCESS)[1],
            message_model="BROADCASTING", offset_store_dir=tmp_path / "offsets", instance_name=name)

    a, b = member("a"), member("b")
    try:
        wait_until(lambda: len(got["a"]) >= 20 and len(got["b"]) >= 20)
    finally:
        a.shutdown()
        b.shutdown()
    assert sorted(got["a"]) == sorted(got["b"]) == list(range(20))
    files = sorted((tmp_path / "offsets").rglob("offsets.json"))
    assert len(files) == 2 and b"offsetTable" in files[0].read_bytes()
    send(broker.endpoints, 5)
    got["a"].clear()
    a = member("a")  # restarts from its local offsets: only the new messages
    try:
        wait_until(lambda: len(got["a"]) >= 5)
        time.sleep(0.3)
    finally:
        a.shutdown()
    assert sorted(got["a"]) == list(range(5))


def test_consume_from_timestamp_starts_a_new_group_at_that_time(broker: BrokerProcess) -> None:
    send(broker.endpoints, 8, topic="one")
    time.sleep(0.05)
    later = send(broker.endpoints, 5, topic="one")
    with PullConsumer(broker.endpoints) as pc:
        msgs = pc.pull("one", 0, 0, 100).messages
        ts = min(m.store_timestamp_ms for m in msgs if m.msg_id in later)
        assert pc.search_offset("one", 0, ts) == 8
    got: list[str] = []
    c = consumer(broker.endpoints, "fromts", lambda ms: (
        got.extend(m.msg_id for m in ms), ConsumeStatus.CONSUME_SUCCESS)[1], topic="one",
        consume_from_where="CONSUME_FROM_TIMESTAMP", consume_timestamp_ms=ts)
    try:
        wait_until(lambda: len(got) >= 5)
        time.sleep(0.2)
    finally:
        c.shutdown()
    assert got == later


def test_orderly_retries_locally_then_dead_letters_and_keeps_the_order(broker: BrokerProcess) -> None:
    send(broker.endpoints, 6, topic="one")
    seen: list[tuple[int, int]] = []

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        m = msgs[0]
        seen.append((int(m.body), m.reconsume_times))
        if int(m.body) == 2:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = consumer(broker.endpoints, "ordg", listener, topic="one", orderly=True, max_reconsume_times=3,
                 suspend_current_queue_time_ms=20)
    try:
        wait_until(lambda: [b for b, _ in seen][-1:] == [5])
        with Admin(broker.endpoints) as adm:
            [dead] = adm.dlq_messages("ordg")
            [stats] = [s for s in adm.consume_stats("ordg", "one")]
            assert stats.locked_by == c.client_id
    finally:
        c.shutdown()
    assert seen == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (2, 3), (3, 0), (4, 0), (5, 0)]
    assert (int(dead.body), dead.reconsume_times, dead.properties["RETRY_TOPIC"]) == (2, 4, "one")


def test_reset_offset_makes_a_running_member_replay(broker: BrokerProcess) -> None:
    send(broker.endpoints, 10, topic="one")
    got: list[int] = []
    c = consumer(broker.endpoints, "replay", lambda ms: (
        got.extend(int(m.body) for m in ms), ConsumeStatus.CONSUME_SUCCESS)[1], topic="one")
    try:
        wait_until(lambda: len(got) >= 10)
        with Admin(broker.endpoints) as adm:
            wait_until(lambda: adm.consume_stats("replay", "one")[0].consumer_offset == 10)
            [e] = adm.reset_offset("replay", "one", offset=4)
            assert (e.old_offset, e.new_offset) == (10, 4)
            wait_until(lambda: len(got) >= 16)
            wait_until(lambda: adm.consume_stats("replay", "one")[0].consumer_offset == 10)
            groups = {g.group: g for g in adm.groups()}
            assert groups["replay"].client_ids == [c.client_id]
    finally:
        c.shutdown()
    assert got[10:] == list(range(4, 10))


def test_pull_consumer_assign_poll_seek_commit_and_subscribe(broker: BrokerProcess) -> None:
    send(broker.endpoints, 12, topic="one")
    with PullConsumer(broker.endpoints, "puller", consume_from_where="CONSUME_FROM_FIRST_OFFSET") as pc:
        pc.assign([("one", 0)])
        first = pc.poll(1000)
        assert [int(m.body) for m in first] == list(range(12))
        assert pc.poll(0) == []
        pc.commit()
        assert pc.committed("one", 0) == 12
        pc.seek("one", 0, 10)
        assert [int(m.body) for m in pc.poll(1000)] == [10, 11]
        pc.seek_to_begin("one", 0)
        assert pc.position("one", 0) == 0
        t0 = time.monotonic()
        threading.Timer(0.3, lambda: send(broker.endpoints, 1, topic="one")).start()
        pc.seek_to_end("one", 0)
        assert [m.body for m in pc.poll(10_000)] == [b"0"]  # woken by the new message
        assert time.monotonic() - t0 < 9
    a = PullConsumer(broker.endpoints, "sub")
    b = PullConsumer(broker.endpoints, "sub")
    for pc in (a, b):
        pc.subscribe("t")
        pc.start()
    try:
        wait_until(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        name = a.queues("t")[0].broker_name  # queues carry their broker group (issue 23)
        assert name
        assert set(a.assignment()) | set(b.assignment()) == {MessageQueue("t", q, name)
                                                              for q in range(4)}
    finally:
        a.shutdown()
        b.shutdown()


def test_delay_messages_due_after_a_broker_crash_are_delivered(tmp_path: Path) -> None:
    bp = BrokerProcess(tmp_path / "b", {"topics": {"one": 1}, "message_delay_level": "100ms 1s"})
    bp.start()
    try:
        t0 = time.time()
        ids = send(bp.endpoints, 5, topic="one", properties={"DELAY": "2"})
        with Producer("p", bp.endpoints) as p:
            ids.append(p.send(Message(topic="one", body=b"x"), delay_level=2).msg_id)
        bp.kill()
        bp.start()
        got: list[tuple[str, float]] = []
        c = consumer(bp.endpoints, "delayed", lambda ms: (
            got.extend((m.msg_id, time.time()) for m in ms), ConsumeStatus.CONSUME_SUCCESS)[1],
            topic="one")
        try:
            wait_until(lambda: len({i for i, _ in got}) >= 6)
        finally:
            c.shutdown()
    finally:
        bp.stop()
    assert {i for i, _ in got} == set(ids)
    assert min(t for _, t in got) >= t0 + 1.0 - 0.05


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_push_consumer_rides_through_a_broker_crash(tmp_path: Path, orderly: bool) -> None:
    bp = BrokerProcess(tmp_path / "b", {"topics": {"t": 4}})
    bp.start()
    got: set[int] = set()
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> object:
        with lock:
            got.update(int(m.body) for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeStatus.CONSUME_SUCCESS

    try:
        c = consumer(bp.endpoints, "survivor", listener, orderly=orderly)
        try:
            with Producer("p", bp.endpoints) as p:
                for i in range(20):
                    p.send(Message(topic="t", body=str(i).encode()))
            wait_until(lambda: len(got) >= 20)
            bp.kill()
            bp.start()  # same port, same data
            with Producer("p", bp.endpoints) as p:
                for i in range(20, 40):
                    p.send(Message(topic="t", body=str(i).encode()))
            wait_until(lambda: len(got) >= 40)
            assert sorted((q.topic, q.queue_id) for q in c.assignment()) == [
                ("%RETRY%survivor", 0)] + [("t", q) for q in range(4)]
        finally:
            c.shutdown()
    finally:
        bp.stop()
    assert got == set(range(40))


def test_async_push_consumer_with_a_coroutine_listener(broker: BrokerProcess) -> None:
    send(broker.endpoints, 10, topic="one")
    seen: list[tuple[int, int]] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        await asyncio.sleep(0)
        m = msgs[0]
        seen.append((int(m.body), m.reconsume_times))
        if int(m.body) == 3 and m.reconsume_times == 0:
            raise RuntimeError("flaky")  # counts as RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    async def main() -> None:
        c = AsyncPushConsumer("async-g", broker.endpoints, listener, suspend_ms=500,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe("one")
        await c.start()
        try:
            while (3, 1) not in seen or len(seen) < 11:
                await asyncio.sleep(0.02)
        finally:
            await c.shutdown()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert sorted(seen) == sorted([(i, 0) for i in range(10)] + [(3, 1)])


def test_operator_cli_lists_groups_lag_and_exports_the_dlq(broker: BrokerProcess, tmp_path: Path) -> None:
    from txmq.cli import app  # every command registered

    send(broker.endpoints, 1, topic="one")
    c = consumer(broker.endpoints, "cli", lambda ms: ConsumeStatus.RECONSUME_LATER, topic="one",
                 max_reconsume_times=0)
    with Admin(broker.endpoints) as adm:
        wait_until(lambda: len(adm.dlq_messages("cli")) == 1)
    c.shutdown()
    run = CliRunner().invoke
    e = ["--endpoints", broker.endpoints]
    r = run(app, ["group", "list", *e, "--json"])
    assert r.exit_code == 0 and '"cli"' in r.output
    r = run(app, ["group", "lag", "cli", *e, "--json"])
    assert r.exit_code == 0 and '"lag"' in r.output
    r = run(app, ["dlq", "export", "cli", *e, "--format", "csv", "--output", str(tmp_path / "d.csv")])
    assert r.exit_code == 0
    lines = (tmp_path / "d.csv").read_text().splitlines()
    assert lines[0].startswith("msg_id,") and len(lines) == 2 and ",one," in lines[1]
    r = run(app, ["dlq", "export", "cli", *e])
    [row] = json.loads(r.output)
    assert (row["original_topic"], row["keys"], row["reconsume_times"], row["body"]) == ("one", "k0", 1, "0")
    r = run(app, ["dlq", "list", "cli", *e])
    assert r.exit_code == 0 and "%DLQ%cli" in r.output and "one" in r.output
    r = run(app, ["dlq", "show", "cli", row["msg_id"], *e, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)[0]["msg_id"] == row["msg_id"]
    r = run(app, ["dlq", "resend", "cli", *e, "--msg-id", "nope"])
    assert r.exit_code == 1 and "NOT_FOUND" in r.output
    r = run(app, ["group", "reset-offset", "cli", *e, "--topic", "one", "--to-timestamp", "0"])
    assert r.exit_code == 0, r.output
