"""The gRPC door with ACL on, over txmq's own stubs on a real broker process: signed calls are served;
no, bad or stale credentials answer UNAUTHORIZED, a denied request FORBIDDEN, a refused Telemetry
settings ends the stream; unsupported rpcs stay NOT_IMPLEMENTED; nothing is stored on refusal."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from txmq.broker.acl import Accounts, Action, PolicyEntry, Resource, User, UserType, save_accounts
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.broker.grpc.pb import service_pb2_grpc as psg
from txmq.client import Admin
from txmq.protocol import grpc_authorization, grpc_date_time
from txmq.testing import BrokerProcess, free_port, run_broker


def message(topic: str, body: bytes) -> pd.Message:
    sp = pd.SystemProperties(message_id=uuid.uuid4().hex.upper(), body_encoding=pd.IDENTITY,
                             message_type=pd.NORMAL)
    return pd.Message(topic=pd.Resource(name=topic), body=body, system_properties=sp)


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    r = Resource.parse
    alice = (PolicyEntry(r("Topic:t"), (Action.PUB, Action.SUB)), PolicyEntry(r("Group:g"), (Action.SUB,)))
    save_accounts(tmp_path / "acl.toml", Accounts({
        "alice": User("alice", "sk", UserType.NORMAL, alice), "root": User("root", "rk", UserType.SUPER)}))
    with run_broker(tmp_path / "b", topics={"t": 1, "u": 1}, grpc_port=free_port(), acl_enable=True,
                    acl_file=str(tmp_path / "acl.toml")) as b:
        yield b


class Signed:
    def __init__(self, b: BrokerProcess, ak: str = "alice", sk: str = "sk", skew_ms: int = 0) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{b.config['grpc_port']}")
        self.stub = psg.MessagingServiceStub(self.channel)
        self.cid = f"acl@{uuid.uuid4().hex[:8]}"
        self.ak, self.sk, self.skew_ms = ak, sk, skew_ms

    def md(self) -> list[tuple[str, str]]:
        out = [("x-mq-client-id", self.cid)]
        if self.ak:
            date = grpc_date_time(int(time.time() * 1000) + self.skew_ms)
            out += [("x-mq-date-time", date), ("authorization", grpc_authorization(self.ak, self.sk, date))]
        return out

    def call(self, rpc: str, req: Any) -> Any:
        return getattr(self.stub, rpc)(req, metadata=self.md(), timeout=10)


def stored(b: BrokerProcess, topic: str) -> int:
    with Admin(b.endpoints, access_key="root", secret_key="rk") as a:
        return sum(q.max_offset for q in a.topic_stats(topic).offset_table)


def send(c: Signed, topic: str) -> int:
    r = c.call("SendMessage", ps.SendMessageRequest(messages=[message(topic, b"x")]))
    return int(r.status.code)


def test_signed_calls_are_served_and_refusals_have_their_status(acl_broker: BrokerProcess) -> None:
    assert send(Signed(acl_broker), "t") == pd.OK
    assert send(Signed(acl_broker, sk="wrong"), "t") == pd.UNAUTHORIZED
    assert send(Signed(acl_broker, ak=""), "t") == pd.UNAUTHORIZED
    assert send(Signed(acl_broker, skew_ms=-20 * 3600 * 1000), "t") == pd.UNAUTHORIZED
    assert send(Signed(acl_broker, skew_ms=+20 * 3600 * 1000), "t") == pd.UNAUTHORIZED
    assert send(Signed(acl_broker, skew_ms=+8 * 3600 * 1000), "t") == pd.OK  # a UTC+8 client's local time
    assert send(Signed(acl_broker), "u") == pd.FORBIDDEN
    assert stored(acl_broker, "t") == 2 and stored(acl_broker, "u") == 0
    hb = Signed(acl_broker).call("Heartbeat", ps.HeartbeatRequest(group=pd.Resource(name="other"),
                                                                 client_type=pd.SIMPLE_CONSUMER))
    assert hb.status.code == pd.FORBIDDEN and "Sub on Group:other" in hb.status.message
    got = Signed(acl_broker, ak="").call("QueryRoute", ps.QueryRouteRequest(topic=pd.Resource(name="t")))
    assert got.status.code == pd.OK  # route lookups are public
    off = Signed(acl_broker, ak="").call("GetOffset", ps.GetOffsetRequest())
    assert off.status.code == pd.NOT_IMPLEMENTED
    recv = Signed(acl_broker).stub.ReceiveMessage(ps.ReceiveMessageRequest(
        group=pd.Resource(name="other"), message_queue=pd.MessageQueue(topic=pd.Resource(name="t"))),
        metadata=Signed(acl_broker).md(), timeout=10)
    assert [f.status.code for f in recv] == [pd.FORBIDDEN]


def test_refused_telemetry_settings_end_the_stream(acl_broker: BrokerProcess) -> None:
    c = Signed(acl_broker)
    settings = pd.Settings(client_type=pd.PRODUCER, publishing=pd.Publishing(topics=[pd.Resource(name="u")]))
    call = c.stub.Telemetry(iter([ps.TelemetryCommand(settings=settings)]), metadata=c.md(), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "Pub on Topic:u" in (info.value.details() or "")
    ok = pd.Settings(client_type=pd.PRODUCER, publishing=pd.Publishing(topics=[pd.Resource(name="t")]))
    stream = c.stub.Telemetry(iter([ps.TelemetryCommand(settings=ok)]), metadata=c.md(), timeout=10)
    first = next(iter(stream))
    assert first.status.code == pd.OK
