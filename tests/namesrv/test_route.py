"""Route, cluster info and registration bodies: fastjson golden vectors, both key styles, the
compressed RegisterBrokerBody layout, and bad input surfacing as MalformedHeader only."""

from __future__ import annotations

import json
import struct
import zlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.errors import MalformedHeader
from txmq.protocol import (
    DEFAULT_TOPIC,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    BrokerData,
    BrokerHeartbeatRequestHeader,
    ClusterInfo,
    Command,
    DataVersion,
    FrameDecoder,
    GetRouteInfoRequestHeader,
    QueueData,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    RequestCode,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    UnRegisterBrokerRequestHeader,
    broker_route,
    decode_cluster_info,
    decode_register_body,
    decode_route,
    decode_topic_list,
    encode_cluster_info,
    encode_command,
    encode_register_body,
    encode_route,
    encode_topic_list,
    from_ext,
    quote_int_keys,
    to_ext,
    topic_configs,
)

# RocketMQ TopicRouteDataTest's route (broker-a, perm 6, 8 + 8 queues, ids 0 and 1) as fastjson
# 1.2.83 writes it for RocketMQ 5.x: fields in alphabetical order, null fields (orderTopicConf,
# zoneName, topicQueueMappingByBroker) left out, Long map keys bare.
FASTJSON_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"192.168.0.47:10911",1:"192.168.0.47:10921"},'
    b'"brokerName":"broker-a","cluster":"TestCluster","enableActingMaster":false}],'
    b'"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":8,'
    b'"topicSysFlag":0,"writeQueueNums":8}]}'
)
ROUTE = TopicRouteData(
    queue_datas=[QueueData(broker_name="broker-a", read_queue_nums=8, write_queue_nums=8, perm=6)],
    broker_datas=[BrokerData(cluster="TestCluster", broker_name="broker-a",
                             broker_addrs={0: "192.168.0.47:10911", 1: "192.168.0.47:10921"})],
)

# `mqadmin topicRoute` of a RocketMQ 4.x name server (pretty-printed fastjson; 4.0's "topicSynFlag").
MQADMIN_4X_ROUTE = b"""{
\t"brokerDatas":[
\t\t{
\t\t\t"brokerAddrs":{0:"172.31.10.10:10911"
\t\t\t},
\t\t\t"brokerName":"ip-172-31-10-10"
\t\t}
\t],
\t"filterServerTable":{},
\t"queueDatas":[
\t\t{
\t\t\t"brokerName":"ip-172-31-10-10",
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicSynFlag":0,
\t\t\t"writeQueueNums":4
\t\t}
\t]
}"""

FASTJSON_CLUSTER = (
    b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster","enableActingMaster":false}},'
    b'"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
)


def test_fastjson_route_decodes_and_encodes_byte_for_byte() -> None:
    assert decode_route(FASTJSON_ROUTE) == ROUTE
    assert encode_route(ROUTE) == FASTJSON_ROUTE


def test_standard_route_quotes_integer_keys_and_decodes_the_same() -> None:
    standard = encode_route(ROUTE, standard=True)
    assert b'"brokerAddrs":{"0":"192.168.0.47:10911","1":"192.168.0.47:10921"}' in standard
    assert json.loads(standard)["brokerDatas"][0]["brokerAddrs"] == {
        "0": "192.168.0.47:10911", "1": "192.168.0.47:10921"}
    assert decode_route(standard) == ROUTE


def test_4x_mqadmin_route_with_whitespace_and_old_field_decodes() -> None:
    route = decode_route(MQADMIN_4X_ROUTE)
    assert route.broker_datas[0].broker_addrs == {0: "172.31.10.10:10911"}
    assert route.broker_datas[0].cluster is None
    assert route.queue_datas[0].read_queue_nums == 4 and route.queue_datas[0].perm == 6


def test_cluster_info_fastjson_golden() -> None:
    info = decode_cluster_info(FASTJSON_CLUSTER)
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: "127.0.0.1:10911"}
    assert info.cluster_addr_table == {"DefaultCluster": ["broker-a"]}
    assert encode_cluster_info(info) == FASTJSON_CLUSTER


def test_topic_list_round_trip() -> None:
    body = encode_topic_list(TopicList(topic_list=["TopicA", "TBW102"]))
    assert body == b'{"topicList":["TopicA","TBW102"]}'
    assert decode_topic_list(body).topic_list == ["TopicA", "TBW102"]


@pytest.mark.parametrize(("raw", "want"), [
    (b'{0:"a",-1:"b",12:"c"}', b'{"0":"a","-1":"b","12":"c"}'),
    (b'{ \n 0 :"a"}', b'{ \n "0" :"a"}'),
    (b'{"k":[0,1,{2:3}]}', b'{"k":[0,1,{"2":3}]}'),                  # array numbers stay values
    (b'{"s":"{0:\\"x\\",1:2}","t":{5:"y"}}', b'{"s":"{0:\\"x\\",1:2}","t":{"5":"y"}}'),  # in strings
    (b'{"a\\\\":{7:"z"}}', b'{"a\\\\":{"7":"z"}}'),                  # an escaped backslash ends a key
    (b'{"a":1,"b":[{"c":2},3]}', b'{"a":1,"b":[{"c":2},3]}'),         # standard JSON untouched
])
def test_quote_int_keys(raw: bytes, want: bytes) -> None:
    assert quote_int_keys(raw) == want


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=20)


@given(_json_values)
def test_quote_int_keys_leaves_standard_json_alone(value: object) -> None:
    text = json.dumps(value).encode()
    assert quote_int_keys(text) == text


_names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF), min_size=1, max_size=12)
_routes = st.builds(
    TopicRouteData,
    queue_datas=st.lists(st.builds(QueueData, broker_name=_names, read_queue_nums=st.integers(0, 1024),
                                   write_queue_nums=st.integers(0, 1024), perm=st.integers(0, 7),
                                   topic_sys_flag=st.integers(0, 3)), max_size=3),
    broker_datas=st.lists(st.builds(
        BrokerData, cluster=st.none() | _names, broker_name=_names,
        broker_addrs=st.dictionaries(st.integers(-(2**63), 2**63 - 1), _names, max_size=3),
        zone_name=st.none() | _names, enable_acting_master=st.booleans()), max_size=3),
    filter_server_table=st.dictionaries(_names, st.lists(_names, max_size=2), max_size=2),
    order_topic_conf=st.none() | _names,
)


@given(_routes, st.booleans())
def test_route_round_trip(route: TopicRouteData, standard: bool) -> None:
    body = encode_route(route, standard=standard)
    assert decode_route(body) == route
    if standard:
        json.loads(body)  # standard JSON indeed


@pytest.mark.parametrize("bad", [
    b"", b"{", b"[1]", b'{"brokerDatas":[{"brokerAddrs":{x:"a"}}]}', b'{"queueDatas":[{"perm":"6"}]}',
    b'{"brokerDatas":[{"brokerName":"b","brokerAddrs":{0:1}}]}', b"\xff\xfe", b"[" * 200_000,
    b'{"a":' * 100_000,
])
def test_bad_route_bodies_raise_malformed_header(bad: bytes) -> None:
    with pytest.raises(MalformedHeader):
        decode_route(bad)


# --- RegisterBrokerBody -----------------------------------------------------------------------------
# What a RocketMQ 5.x broker sends (TopicConfigAndMappingSerializeWrapper, fastjson): the mapping maps
# and mappingDataVersion are ignored, attributes kept.
JAVA_REGISTER_BODY = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,'
    b'"stateVersion":0,"timestamp":1700000000000},"mappingDataVersion":{"counter":0,"stateVersion":0,'
    b'"timestamp":1700000000001},"topicConfigTable":{"TBW102":{"attributes":{},"order":false,"perm":7,'
    b'"readQueueNums":8,"topicFilterType":"SINGLE_TAG","topicName":"TBW102","topicSysFlag":0,'
    b'"writeQueueNums":8},"TopicTest":{"attributes":{"+message.type":"TRANSACTION"},"order":false,'
    b'"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicTest",'
    b'"topicSysFlag":0,"writeQueueNums":4}},"topicQueueMappingDetailMap":{},'
    b'"topicQueueMappingInfoMap":{}}}'
)


def test_java_register_body_decodes() -> None:
    body = decode_register_body(JAVA_REGISTER_BODY)
    wrapper = body.topic_config_serialize_wrapper
    assert wrapper.data_version == DataVersion(counter=3, timestamp=1700000000000)
    assert set(wrapper.topic_config_table) == {"TBW102", "TopicTest"}
    assert wrapper.topic_config_table["TBW102"].perm == PERM_INHERIT | PERM_READ | PERM_WRITE
    assert wrapper.topic_config_table["TopicTest"].attributes == {"+message.type": "TRANSACTION"}
    assert wrapper.topic_config_table["TopicTest"].read_queue_nums == 4


def _java_compressed(lines: list[bytes], version: bytes, filters: bytes, mapping: bool) -> bytes:
    """RegisterBrokerBody.encode(true)'s layout, built field by field from its description."""
    raw = struct.pack(">i", len(version)) + version + struct.pack(">i", len(lines))
    for line in lines:
        raw += struct.pack(">i", len(line)) + line
    raw += struct.pack(">i", len(filters)) + filters
    if mapping:
        raw += struct.pack(">i", 0)
    return zlib.compress(raw, 9)


@pytest.mark.parametrize("mapping", [True, False])  # 5.x adds the mapping count; 4.x does not
def test_compressed_register_body_from_rocketmq_layout(mapping: bool) -> None:
    data = _java_compressed(
        [b"TopicA 8 8 6 SINGLE_TAG {}", b'TopicB 4 4 6 SINGLE_TAG {"+message.type":"FIFO"}',
         b"TopicC 2 2 6 SINGLE_TAG "],  # attributes null in Java: nothing after the separator
        b'{"counter":9,"stateVersion":0,"timestamp":5}', b'["10.0.0.1:1"]', mapping)
    body = decode_register_body(data, compressed=True)
    table = body.topic_config_serialize_wrapper.topic_config_table
    assert [(t.topic_name, t.read_queue_nums, t.write_queue_nums, t.perm) for t in table.values()] == [
        ("TopicA", 8, 8, 6), ("TopicB", 4, 4, 6), ("TopicC", 2, 2, 6)]
    assert table["TopicB"].attributes == {"+message.type": "FIFO"} and table["TopicC"].attributes == {}
    assert body.topic_config_serialize_wrapper.data_version.counter == 9
    assert body.filter_server_list == ["10.0.0.1:1"]


def test_register_body_round_trips_both_ways() -> None:
    body = RegisterBrokerBody(topic_config_serialize_wrapper=TopicConfigSerializeWrapper(
        topic_config_table=topic_configs({"T1": 4, "T2": 16}),
        data_version=DataVersion(timestamp=1, counter=2)))
    assert decode_register_body(encode_register_body(body)) == body
    assert decode_register_body(encode_register_body(body, compressed=True), compressed=True) == body


@pytest.mark.parametrize("bad", [
    b"", b"not zlib", zlib.compress(b"\x00\x00"), zlib.compress(b"\x00\x00\x00\x50{}"),
    _java_compressed([b"TopicA 8 8"], b"{}", b"[]", True),            # too few fields
    _java_compressed([b"TopicA x 8 6 SINGLE_TAG {}"], b"{}", b"[]", True),
    _java_compressed([], b'{"counter":"x"}', b"[]", True),
    _java_compressed([], b"{}", b"[1]", True),
    zlib.compress(b"\x00\x00\x00\x02{}\xff\xff\xff\xff"),              # negative count
    _java_compressed([b"TopicA 8 8 6 SINGLE_TAG {}"], b"{}", b"[]", True)[:-6],  # truncated stream
])
def test_bad_compressed_bodies_raise_malformed_header(bad: bytes) -> None:
    with pytest.raises(MalformedHeader):
        decode_register_body(bad, compressed=True)


def test_compressed_body_inflating_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import txmq.protocol._route as route_module

    monkeypatch.setattr(route_module, "REGISTER_BODY_INFLATED_MAX_BYTES", 1024)
    bomb = zlib.compress(b"\x00\x00\x00\x02{}" + b" " * 10_000)
    with pytest.raises(MalformedHeader, match="inflates beyond"):
        decode_register_body(bomb, compressed=True)


def test_topic_configs_add_tbw102_only_with_auto_create() -> None:
    table = topic_configs({"T": 4})
    tbw = table[DEFAULT_TOPIC]
    assert (tbw.read_queue_nums, tbw.write_queue_nums, tbw.perm) == (8, 8, 7)
    assert (table["T"].read_queue_nums, table["T"].perm) == (4, PERM_READ | PERM_WRITE)
    assert DEFAULT_TOPIC not in topic_configs({"T": 4}, auto_create_topic_enable=False)


def test_broker_route_answers_for_a_lone_broker() -> None:
    route = broker_route("T", 4, "broker-a", "DefaultCluster", "127.0.0.1:10911")
    assert encode_route(route) == (
        b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},'
        b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
        b'"writeQueueNums":4}]}')


def test_cluster_info_round_trip_with_many_ids() -> None:
    info = ClusterInfo(
        broker_addr_table={"b": BrokerData(cluster="c", broker_name="b", broker_addrs={2: "x:2", 0: "x:0"})},
        cluster_addr_table={"c": ["b"]})
    assert b'"brokerAddrs":{0:"x:0",2:"x:2"}' in encode_cluster_info(info)
    assert decode_cluster_info(encode_cluster_info(info)) == info


_text = st.text(max_size=20)
_long = st.integers(-(2**63), 2**63 - 1)
_int = st.integers(-(2**31), 2**31 - 1)
_headers = st.one_of(
    st.builds(GetRouteInfoRequestHeader, topic=_text, accept_standard_json_only=st.none() | st.booleans()),
    st.builds(RegisterBrokerRequestHeader, broker_name=_text, broker_addr=_text, cluster_name=_text,
              ha_server_addr=_text, broker_id=_long, heartbeat_timeout_millis=st.none() | _long,
              enable_acting_master=st.none() | st.booleans(), compressed=st.booleans(), body_crc32=_int),
    st.builds(RegisterBrokerResponseHeader, ha_server_addr=st.none() | _text,
              master_addr=st.none() | _text),
    st.builds(UnRegisterBrokerRequestHeader, broker_name=_text, broker_addr=_text, cluster_name=_text,
              broker_id=_long),
    st.builds(BrokerHeartbeatRequestHeader, cluster_name=_text, broker_addr=_text, broker_name=_text,
              broker_id=st.none() | _long, epoch=st.none() | _int, max_offset=st.none() | _long,
              confirm_offset=st.none() | _long, heartbeat_timeout_mills=st.none() | _long,
              election_priority=st.none() | _int),
)


@given(_headers, st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))
def test_name_server_headers_round_trip_through_both_codecs(header: msgspec.Struct, codec: int) -> None:
    frame = encode_command(Command(RequestCode.REGISTER_BROKER, 1, ext=to_ext(header), serialize_type=codec))
    (cmd,) = FrameDecoder().feed(frame)
    assert from_ext(cmd.ext, type(header)) == header


def test_register_header_wire_names() -> None:
    ext = to_ext(RegisterBrokerRequestHeader(
        broker_name="b", broker_addr="a:1", cluster_name="c", ha_server_addr="", broker_id=0,
        heartbeat_timeout_millis=None, compressed=False, body_crc32=5))
    assert ext == {"brokerName": "b", "brokerAddr": "a:1", "clusterName": "c", "haServerAddr": "",
                   "brokerId": "0", "compressed": "false", "bodyCrc32": "5"}
    beat = to_ext(BrokerHeartbeatRequestHeader(cluster_name="c", broker_addr="a", broker_name="b",
                                               heartbeat_timeout_mills=9))
    assert beat == {"clusterName": "c", "brokerAddr": "a", "brokerName": "b", "heartbeatTimeoutMills": "9"}
