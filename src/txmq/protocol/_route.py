"""Route data, cluster info and broker registration: the name server's wire contract.

Every struct here mirrors a RocketMQ class field for field, with RocketMQ's wire names (python
attributes are snake_case, ``msgspec.field(name=...)`` gives the camelCase name on the wire).

RocketMQ writes these bodies with fastjson 1.x (``RemotingSerializable.encode``), which is not quite
standard JSON: a map with ``Long`` keys (``BrokerData.brokerAddrs``) is written with bare integer keys,
``{"brokerAddrs":{0:"127.0.0.1:10911"}}``. :func:`encode_route` and :func:`encode_cluster_info` write
exactly that (fields in alphabetical order, ``null`` fields left out, as fastjson does); with
``standard=True`` they quote the keys, which RocketMQ's name server does for a client of version
``>= V4_9_4`` or one that sets ``acceptStandardJsonOnly`` (ClientRequestProcessor.getRouteInfoByTopic).
:func:`decode_route` and :func:`decode_cluster_info` accept both forms.

Errors: every decoder raises :class:`~txmq.errors.MalformedHeader` (never a msgspec, zlib or struct
exception) for bytes that do not form the expected body.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from txmq.errors import ConfigError, MalformedHeader
from txmq.limits import AUTO_CREATE_TOPIC_QUEUE_NUMS, REGISTER_BODY_INFLATED_MAX_BYTES
from txmq.protocol._headers import DEFAULT_TOPIC

__all__ = [
    "DEFAULT_CLUSTER_NAME",
    "MASTER_ID",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "STANDARD_JSON_MIN_VERSION",
    "BrokerData",
    "BrokerHeartbeatRequestHeader",
    "ClusterInfo",
    "DataVersion",
    "GetRouteInfoRequestHeader",
    "QueueData",
    "RegisterBrokerBody",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicList",
    "TopicRouteData",
    "UnRegisterBrokerRequestHeader",
    "broker_route",
    "decode_cluster_info",
    "decode_register_body",
    "decode_route",
    "decode_topic_list",
    "encode_cluster_info",
    "encode_fastjson",
    "encode_register_body",
    "encode_route",
    "encode_topic_list",
    "parse_address",
    "quote_int_keys",
    "topic_configs",
    "wants_standard_json",
]

# --- permissions (RocketMQ PermName) --------------------------------------------------------------
PERM_PRIORITY = 0x1 << 3
PERM_READ = 0x1 << 2
PERM_WRITE = 0x1 << 1
PERM_INHERIT = 0x1 << 0

MASTER_ID = 0
"""Broker id of a master (RocketMQ MixAll.MASTER_ID)."""

DEFAULT_CLUSTER_NAME = "DefaultCluster"
"""RocketMQ BrokerIdentity ``brokerClusterName`` default."""

STANDARD_JSON_MIN_VERSION = 401
"""``MQVersion.Version.V4_9_4.ordinal()``: a GET_ROUTEINFO_BY_TOPIC request of this remoting version or
later gets standard JSON (quoted keys) from RocketMQ's name server (ClientRequestProcessor)."""

_SINGLE_TAG = "SINGLE_TAG"  # RocketMQ TopicFilterType.SINGLE_TAG, TopicConfig's default


# --- route data -----------------------------------------------------------------------------------
class QueueData(msgspec.Struct, kw_only=True):
    """Queues of a topic on one broker (RocketMQ ``route.QueueData``)."""

    broker_name: str = msgspec.field(name="brokerName")
    read_queue_nums: int = msgspec.field(default=0, name="readQueueNums")
    write_queue_nums: int = msgspec.field(default=0, name="writeQueueNums")
    perm: int = 0
    """``PERM_READ | PERM_WRITE`` (6) for an ordinary topic."""
    topic_sys_flag: int = msgspec.field(default=0, name="topicSysFlag")


class BrokerData(msgspec.Struct, kw_only=True):
    """A broker group: its name, cluster and the address of each member by broker id (0 = master)
    (RocketMQ ``route.BrokerData``). ``brokerAddrs`` has integer keys, bare on the wire."""

    cluster: str | None = None
    broker_name: str = msgspec.field(name="brokerName")
    broker_addrs: dict[int, str] = msgspec.field(default_factory=dict, name="brokerAddrs")
    """``{brokerId: "ip:port"}``."""
    zone_name: str | None = msgspec.field(default=None, name="zoneName")
    enable_acting_master: bool = msgspec.field(default=False, name="enableActingMaster")


class TopicRouteData(msgspec.Struct, kw_only=True):
    """What GET_ROUTEINFO_BY_TOPIC answers (RocketMQ ``route.TopicRouteData``)."""

    order_topic_conf: str | None = msgspec.field(default=None, name="orderTopicConf")
    queue_datas: list[QueueData] = msgspec.field(default_factory=list, name="queueDatas")
    broker_datas: list[BrokerData] = msgspec.field(default_factory=list, name="brokerDatas")
    filter_server_table: dict[str, list[str]] = msgspec.field(
        default_factory=dict, name="filterServerTable")
    """``{brokerAddr: [filter server addr]}``; empty unless a broker registers filter servers."""


class ClusterInfo(msgspec.Struct, kw_only=True):
    """What GET_BROKER_CLUSTER_INFO answers (RocketMQ ``body.ClusterInfo``)."""

    broker_addr_table: dict[str, BrokerData] = msgspec.field(
        default_factory=dict, name="brokerAddrTable")
    """``{brokerName: BrokerData}``."""
    cluster_addr_table: dict[str, list[str]] = msgspec.field(
        default_factory=dict, name="clusterAddrTable")
    """``{clusterName: [brokerName]}`` (a Java ``Set``, written as an array)."""

    def masters(self, cluster: str = "") -> dict[str, str]:
        """Broker name → master address (broker id ``MASTER_ID``) of every broker group of
        ``cluster`` (every cluster when empty), sorted by broker name; groups without a master
        are left out. RocketMQ mqadmin ``CommandUtil.fetchMasterAddrByClusterName``.

        Raises:
            ConfigError: ``cluster`` is not a cluster of this table.
        """
        if cluster and cluster not in self.cluster_addr_table:
            known = ", ".join(sorted(self.cluster_addr_table)) or "none"
            raise ConfigError(f"no cluster {cluster!r} on the name server (clusters: {known})")
        names = set(self.cluster_addr_table[cluster]) if cluster else set(self.broker_addr_table)
        return {n: addr for n in sorted(names)
                if (bd := self.broker_addr_table.get(n)) and (addr := bd.broker_addrs.get(MASTER_ID))}


class TopicList(msgspec.Struct, kw_only=True):
    """What GET_ALL_TOPIC_LIST_FROM_NAMESERVER answers (RocketMQ ``body.TopicList``)."""

    topic_list: list[str] = msgspec.field(default_factory=list, name="topicList")
    broker_addr: str | None = msgspec.field(default=None, name="brokerAddr")


# --- broker registration --------------------------------------------------------------------------
class DataVersion(msgspec.Struct, kw_only=True):
    """Version of a broker's topic table (RocketMQ ``DataVersion``); equal versions mean unchanged."""

    state_version: int = msgspec.field(default=0, name="stateVersion")
    timestamp: int = 0
    """Milliseconds since the epoch of the last change."""
    counter: int = 0


class TopicConfig(msgspec.Struct, kw_only=True):
    """One topic of a broker (RocketMQ ``common.TopicConfig``; its defaults: 16 queues, perm 6)."""

    topic_name: str = msgspec.field(name="topicName")
    read_queue_nums: int = msgspec.field(default=16, name="readQueueNums")
    write_queue_nums: int = msgspec.field(default=16, name="writeQueueNums")
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = msgspec.field(default=_SINGLE_TAG, name="topicFilterType")
    topic_sys_flag: int = msgspec.field(default=0, name="topicSysFlag")
    order: bool = False
    attributes: dict[str, str] = msgspec.field(default_factory=dict)


class TopicConfigSerializeWrapper(msgspec.Struct, kw_only=True):
    """A broker's topic table and its version (RocketMQ ``TopicConfigSerializeWrapper``; the 5.x
    subclass ``TopicConfigAndMappingSerializeWrapper`` adds static-topic mappings, not modelled)."""

    topic_config_table: dict[str, TopicConfig] = msgspec.field(
        default_factory=dict, name="topicConfigTable")
    data_version: DataVersion = msgspec.field(default_factory=DataVersion, name="dataVersion")


class RegisterBrokerBody(msgspec.Struct, kw_only=True):
    """Body of REGISTER_BROKER (RocketMQ ``body.RegisterBrokerBody``)."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = msgspec.field(
        default_factory=TopicConfigSerializeWrapper, name="topicConfigSerializeWrapper")
    filter_server_list: list[str] = msgspec.field(default_factory=list, name="filterServerList")


# --- headers (extFields) --------------------------------------------------------------------------
class GetRouteInfoRequestHeader(msgspec.Struct, kw_only=True):
    """GET_ROUTEINFO_BY_TOPIC (RocketMQ ``namesrv.GetRouteInfoRequestHeader``)."""

    topic: str
    accept_standard_json_only: bool | None = msgspec.field(default=None, name="acceptStandardJsonOnly")


class RegisterBrokerRequestHeader(msgspec.Struct, kw_only=True):
    """REGISTER_BROKER (RocketMQ ``namesrv.RegisterBrokerRequestHeader``). ``bodyCrc32`` is
    ``CRC32(body) & 0x7FFFFFFF`` (UtilAll.crc32), 0 for "not checked"; ``masterEpoch`` is a txmq
    extension."""

    broker_name: str = msgspec.field(name="brokerName")
    broker_addr: str = msgspec.field(name="brokerAddr")
    cluster_name: str = msgspec.field(name="clusterName")
    ha_server_addr: str = msgspec.field(name="haServerAddr")
    broker_id: int = msgspec.field(name="brokerId")
    heartbeat_timeout_millis: int | None = msgspec.field(default=None, name="heartbeatTimeoutMillis")
    enable_acting_master: bool | None = msgspec.field(default=None, name="enableActingMaster")
    compressed: bool = False
    body_crc32: int = msgspec.field(default=0, name="bodyCrc32")
    master_epoch: int | None = msgspec.field(default=None, name="masterEpoch")
    """txmq extension: the master epoch of a broker in controller mode (RocketMQ
    ``ReplicasManager.masterEpoch``); None for a classic broker. The name server keeps, per broker
    group, the id-0 entry of the highest epoch (docs/replication.md)."""


class RegisterBrokerResponseHeader(msgspec.Struct, kw_only=True):
    """REGISTER_BROKER answer (RocketMQ ``namesrv.RegisterBrokerResponseHeader``): a slave learns
    its master's addresses."""

    ha_server_addr: str | None = msgspec.field(default=None, name="haServerAddr")
    master_addr: str | None = msgspec.field(default=None, name="masterAddr")


class UnRegisterBrokerRequestHeader(msgspec.Struct, kw_only=True):
    """UNREGISTER_BROKER (RocketMQ ``namesrv.UnRegisterBrokerRequestHeader``)."""

    broker_name: str = msgspec.field(name="brokerName")
    broker_addr: str = msgspec.field(name="brokerAddr")
    cluster_name: str = msgspec.field(name="clusterName")
    broker_id: int = msgspec.field(name="brokerId")


class BrokerHeartbeatRequestHeader(msgspec.Struct, kw_only=True):
    """BROKER_HEARTBEAT, 904 (RocketMQ ``namesrv.BrokerHeartbeatRequestHeader``; note the wire name
    ``heartbeatTimeoutMills``, spelt so in RocketMQ)."""

    cluster_name: str = msgspec.field(name="clusterName")
    broker_addr: str = msgspec.field(name="brokerAddr")
    broker_name: str = msgspec.field(name="brokerName")
    broker_id: int | None = msgspec.field(default=None, name="brokerId")
    epoch: int | None = None
    max_offset: int | None = msgspec.field(default=None, name="maxOffset")
    confirm_offset: int | None = msgspec.field(default=None, name="confirmOffset")
    heartbeat_timeout_mills: int | None = msgspec.field(default=None, name="heartbeatTimeoutMills")
    election_priority: int | None = msgspec.field(default=None, name="electionPriority")


# --- fastjson-compatible JSON ---------------------------------------------------------------------
_WS = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")


def _string_end(data: bytes, i: int) -> int:
    """Index just past the JSON string that opens at ``data[i]`` (a quote); ``len(data)`` if it never
    closes (the JSON decoder then reports the error)."""
    j = i + 1
    while True:
        j = data.find(b'"', j)
        if j < 0:
            return len(data)
        k = j - 1
        while data[k] == 0x5C:  # count the backslashes before this quote
            k -= 1
        if (j - 1 - k) % 2 == 0:
            return j + 1
        j += 1


def quote_int_keys(data: bytes) -> bytes:
    """Standard JSON from fastjson's: every bare integer object key (``{0:"a",-1:"b"}``) is quoted
    (``{"0":"a","-1":"b"}``); strings, values and quoted keys are left as they are.

    A one-pass scanner with a stack of open containers: a key is expected after ``{`` and after a
    ``,`` inside an object, never inside an array or after ``:``, so numbers that are values stay
    numbers and digits inside strings are never touched."""
    out = bytearray()
    stack = bytearray()  # b"{" / b"[" of open containers
    start, i, n = 0, 0, len(data)
    expect_key = False
    while i < n:
        c = data[i]
        if c == 0x22:  # '"'
            i = _string_end(data, i)
            expect_key = False
            continue
        if c == 0x7B:  # '{'
            stack.append(c)
            expect_key = True
        elif c == 0x5B:  # '['
            stack.append(c)
            expect_key = False
        elif c in (0x7D, 0x5D):  # '}' ']'
            if stack:
                stack.pop()
            expect_key = False
        elif c == 0x2C:  # ','
            expect_key = bool(stack) and stack[-1] == 0x7B
        elif c in _WS:
            pass
        elif expect_key and (c == 0x2D or c in _DIGITS):  # a bare key: '-'? digits
            j = i + 1
            while j < n and data[j] in _DIGITS:
                j += 1
            out += data[start:i]
            out += b'"'
            out += data[i:j]
            out += b'"'
            start = i = j
            expect_key = False
            continue
        else:
            expect_key = False
        i += 1
    if start == 0:
        return data
    out += data[start:]
    return bytes(out)


def _json_str(s: str, ascii_only: bool) -> str:
    return json.dumps(s, ensure_ascii=ascii_only)


def _fastjson_parts(value: Any, standard: bool, out: list[str]) -> None:
    """Append the fastjson text of ``value`` to ``out`` (see :func:`encode_fastjson`)."""
    if isinstance(value, msgspec.Struct):
        fields = msgspec.structs.fields(value)
        items = sorted((f.encode_name, getattr(value, f.name)) for f in fields)
        out.append("{")
        first = True
        for name, item in items:
            if item is None:
                continue
            out.append(f"{'' if first else ','}{_json_str(name, standard)}:")
            _fastjson_parts(item, standard, out)
            first = False
        out.append("}")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, str):
        out.append(_json_str(value, standard))
    elif isinstance(value, Mapping):
        out.append("{")
        for n, key in enumerate(sorted(value)):
            sep = "," if n else ""
            is_int = isinstance(key, int) and not isinstance(key, bool)
            text = f'"{key}"' if is_int and standard else str(key) if is_int else _json_str(key, standard)
            out.append(f"{sep}{text}:")
            _fastjson_parts(value[key], standard, out)
        out.append("}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        out.append("[")
        for n, item in enumerate(sorted(value) if isinstance(value, (set, frozenset)) else value):
            if n:
                out.append(",")
            _fastjson_parts(item, standard, out)
        out.append("]")
    elif value is None:
        out.append("null")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as fastjson")


def encode_fastjson(obj: msgspec.Struct, *, standard: bool = False) -> bytes:
    """UTF-8 JSON of ``obj`` as RocketMQ's fastjson 1.x ``JSON.toJSONString`` writes it: struct fields
    sorted by wire name, ``None`` fields omitted, integer map keys bare (``{0:"..."}``), map keys
    sorted. ``standard=True`` is for a client that wants standard JSON (ClientRequestProcessor's
    ``BrowserCompatible, QuoteFieldNames, MapSortField`` for version >= V4_9_4): integer keys
    quoted, non-ASCII characters written as ``\\u`` escapes."""
    out: list[str] = []
    _fastjson_parts(obj, standard, out)
    return "".join(out).encode()


T = TypeVar("T", bound=msgspec.Struct)


def _decode_json(data: bytes, cls: type[T]) -> T:
    try:
        return msgspec.json.decode(quote_int_keys(bytes(data)), type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError) as exc:
        raise MalformedHeader(f"bad {cls.__name__} body: {exc}") from exc


def encode_route(route: TopicRouteData, *, standard: bool = False) -> bytes:
    """The GET_ROUTEINFO_BY_TOPIC body (see :func:`encode_fastjson` for ``standard``)."""
    return encode_fastjson(route, standard=standard)


def wants_standard_json(version: int, accept_standard_json_only: bool | None = None) -> bool:
    """Whether a GET_ROUTEINFO_BY_TOPIC request gets standard JSON (quoted keys): its remoting
    ``version`` is V4_9_4 or later, or its header sets ``acceptStandardJsonOnly``
    (ClientRequestProcessor.getRouteInfoByTopic). Otherwise fastjson's bare keys."""
    return version >= STANDARD_JSON_MIN_VERSION or bool(accept_standard_json_only)


def decode_route(data: bytes) -> TopicRouteData:
    """Parse a route body, fastjson (bare integer keys) or standard JSON.

    Raises:
        MalformedHeader: not a TopicRouteData JSON object.
    """
    return _decode_json(data, TopicRouteData)


def encode_cluster_info(info: ClusterInfo, *, standard: bool = False) -> bytes:
    """The GET_BROKER_CLUSTER_INFO body, as fastjson writes it."""
    return encode_fastjson(info, standard=standard)


def decode_cluster_info(data: bytes) -> ClusterInfo:
    """Parse a cluster info body, fastjson or standard JSON. Raises MalformedHeader."""
    return _decode_json(data, ClusterInfo)


def encode_topic_list(topics: TopicList) -> bytes:
    """The GET_ALL_TOPIC_LIST_FROM_NAMESERVER body."""
    return encode_fastjson(topics)


def decode_topic_list(data: bytes) -> TopicList:
    """Parse a topic list body. Raises MalformedHeader."""
    return _decode_json(data, TopicList)


# --- RegisterBrokerBody: JSON, or RocketMQ's compressed layout ---------------------------------------
#
# Compressed (RegisterBrokerBody.encode(true)): a zlib stream (java.util.zip.Deflater) of
#
#   +---------+------------------+---------+----------------------------------------+
#   | n: i32  | DataVersion JSON | t: i32  | t x ( len: i32 | TopicConfig.encode() ) |
#   +---------+------------------+---------+----------------------------------------+
#   | f: i32  | filterServerList JSON      | m: i32 | m x ( len: i32 | mapping JSON ) |   (m: 5.x)
#   +---------+----------------------------+--------+-------------------------------+
#
# all integers big-endian; TopicConfig.encode() is "name read write perm FILTERTYPE {attributes}".
_I32 = struct.Struct(">i")


def encode_register_body(body: RegisterBrokerBody, *, compressed: bool = False) -> bytes:
    """The REGISTER_BROKER body: fastjson JSON, or RocketMQ's compressed layout (drawn above; it
    drops ``topicSysFlag`` and ``order``, as RocketMQ's does)."""
    if not compressed:
        return encode_fastjson(body)
    wrapper = body.topic_config_serialize_wrapper
    parts = [encode_fastjson(wrapper.data_version)]
    raw = bytearray(_I32.pack(len(parts[0])) + parts[0])
    raw += _I32.pack(len(wrapper.topic_config_table))
    for tc in wrapper.topic_config_table.values():
        attrs = _fastjson_map(tc.attributes)
        line = (f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} "
                f"{tc.topic_filter_type} {attrs}").encode()
        raw += _I32.pack(len(line)) + line
    filters = json.dumps(body.filter_server_list, separators=(",", ":")).encode()
    raw += _I32.pack(len(filters)) + filters + _I32.pack(0)
    return zlib.compress(bytes(raw), 9)


def _fastjson_map(value: Mapping[str, str]) -> str:
    """A ``Map<String, String>`` as fastjson writes it (keys sorted)."""
    out: list[str] = []
    _fastjson_parts(dict(value), False, out)
    return "".join(out)


def _inflate(data: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, REGISTER_BODY_INFLATED_MAX_BYTES)
    except zlib.error as exc:
        raise MalformedHeader(f"bad compressed RegisterBrokerBody: {exc}") from exc
    if inflater.unconsumed_tail:
        raise MalformedHeader(
            f"compressed RegisterBrokerBody inflates beyond {REGISTER_BODY_INFLATED_MAX_BYTES} bytes")
    if not inflater.eof:
        raise MalformedHeader("compressed RegisterBrokerBody is truncated")
    return raw


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw, self.pos = raw, 0

    def chunk(self) -> bytes:
        size = self.int()
        if size < 0 or self.pos + size > len(self.raw):
            raise MalformedHeader("compressed RegisterBrokerBody: a length runs past the end")
        self.pos += size
        return self.raw[self.pos - size:self.pos]

    def int(self) -> int:
        if self.pos + 4 > len(self.raw):
            raise MalformedHeader("compressed RegisterBrokerBody ends early")
        self.pos += 4
        return int(_I32.unpack_from(self.raw, self.pos - 4)[0])


def _topic_config_line(line: bytes) -> TopicConfig:
    """Parse ``TopicConfig.encode()``: ``name read write perm FILTERTYPE [attributes JSON]``."""
    try:
        parts = line.decode().split(" ", 5)
        if len(parts) < 5:
            raise ValueError(f"{len(parts)} fields, want 5 or 6")
        attrs = msgspec.json.decode(parts[5], type=dict[str, str]) if len(parts) > 5 and parts[5] else {}
        return TopicConfig(topic_name=parts[0], read_queue_nums=int(parts[1]),
                           write_queue_nums=int(parts[2]), perm=int(parts[3]),
                           topic_filter_type=parts[4], attributes=attrs)
    except (UnicodeDecodeError, ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedHeader(f"bad TopicConfig line in RegisterBrokerBody: {exc}") from exc


def decode_register_body(data: bytes, *, compressed: bool = False) -> RegisterBrokerBody:
    """Parse a REGISTER_BROKER body: fastjson JSON, or (``compressed``, the header's flag) RocketMQ's
    zlib layout drawn above (RegisterBrokerBody.decode). Static-topic mappings are skipped.

    Raises:
        MalformedHeader: the body does not decode, or inflates beyond
            ``limits.REGISTER_BODY_INFLATED_MAX_BYTES``.
    """
    if not compressed:
        return _decode_json(data, RegisterBrokerBody)
    reader = _Reader(_inflate(data))
    version = _decode_json(reader.chunk(), DataVersion)
    count = reader.int()
    if count < 0:
        raise MalformedHeader(f"compressed RegisterBrokerBody: {count} topics")
    table: dict[str, TopicConfig] = {}
    for _ in range(count):
        tc = _topic_config_line(reader.chunk())
        table[tc.topic_name] = tc
    try:
        filters = msgspec.json.decode(reader.chunk(), type=list[str])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedHeader(f"bad filterServerList in RegisterBrokerBody: {exc}") from exc
    wrapper = TopicConfigSerializeWrapper(topic_config_table=table, data_version=version)
    return RegisterBrokerBody(topic_config_serialize_wrapper=wrapper, filter_server_list=filters)


# --- what a broker announces and answers ----------------------------------------------------------
def topic_configs(topics: Mapping[str, int], *, auto_create_topic_enable: bool = True,
                  default_topic_queue_nums: int = AUTO_CREATE_TOPIC_QUEUE_NUMS,
                  perm: int = PERM_READ | PERM_WRITE) -> dict[str, TopicConfig]:
    """A broker's topic table ``{topic: queue_nums}`` as RocketMQ TopicConfigs (read = write queue
    numbers, ``perm``), plus ``TBW102`` with ``default_topic_queue_nums`` queues and perm
    ``PERM_INHERIT | PERM_READ | PERM_WRITE`` when ``auto_create_topic_enable`` (RocketMQ
    TopicConfigManager; BrokerConfig ``defaultTopicQueueNums`` 8)."""
    table = {name: TopicConfig(topic_name=name, read_queue_nums=n, write_queue_nums=n, perm=perm)
             for name, n in topics.items()}
    if auto_create_topic_enable:
        table[DEFAULT_TOPIC] = TopicConfig(
            topic_name=DEFAULT_TOPIC, read_queue_nums=default_topic_queue_nums,
            write_queue_nums=default_topic_queue_nums, perm=PERM_INHERIT | PERM_READ | PERM_WRITE)
    return table


def broker_route(topic: str, queue_nums: int, broker_name: str, cluster: str, addr: str, *,
                 perm: int = PERM_READ | PERM_WRITE, broker_id: int = MASTER_ID) -> TopicRouteData:
    """The route a lone broker answers for one of its topics (``namesrvAddr = broker``): one
    QueueData with ``queue_nums`` read and write queues, one BrokerData ``{broker_id: addr}``."""
    return TopicRouteData(
        queue_datas=[QueueData(broker_name=broker_name, read_queue_nums=queue_nums,
                               write_queue_nums=queue_nums, perm=perm)],
        broker_datas=[BrokerData(cluster=cluster, broker_name=broker_name,
                                 broker_addrs={broker_id: addr})],
    )


_PORT_MAX = 65_535


def parse_address(addr: str) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``, as name server and broker addresses are written
    (RocketMQ ``namesrvAddr`` lists them separated by ``;``). Raises ConfigError."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= _PORT_MAX:
        raise ConfigError(f"address {addr.strip()!r} is not host:port")
    return host, int(port)
