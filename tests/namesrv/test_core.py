"""The sans-IO name server core: registration, re-registration, unregistration, expiry with a fake
clock, routes over two brokers, TBW102, and every answer to bad input."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.errors import ResponseCode
from txmq.limits import BROKER_CHANNEL_EXPIRED_TIME_MS
from txmq.namesrv import BrokerRegistration, NameServerCore, topic_not_exist_remark
from txmq.protocol import (
    DEFAULT_TOPIC,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    SERIALIZE_ROCKETMQ,
    ClusterInfo,
    Command,
    GetRouteInfoRequestHeader,
    RegisterBrokerResponseHeader,
    RequestCode,
    TopicRouteData,
    UnRegisterBrokerRequestHeader,
    decode_cluster_info,
    decode_register_body,
    decode_route,
    decode_topic_list,
    encode_register_body,
    from_ext,
    to_ext,
)

A = "127.0.0.1:10911"
B = "127.0.0.1:10921"


def _register(core: NameServerCore, reg: BrokerRegistration, topics: dict[str, int], now: int,
              conn: object = None) -> Command:
    response = core.handle(reg.register(topics, now), now, conn)
    assert response is not None
    return response


def _route(core: NameServerCore, topic: str, version: int = 0) -> Command:
    cmd = Command(RequestCode.GET_ROUTEINFO_BY_TOPIC, 7, version=version,
                  ext=to_ext(GetRouteInfoRequestHeader(topic=topic)))
    response = core.handle(cmd, 0)
    assert response is not None and response.opaque == 7 and response.flag == FLAG_RESPONSE
    return response


def _queues(route: TopicRouteData) -> dict[str, tuple[int, int, int]]:
    return {q.broker_name: (q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas}


def test_register_then_route() -> None:
    core = NameServerCore()
    response = _register(core, BrokerRegistration("broker-a", A), {"TopicA": 4}, now=1)
    assert response.code == ResponseCode.SUCCESS and response.flag == FLAG_RESPONSE
    route = core.route("TopicA")
    assert route is not None
    assert _queues(route) == {"broker-a": (4, 4, PERM_READ | PERM_WRITE)}
    assert [(b.broker_name, b.cluster, b.broker_addrs) for b in route.broker_datas] == [
        ("broker-a", "DefaultCluster", {0: A})]
    assert decode_route(_route(core, "TopicA").body) == route


def test_tbw102_registered_with_inherit_perm_only_with_auto_create() -> None:
    core = NameServerCore()
    _register(core, BrokerRegistration("broker-a", A), {"TopicA": 4}, now=1)
    tbw = core.route(DEFAULT_TOPIC)
    assert tbw is not None and _queues(tbw) == {"broker-a": (8, 8, PERM_INHERIT | PERM_READ | PERM_WRITE)}
    core2 = NameServerCore()
    _register(core2, BrokerRegistration("broker-b", B, auto_create_topic_enable=False), {"T": 1}, now=1)
    assert core2.route(DEFAULT_TOPIC) is None
    assert _route(core2, DEFAULT_TOPIC).code == ResponseCode.TOPIC_NOT_EXIST


def test_reregistration_updates_queues_and_adds_topics() -> None:
    core = NameServerCore()
    reg = BrokerRegistration("broker-a", A)
    _register(core, reg, {"TopicA": 4}, now=1)
    first = reg.data_version
    _register(core, reg, {"TopicA": 4}, now=2)
    assert reg.data_version == first  # unchanged table, unchanged version
    _register(core, reg, {"TopicA": 8, "TopicB": 2}, now=3)
    assert reg.data_version.counter == first.counter + 1 and reg.data_version.timestamp == 3
    route_a, route_b = core.route("TopicA"), core.route("TopicB")
    assert route_a is not None and _queues(route_a)["broker-a"][:2] == (8, 8)
    assert route_b is not None and _queues(route_b)["broker-a"][:2] == (2, 2)
    # RocketMQ keeps a topic the broker no longer lists (deleteTopicWithBrokerRegistration off) ...
    _register(core, reg, {"TopicB": 2}, now=4)
    assert core.route("TopicA") is not None
    # ... and drops it with the option on.
    core2 = NameServerCore(delete_topic_with_broker_registration=True)
    reg2 = BrokerRegistration("broker-a", A)
    _register(core2, reg2, {"TopicA": 4, "TopicB": 2}, now=1)
    _register(core2, reg2, {"TopicB": 2}, now=2)
    assert core2.route("TopicA") is None and core2.route("TopicB") is not None


def test_two_brokers_serve_one_topic_until_one_leaves() -> None:
    core = NameServerCore()
    reg_a, reg_b = BrokerRegistration("broker-a", A), BrokerRegistration("broker-b", B)
    _register(core, reg_a, {"Shared": 4, "OnlyA": 1}, now=1)
    _register(core, reg_b, {"Shared": 2}, now=1)
    route = core.route("Shared")
    assert route is not None
    assert _queues(route) == {"broker-a": (4, 4, 6), "broker-b": (2, 2, 6)}
    assert {b.broker_name: b.broker_addrs for b in route.broker_datas} == {
        "broker-a": {0: A}, "broker-b": {0: B}}
    info = decode_cluster_info(core.handle(Command(RequestCode.GET_BROKER_CLUSTER_INFO), 0).body)  # type: ignore[union-attr]
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert set(info.broker_addr_table) == {"broker-a", "broker-b"}

    response = core.handle(reg_a.unregister(opaque=3), 5)
    assert response is not None and response.code == ResponseCode.SUCCESS and response.opaque == 3
    route = core.route("Shared")
    assert route is not None and _queues(route) == {"broker-b": (2, 2, 6)}
    assert core.route("OnlyA") is None
    topics = decode_topic_list(core.handle(Command(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 0).body)  # type: ignore[union-attr]
    assert sorted(topics.topic_list) == ["DefaultCluster", "Shared", "TBW102", "broker-b"]
    core.handle(reg_b.unregister(), 6)
    assert core.cluster_info().cluster_addr_table == {} and core.topic_list().topic_list == []


def test_expiry_with_a_fake_clock_and_heartbeats() -> None:
    core = NameServerCore()
    reg = BrokerRegistration("broker-a", A)
    _register(core, reg, {"T": 4}, now=0)
    assert core.scan_inactive(BROKER_CHANNEL_EXPIRED_TIME_MS) == []  # RocketMQ: last + timeout < now
    assert core.handle(reg.heartbeat(), 100_000) is not None
    assert core.scan_inactive(BROKER_CHANNEL_EXPIRED_TIME_MS + 1) == []  # the beat moved it on
    assert core.scan_inactive(100_000 + BROKER_CHANNEL_EXPIRED_TIME_MS + 1) == [A]
    assert core.route("T") is None and core.cluster_info().broker_addr_table == {}
    assert core.heartbeat("DefaultCluster", A, 1) is False  # a beat does not bring it back


def test_header_timeout_overrides_the_default() -> None:
    core = NameServerCore()
    cmd = BrokerRegistration("broker-a", A).register({"T": 1}, 0)
    cmd.ext["heartbeatTimeoutMillis"] = "10000"
    cmd.ext["bodyCrc32"] = "0"
    core.handle(cmd, 0)
    assert core.scan_inactive(10_000) == [] and core.scan_inactive(10_001) == [A]


def test_oneway_heartbeat_gets_no_answer() -> None:
    core = NameServerCore()
    reg = BrokerRegistration("broker-a", A)
    _register(core, reg, {"T": 1}, now=0)
    beat = reg.heartbeat()
    beat.flag = FLAG_ONEWAY
    assert core.handle(beat, 50) is None
    assert core.broker_live[("DefaultCluster", A)].last_update_ms == 50


def test_connection_close_unregisters_its_broker() -> None:
    core = NameServerCore()
    _register(core, BrokerRegistration("broker-a", A), {"T": 1}, now=0, conn=11)
    _register(core, BrokerRegistration("broker-b", B), {"T": 1}, now=0, conn=12)
    core.connection_closed(11)
    route = core.route("T")
    assert route is not None and [b.broker_name for b in route.broker_datas] == ["broker-b"]
    core.connection_closed(99)  # unknown connection: nothing happens
    assert core.route("T") is not None


def test_slave_learns_master_and_does_not_override_topics() -> None:
    core = NameServerCore()
    _register(core, BrokerRegistration("broker-a", A), {"T": 4}, now=0)
    response = _register(core, BrokerRegistration("broker-a", B, broker_id=1), {"T": 16, "X": 2}, now=0)
    header = from_ext(response.ext, RegisterBrokerResponseHeader)
    assert header.master_addr == A
    route = core.route("T")
    assert route is not None and _queues(route)["broker-a"][:2] == (4, 4)
    assert route.broker_datas[0].broker_addrs == {0: A, 1: B}
    assert core.route("X") is None
    core.unregister_broker(UnRegisterBrokerRequestHeader(
        broker_name="broker-a", broker_addr=A, cluster_name="DefaultCluster", broker_id=0))
    route = core.route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: B}


def test_route_json_style_follows_the_request_version() -> None:
    core = NameServerCore()
    _register(core, BrokerRegistration("broker-a", A), {"T": 1}, now=0)
    assert b'"brokerAddrs":{0:"' in _route(core, "T", version=400).body  # before V4_9_4: fastjson
    standard = _route(core, "T", version=401).body
    assert b'"brokerAddrs":{"0":"' in standard and json.loads(standard)
    cmd = Command(RequestCode.GET_ROUTEINFO_BY_TOPIC, version=1,
                  ext={"topic": "T", "acceptStandardJsonOnly": "true"})
    assert b'{"0":"' in core.handle(cmd, 0).body  # type: ignore[union-attr]


def test_unknown_topic_and_unknown_code() -> None:
    core = NameServerCore()
    response = _route(core, "Nope")
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert response.remark == topic_not_exist_remark("Nope")
    assert response.remark.startswith("No topic route info in name server for the topic: Nope\nSee ")
    response = core.handle(Command(9999, 5, serialize_type=SERIALIZE_ROCKETMQ), 0)
    assert response is not None
    assert (response.code, response.remark, response.opaque) == (
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 9999 not supported", 5)
    assert response.serialize_type == SERIALIZE_ROCKETMQ


@pytest.mark.parametrize(("code", "ext", "body", "remark"), [
    (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}, b"", "the custom field <topic> is null"),
    (RequestCode.REGISTER_BROKER, {"brokerName": "b"}, b"", "is null"),
    (RequestCode.UNREGISTER_BROKER, {"brokerName": "b", "brokerAddr": A, "clusterName": "c",
                                     "brokerId": "zero"}, b"", "UnRegisterBrokerRequestHeader"),
    (RequestCode.REGISTER_BROKER, {"brokerName": "b", "brokerAddr": A, "clusterName": "c",
                                   "haServerAddr": "", "brokerId": "0"}, b"{not json", "RegisterBrokerBody"),
    (RequestCode.REGISTER_BROKER, {"brokerName": "b", "brokerAddr": A, "clusterName": "c",
                                   "haServerAddr": "", "brokerId": "0", "compressed": "true"},
     b"not zlib", "compressed"),
    (RequestCode.REGISTER_BROKER, {"brokerName": "b", "brokerAddr": A, "clusterName": "c",
                                   "haServerAddr": "", "brokerId": "0", "bodyCrc32": "12345"},
     b"{}", "crc32 not match"),
    (RequestCode.BROKER_HEARTBEAT, {"clusterName": "c"}, b"", "is null"),
])
def test_bad_requests_get_system_error_and_change_nothing(
        code: int, ext: dict[str, str], body: bytes, remark: str) -> None:
    core = NameServerCore()
    response = core.handle(Command(code, 1, ext=ext, body=body), 0)
    assert response is not None and response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark is not None and remark in response.remark
    assert core.broker_addr == {} and core.topic_queue == {} and core.broker_live == {}


def test_body_crc32_checked_when_given() -> None:
    core = NameServerCore()
    cmd = BrokerRegistration("broker-a", A).register({"T": 1}, 0)
    assert cmd.ext["bodyCrc32"] == str(zlib.crc32(cmd.body) & 0x7FFFFFFF)
    assert core.handle(cmd, 0).code == ResponseCode.SUCCESS  # type: ignore[union-attr]


def test_compressed_registration() -> None:
    core = NameServerCore()
    response = _register(core, BrokerRegistration("broker-a", A, compressed=True), {"T": 3}, now=0)
    assert response.code == ResponseCode.SUCCESS
    route = core.route("T")
    assert route is not None and _queues(route)["broker-a"] == (3, 3, 6)


def test_single_topic_registration_of_an_unknown_broker_id_is_refused() -> None:
    core = NameServerCore()
    cmd = BrokerRegistration("broker-a", A, auto_create_topic_enable=False).register({"T": 1}, 0)
    body = decode_register_body(cmd.body)
    table = body.topic_config_serialize_wrapper.topic_config_table
    # the cluster's and the broker's own topics, as RocketMQ brokers announce them
    assert set(table) == {"T", "DefaultCluster", "broker-a"}
    del table["broker-a"], table["DefaultCluster"]
    cmd.body, cmd.ext["bodyCrc32"] = encode_register_body(body), "0"
    response = core.handle(cmd, 0)
    assert response is not None
    assert (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, "register broker failed")
    assert core.route("T") is None
    assert core.cluster_info() == ClusterInfo()


def test_a_broker_with_no_topic_of_its_own_registers() -> None:
    """A new broker whose table is empty (no topics yet, auto-create off) still registers: its
    cluster and broker topics keep the registration from looking like a single-topic update."""
    core = NameServerCore()
    response = _register(core, BrokerRegistration("broker-a", A, auto_create_topic_enable=False), {},
                         now=1)
    assert response.code == ResponseCode.SUCCESS
    assert core.cluster_info().broker_addr_table["broker-a"].broker_addrs == {0: A}
    route = core.route("DefaultCluster")
    assert route is not None and _queues(route) == {"broker-a": (16, 16, 7)}


def test_topic_list_can_be_disabled() -> None:
    response = NameServerCore(enable_all_topic_list=False).handle(
        Command(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 0)
    assert response is not None and (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, "disable")


def test_registration_due_every_period() -> None:
    reg = BrokerRegistration("broker-a", A, period_ms=30_000)
    assert reg.due(0)
    reg.register({}, 1_000)
    assert not reg.due(30_999) and reg.due(31_000)


_codes = st.sampled_from([int(c) for c in (
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.BROKER_HEARTBEAT,
    RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)] + [0, 65535])
_keys = st.sampled_from(["topic", "brokerName", "brokerAddr", "clusterName", "haServerAddr", "brokerId",
                         "compressed", "bodyCrc32", "heartbeatTimeoutMillis", "acceptStandardJsonOnly",
                         "enableActingMaster", "x"])
_values = st.sampled_from(["", "0", "-1", "1", "true", "false", "9" * 30, "b", "\x00"]) | st.text(max_size=5)


@given(_codes, st.dictionaries(_keys, _values), st.binary(max_size=64) | st.just(b"{}"), st.booleans())
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a loaded machine: st.text
def test_any_request_gets_an_answer_and_never_raises(
        code: int, ext: dict[str, str], body: bytes, compressed_body: bool) -> None:
    core = NameServerCore()
    _register(core, BrokerRegistration("broker-a", A), {"T": 1}, now=0)
    if compressed_body:
        body = zlib.compress(body)
    response = core.handle(Command(code, 9, ext=ext, body=body), 1)
    assert response is not None and response.opaque == 9 and response.is_response
    core.scan_inactive(10**12)
    assert core.route("T") is None
