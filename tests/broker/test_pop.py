"""Pop consumption in the sans-IO broker (RocketMQ 5 semantics), on MemoryStore and FileStore,
with a hand-driven clock: ack, redelivery through the retry topic, change of invisible time,
refused handles, the DLQ, FIFO groups, restarts, and pop and pull groups on one topic."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from txmq.broker import Popped, dlq_topic, load_config, retry_topic
from txmq.broker._pop_records import CK_TAG, PopCheckPoint
from txmq.errors import ConfigError, InvalidReceiptHandle, InvalidRequest, ResponseCode
from txmq.protocol import (
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    PullMessageRequestHeader,
    RequestCode,
    decode_message_exts,
    revive_topic,
    to_ext,
)
from txmq.store import FileStore, MemoryStore, Store
from txmq.testing import BrokerHarness

INV = 30_000
REVIVE = revive_topic("DefaultCluster")


class Env:
    """A broker harness that can restart on the same store (a FileStore is closed and reopened)."""

    def __init__(self, kind: str, tmp_path: Path, **config: object) -> None:
        self.kind, self.path, self.config = kind, tmp_path / "store", config
        self.h = BrokerHarness(store=self._store(None), **config)

    def _store(self, old: Store | None) -> Store:
        if self.kind == "memory":
            return old if old is not None else MemoryStore()
        return FileStore(self.path)

    def restart(self, *, persist: bool = True) -> None:
        h = self.h
        if persist:
            h.broker.persist_offsets()
        h.store.flush()
        if self.kind == "file":
            h.store.close()
        self.h = BrokerHarness(store=self._store(h.store), now_ms=h.now_ms, **self.config)

    def send(self, body: str, *, queue_id: int = 0, tags: str = "", topic: str = "t") -> None:
        props = {"TAGS": tags} if tags else None
        assert self.h.send(1, topic, body.encode(), queue_id=queue_id,
                           properties=props).code == ResponseCode.SUCCESS

    def pop(self, group: str = "cg", n: int = 32, inv: int = INV, *, topic: str = "t",
            queue_id: int | None = None, tags: set[str] | None = None) -> list[Popped]:
        out = self.h.broker.pop.pop(group, topic, queue_id, n, inv, tags, self.h.now_ms)
        self.h.store.flush()
        return out

    def ack(self, p: Popped, group: str = "cg", topic: str = "t") -> None:
        self.h.broker.pop.ack(group, topic, p.receipt_handle, self.h.now_ms)
        self.h.store.flush()

    def advance(self, ms: int) -> None:
        self.h.now_ms += ms
        self.h.broker.tick(self.h.now_ms)
        self.h.store.flush()
        assert "pop" not in self.h.broker.health.errors, self.h.broker.health.errors


@pytest.fixture(params=["memory", "file"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    return Env(request.param, tmp_path, topics={"t": 2})


def bodies(ps: list[Popped]) -> list[str]:
    return sorted(p.message.body.decode() for p in ps)


def test_pop_then_ack_never_again(env: Env) -> None:
    for i in range(3):
        env.send(f"m{i}", queue_id=i % 2)
    got = env.pop()
    assert bodies(got) == ["m0", "m1", "m2"]
    assert all(p.delivery_attempt == 1 and p.invisible_until_ms == env.h.now_ms + INV for p in got)
    assert env.pop() == []  # invisible, and the pop offset moved
    for p in got:
        env.ack(p)
    env.advance(2 * INV)
    assert env.pop() == []


def test_one_checkpoint_per_queue_run_in_the_revive_topic(env: Env) -> None:
    for i in range(4):
        env.send(f"m{i}", queue_id=i % 2)
    env.pop()
    cks = [msgspec.json.decode(m.body, type=PopCheckPoint) for m in env.h.all_messages(REVIVE)
           if m.tags == CK_TAG]
    assert sorted((ck.q, ck.n, ck.d) for ck in cks) == [(0, 2, [0, 1]), (1, 2, [0, 1])]
    assert {ck.c for ck in cks} == {"cg"} and {ck.bn for ck in cks} == {"broker-a"}
    raw = msgspec.json.decode(env.h.all_messages(REVIVE)[0].body)
    assert {"so", "pt", "it", "n", "q", "t", "c", "d", "bn"} <= set(raw)


def test_unacked_message_comes_again_through_the_retry_topic(env: Env) -> None:
    env.send("a")
    env.send("b")
    first = env.pop()
    env.ack(next(p for p in first if p.message.body == b"a"))
    env.advance(INV - 1)
    assert env.pop() == []
    env.advance(1)
    again = env.pop()
    assert bodies(again) == ["b"]
    p = again[0]
    assert p.delivery_attempt == 2 and p.message.topic == "t"
    assert p.message.properties[PROPERTY_RETRY_TOPIC] == "t"
    orig = next(q for q in first if q.message.body == b"b")
    assert p.message.properties[PROPERTY_UNIQ_KEY] == orig.message.properties[PROPERTY_UNIQ_KEY]
    assert env.h.all_messages(retry_topic("cg"))[0].reconsume_times == 1
    env.ack(p)  # a retry handle acks under the original topic
    env.advance(2 * INV)
    assert env.pop() == []


def test_change_invisible_gives_a_new_handle_and_refuses_the_old(env: Env) -> None:
    env.send("a")
    (p,) = env.pop()
    svc = env.h.broker.pop
    new, durable = svc.change_invisible("cg", "t", p.receipt_handle, 3 * INV, env.h.now_ms)
    assert new != p.receipt_handle and durable > 0
    with pytest.raises(InvalidReceiptHandle):
        svc.ack("cg", "t", p.receipt_handle, env.h.now_ms)
    env.advance(2 * INV)  # past the old invisible time: still invisible
    assert env.pop() == []
    svc.ack("cg", "t", new, env.h.now_ms)
    env.advance(2 * INV)
    assert env.pop() == []


def test_change_invisible_to_sooner_redelivers_sooner(env: Env) -> None:
    env.send("a")
    (p,) = env.pop()
    env.h.broker.pop.change_invisible("cg", "t", p.receipt_handle, 1_000, env.h.now_ms)
    env.h.store.flush()
    env.advance(1_000)
    (again,) = env.pop()
    assert again.delivery_attempt == 2


def test_refused_handles(env: Env) -> None:
    env.send("a")
    (p,) = env.pop()
    svc, now = env.h.broker.pop, env.h.now_ms
    for forged in ("", "garbage", "1 2 3", p.receipt_handle + " 1", "x" * 10_000,
                   p.receipt_handle.replace("broker-a", "broker-b"),
                   " ".join(["99", *p.receipt_handle.split(" ")[1:]]),
                   " ".join([*p.receipt_handle.split(" ")[:-1], "12345"])):
        with pytest.raises(InvalidReceiptHandle):
            svc.ack("cg", "t", forged, now)
    with pytest.raises(InvalidReceiptHandle, match="another consumer group"):
        svc.ack("other", "t", p.receipt_handle, now)
    with pytest.raises(InvalidReceiptHandle, match="another topic"):
        svc.ack("cg", "u", p.receipt_handle, now)
    with pytest.raises(InvalidReceiptHandle, match="expired"):
        svc.ack("cg", "t", p.receipt_handle, now + INV)
    with pytest.raises(InvalidRequest):
        svc.ack("bad group!", "t", p.receipt_handle, now)
    svc.ack("cg", "t", p.receipt_handle, now)
    with pytest.raises(InvalidReceiptHandle):
        svc.ack("cg", "t", p.receipt_handle, now)
    assert isinstance(InvalidReceiptHandle("x"), InvalidRequest)


def test_bad_pop_arguments(env: Env) -> None:
    svc, now = env.h.broker.pop, env.h.now_ms
    for args in (("cg", "t", None, 0, INV), ("cg", "t", None, 33, INV), ("cg", "t", None, 1, 0),
                 ("cg", "t", 2, 1, INV), ("cg", "t", None, 1, 13 * 3_600_000)):
        with pytest.raises(InvalidRequest):
            svc.pop(*args, None, now)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as exc:
        svc.pop("cg", "nope", None, 1, INV, None, now)
    assert exc.value.response_code == ResponseCode.TOPIC_NOT_EXIST


def test_max_attempts_then_dlq(tmp_path: Path) -> None:
    env = Env("memory", tmp_path, topics={"t": 1}, groups={"cg": {"retry_max_times": 2}})
    assert env.h.broker.pop.max_attempts("cg") == 3
    env.send("a")
    attempts = []
    for _ in range(3):
        (p,) = env.pop()
        attempts.append(p.delivery_attempt)
        env.advance(INV)
    assert attempts == [1, 2, 3]
    assert env.pop() == []
    (dead,) = env.h.all_messages(dlq_topic("cg"))
    assert dead.body == b"a" and dead.properties[PROPERTY_RETRY_TOPIC] == "t"


def test_default_max_attempts_is_17(env: Env) -> None:
    assert env.h.broker.pop.max_attempts("any") == 17
    assert not env.h.broker.pop.is_fifo("any")


def test_forward_to_dlq(env: Env) -> None:
    env.send("a")
    (p,) = env.pop()
    env.h.broker.pop.forward_to_dlq("cg", "t", p.receipt_handle, env.h.now_ms)
    env.h.store.flush()
    assert [m.body for m in env.h.all_messages(dlq_topic("cg"))] == [b"a"]
    env.advance(2 * INV)
    assert env.pop() == []


def test_tags_filter(env: Env) -> None:
    env.send("a", tags="A")
    env.send("b", tags="B")
    assert bodies(env.pop(tags={"B"})) == ["b"]
    assert env.pop() == []  # the filtered message is skipped for the group


def test_queue_round_robin_and_queue_id(env: Env) -> None:
    for i in range(4):
        env.send(f"m{i}", queue_id=i % 2)
    assert bodies(env.pop(queue_id=1)) == ["m1", "m3"]
    one = env.pop(n=1)
    assert bodies(one) == ["m0"]


def test_fifo_blocks_the_queue_and_redelivers_the_same_offsets(tmp_path: Path) -> None:
    env = Env("memory", tmp_path, topics={"t": 1},
              groups={"fg": {"consume_message_orderly": True, "retry_max_times": 1}})
    assert env.h.broker.pop.is_fifo("fg")
    for i in range(4):
        env.send(f"m{i}")
    first = env.pop("fg", n=2)
    assert [p.message.body for p in first] == [b"m0", b"m1"]
    assert env.pop("fg") == []  # blocked while m0, m1 are in flight
    env.ack(first[0], "fg")
    assert env.pop("fg") == []  # still blocked by m1
    env.advance(INV)
    again = env.pop("fg")
    assert [(p.message.body, p.delivery_attempt) for p in again] == [(b"m1", 2)]
    assert again[0].message.queue_offset == first[1].message.queue_offset
    assert env.h.all_messages(retry_topic("fg")) == []
    env.advance(INV)  # attempt 2 of max 2 expired: the DLQ, and the queue moves on
    assert [m.body for m in env.h.all_messages(dlq_topic("fg"))] == [b"m1"]
    rest = env.pop("fg")
    assert [(p.message.body, p.delivery_attempt) for p in rest] == [(b"m2", 1), (b"m3", 1)]


def test_restart_keeps_in_flight_checkpoints_and_acks(env: Env) -> None:
    for i in range(4):
        env.send(f"m{i}", queue_id=0)
    got = env.pop()
    env.ack(got[0])
    env.ack(got[2])
    env.restart()
    assert env.pop() == []  # still invisible after the restart
    env.ack(got[3])  # handles survive a restart
    env.advance(INV)
    assert bodies(env.pop()) == ["m1"]


def test_restart_without_saved_offsets_replays_the_checkpoints(env: Env) -> None:
    for i in range(3):
        env.send(f"m{i}", queue_id=0)
    got = env.pop()
    env.ack(got[0])
    env.restart(persist=False)  # a crash: consumer offsets and revive offset never saved
    assert env.pop() == []
    env.advance(INV)
    assert bodies(env.pop()) == ["m1", "m2"]


def test_expired_at_restart_revived_on_first_tick(env: Env) -> None:
    env.send("a")
    env.pop()
    env.h.now_ms += 2 * INV
    env.restart()
    env.advance(0)
    (p,) = env.pop()
    assert p.delivery_attempt == 2


def test_pop_and_pull_groups_share_a_topic(env: Env) -> None:
    env.send("a")
    env.send("b")
    got = env.pop()
    assert bodies(got) == ["a", "b"]
    h = PullMessageRequestHeader(consumer_group="pullg", topic="t", queue_id=0, queue_offset=0,
                                 max_msg_nums=32, sys_flag=0, commit_offset=0,
                                 suspend_timeout_millis=0, subscription="*", sub_version=0)
    r = env.h.request(1, RequestCode.PULL_MESSAGE, to_ext(h))
    assert [m.body for m in decode_message_exts(r.body)] == [b"a", b"b"]
    assert env.h.broker.offsets.get("pullg", "t", 0) is None  # pop did not touch the pull group
    assert bodies(env.pop("cg2")) == ["a", "b"]  # another pop group starts on its own


def test_broker_retry_and_dlq_topics_are_not_popped(env: Env) -> None:
    svc = env.h.broker.pop
    for topic in (REVIVE, retry_topic("cg"), dlq_topic("cg"), "RMQ_SYS_TRANS_HALF_TOPIC"):
        with pytest.raises(InvalidRequest) as exc:
            svc.pop("cg", topic, None, 1, INV, None, env.h.now_ms)
        assert exc.value.response_code == ResponseCode.NO_PERMISSION


def test_fifo_in_flight_run_survives_a_restart(tmp_path: Path) -> None:
    for kind in ("memory", "file"):
        env = Env(kind, tmp_path / kind, topics={"t": 1},
                  groups={"fg": {"consume_message_orderly": True}})
        env.send("m0")
        env.send("m1")
        first = env.pop("fg", n=1)
        env.restart()
        assert env.pop("fg") == []  # still blocked
        env.advance(INV)
        again = env.pop("fg")
        assert [(p.message.body, p.delivery_attempt) for p in again] == [(b"m0", 2)]
        env.ack(again[0], "fg")
        env.restart(persist=False)
        assert [p.message.body for p in env.pop("fg")] == [b"m1"]
        assert first


def test_groups_in_toml(tmp_path: Path) -> None:
    f = tmp_path / "broker.toml"
    f.write_text('[groups.fg]\nconsume_message_orderly = true\n[groups.cg]\nretry_max_times = 3\n')
    c = load_config(f)
    assert c.groups["fg"].consume_message_orderly and c.groups["fg"].retry_max_times == 16
    assert c.groups["cg"].retry_max_times == 3 and not c.groups["cg"].consume_message_orderly
    for bad in ('[groups."bad name"]\n', "[groups.g]\nretry_max_times = -1\n",
                "[groups.g]\nfifo = true\n"):
        f.write_text(bad)
        with pytest.raises(ConfigError):
            load_config(f)


def test_offsets_are_saved_only_once_their_records_are_durable(tmp_path: Path) -> None:
    env = Env("memory", tmp_path, topics={"t": 1})
    env.send("a")
    env.send("b")
    svc, now = env.h.broker.pop, env.h.now_ms
    (p,) = svc.pop("cg", "t", 0, 1, INV, None, now)  # the CK is not flushed yet
    assert env.h.broker.offsets.get("cg", "t", 0) is None
    (q,) = svc.pop("cg", "t", 0, 1, INV, None, now)  # the next pop still moves on
    assert (p.message.body, q.message.body) == (b"a", b"b")
    env.h.store.flush()
    env.advance(0)  # durable, then a tick: the offset reaches the table
    assert env.h.broker.offsets.get("cg", "t", 0) == 2
