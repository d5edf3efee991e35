"""Unit tests of the gRPC door's sans-IO parts: config, conversions, status mapping."""

from __future__ import annotations

import gzip
import hashlib
import zlib

import pytest

from txmq import limits
from txmq.broker import BrokerConfig, load_config
from txmq.broker.grpc import GrpcCore, GrpcError, endpoints_of, is_grpc_conn
from txmq.broker.grpc._convert import code_of, delay_level_for, host_port, outgoing, to_message
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.errors import ConfigError, ResponseCode
from txmq.protocol import MessageExt
from txmq.testing import BrokerHarness

LEVELS = [1_000, 5_000, 10_000, 30_000]


def test_grpc_port_config() -> None:
    assert BrokerConfig().grpc_port == 0
    assert load_config(None, grpc_port=8081).grpc_port == limits.GRPC_PORT_DEFAULT
    with pytest.raises(ConfigError):
        load_config(None, grpc_port=70_000)


@pytest.mark.parametrize(("wait_ms", "level"), [
    (-5, 0), (0, 0), (1, 1), (999, 1), (1_000, 1), (1_001, 2), (4_999, 2), (5_000, 2),
    (5_001, 3), (29_999, 4), (30_000, 4)])
def test_delay_level_is_the_delay_rounded_up_to_a_level(wait_ms: int, level: int) -> None:
    assert delay_level_for(1_000_000 + wait_ms, 1_000_000, LEVELS) == level


def test_delay_beyond_the_longest_level_is_refused_not_delivered_early() -> None:
    with pytest.raises(GrpcError, match="longest delay level") as info:
        delay_level_for(30_001, 0, LEVELS)
    assert info.value.status_code == pd.ILLEGAL_DELIVERY_TIME


def test_delay_beyond_a_day_is_refused() -> None:
    with pytest.raises(GrpcError) as info:
        delay_level_for(limits.GRPC_DELAY_MAX_MS + 1, 0, LEVELS)
    assert info.value.status_code == pd.ILLEGAL_DELIVERY_TIME


def test_status_mapping_follows_the_proxy() -> None:
    assert code_of(ResponseCode.SUCCESS) == pd.OK
    assert code_of(ResponseCode.SYSTEM_BUSY) == pd.TOO_MANY_REQUESTS
    assert code_of(ResponseCode.TOPIC_NOT_EXIST) == pd.TOPIC_NOT_FOUND
    assert code_of(ResponseCode.SYSTEM_ERROR) == pd.INTERNAL_SERVER_ERROR


def test_peer_addresses() -> None:
    assert host_port("ipv4:10.0.0.1:5555") == "10.0.0.1:5555"
    assert host_port("ipv6:[::1]:5555") == "[::1]:5555"
    assert host_port("unix:/tmp/s") == ""


def _msg(**sys: object) -> pd.Message:
    sys.setdefault("body_encoding", pd.IDENTITY)
    sp = pd.SystemProperties(message_id="M1", **sys)  # type: ignore[arg-type]
    return pd.Message(topic=pd.Resource(name="t"), body=b"body", system_properties=sp)


def test_outgoing_properties() -> None:
    m = _msg(tag="A", keys=["k1", "k2"], message_type=pd.TRANSACTION)
    m.user_properties["color"] = "red"
    out = outgoing(m, 100)
    assert out.half and out.topic == "t" and out.message_id == "M1"
    assert out.properties == {"color": "red", "UNIQ_KEY": "M1", "TAGS": "A", "KEYS": "k1 k2",
                              "TRAN_MSG": "true", "PGROUP": "t"}


def test_outgoing_gzip_body_and_digest() -> None:
    m = _msg(body_encoding=pd.GZIP)
    m.body = gzip.compress(b"x" * 50)
    assert outgoing(m, 100).body == b"x" * 50
    m.body = gzip.compress(b"x" * 101)
    with pytest.raises(GrpcError) as info:
        outgoing(m, 100)
    assert info.value.status_code == pd.MESSAGE_BODY_TOO_LARGE
    ok = _msg(body_digest=pd.Digest(type=pd.CRC32, checksum=format(zlib.crc32(b"body"), "08X")))
    assert outgoing(ok, 100).body == b"body"


def test_to_message_for_a_retried_message() -> None:
    ext = MessageExt(topic="%RETRY%g", body=b"b", tags="T", keys="a b",
                     properties={"RETRY_TOPIC": "t", "UNIQ_KEY": "U", "__SHARDINGKEY": "grp",
                                 "user": "v", "POP_CK": "h"},
                     queue_id=1, queue_offset=7, born_host="10.0.0.2:4000",
                     store_host="10.0.0.1:10911")
    m = to_message(ext, receipt_handle="h", delivery_attempt=3)
    sp = m.system_properties
    assert m.topic.name == "t" and dict(m.user_properties) == {"user": "v"}
    assert sp.message_id == "U" and sp.message_group == "grp" and sp.message_type == pd.FIFO
    assert sp.receipt_handle == "h" and sp.delivery_attempt == 3 and sp.born_host == "10.0.0.2"
    assert sp.body_digest.checksum == hashlib.md5(b"b").hexdigest().upper()
    assert list(sp.keys) == ["a", "b"] and sp.tag == "T" and sp.queue_offset == 7


# -- the sans-IO core over a BrokerHarness (no processes, a hand-driven clock) --------------------

def _core() -> tuple[BrokerHarness, GrpcCore]:
    h = BrokerHarness(topics={"tx": 1}, transaction_timeout_ms=100, transaction_check_interval_ms=100)
    return h, GrpcCore(h.broker, endpoints_of("127.0.0.1", 8081))


def _producer_settings(*topics: str) -> ps.TelemetryCommand:
    return ps.TelemetryCommand(settings=pd.Settings(
        client_type=pd.PRODUCER, publishing=pd.Publishing(topics=[pd.Resource(name=t) for t in topics])))


def test_core_relays_a_check_back_to_the_producer_of_the_topic() -> None:
    h, core = _core()
    core.stream_opened("c1", h.now_ms)
    answer = core.settings("c1", _producer_settings("tx"), h.now_ms).response
    assert isinstance(answer, ps.TelemetryCommand) and answer.status.code == pd.OK
    conn = core.clients["c1"].conn
    assert is_grpc_conn(conn) and h.broker.clients.producer_conns("tx") == {"c1": conn}
    req = ps.SendMessageRequest(messages=[pd.Message(
        topic=pd.Resource(name="tx"), body=b"b", system_properties=pd.SystemProperties(
            message_id="M1", message_type=pd.TRANSACTION))])
    sent = core.send("c1", req, "ipv4:127.0.0.1:5000", h.now_ms).response
    assert isinstance(sent, ps.SendMessageResponse) and sent.status.code == pd.OK
    [check] = h.tick(1_000)
    assert check.conn == conn
    relayed = core.check_back(check.conn, check.command)
    assert relayed is not None
    client_id, cmd = relayed
    rec = cmd.recover_orphaned_transaction_command
    assert client_id == "c1" and rec.transaction_id == sent.entries[0].transaction_id
    assert rec.message.system_properties.message_id == "M1"
    end = core.end_transaction("c1", ps.EndTransactionRequest(
        topic=pd.Resource(name="tx"), message_id="M1", transaction_id=rec.transaction_id,
        resolution=pd.COMMIT, source=pd.SOURCE_SERVER_CHECK), h.now_ms)
    assert isinstance(end.response, ps.EndTransactionResponse)
    assert end.response.status.code == pd.OK and end.durable_offset > 0


def test_core_unregisters_a_producer_whose_last_stream_ended() -> None:
    h, core = _core()
    core.stream_opened("c1", h.now_ms)
    core.stream_opened("c1", h.now_ms)
    core.settings("c1", _producer_settings("tx"), h.now_ms)
    core.stream_closed("c1", h.now_ms)
    assert "c1" in h.broker.clients.producer_conns("tx")
    core.stream_closed("c1", h.now_ms)
    assert h.broker.clients.producer_conns("tx") == {}
    assert core.expire(h.now_ms + limits.GRPC_CLIENT_IDLE_MS + 1) == [] and "c1" not in core.clients


def test_core_refuses_a_missing_client_id_and_bad_settings() -> None:
    h, core = _core()
    with pytest.raises(GrpcError) as info:
        core.client("", h.now_ms)
    assert info.value.status_code == pd.CLIENT_ID_REQUIRED
    with pytest.raises(GrpcError) as info:
        core.settings("c1", ps.TelemetryCommand(settings=pd.Settings(client_type=pd.PRODUCER)),
                      h.now_ms)
    assert info.value.status_code == pd.BAD_REQUEST
    assert core.settings("c1", ps.TelemetryCommand(), h.now_ms).response is None


def test_core_creates_a_topic_when_auto_creation_is_on() -> None:
    h = BrokerHarness(auto_create_topic_enable=True)
    core = GrpcCore(h.broker, endpoints_of("127.0.0.1", 8081))
    r = core.query_route("c1", ps.QueryRouteRequest(topic=pd.Resource(name="fresh")), h.now_ms)
    assert isinstance(r.response, ps.QueryRouteResponse) and r.response.status.code == pd.OK
    assert len(r.response.message_queues) == h.config.default_topic_queue_nums
    with pytest.raises(GrpcError) as info:
        core.query_route("c1", ps.QueryRouteRequest(topic=pd.Resource(name="%RETRY%x")), h.now_ms)
    assert info.value.status_code == pd.TOPIC_NOT_FOUND
