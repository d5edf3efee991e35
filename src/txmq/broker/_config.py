"""Broker configuration: RocketMQ's knobs with RocketMQ's defaults (names in snake_case)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from txmq import limits
from txmq.broker._tls import TlsConfig
from txmq.errors import ConfigError
from txmq.protocol import (
    CPP_DEFAULT_TRACE_REGION_ID,
    DEFAULT_TRACE_REGION_ID,
    RMQ_SYS_TRACE_TOPIC,
    TRACE_TOPIC_PREFIX,
    is_broker_topic,
    is_valid_topic,
    parse_address,
)
from txmq.store import StoreConfig

__all__ = ["BrokerConfig", "SubscriptionGroupConfig", "load_config", "parse_delay_levels"]


class SubscriptionGroupConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One consumer group's settings (RocketMQ ``SubscriptionGroupConfig``; a ``[groups.<name>]``
    table in TOML). Groups not configured get the defaults."""

    consume_message_orderly: bool = False
    """A FIFO group: pop delivers a queue's messages in order, one in-flight run at a time
    (RocketMQ ``consumeMessageOrderly``)."""
    retry_max_times: int = limits.RETRY_MAX_TIMES
    """Retries before the DLQ; max delivery attempts is this + 1 (RocketMQ ``retryMaxTimes`` 16)."""


class BrokerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything a broker can be configured with.

    Load from a TOML file with :func:`load_config`; unknown keys are an error. Times are in ms.
    """

    host: str = "127.0.0.1"
    port: int = limits.BROKER_PORT
    """Listen port (RocketMQ's broker default ``listenPort`` 10911); 0 picks a free port."""
    broker_name: str = "broker-a"
    """RocketMQ ``brokerName``, as routes name this broker."""
    broker_cluster_name: str = "DefaultCluster"
    """RocketMQ ``brokerClusterName``."""
    namesrv_addr: str = ""
    """Name servers to register with, ``host:port`` separated by ``;`` (RocketMQ
    ``namesrvAddr``); empty: none, clients use the broker itself as their name server."""
    data_dir: str = "./txmq-data"
    flush_disk_type: Literal["SYNC_FLUSH", "ASYNC_FLUSH"] = "SYNC_FLUSH"
    """RocketMQ MessageStoreConfig ``flushDiskType``: SYNC_FLUSH acknowledges after fsync."""
    flush_interval_ms: int = limits.FLUSH_INTERVAL_MS
    """Period of the asynchronous flush (RocketMQ ``flushIntervalCommitLog`` 500 ms)."""
    max_message_size: int = limits.MESSAGE_SIZE_MAX_BYTES
    auto_create_topic_enable: bool = False
    """RocketMQ defaults this to true; txmq refuses unknown topics unless enabled."""
    default_topic_queue_nums: int = limits.DEFAULT_QUEUE_NUMS
    topics: dict[str, int] = msgspec.field(default_factory=dict)
    """Topics (name to queue count) created at start."""
    trace_topic_enable: bool = False
    """Create the message trace topics at start, one queue each (RocketMQ ``traceTopicEnable``,
    false there too): ``msg_trace_topic_name``, and (txmq) the region topics the C++ client writes,
    ``rmq_sys_TRACE_DATA_<region_id>`` and ``rmq_sys_TRACE_DATA_DEFAULT_REGION``; and (txmq: RocketMQ
    does it always) give every stored message the ``MSG_REGION`` and ``TRACE_ON`` properties,
    without which RocketMQ's Java consumers write no consume records (docs/tracing.md)."""
    msg_trace_topic_name: str = RMQ_SYS_TRACE_TOPIC
    """The trace topic ``trace_topic_enable`` creates (RocketMQ ``msgTraceTopicName``)."""
    region_id: str = DEFAULT_TRACE_REGION_ID
    """This broker's region (RocketMQ ``regionId``, ``DefaultRegion``), sent in send responses'
    ``MSG_REGION`` with ``trace_topic_enable``: clients put it in their trace records and the C++
    client names its trace topic after it."""
    trace_on: bool = True
    """Sent in send responses' ``TRACE_ON`` (RocketMQ ``traceOn``) with ``trace_topic_enable``, and
    always when false: false tells clients not to write trace records of the messages sent here."""
    groups: dict[str, SubscriptionGroupConfig] = msgspec.field(default_factory=dict)
    """Consumer group settings by group name (FIFO, retries); unknown groups get the defaults."""
    transaction_timeout_ms: int = limits.TRANSACTION_TIMEOUT_MS
    transaction_check_interval_ms: int = limits.TRANSACTION_CHECK_INTERVAL_MS
    transaction_check_max: int = limits.TRANSACTION_CHECK_MAX
    transaction_checks_in_flight_max: int = limits.TRANSACTION_CHECKS_IN_FLIGHT_MAX
    """Check-backs outstanding at once (back-pressure on the checker)."""
    file_reserved_time_ms: int = limits.FILE_RESERVED_TIME_MS
    reject_transaction_message: bool = False
    transaction_trace_max: int = limits.TRANSACTION_TRACE_MAX
    """Transactions whose life (half stored, check-backs and their answers, end) the broker keeps
    in memory for GET_TRANSACTION_TRACE and the console: up to this many pending and this many
    recently settled ones (docs/tracing.md, "The broker's leg"); 0 records nothing."""
    otlp_endpoint: str = ""
    """Export the transactions' lives as OpenTelemetry spans over OTLP/HTTP to this URL (e.g.
    ``http://127.0.0.1:4318/v1/traces``), in the producer's trace (extra ``otlp``); "" = off."""
    otlp_file: str = ""
    """Export the same spans as OTLP JSON lines appended to this file (one
    ``ExportTraceServiceRequest`` per line, as the OpenTelemetry Collector's file exporter
    writes them); "" = off."""
    broker_role: Literal["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"] = "ASYNC_MASTER"
    """RocketMQ ``brokerRole`` (docs/replication.md): a SLAVE replicates its master's commit log,
    serves pulls, refuses sends (SERVICE_NOT_AVAILABLE) and end transaction (SLAVE_NOT_AVAILABLE)
    and runs no check-back, delay delivery or pop revive; a SYNC_MASTER answers a send only once
    its slaves acknowledged it."""
    broker_id: int = 0
    """RocketMQ ``brokerId``: 0 for a master, > 0 for a slave of the group ``broker_name``."""
    ha_listen_port: int = 0
    """Port a master serves its slaves on (RocketMQ ``haListenPort``); 0: ``port + 1``, as
    RocketMQ's BrokerStartup sets it (a free port when ``port`` is 0); -1: no HA listener."""
    ha_master_address: str = ""
    """``host:port`` of the master's HA listener, for a SLAVE (RocketMQ ``haMasterAddress``)."""
    ha_access_key: str = ""
    """A SLAVE's ACL account for its master's HA handshake (a user of the master's ``acl_file``
    allowed All on ``Cluster:<broker_cluster_name>``); needed when the master has ACL on, and
    must be empty when it has not (docs/replication.md)."""
    ha_secret_key: str = ""
    """The secret key of ``ha_access_key``."""
    total_replicas: int = 2
    """Copies of the commit log in the group, the master included (RocketMQ ``totalReplicas``,
    default 1; txmq assumes one slave, the smallest group that replicates)."""
    in_sync_replicas: int = 0
    """Copies, the master included, a SYNC_MASTER waits for before it answers a send (RocketMQ
    ``inSyncReplicas``, default 1 so RocketMQ 5 waits for no slave); 0: ``total_replicas``, all."""
    sync_flush_timeout_ms: int = limits.HA_SLAVE_TIMEOUT_MS
    """Longest a SYNC_MASTER waits for slave acknowledgements before it answers
    FLUSH_SLAVE_TIMEOUT (RocketMQ ``slaveTimeout``, 3 s)."""
    ha_max_gap_not_in_sync: int = limits.HA_MAX_GAP_NOT_IN_SYNC_BYTES
    """A SYNC_MASTER answers SLAVE_NOT_AVAILABLE at once when no slave is within this many bytes
    (RocketMQ ``haMaxGapNotInSync``, 256 MiB)."""
    slave_read_enable: bool = True
    """Consumers that lag are told to pull from a slave, and a SLAVE serves pulls (RocketMQ
    ``slaveReadEnable``, default false there; docs/replication.md "Reads from the slave")."""
    access_message_in_memory_max_bytes: int = 0
    """A pull that leaves more than this many bytes of commit log behind it suggests the slave
    (RocketMQ ``accessMessageInMemoryMaxRatio``); 0: ``ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO_PERCENT``
    (40) of physical memory, as RocketMQ."""
    enable_controller_mode: bool = False
    """Controller mode (RocketMQ BrokerConfig ``enableControllerMode``, RIP-44): the controller
    gives this broker its id and role (master or slave) and fails the group over; ``broker_role``
    and ``broker_id`` must then not be set (docs/replication.md "Controller mode")."""
    controller_addr: str = ""
    """The controllers, ``host:port`` separated by ``;`` (RocketMQ ``controllerAddr``); needed in
    controller mode."""
    broker_heartbeat_interval_ms: int = limits.BROKER_HEARTBEAT_INTERVAL_MS
    """Period of BROKER_HEARTBEAT to the controller (RocketMQ ``brokerHeartbeatInterval``, 1 s)."""
    controller_lease_ms: int = limits.CONTROLLER_LEASE_MS
    """A master's write lease from its heartbeat's send time (txmq; docs/replication.md
    "Fencing"); must exceed ``broker_heartbeat_interval_ms``."""
    controller_heartbeat_timeout_ms: int = limits.CONTROLLER_HEARTBEAT_TIMEOUT_MS
    """Silence after which the controller deems this broker inactive (RocketMQ
    ``controllerHeartBeatTimeoutMills``, 10 s there)."""
    broker_election_priority: int = 0
    """Tie-break among equally caught-up candidates, lower preferred (RocketMQ
    ``brokerElectionPriority``)."""
    min_in_sync_replicas: int = limits.MIN_IN_SYNC_REPLICAS
    """A controller-mode master answers IN_SYNC_REPLICAS_NOT_ENOUGH to a send while its
    SyncStateSet is smaller (RocketMQ ``minInSyncReplicas``)."""
    all_ack_in_sync_state_set: bool = True
    """A controller-mode master answers a send once every SyncStateSet member has it (RocketMQ
    ``allAckInSyncStateSet``)."""
    ha_max_time_slave_not_catchup_ms: int = limits.HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS
    """A slave behind the master's end this long leaves the SyncStateSet (RocketMQ
    ``haMaxTimeSlaveNotCatchup``, 15 s)."""
    message_delay_level: str = limits.MESSAGE_DELAY_LEVELS
    metrics_port: int = 0
    """Prometheus endpoint port; 0 turns it off."""
    grpc_port: int = 0
    """Port of the gRPC door (RocketMQ 5's ``apache.rocketmq.v2.MessagingService``, the protocol
    of the 5.x clients; the proxy's default is ``limits.GRPC_PORT_DEFAULT`` 8081) on ``host``;
    0 turns it off."""
    grpc_min_invisible_time_ms: int = limits.GRPC_INVISIBLE_MIN_RECV_MS
    """Shortest invisible time a gRPC ReceiveMessage may ask for (RocketMQ
    ``ProxyConfig.minInvisibleTimeMillsForRecv``, 10 s); shorter ones are ILLEGAL_INVISIBLE_TIME."""
    max_connections: int = 0
    """Most client connections at once; one more is answered SYSTEM_BUSY and closed. 0: the
    file-descriptor limit less ``limits.CONNECTION_FD_RESERVE``, at most
    ``limits.CONNECTIONS_MAX``."""
    buffer_budget_bytes: int = limits.BUFFER_BUDGET_BYTES
    """Bytes of partial frames and unsent replies over all connections (back-pressure above)."""
    channel_idle_max_ms: int = limits.CHANNEL_IDLE_MAX_MS
    """Close a connection idle this long (RocketMQ ``serverChannelMaxIdleTimeSeconds``); 0: never."""
    acl_enable: bool = False
    """Authenticate and authorize every request on both doors (RocketMQ ``authenticationEnabled``
    and ``authorizationEnabled``) against the users and policies of ``acl_file``
    (docs/security.md). Off by default, like RocketMQ's."""
    acl_file: str = ""
    """The accounts file (TOML: users, secret keys, policies); re-read when it changes."""
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    """The ``[tls]`` table (RocketMQ ``TlsSystemConfig``): TLS of the remoting port, the gRPC port
    and the metrics endpoint, ``server_mode`` disabled / permissive / enforcing (docs/security.md)."""
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    """The ``[store]`` table: :class:`~txmq.store.StoreConfig` (RocketMQ MessageStoreConfig names:
    segment size, retention hour, disk ratios, index). ``file_reserved_time_ms`` is set at the top
    level (the transaction checker uses it too) and ``store_host`` defaults to ``host:port``."""

    def _validate_ha(self) -> None:
        """RocketMQ BrokerStartup's role rules, and the ranges of the replication knobs."""
        if self.broker_role == "SLAVE" and self.broker_id <= 0:
            raise ConfigError("a SLAVE's broker_id must be > 0 (RocketMQ: \"Slave's brokerId must "
                              "be > 0\")")
        if self.broker_role != "SLAVE" and self.broker_id != 0:
            raise ConfigError(f"a {self.broker_role}'s broker_id must be 0")
        if not -1 <= self.ha_listen_port <= limits.PORT_MAX:
            raise ConfigError(f"ha_listen_port {self.ha_listen_port} out of range")
        if self.ha_master_address:
            try:
                parse_address(self.ha_master_address)
            except ConfigError as exc:
                raise ConfigError(f"ha_master_address: {exc}") from exc
        if bool(self.ha_access_key) != bool(self.ha_secret_key):
            raise ConfigError("ha_access_key and ha_secret_key go together")
        if self.total_replicas < 1 or not 0 <= self.in_sync_replicas <= self.total_replicas:
            raise ConfigError("need 1 <= total_replicas and 0 <= in_sync_replicas <= total_replicas")
        if self.sync_flush_timeout_ms <= 0 or self.ha_max_gap_not_in_sync <= 0:
            raise ConfigError("sync_flush_timeout_ms and ha_max_gap_not_in_sync must be positive")
        if self.access_message_in_memory_max_bytes < 0:
            raise ConfigError("access_message_in_memory_max_bytes must not be negative")
        self._validate_controller()

    def trace_topics(self) -> list[str]:
        """The trace topics ``trace_topic_enable`` creates: ``msg_trace_topic_name``, then the
        region topics of ``region_id`` and of the C++ client's default region."""
        regions = (TRACE_TOPIC_PREFIX + self.region_id, TRACE_TOPIC_PREFIX + CPP_DEFAULT_TRACE_REGION_ID)
        return list(dict.fromkeys((self.msg_trace_topic_name, *regions)))

    def controller_addresses(self) -> list[str]:
        """``controller_addr`` split into ``host:port`` items (empty ones dropped)."""
        return [a.strip() for a in self.controller_addr.split(";") if a.strip()]

    def _validate_controller(self) -> None:
        """Controller mode's rules: a controller to talk to, no static role, sane timers."""
        for name in ("broker_heartbeat_interval_ms", "controller_lease_ms",
                     "controller_heartbeat_timeout_ms", "ha_max_time_slave_not_catchup_ms",
                     "min_in_sync_replicas"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.controller_lease_ms <= self.broker_heartbeat_interval_ms:
            raise ConfigError("controller_lease_ms must exceed broker_heartbeat_interval_ms, or "
                              "the lease lapses between two renewals")
        addrs = self.controller_addresses()
        if len(addrs) > limits.CONTROLLER_ADDRESSES_MAX:
            raise ConfigError(f"controller_addr names more than {limits.CONTROLLER_ADDRESSES_MAX}")
        for addr in addrs:
            try:
                parse_address(addr)
            except ConfigError as exc:
                raise ConfigError(f"controller_addr: {exc}") from exc
        if not self.enable_controller_mode:
            return
        if not addrs:
            raise ConfigError("enable_controller_mode needs controller_addr (host:port;host:port…)")
        if self.broker_role != "ASYNC_MASTER" or self.broker_id != 0:
            raise ConfigError("in controller mode the controller assigns broker_role and broker_id:"
                              " do not set them")
        if self.ha_master_address:
            raise ConfigError("in controller mode the controller names the master: do not set "
                              "ha_master_address")

    def validate(self) -> BrokerConfig:
        """Check ranges. Raises ConfigError."""
        if not 0 <= self.port <= limits.PORT_MAX:
            raise ConfigError(f"port {self.port} out of range")
        if not 0 <= self.grpc_port <= limits.PORT_MAX:
            raise ConfigError(f"grpc_port {self.grpc_port} out of range")
        if not 1 <= self.grpc_min_invisible_time_ms <= limits.GRPC_INVISIBLE_MAX_MS:
            raise ConfigError(f"grpc_min_invisible_time_ms must be 1..{limits.GRPC_INVISIBLE_MAX_MS}")
        for addr in filter(None, (a.strip() for a in self.namesrv_addr.split(";"))):
            try:
                parse_address(addr)
            except ConfigError as exc:
                raise ConfigError(f"namesrv_addr: {exc}") from exc
        for name in ("transaction_timeout_ms", "transaction_check_interval_ms",
                     "transaction_check_max", "max_message_size", "default_topic_queue_nums"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.transaction_trace_max < 0:
            raise ConfigError("transaction_trace_max must not be negative")
        if (self.otlp_endpoint or self.otlp_file) and not self.transaction_trace_max:
            raise ConfigError("otlp_endpoint and otlp_file export the transactions' lives: they "
                              "need transaction_trace_max > 0")
        if self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"otlp_endpoint {self.otlp_endpoint[:200]!r} is not an http(s) URL")
        if self.max_connections < 0 or self.channel_idle_max_ms < 0:
            raise ConfigError("max_connections and channel_idle_max_ms must not be negative")
        if self.buffer_budget_bytes < limits.FRAME_SIZE_MAX_BYTES:
            raise ConfigError(f"buffer_budget_bytes must hold one largest frame "
                              f"({limits.FRAME_SIZE_MAX_BYTES} bytes)")
        if self.max_message_size > limits.MESSAGE_SIZE_CONFIG_MAX_BYTES:
            raise ConfigError("max_message_size above 16 MiB does not fit a frame")
        for topic, n in self.topics.items():
            if not is_valid_topic(topic) or is_broker_topic(topic):
                raise ConfigError(f"topic {topic[:160]!r}: not a legal topic name, or a broker topic")
            if not 0 < n <= limits.QUEUE_NUMS_MAX:
                raise ConfigError(f"topic {topic!r}: queue count {n} not in 1..{limits.QUEUE_NUMS_MAX}")
        for group, gc in self.groups.items():
            if not is_valid_topic(group) or len(group) > limits.GROUP_NAME_MAX_CHARS:
                raise ConfigError(f"groups: {group[:160]!r} is not a legal group name")
            if gc.retry_max_times < 0:
                raise ConfigError(f"groups.{group}: retry_max_times must not be negative")
        parse_delay_levels(self.message_delay_level)
        for topic in self.trace_topics():
            if not is_valid_topic(topic) or is_broker_topic(topic):
                raise ConfigError(f"trace topic {topic[:160]!r} (msg_trace_topic_name, region_id): "
                                  f"not a legal topic name, or a broker topic")
        self._validate_ha()
        if self.acl_enable and not self.acl_file:
            raise ConfigError("acl_enable needs acl_file, the accounts file (see docs/security.md)")
        if self.store.file_reserved_time_ms not in (limits.FILE_RESERVED_TIME_MS,
                                                    self.file_reserved_time_ms):
            raise ConfigError("set file_reserved_time_ms at the top level, not in [store]: the "
                              "transaction checker uses it too")
        self.store.validate()
        self.tls.validate()
        return self


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> list[int]:
    """``"1s 5s 10s 30s 1m …"`` → delays in ms, level 1 first (RocketMQ ``messageDelayLevel``).

    Raises:
        ConfigError: a token is not a number followed by s, m, h or d (``ms`` is accepted too).
    """
    out = []
    for tok in spec.split():
        try:
            if tok.endswith("ms"):
                out.append(int(tok[:-2]))
            else:
                out.append(int(tok[:-1]) * _UNITS_MS[tok[-1]])
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"bad delay level {tok!r} in {spec!r}") from exc
    if not out:
        raise ConfigError("message_delay_level is empty")
    return out


def load_config(path: Path | None, **overrides: object) -> BrokerConfig:
    """Read a TOML config file (or none) and apply non-None overrides.

    Raises:
        ConfigError: unreadable file, unknown key, wrong type or value out of range.
    """
    data: dict[str, object] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    data.update({k: v for k, v in overrides.items() if v is not None})
    if data.get("enable_controller_mode") is True:
        static = sorted({"broker_role", "broker_id"} & data.keys())
        if static:
            raise ConfigError(f"in controller mode the controller assigns broker_role and "
                              f"broker_id: do not set {', '.join(static)}")
    try:
        return msgspec.convert(data, BrokerConfig).validate()
    except msgspec.ValidationError as exc:
        raise ConfigError(f"config: {exc}") from exc
