"""The broker's side of the name server, sans-IO: the REGISTER_BROKER, UNREGISTER_BROKER and
BROKER_HEARTBEAT requests a broker sends (RocketMQ BrokerOuterAPI ``registerBrokerAll``,
``unregisterBrokerAll``, ``sendHeartbeat``).

The broker's shell keeps one :class:`BrokerRegistration`, sends :meth:`~BrokerRegistration.register`
at start and whenever :meth:`~BrokerRegistration.due` says so (every
``REGISTER_NAME_SERVER_PERIOD_MS``, RocketMQ BrokerConfig ``registerNameServerPeriod``), and
:meth:`~BrokerRegistration.unregister` at shutdown.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import msgspec

from txmq.limits import (
    AUTO_CREATE_TOPIC_QUEUE_NUMS,
    CLUSTER_TOPIC_QUEUE_NUMS,
    REGISTER_NAME_SERVER_PERIOD_MS,
)
from txmq.protocol import (
    DEFAULT_CLUSTER_NAME,
    MASTER_ID,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    SERIALIZE_JSON,
    BrokerHeartbeatRequestHeader,
    Command,
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RequestCode,
    TopicConfig,
    TopicConfigSerializeWrapper,
    UnRegisterBrokerRequestHeader,
    encode_register_body,
    to_ext,
    topic_configs,
)

__all__ = ["BrokerRegistration"]


class BrokerRegistration:
    """What one broker tells name servers about itself.

    Args:
        broker_name: RocketMQ ``brokerName``.
        broker_addr: ``"ip:port"`` clients connect to.
        cluster: RocketMQ ``brokerClusterName`` (``DefaultCluster``).
        broker_id: 0 for a master (RocketMQ ``brokerId``).
        ha_server_addr: ``"ip:port"`` of the master's HA listener (RocketMQ ``haServerAddr``);
            the name server hands it to the group's slaves.
        auto_create_topic_enable: also announce ``TBW102`` (RocketMQ ``autoCreateTopicEnable``).
        default_topic_queue_nums: TBW102's queues (RocketMQ ``defaultTopicQueueNums`` 8).
        perm: permission of every topic (RocketMQ ``brokerPermission``, read | write).
        compressed: send RocketMQ's compressed body (``compressedRegister``, off by default).
        serialize_type: header codec of the requests.

    Attributes:
        master_epoch: None for a classic broker; in controller mode the broker's master epoch,
            sent as ``masterEpoch`` (txmq extension) so the name server keeps the newest master of
            the group at id 0. The broker sets it (with ``broker_id``) on every role change.
    """

    def __init__(self, broker_name: str, broker_addr: str, *, cluster: str = DEFAULT_CLUSTER_NAME,
                 broker_id: int = MASTER_ID, auto_create_topic_enable: bool = True,
                 default_topic_queue_nums: int = AUTO_CREATE_TOPIC_QUEUE_NUMS,
                 perm: int = PERM_READ | PERM_WRITE, compressed: bool = False,
                 serialize_type: int = SERIALIZE_JSON,
                 period_ms: int = REGISTER_NAME_SERVER_PERIOD_MS, ha_server_addr: str = "") -> None:
        self.broker_name, self.broker_addr, self.cluster = broker_name, broker_addr, cluster
        self.broker_id, self.ha_server_addr = broker_id, ha_server_addr
        self.master_epoch: int | None = None
        self._auto_create = auto_create_topic_enable
        self._default_queues = default_topic_queue_nums
        self._perm, self._compressed, self._serialize = perm, compressed, serialize_type
        self._period_ms = period_ms
        self._table: dict[str, TopicConfig] | None = None
        self.data_version = DataVersion()
        self._next_ms: int | None = None

    def set_role(self, broker_id: int, master_epoch: int | None) -> None:
        """A role change (controller mode: the controller named this broker master or slave of
        ``master_epoch``): the next registration carries the new id and epoch and is due at once,
        so the name server's route moves within the registrar's next check
        (``NAMESRV_REGISTER_CHECK_MS``), not at the next periodic registration (30 s)."""
        if (broker_id, master_epoch) != (self.broker_id, self.master_epoch):
            self.broker_id, self.master_epoch = broker_id, master_epoch
            self._next_ms = None

    def due(self, now_ms: int) -> bool:
        """True when the next periodic registration should go out."""
        return self._next_ms is None or now_ms >= self._next_ms

    def register(self, topics: Mapping[str, int], now_ms: int, opaque: int = 0) -> Command:
        """The REGISTER_BROKER request for the topic table ``{topic: queue_nums}``. The data version
        (RocketMQ ``DataVersion.nextVersion``) moves when the table changed since the last call,
        so the name server updates only then. Schedules the next registration."""
        table = topic_configs(topics, auto_create_topic_enable=self._auto_create,
                              default_topic_queue_nums=self._default_queues, perm=self._perm)
        # Every RocketMQ broker also announces a topic named after its cluster (16 queues,
        # ``clusterTopicEnable``) and one named after itself (1 queue, ``brokerTopicEnable``),
        # perm inherit|read|write (TopicConfigManager.init). With them a registration never lists
        # a single topic, which RouteInfoManager takes for a single-topic update and refuses from
        # a broker it does not know yet (a broker with no topic of its own was refused).
        table.setdefault(self.cluster, TopicConfig(
            topic_name=self.cluster, read_queue_nums=CLUSTER_TOPIC_QUEUE_NUMS,
            write_queue_nums=CLUSTER_TOPIC_QUEUE_NUMS,
            perm=PERM_INHERIT | PERM_READ | PERM_WRITE))
        table.setdefault(self.broker_name, TopicConfig(
            topic_name=self.broker_name, read_queue_nums=1, write_queue_nums=1,
            perm=PERM_INHERIT | PERM_READ | PERM_WRITE))
        if table != self._table:
            self._table = table
            self.data_version = DataVersion(timestamp=now_ms, counter=self.data_version.counter + 1)
        self._next_ms = now_ms + self._period_ms
        body = encode_register_body(RegisterBrokerBody(
            topic_config_serialize_wrapper=TopicConfigSerializeWrapper(
                topic_config_table=table, data_version=msgspec.structs.replace(self.data_version))),
            compressed=self._compressed)
        header = RegisterBrokerRequestHeader(
            broker_name=self.broker_name, broker_addr=self.broker_addr, cluster_name=self.cluster,
            ha_server_addr=self.ha_server_addr, broker_id=self.broker_id, enable_acting_master=False,
            compressed=self._compressed, body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
            master_epoch=self.master_epoch)
        return Command(RequestCode.REGISTER_BROKER, opaque, ext=to_ext(header), body=body,
                       serialize_type=self._serialize)

    def unregister(self, opaque: int = 0) -> Command:
        """The UNREGISTER_BROKER request a broker sends at shutdown."""
        header = UnRegisterBrokerRequestHeader(
            broker_name=self.broker_name, broker_addr=self.broker_addr, cluster_name=self.cluster,
            broker_id=self.broker_id)
        return Command(RequestCode.UNREGISTER_BROKER, opaque, ext=to_ext(header),
                       serialize_type=self._serialize)

    def heartbeat(self, opaque: int = 0) -> Command:
        """A BROKER_HEARTBEAT request (RocketMQ sends it one-way; set ``FLAG_ONEWAY`` for that)."""
        header = BrokerHeartbeatRequestHeader(
            cluster_name=self.cluster, broker_addr=self.broker_addr, broker_name=self.broker_name,
            broker_id=self.broker_id)
        return Command(RequestCode.BROKER_HEARTBEAT, opaque, ext=to_ext(header),
                       serialize_type=self._serialize)
