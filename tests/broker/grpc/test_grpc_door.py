"""The gRPC door of a real broker process: route, heartbeat, telemetry, send, transactions."""

from __future__ import annotations

import time

import pytest

from conftest import Client, message
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.client import Message, MessageExt, Producer, PullConsumer
from txmq.protocol import decode_offset_msg_id
from txmq.testing import BrokerProcess, wait_until


def pull_all(endpoints: str, topic: str, queues: int, group: str = "g-pull") -> list[MessageExt]:
    out: list[MessageExt] = []
    with PullConsumer(endpoints, group) as c:
        for q in range(queues):
            res = c.pull(topic, q, 0, 32)
            out.extend(res.messages)
    return out


def test_query_route_names_the_door(client: Client, target: str) -> None:
    r = client.route("t")
    assert r.status.code == pd.OK
    assert [q.id for q in r.message_queues] == [0, 1]
    q = r.message_queues[0]
    assert q.permission == pd.READ_WRITE and q.broker.id == 0
    assert q.broker.name == "broker-a"
    addr = q.broker.endpoints.addresses[0]
    assert f"{addr.host}:{addr.port}" == target and q.broker.endpoints.scheme == pd.IPv4
    assert set(q.accept_message_types) == {pd.NORMAL, pd.FIFO, pd.DELAY, pd.TRANSACTION}


def test_query_route_unknown_and_illegal_topics(client: Client) -> None:
    assert client.route("nope").status.code == pd.TOPIC_NOT_FOUND
    assert client.route("bad topic!").status.code == pd.ILLEGAL_TOPIC


def test_client_id_is_required(target: str) -> None:
    anon = Client(target, client_id="")
    try:
        assert anon.route("t").status.code == pd.CLIENT_ID_REQUIRED
        call = anon.producer("t")[1]
        assert call.status.code == pd.CLIENT_ID_REQUIRED
    finally:
        anon.close()


def test_settings_handshake_producer(client: Client, broker: BrokerProcess) -> None:
    stream, answer = client.producer("t", "tx")
    try:
        assert answer.status.code == pd.OK and answer.HasField("settings")
        s = answer.settings
        assert s.publishing.max_body_size == 4 * 1024 * 1024
        assert s.publishing.validate_message_type
        assert [t.name for t in s.publishing.topics] == ["t", "tx"]
        assert s.backoff_policy.max_attempts == 3
        assert s.backoff_policy.exponential_backoff.initial.ToMilliseconds() == 10
        assert s.backoff_policy.exponential_backoff.max.ToMilliseconds() == 1000
    finally:
        stream.close()


def test_settings_handshake_consumer(client: Client) -> None:
    s = pd.Settings(client_type=pd.SIMPLE_CONSUMER, subscription=pd.Subscription(
        group=pd.Resource(name="g1"), subscriptions=[pd.SubscriptionEntry(
            topic=pd.Resource(name="t"), expression=pd.FilterExpression(type=pd.TAG, expression="*"))]))
    stream, answer = client.telemetry(s)
    try:
        assert answer.status.code == pd.OK
        sub = answer.settings.subscription
        assert sub.receive_batch_size == 32 and sub.long_polling_timeout.ToSeconds() == 20
        assert sub.HasField("fifo") and not sub.fifo
        policy = answer.settings.backoff_policy
        assert policy.max_attempts == 17 and len(policy.customized_backoff.next) >= 1
    finally:
        stream.close()


def test_heartbeat_and_termination(client: Client) -> None:
    hb = ps.HeartbeatRequest(client_type=pd.PRODUCER)
    assert client.call("Heartbeat", hb).status.code == pd.UNRECOGNIZED_CLIENT_TYPE
    stream, _ = client.producer("t")
    try:
        assert client.call("Heartbeat", hb).status.code == pd.OK
        bye = client.call("NotifyClientTermination", ps.NotifyClientTerminationRequest())
        assert bye.status.code == pd.OK
    finally:
        stream.close()


def test_send_normal_is_visible_to_remoting(client: Client, broker: BrokerProcess) -> None:
    r = client.send("t", b"hello", message_id="ID-1", tag="TagA", keys=["k1", "k2"])
    assert r.status.code == pd.OK, r.status
    [e] = r.entries
    assert e.status.code == pd.OK and e.message_id == "ID-1" and not e.transaction_id
    got = pull_all(broker.endpoints, "t", 2)
    assert [(m.body, m.tags, m.keys, m.properties.get("UNIQ_KEY")) for m in got] == [
        (b"hello", "TagA", "k1 k2", "ID-1")]


def test_send_is_idempotent_per_message_id(client: Client, broker: BrokerProcess) -> None:
    first = client.send("t", b"once", message_id="DUP-1")
    again = client.send("t", b"once", message_id="DUP-1")
    assert first.entries[0] == again.entries[0]
    assert len(pull_all(broker.endpoints, "t", 2)) == 1


def test_send_delay_via_delivery_timestamp(client: Client, broker: BrokerProcess) -> None:
    sent = time.time()
    m = message("t", b"later", mtype=pd.DELAY)
    m.system_properties.delivery_timestamp.FromMilliseconds(int(sent * 1000) + 250)
    r = client.call("SendMessage", ps.SendMessageRequest(messages=[m]))
    assert r.status.code == pd.OK, r.status
    assert pull_all(broker.endpoints, "t", 2) == []
    wait_until(lambda: len(pull_all(broker.endpoints, "t", 2)) == 1, timeout_s=10)
    assert time.time() - sent >= 0.25


def test_send_fifo_keeps_a_group_in_one_queue(client: Client, broker: BrokerProcess) -> None:
    msgs = [message("t", str(i).encode(), mtype=pd.FIFO, message_group="order-7") for i in range(6)]
    for m in msgs:
        r = client.call("SendMessage", ps.SendMessageRequest(messages=[m]))
        assert r.status.code == pd.OK
    got = pull_all(broker.endpoints, "t", 2)
    assert len({m.queue_id for m in got}) == 1
    assert [m.body for m in got] == [str(i).encode() for i in range(6)]


def test_transaction_commit_and_rollback(client: Client, broker: BrokerProcess) -> None:
    stream, _ = client.producer("tx")
    try:
        a = client.send("tx", b"commit-me", message_id="TX-A", mtype=pd.TRANSACTION).entries[0]
        b = client.send("tx", b"roll-me", message_id="TX-B", mtype=pd.TRANSACTION).entries[0]
        assert a.status.code == pd.OK and a.message_id == "TX-A"
        assert decode_offset_msg_id(a.transaction_id)[1] >= 0  # an offset message id
        assert pull_all(broker.endpoints, "tx", 1) == []
        assert client.end("tx", "TX-A", a.transaction_id, pd.COMMIT).status.code == pd.OK
        assert client.end("tx", "TX-B", b.transaction_id, pd.ROLLBACK).status.code == pd.OK
        assert [m.body for m in pull_all(broker.endpoints, "tx", 1)] == [b"commit-me"]
    finally:
        stream.close()


def test_end_transaction_bad_ids(client: Client) -> None:
    assert client.end("tx", "x", "not-an-id", pd.COMMIT).status.code == pd.INVALID_TRANSACTION_ID
    forged = "7F000001" + "00002A9F" + "0000000000ABCDEF"
    assert client.end("tx", "x", forged, pd.COMMIT).status.code == pd.INVALID_TRANSACTION_ID


def test_end_transaction_of_another_topics_half_is_refused(client: Client,
                                                            broker: BrokerProcess) -> None:
    """A gRPC end's producer group is its topic. A half sent over remoting by group "t" to topic
    "tx" passes the group check of an end for topic "t"; the end is refused all the same, since
    "t" is not the half's REAL_TOPIC (ACL authorized Pub on "t" only), and the half stays
    pending until its own producer commits it."""
    from txmq.client import LocalTransactionState, TransactionProducer

    class Unknown:  # the half stays pending: no end but the test's
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.UNKNOW

    with TransactionProducer("t", broker.endpoints, Unknown()) as producer:
        half = producer.send_half(Message(topic="tx", body=b"mine"))
        other = client.end("t", half.msg_id, half.offset_msg_id, pd.COMMIT)
        assert other.status.code == pd.INVALID_TRANSACTION_ID, other
        assert pull_all(broker.endpoints, "tx", 1) == []
        producer.end_transaction(half, LocalTransactionState.COMMIT_MESSAGE)
        wait_until(lambda: [m.body for m in pull_all(broker.endpoints, "tx", 1)] == [b"mine"],
                   timeout_s=10)


def test_check_back_over_telemetry(client: Client, broker: BrokerProcess) -> None:
    stream, _ = client.producer("tx")
    try:
        e = client.send("tx", b"unknown", message_id="TX-C", mtype=pd.TRANSACTION,
                        keys=["kc"]).entries[0]
        assert client.end("tx", "TX-C", e.transaction_id,
                          pd.TRANSACTION_RESOLUTION_UNSPECIFIED).status.code == pd.OK
        cmd = stream.read(timeout=15)
        assert cmd.WhichOneof("command") == "recover_orphaned_transaction_command"
        rec = cmd.recover_orphaned_transaction_command
        assert rec.transaction_id == e.transaction_id
        m = rec.message
        assert m.topic.name == "tx" and m.body == b"unknown" and list(m.system_properties.keys) == ["kc"]
        assert m.system_properties.message_id == "TX-C"
        assert m.system_properties.body_encoding == pd.IDENTITY
        assert m.system_properties.message_type == pd.TRANSACTION
        import hashlib
        assert m.system_properties.body_digest.checksum == hashlib.md5(b"unknown").hexdigest().upper()
        r = client.end("tx", "TX-C", rec.transaction_id, pd.COMMIT, source=pd.SOURCE_SERVER_CHECK)
        assert r.status.code == pd.OK
        assert [x.body for x in pull_all(broker.endpoints, "tx", 1)] == [b"unknown"]
    finally:
        stream.close()


def test_remoting_half_is_checked_back_on_a_grpc_producer(client: Client,
                                                          broker: BrokerProcess) -> None:
    from txmq.client import LocalTransactionState, TransactionProducer

    stream, _ = client.producer("tx")
    try:
        class Unknown:
            def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
                return LocalTransactionState.UNKNOWN

            def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
                return LocalTransactionState.UNKNOWN

        with TransactionProducer("tx", broker.endpoints, Unknown()) as tp:
            tp.send_message_in_transaction(Message(topic="tx", body=b"from-remoting"))
        cmd = stream.read(timeout=15)  # the remoting producer is gone: the gRPC one is asked
        rec = cmd.recover_orphaned_transaction_command
        assert rec.message.body == b"from-remoting"
        r = client.end("tx", rec.message.system_properties.message_id, rec.transaction_id,
                       pd.COMMIT, source=pd.SOURCE_SERVER_CHECK)
        assert r.status.code == pd.OK
        assert [x.body for x in pull_all(broker.endpoints, "tx", 1)] == [b"from-remoting"]
    finally:
        stream.close()


@pytest.mark.parametrize("n", [1])
def test_remoting_send_is_listed_in_grpc_route(client: Client, broker: BrokerProcess, n: int) -> None:
    with Producer("p", broker.endpoints) as p:
        p.send(Message(topic="t", body=b"r"))
    assert client.route("t").status.code == pd.OK


def test_concurrent_sends_are_each_stored_once(target: str, broker: BrokerProcess) -> None:
    import asyncio

    import grpc

    from txmq.broker.grpc.pb import service_pb2_grpc as psg

    async def burst() -> list[ps.SendMessageResponse]:
        async with grpc.aio.insecure_channel(target) as ch:
            stub = psg.MessagingServiceStub(ch)
            md = (("x-mq-client-id", "burst"),)
            reqs = [ps.SendMessageRequest(messages=[message("t", f"{i}".encode(), message_id=f"B{i % 48}")])
                    for i in range(64)]  # 16 of them repeat an id: retries
            return list(await asyncio.gather(*(stub.SendMessage(r, metadata=md) for r in reqs)))

    got = asyncio.run(burst())
    assert all(r.status.code == pd.OK for r in got)
    assert got[50].entries[0].offset == got[2].entries[0].offset  # a retry: the first's answer
    assert len(pull_all(broker.endpoints, "t", 2)) == 48
