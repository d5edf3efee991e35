"""Consumption through the gRPC door of a real broker: receive (long polling), ack, invisible
time, DLQ, assignments, and the proxy's codes for bad handles and requests."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import FAST_TX, Client, free_port
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.client import Message, Producer, PullConsumer
from txmq.errors import RemoteError
from txmq.testing import BrokerProcess, run_broker

GROUPS = {"g-fifo": {"consume_message_orderly": True}, "g-once": {"retry_max_times": 1}}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"t": 2}, grpc_port=free_port(), groups=GROUPS,
                    **FAST_TX) as b:
        yield b


def receive(client: Client, group: str = "g", topic: str = "t", *, batch: int = 32,
            invisible_s: float | None = 10, wait_s: float = 1.5, tag: str = "*", qid: int = -1,
            ftype: int = pd.TAG) -> list[ps.ReceiveMessageResponse]:
    req = ps.ReceiveMessageRequest(
        group=pd.Resource(name=group), batch_size=batch,
        message_queue=pd.MessageQueue(topic=pd.Resource(name=topic), id=qid),
        filter_expression=pd.FilterExpression(type=ftype, expression=tag))  # type: ignore[arg-type]
    if invisible_s is not None:
        req.invisible_duration.FromMilliseconds(int(invisible_s * 1000))
    req.long_polling_timeout.FromSeconds(20)
    return list(client.stub.ReceiveMessage(req, metadata=client.md, timeout=wait_s))


def messages(frames: list[ps.ReceiveMessageResponse]) -> list[pd.Message]:
    return [f.message for f in frames if f.WhichOneof("content") == "message"]


def ack(client: Client, m: pd.Message, group: str = "g", handle: str | None = None) -> Any:
    return client.call("AckMessage", ps.AckMessageRequest(
        group=pd.Resource(name=group), topic=m.topic, entries=[ps.AckMessageEntry(
            message_id=m.system_properties.message_id,
            receipt_handle=m.system_properties.receipt_handle if handle is None else handle)]))


def change(client: Client, m: pd.Message, ms: int, group: str = "g") -> Any:
    req = ps.ChangeInvisibleDurationRequest(
        group=pd.Resource(name=group), topic=m.topic,
        receipt_handle=m.system_properties.receipt_handle,
        message_id=m.system_properties.message_id)
    req.invisible_duration.FromMilliseconds(ms)
    return client.call("ChangeInvisibleDuration", req)


def test_receive_and_ack(client: Client) -> None:
    for i in range(3):
        assert client.send("t", f"m{i}".encode(), tag="A").status.code == pd.OK
    frames = receive(client)
    kinds = [f.WhichOneof("content") for f in frames]
    assert kinds == ["status", "message", "message", "message", "delivery_timestamp"]
    assert frames[0].status.code == pd.OK
    got = messages(frames)
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
    for m in got:
        sp = m.system_properties
        assert m.topic.name == "t" and sp.tag == "A" and sp.receipt_handle
        assert sp.delivery_attempt == 1 and sp.body_encoding == pd.IDENTITY
        assert sp.body_digest.type == pd.MD5
        assert sp.body_digest.checksum == hashlib.md5(m.body).hexdigest().upper()
        assert sp.message_type == pd.NORMAL and sp.HasField("born_timestamp")
        assert ack(client, m).status.code == pd.OK
    frames = receive(client)
    assert frames[0].status.code == pd.MESSAGE_NOT_FOUND
    assert [f.WhichOneof("content") for f in frames] == ["status", "delivery_timestamp"]


def test_acked_twice_and_forged_and_foreign_handles(client: Client) -> None:
    client.send("t", b"x")
    [m] = messages(receive(client))
    assert ack(client, m, group="other").status.code == pd.INVALID_RECEIPT_HANDLE
    assert ack(client, m, handle="forged").status.code == pd.INVALID_RECEIPT_HANDLE
    assert ack(client, m).status.code == pd.OK
    assert ack(client, m).status.code == pd.INVALID_RECEIPT_HANDLE


def test_long_polling_wakes_on_a_remoting_send(client: Client, broker: BrokerProcess) -> None:
    out: list[list[ps.ReceiveMessageResponse]] = []
    t = threading.Thread(target=lambda: out.append(receive(client, wait_s=15)))
    t0 = time.monotonic()
    t.start()
    time.sleep(0.5)
    with Producer("p", broker.endpoints) as p:
        p.send(Message(topic="t", body=b"woken", tags="T", keys="k1 k2",
                       properties={"color": "red"}))
    t.join(20)
    assert time.monotonic() - t0 < 5
    [m] = messages(out[0])
    assert m.body == b"woken" and m.system_properties.tag == "T"
    assert list(m.system_properties.keys) == ["k1", "k2"] and dict(m.user_properties) == {"color": "red"}


def test_change_invisible_duration_redelivers(client: Client) -> None:
    client.send("t", b"again")
    [m] = messages(receive(client))
    r = change(client, m, 500)
    assert r.status.code == pd.OK and r.receipt_handle
    assert r.receipt_handle != m.system_properties.receipt_handle
    assert ack(client, m).status.code == pd.INVALID_RECEIPT_HANDLE  # the old handle is gone
    deadline = time.monotonic() + 15
    while not (again := messages(receive(client))) and time.monotonic() < deadline:
        pass
    [m2] = again
    assert m2.body == b"again" and m2.system_properties.delivery_attempt == 2
    assert ack(client, m2).status.code == pd.OK


def test_expired_handle(client: Client) -> None:
    client.send("t", b"expire")
    [m] = messages(receive(client))
    r = change(client, m, 300)
    time.sleep(0.6)
    stale = ack(client, m, handle=r.receipt_handle)
    assert stale.status.code == pd.INVALID_RECEIPT_HANDLE


def test_forward_to_dead_letter_queue(client: Client, broker: BrokerProcess) -> None:
    client.send("t", b"poison")
    [m] = messages(receive(client))
    r = client.call("ForwardMessageToDeadLetterQueue", ps.ForwardMessageToDeadLetterQueueRequest(
        group=pd.Resource(name="g"), topic=m.topic,
        receipt_handle=m.system_properties.receipt_handle,
        message_id=m.system_properties.message_id, delivery_attempt=1, max_delivery_attempts=1))
    assert r.status.code == pd.OK
    with PullConsumer(broker.endpoints, "g-dlq") as c:
        dlq = c.pull("%DLQ%g", 0, 0, 32).messages
    assert [d.body for d in dlq] == [b"poison"]
    assert ack(client, m).status.code == pd.INVALID_RECEIPT_HANDLE


def test_max_attempts_then_dlq(client: Client, broker: BrokerProcess) -> None:
    client.send("t", b"twice")
    [m] = messages(receive(client, group="g-once"))
    assert change(client, m, 0, group="g-once").status.code == pd.OK
    deadline = time.monotonic() + 15
    while not (again := messages(receive(client, group="g-once"))) and time.monotonic() < deadline:
        pass
    [m2] = again
    assert m2.system_properties.delivery_attempt == 2
    assert change(client, m2, 0, group="g-once").status.code == pd.OK

    def in_dlq() -> list[bytes]:
        with PullConsumer(broker.endpoints, "g-dlq") as c:
            try:
                return [d.body for d in c.pull("%DLQ%g-once", 0, 0, 32).messages]
            except RemoteError:  # no DLQ topic yet
                return []
    deadline = time.monotonic() + 15
    while not in_dlq() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert in_dlq() == [b"twice"]
    assert messages(receive(client, group="g-once")) == []


def test_tag_filter(client: Client) -> None:
    client.send("t", b"a", tag="A")
    client.send("t", b"b", tag="B")
    got = messages(receive(client, tag="B"))
    assert [m.body for m in got] == [b"b"]


def test_grpc_and_remoting_consumers_of_different_groups_share_a_topic(
        client: Client, broker: BrokerProcess) -> None:
    client.send("t", b"both")
    assert [m.body for m in messages(receive(client))] == [b"both"]
    with PullConsumer(broker.endpoints, "g-pull") as c:
        pulled = [x.body for q in range(2) for x in c.pull("t", q, 0, 32).messages]
    assert pulled == [b"both"]


def test_query_assignment(client: Client) -> None:
    def assign(group: str, topic: str = "t") -> Any:
        return client.call("QueryAssignment", ps.QueryAssignmentRequest(
            topic=pd.Resource(name=topic), group=pd.Resource(name=group)))
    r = assign("g")
    assert r.status.code == pd.OK
    assert [a.message_queue.id for a in r.assignments] == [-1]
    assert r.assignments[0].message_queue.broker.id == 0
    assert [a.message_queue.id for a in assign("g-fifo").assignments] == [0, 1]
    assert assign("g", "nope").status.code == pd.TOPIC_NOT_FOUND
    assert assign("bad group!").status.code == pd.ILLEGAL_CONSUMER_GROUP


def test_fifo_group_settings(client: Client) -> None:
    s = pd.Settings(client_type=pd.PUSH_CONSUMER, subscription=pd.Subscription(
        group=pd.Resource(name="g-fifo")))
    stream, answer = client.telemetry(s)
    try:
        assert answer.settings.subscription.fifo
    finally:
        stream.close()


@pytest.mark.parametrize(("kw", "code"), [
    ({"invisible_s": 1}, pd.ILLEGAL_INVISIBLE_TIME),
    ({"ftype": pd.SQL, "tag": "a > 1"}, pd.ILLEGAL_FILTER_EXPRESSION),
    ({"topic": "nope"}, pd.TOPIC_NOT_FOUND),
    ({"group": "bad group!"}, pd.ILLEGAL_CONSUMER_GROUP),
    ({"batch": 0}, pd.BAD_REQUEST),
])
def test_bad_receives(client: Client, kw: dict[str, Any], code: int) -> None:
    frames = receive(client, **kw)
    assert [f.status.code for f in frames] == [code]


def test_bad_change_invisible(client: Client) -> None:
    client.send("t", b"x")
    [m] = messages(receive(client))
    too_long = change(client, m, 13 * 3600 * 1000)
    assert too_long.status.code == pd.ILLEGAL_INVISIBLE_TIME
    m.system_properties.receipt_handle = "forged"
    assert change(client, m, 1000).status.code == pd.INVALID_RECEIPT_HANDLE


def test_receive_without_client_id(target: str) -> None:
    anon = Client(target, client_id="")
    try:
        frames = receive(anon)
        assert [f.status.code for f in frames] == [pd.CLIENT_ID_REQUIRED]
    finally:
        anon.close()


def test_deadline_shorter_than_polling(client: Client) -> None:
    t0 = time.monotonic()
    frames = receive(client, wait_s=0.8)
    assert frames[0].status.code == pd.MESSAGE_NOT_FOUND and time.monotonic() - t0 < 0.8


def test_a_shorter_minimum_invisible_time(tmp_path: Path) -> None:
    with run_broker(tmp_path / "b2", topics={"t": 1}, grpc_port=free_port(),
                    grpc_min_invisible_time_ms=1000) as b:
        c = Client(f"127.0.0.1:{b.config['grpc_port']}")
        try:
            c.send("t", b"soon")
            assert [f.status.code for f in receive(c, invisible_s=0.5)] == [pd.ILLEGAL_INVISIBLE_TIME]
            assert len(messages(receive(c, invisible_s=1))) == 1
            t0 = time.monotonic()
            deadline = t0 + 15
            while not (again := messages(receive(c, invisible_s=1))) and time.monotonic() < deadline:
                pass
            assert [x.body for x in again] == [b"soon"] and time.monotonic() - t0 < 8
            assert again[0].system_properties.delivery_attempt == 2
        finally:
            c.close()
