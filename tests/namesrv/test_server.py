"""``txmq namesrv`` as a real process: fake brokers register over TCP in both header codecs, then
clients ask for routes, cluster info and the topic list; a malformed frame closes only its own
connection."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from txmq.errors import ResponseCode
from txmq.namesrv import BrokerRegistration
from txmq.protocol import (
    FLAG_ONEWAY,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Command,
    FrameDecoder,
    GetRouteInfoRequestHeader,
    RequestCode,
    decode_cluster_info,
    decode_route,
    decode_topic_list,
    encode_command,
    to_ext,
)

pytestmark = pytest.mark.slow

A = "127.0.0.1:10911"
B = "127.0.0.1:10921"


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port_file = tmp_path_factory.mktemp("namesrv") / "port"
    # `txmq namesrv`, the installed command (`python -m txmq namesrv`, as other tests run `txmq`).
    proc = subprocess.Popen([sys.executable, "-m", "txmq", "namesrv", "--port", "0",
                             "--port-file", str(port_file), "--log-level", "WARNING"])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, "name server exited"
            assert time.monotonic() < deadline, "name server did not start"
            time.sleep(0.05)
        yield int(port_file.read_text())
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


class _Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder()
        self.pending: list[Command] = []

    def call(self, cmd: Command) -> Command:
        self.sock.sendall(encode_command(cmd))
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.pending.extend(self.decoder.feed(data))
        response = self.pending.pop(0)
        assert response.is_response and response.opaque == cmd.opaque
        assert response.serialize_type == cmd.serialize_type
        return response

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def _route(conn: _Conn, topic: str, serialize_type: int, opaque: int) -> Command:
    return conn.call(Command(RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque, version=400,
                             ext=to_ext(GetRouteInfoRequestHeader(topic=topic)),
                             serialize_type=serialize_type))


def test_register_and_look_up_over_tcp_in_both_codecs(namesrv: int) -> None:
    broker_a, broker_b = _Conn(namesrv), _Conn(namesrv)
    reg_a = BrokerRegistration("broker-a", A, serialize_type=SERIALIZE_JSON)
    reg_b = BrokerRegistration("broker-b", B, serialize_type=SERIALIZE_ROCKETMQ)
    assert broker_a.call(reg_a.register({"Shared": 4, "OnlyA": 2}, 0, opaque=1)).code == ResponseCode.SUCCESS
    assert broker_b.call(reg_b.register({"Shared": 8}, 0, opaque=1)).code == ResponseCode.SUCCESS
    one_way = reg_b.heartbeat(opaque=2)
    one_way.flag = FLAG_ONEWAY
    broker_b.sock.sendall(encode_command(one_way))  # no answer expected; the next call proves it

    client = _Conn(namesrv)
    for n, codec in enumerate((SERIALIZE_JSON, SERIALIZE_ROCKETMQ)):
        response = _route(client, "Shared", codec, opaque=10 + n)
        assert response.code == ResponseCode.SUCCESS
        assert b'"brokerAddrs":{0:"' in response.body  # fastjson's bare keys for a 4.x client
        route = decode_route(response.body)
        assert {q.broker_name: q.write_queue_nums for q in route.queue_datas} == {
            "broker-a": 4, "broker-b": 8}
        assert {b.broker_name: b.broker_addrs for b in route.broker_datas} == {
            "broker-a": {0: A}, "broker-b": {0: B}}

    missing = _route(client, "Missing", SERIALIZE_ROCKETMQ, opaque=20)
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST
    assert missing.remark is not None and missing.remark.startswith(
        "No topic route info in name server for the topic: Missing")

    info = client.call(Command(RequestCode.GET_BROKER_CLUSTER_INFO, 21))
    assert decode_cluster_info(info.body).cluster_addr_table == {"DefaultCluster": ["broker-a", "broker-b"]}
    topics = client.call(Command(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, 22,
                                 serialize_type=SERIALIZE_ROCKETMQ))
    assert sorted(decode_topic_list(topics.body).topic_list) == [
        "DefaultCluster", "OnlyA", "Shared", "TBW102", "broker-a", "broker-b"]
    unknown = client.call(Command(7777, 23))
    assert (unknown.code, unknown.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                              " request type 7777 not supported")

    # A broker's connection closing unregisters it (RocketMQ BrokerHousekeepingService).
    broker_a.sock.close()
    deadline = time.monotonic() + 10
    while _route(client, "OnlyA", SERIALIZE_JSON, opaque=30).code != ResponseCode.TOPIC_NOT_EXIST:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    route = decode_route(_route(client, "Shared", SERIALIZE_JSON, opaque=31).body)
    assert [b.broker_name for b in route.broker_datas] == ["broker-b"]


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x08\x05\x00\x00\x00abcd",            # unknown serialize type 5
    b"\x00\x00\x00\x08\x00\x00\x00\x40abcd",            # header longer than the frame
    b"\x00\x00\x00\x06\x00\x00\x00\x02{x",              # JSON header that does not parse
    b"\x00\x00\x00\x00\x00\x00\x00\x00",                # frame length 0: shorter than its own prefix
])
def test_malformed_frame_closes_only_that_connection(namesrv: int, garbage: bytes) -> None:
    bad = _Conn(namesrv)
    bad.sock.sendall(garbage)
    assert bad.closed_by_peer()
    good = _Conn(namesrv)
    assert good.call(Command(RequestCode.GET_BROKER_CLUSTER_INFO, 1)).code == ResponseCode.SUCCESS


def test_sdk_producer_finds_a_broker_through_the_name_server(namesrv: int) -> None:
    """The whole loop: a broker registered with `txmq namesrv`, and txmq's SDK given only the name
    server's address (RocketMQ ``namesrvAddr``) sends through the route it answers."""
    from txmq.client import Message, Producer
    from txmq.testing import run_broker

    with run_broker(topics={"Orders": 4}) as broker:
        registrar = _Conn(namesrv)  # stands in for the broker's own registration (kept open)
        reg = BrokerRegistration("broker-sdk", broker.endpoints)
        assert registrar.call(reg.register({"Orders": 4}, 0, opaque=1)).code == ResponseCode.SUCCESS
        with Producer("p", namesrv_addr=f"127.0.0.1:{namesrv}") as producer:
            result = producer.send(Message(topic="Orders", body=b"via the name server"))
        assert result.queue_id in range(4)
        registrar.call(reg.unregister(opaque=2))
