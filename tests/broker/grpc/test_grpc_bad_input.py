"""Bad input at the gRPC door: each gets the proxy's status code, nothing is stored, the broker lives."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from conftest import Client, TelemetryCall, free_port, message
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.client import PullConsumer
from txmq.testing import BrokerProcess, run_broker

_SERVICE = "/apache.rocketmq.v2.MessagingService/"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module: every send here but one (to ``tx``) is refused."""
    with run_broker(tmp_path_factory.mktemp("bad") / "broker", topics={"t": 2, "tx": 1},
                    grpc_port=free_port()) as b:
        yield b


def stored(broker: BrokerProcess, topic: str = "t", queues: int = 2) -> int:
    with PullConsumer(broker.endpoints, "g-check") as c:
        return sum(len(c.pull(topic, q, 0, 32).messages) for q in range(queues))


def send_one(client: Client, m: pd.Message) -> ps.SendMessageResponse:
    r: ps.SendMessageResponse = client.call("SendMessage", ps.SendMessageRequest(messages=[m]))
    return r


def test_malformed_protobuf_is_refused_by_the_transport(client: Client, target: str,
                                                        broker: BrokerProcess) -> None:
    raw = client.channel.unary_unary(_SERVICE + "SendMessage")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\x0a\xff\xff\xff\xff\x0f garbage", metadata=client.md, timeout=5)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    stream = client.channel.stream_stream(_SERVICE + "Telemetry")
    with pytest.raises(grpc.RpcError) as info:
        list(stream(iter([b"\x12\xff\xff\xff"]), metadata=client.md, timeout=5))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert client.route("t").status.code == pd.OK  # still serving
    assert stored(broker) == 0


@pytest.mark.parametrize(("make", "code"), [
    (lambda: message("", b"x"), pd.ILLEGAL_TOPIC),
    (lambda: message("bad topic!", b"x"), pd.ILLEGAL_TOPIC),
    (lambda: message("RMQ_SYS_TRANS_HALF_TOPIC", b"x"), pd.FORBIDDEN),
    (lambda: message("nope", b"x"), pd.TOPIC_NOT_FOUND),
    (lambda: message("t", b""), pd.MESSAGE_BODY_EMPTY),
    (lambda: message("t", b"x" * (4 * 1024 * 1024 + 1)), pd.MESSAGE_BODY_TOO_LARGE),
    (lambda: _no_id(), pd.ILLEGAL_MESSAGE_ID),
    (lambda: _with_user({"UNIQ_KEY": "forged"}), pd.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (lambda: _with_user({f"k{i}": "v" for i in range(129)}), pd.MESSAGE_PROPERTIES_TOO_LARGE),
    (lambda: message("t", b"x", mtype=pd.TRANSACTION, message_group="g"),
     pd.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: message("t", b"x", mtype=pd.FIFO, message_group="g" * 65), pd.ILLEGAL_MESSAGE_GROUP),
    (lambda: message("t", b"x", tag="a|b"), pd.ILLEGAL_MESSAGE_TAG),
    (lambda: message("t", b"x", keys=["has space"]), pd.ILLEGAL_MESSAGE_KEY),
    (lambda: message("t", b"x", body_digest=pd.Digest(type=pd.MD5, checksum="00")),
     pd.MESSAGE_CORRUPTED),
    (lambda: _far_future(), pd.ILLEGAL_DELIVERY_TIME),
])
def test_rejected_sends_store_nothing(client: Client, broker: BrokerProcess, make: object,
                                      code: int) -> None:
    r = send_one(client, make())  # type: ignore[operator]
    assert r.status.code == code, r.status
    assert [e.status.code for e in r.entries] == [code]
    assert stored(broker) == 0


def _no_id() -> pd.Message:
    m = message("t", b"x")
    m.system_properties.message_id = ""
    return m


def _with_user(props: dict[str, str]) -> pd.Message:
    m = message("t", b"x")
    m.user_properties.update(props)
    return m


def _far_future() -> pd.Message:
    m = message("t", b"x", mtype=pd.DELAY)
    m.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 2 * 86_400_000)
    return m


def test_send_without_messages_and_a_mixed_batch(client: Client, broker: BrokerProcess) -> None:
    empty = client.call("SendMessage", ps.SendMessageRequest())
    assert empty.status.code == pd.BAD_REQUEST
    mixed = client.call("SendMessage", ps.SendMessageRequest(
        messages=[message("tx", b"good"), message("nope", b"bad")]))
    assert mixed.status.code == pd.MULTIPLE_RESULTS
    assert [e.status.code for e in mixed.entries] == [pd.OK, pd.TOPIC_NOT_FOUND]
    assert stored(broker, "tx", 1) == 1


def test_telemetry_settings_without_pub_sub(client: Client) -> None:
    call = TelemetryCall(client)
    call.write(ps.TelemetryCommand(settings=pd.Settings(client_type=pd.PRODUCER)))
    with pytest.raises(grpc.RpcError) as info:
        call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no publishing or subscription" in (info.value.details() or "")


def test_telemetry_settings_of_the_wrong_client_type(client: Client) -> None:
    call = TelemetryCall(client)
    call.write(ps.TelemetryCommand(settings=pd.Settings(
        client_type=pd.SIMPLE_CONSUMER, publishing=pd.Publishing(topics=[pd.Resource(name="t")]))))
    with pytest.raises(grpc.RpcError) as info:
        call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_telemetry_illegal_topic_and_group(client: Client) -> None:
    for s in (pd.Settings(client_type=pd.PRODUCER, publishing=pd.Publishing(
                  topics=[pd.Resource(name="bad topic!")])),
              pd.Settings(client_type=pd.PUSH_CONSUMER, subscription=pd.Subscription(
                  group=pd.Resource(name="")))):
        call = TelemetryCall(client)
        call.write(ps.TelemetryCommand(settings=s))
        with pytest.raises(grpc.RpcError) as info:
            call.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_telemetry_that_never_sends_settings(client: Client) -> None:
    call = TelemetryCall(client)
    call.write(ps.TelemetryCommand(thread_stack_trace=ps.ThreadStackTrace(nonce="n")))
    call.write(ps.TelemetryCommand())  # no command at all
    hb = client.call("Heartbeat", ps.HeartbeatRequest(client_type=pd.PRODUCER))
    assert hb.status.code == pd.UNRECOGNIZED_CLIENT_TYPE
    bye = client.call("NotifyClientTermination", ps.NotifyClientTerminationRequest())
    assert bye.status.code == pd.UNRECOGNIZED_CLIENT_TYPE
    # the stream is still open and answers settings when they come
    call.write(ps.TelemetryCommand(settings=pd.Settings(
        client_type=pd.PRODUCER, publishing=pd.Publishing(topics=[pd.Resource(name="t")]))))
    assert call.read().status.code == pd.OK
    call.close()


def test_unsupported_rpcs_say_so(client: Client) -> None:
    r = client.call("UpdateOffset", ps.UpdateOffsetRequest(group=pd.Resource(name="g")))
    assert r.status.code == pd.NOT_IMPLEMENTED
    pulled = list(client.stub.PullMessage(ps.PullMessageRequest(), metadata=client.md, timeout=5))
    assert [p.status.code for p in pulled] == [pd.NOT_IMPLEMENTED]
