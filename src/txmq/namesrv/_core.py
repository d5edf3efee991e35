"""The name server's tables and request handling, sans-IO (RocketMQ ``RouteInfoManager`` and
``DefaultRequestProcessor`` / ``ClientRequestProcessor``).

:class:`NameServerCore` takes a request :class:`~txmq.protocol.Command`, the time ``now_ms`` and an
opaque connection key, and returns the response command (``None`` for a one-way request). It owns no
socket and reads no clock: the shell calls :meth:`NameServerCore.scan_inactive` every
``SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS`` and :meth:`NameServerCore.connection_closed` when a
connection ends.

Tables (as RocketMQ's)::

    topic_queue   {topic: {brokerName: QueueData}}
    broker_addr   {brokerName: BrokerData}            (cluster, {brokerId: addr})
    cluster_addr  {clusterName: {brokerName}}
    broker_live   {(clusterName, brokerAddr): _Live}  (last update, timeout, DataVersion, connection)
    filter_server {(clusterName, brokerAddr): [addr]}

Not modelled: KV config, static-topic mappings, the slave-acting-master route rewrite (RocketMQ's
``supportActingMaster`` is off by default), QUERY_DATA_VERSION (brokers send it only with
``forceRegister`` off), write-permission wipe/add.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import msgspec

from txmq.errors import MalformedHeader, ResponseCode
from txmq.limits import BROKER_CHANNEL_EXPIRED_TIME_MS
from txmq.protocol import (
    MASTER_ID,
    PERM_WRITE,
    BrokerData,
    BrokerHeartbeatRequestHeader,
    ClusterInfo,
    Command,
    DataVersion,
    DeleteTopicFromNamesrvRequestHeader,
    GetRouteInfoRequestHeader,
    QueueData,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    RequestCode,
    TopicConfig,
    TopicList,
    TopicRouteData,
    UnRegisterBrokerRequestHeader,
    decode_register_body,
    encode_cluster_info,
    encode_route,
    encode_topic_list,
    from_ext,
    to_ext,
    wants_standard_json,
)

__all__ = ["NameServerCore", "topic_not_exist_remark"]

log = logging.getLogger("txmq.namesrv")

_FAQ_SUGGESTION = "\nSee https://rocketmq.apache.org/docs/bestPractice/06FAQ for further details."
"""RocketMQ ``FAQUrl.suggestTodo(FAQUrl.APPLY_TOPIC_URL)``, appended to TOPIC_NOT_EXIST remarks."""


def topic_not_exist_remark(topic: str) -> str:
    """RocketMQ ClientRequestProcessor's remark for a topic without a route."""
    return f"No topic route info in name server for the topic: {topic}{_FAQ_SUGGESTION}"


@dataclass
class _Live:
    """RocketMQ ``BrokerLiveInfo``."""

    last_update_ms: int
    timeout_ms: int
    data_version: DataVersion
    conn: Hashable | None
    ha_server_addr: str


_BrokerKey = tuple[str, str]  # (clusterName, brokerAddr): RocketMQ BrokerAddrInfo


class NameServerCore:
    """Route tables of a name server and the handling of its requests.

    Args:
        delete_topic_with_broker_registration: a registration drops the broker's topics it no longer
            lists (RocketMQ NamesrvConfig ``deleteTopicWithBrokerRegistration``, default off).
        enable_all_topic_list: answer GET_ALL_TOPIC_LIST_FROM_NAMESERVER (``enableAllTopicList``).
    """

    def __init__(self, *, delete_topic_with_broker_registration: bool = False,
                 enable_all_topic_list: bool = True) -> None:
        self.topic_queue: dict[str, dict[str, QueueData]] = {}
        self.broker_addr: dict[str, BrokerData] = {}
        self.cluster_addr: dict[str, dict[str, None]] = {}  # an ordered set of broker names
        self.broker_live: dict[_BrokerKey, _Live] = {}
        self.filter_server: dict[_BrokerKey, list[str]] = {}
        self.master_epoch: dict[str, tuple[int, str]] = {}
        """brokerName → (master epoch, address) of the newest master registered with an epoch
        (txmq, controller mode); kept after the master leaves, so a stale master that comes back
        with an older epoch is still refused id 0."""
        self._stale_logged: set[tuple[str, str, int]] = set()
        self._delete_topics = delete_topic_with_broker_registration
        self._all_topic_list = enable_all_topic_list
        self._handlers: dict[int, Callable[[Command, int, Hashable | None], Command]] = {
            RequestCode.REGISTER_BROKER: self._on_register,
            RequestCode.UNREGISTER_BROKER: self._on_unregister,
            RequestCode.BROKER_HEARTBEAT: self._on_heartbeat,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._on_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._on_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._on_topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._on_delete_topic,
        }

    # --- requests ---------------------------------------------------------------------------------
    def handle(self, request: Command, now_ms: int, conn: Hashable | None = None) -> Command | None:
        """Answer one request; ``None`` when it is one-way. Never raises on bad input: an unknown
        code gets REQUEST_CODE_NOT_SUPPORTED, a header or body that does not decode SYSTEM_ERROR
        with the decoder's remark (RocketMQ NettyRemotingAbstract)."""
        handler = self._handlers.get(request.code)
        if handler is None:
            response = request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                        f" request type {request.code} not supported")
        else:
            try:
                response = handler(request, now_ms, conn)
            except MalformedHeader as exc:
                response = request.response(ResponseCode.SYSTEM_ERROR, str(exc))
        return None if request.is_oneway else response

    def _on_register(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        header = from_ext(request.ext, RegisterBrokerRequestHeader)
        if header.body_crc32 != 0 and (zlib.crc32(request.body) & 0x7FFFFFFF) != header.body_crc32:
            return request.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        body = (decode_register_body(request.body, compressed=header.compressed) if request.body
                else RegisterBrokerBody())
        result = self.register_broker(header, body, now_ms, conn)
        if result is None:
            return request.response(ResponseCode.SYSTEM_ERROR, "register broker failed")
        return request.response(ResponseCode.SUCCESS, ext=to_ext(result))

    def _on_unregister(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        self.unregister_broker(from_ext(request.ext, UnRegisterBrokerRequestHeader))
        return request.response(ResponseCode.SUCCESS)

    def _on_heartbeat(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        header = from_ext(request.ext, BrokerHeartbeatRequestHeader)
        self.heartbeat(header.cluster_name, header.broker_addr, now_ms)
        return request.response(ResponseCode.SUCCESS)

    def _on_route(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        header = from_ext(request.ext, GetRouteInfoRequestHeader)
        route = self.route(header.topic)
        if route is None:
            return request.response(ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(header.topic))
        standard = wants_standard_json(request.version, header.accept_standard_json_only)
        return request.response(ResponseCode.SUCCESS, body=encode_route(route, standard=standard))

    def _on_cluster_info(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        return request.response(ResponseCode.SUCCESS, body=encode_cluster_info(self.cluster_info()))

    def _on_topic_list(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        if not self._all_topic_list:
            return request.response(ResponseCode.SYSTEM_ERROR, "disable")
        return request.response(ResponseCode.SUCCESS, body=encode_topic_list(self.topic_list()))

    def _on_delete_topic(self, request: Command, now_ms: int, conn: Hashable | None) -> Command:
        h = from_ext(request.ext, DeleteTopicFromNamesrvRequestHeader)
        self.delete_topic(h.topic, h.cluster_name)
        return request.response(ResponseCode.SUCCESS)

    # --- the tables -------------------------------------------------------------------------------
    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """Forget ``topic``'s routes: on every broker, or only on ``cluster``'s brokers
        (RocketMQ ``RouteInfoManager.deleteTopic``). An unknown topic is not an error."""
        queues = self.topic_queue.get(topic)
        if queues is None:
            return
        for name in list(queues) if cluster is None else list(self.cluster_addr.get(cluster, {})):
            queues.pop(name, None)
        if not queues:
            del self.topic_queue[topic]

    def register_broker(self, header: RegisterBrokerRequestHeader, body: RegisterBrokerBody,
                        now_ms: int, conn: Hashable | None = None) -> RegisterBrokerResponseHeader | None:
        """Record a broker and its topics (RocketMQ ``RouteInfoManager.registerBroker``).

        Returns the response header (a slave learns its master's address), or ``None`` when the
        registration is refused: a single-topic registration from a broker id not yet registered.
        """
        cluster, name, addr, broker_id = (header.cluster_name, header.broker_name,
                                          header.broker_addr, header.broker_id)
        wrapper = body.topic_config_serialize_wrapper
        self.cluster_addr.setdefault(cluster, {})[name] = None
        data = self.broker_addr.get(name)
        register_first = data is None
        if data is None:
            data = self.broker_addr[name] = BrokerData(cluster=cluster, broker_name=name)
        old_version_broker = header.enable_acting_master is None
        data.enable_acting_master = not old_version_broker and bool(header.enable_acting_master)
        addrs = data.broker_addrs
        if broker_id == MASTER_ID and header.master_epoch is not None:
            stale = self._epoch_gate(cluster, name, addr, header.master_epoch, addrs)
            if stale is not None:
                if not addrs:  # leave no empty broker behind in the cluster info
                    self._forget_name(cluster, name)
                return stale
        elif broker_id == MASTER_ID and self.master_epoch.get(name, (0, addr))[1] != addr:
            del self.master_epoch[name]  # a classic master took the group over: classic rules
        for other_id in [i for i, a in addrs.items() if a == addr and i != broker_id]:
            del addrs[other_id]  # one address, one id: a slave turned master
        old_addr = addrs.get(broker_id)
        if old_addr is not None and old_addr != addr:
            old_live = self.broker_live.get((cluster, old_addr))
            if old_live and old_live.data_version.state_version > wrapper.data_version.state_version:
                self.broker_live.pop((cluster, addr), None)
                return RegisterBrokerResponseHeader()
        if broker_id not in addrs and len(wrapper.topic_config_table) == 1:
            if not addrs:  # unlike RocketMQ, leave no empty broker behind in the cluster info
                self._forget_name(cluster, name)
            return None
        addrs[broker_id] = addr
        register_first = register_first or not old_addr
        is_master = broker_id == MASTER_ID
        is_prime_slave = not old_version_broker and not is_master and broker_id == min(addrs)
        if is_master or is_prime_slave:
            self._register_topics(cluster, name, addr, wrapper.topic_config_table,
                                  wrapper.data_version, register_first,
                                  wipe_write=is_prime_slave and data.enable_acting_master)
        key = (cluster, addr)
        if key not in self.broker_live:
            log.info("new broker registered: %s %s (%s) id %d", cluster, name, addr, broker_id)
        timeout = header.heartbeat_timeout_millis or BROKER_CHANNEL_EXPIRED_TIME_MS
        self.broker_live[key] = _Live(now_ms, timeout, wrapper.data_version, conn, header.ha_server_addr)
        if body.filter_server_list:
            self.filter_server[key] = list(body.filter_server_list)
        else:
            self.filter_server.pop(key, None)
        return self._master_of(data, cluster, broker_id)

    def _epoch_gate(self, cluster: str, name: str, addr: str, epoch: int,
                    addrs: dict[int, str]) -> RegisterBrokerResponseHeader | None:
        """Master epochs (txmq, controller mode): a registration as id 0 of an epoch older than the
        group's known master is a stale master (isolated, or not yet told it lost its role): it is
        answered with the current master's address and does not take id 0 (logged once per
        address and epoch). One of a newer epoch takes id 0 at once: the previous master's address
        leaves the group (it registers again as a slave with its own id), so the next route lookup
        names the new master. None: go on registering."""
        known = self.master_epoch.get(name)
        if known is not None and epoch < known[0] and known[1] != addr:
            if (name, addr, epoch) not in self._stale_logged:
                self._stale_logged.add((name, addr, epoch))
                log.warning("stale master of %s refused id 0: %s epoch %d < %s epoch %d",
                            name, addr, epoch, known[1], known[0])
            live = self.broker_live.get((cluster, known[1]))
            return RegisterBrokerResponseHeader(
                ha_server_addr=live.ha_server_addr if live else None,
                master_addr=known[1] if addrs.get(MASTER_ID) == known[1] else None)
        old = addrs.get(MASTER_ID)
        if old is not None and old != addr and (known is None or epoch > known[0]):
            log.info("new master of %s: %s epoch %d replaces %s", name, addr, epoch, old)
            del addrs[MASTER_ID]
            self.broker_live.pop((cluster, old), None)
            self.filter_server.pop((cluster, old), None)
        if known is None or epoch >= known[0]:
            self.master_epoch[name] = (epoch, addr)
        return None

    def _register_topics(self, cluster: str, name: str, addr: str, table: dict[str, TopicConfig],
                         version: DataVersion, register_first: bool, wipe_write: bool) -> None:
        if self._delete_topics:
            for topic in [t for t, qds in self.topic_queue.items() if name in qds and t not in table]:
                del self.topic_queue[topic][name]
                if not self.topic_queue[topic]:
                    del self.topic_queue[topic]
        version_changed = self._version_changed(cluster, addr, version)
        for tc in table.values():
            queues = self.topic_queue.get(tc.topic_name)
            if register_first or version_changed or not queues or name not in queues:
                perm = tc.perm & ~PERM_WRITE if wipe_write else tc.perm
                self.topic_queue.setdefault(tc.topic_name, {})[name] = QueueData(
                    broker_name=name, read_queue_nums=tc.read_queue_nums,
                    write_queue_nums=tc.write_queue_nums, perm=perm, topic_sys_flag=tc.topic_sys_flag)

    def _version_changed(self, cluster: str, addr: str, version: DataVersion) -> bool:
        """RocketMQ ``isBrokerTopicConfigChanged``."""
        live = self.broker_live.get((cluster, addr))
        return live is None or live.data_version != version

    def _master_of(self, data: BrokerData, cluster: str, broker_id: int) -> RegisterBrokerResponseHeader:
        if broker_id == MASTER_ID:
            return RegisterBrokerResponseHeader()
        master_addr = data.broker_addrs.get(MASTER_ID)
        live = self.broker_live.get((cluster, master_addr)) if master_addr else None
        if live is None:
            return RegisterBrokerResponseHeader()
        return RegisterBrokerResponseHeader(ha_server_addr=live.ha_server_addr, master_addr=master_addr)

    def unregister_broker(self, header: UnRegisterBrokerRequestHeader) -> None:
        """Forget one broker address (RocketMQ ``RouteInfoManager.unRegisterBroker``): its name goes
        when it has no address left, its cluster when it has no broker left, and topics lose that
        broker's queues."""
        cluster, name, addr = header.cluster_name, header.broker_name, header.broker_addr
        self.broker_live.pop((cluster, addr), None)
        self.filter_server.pop((cluster, addr), None)
        data = self.broker_addr.get(name)
        removed = False
        if data is not None:
            for broker_id in [i for i, a in data.broker_addrs.items() if a == addr]:
                del data.broker_addrs[broker_id]
            if not data.broker_addrs:
                del self.broker_addr[name]
                removed = True
        if removed:
            self._forget_name(cluster, name)
        for topic in list(self.topic_queue):
            queues = self.topic_queue[topic]
            if removed:
                queues.pop(name, None)
                if not queues:
                    del self.topic_queue[topic]
            elif (data is not None and data.enable_acting_master and name in queues
                  and (not data.broker_addrs or min(data.broker_addrs) > MASTER_ID)):  # no master left
                queues[name].perm &= ~PERM_WRITE
        log.info("broker unregistered: %s %s (%s)", cluster, name, addr)

    def _forget_name(self, cluster: str, name: str) -> None:
        self.broker_addr.pop(name, None)
        names = self.cluster_addr.get(cluster)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self.cluster_addr[cluster]

    def heartbeat(self, cluster: str, addr: str, now_ms: int) -> bool:
        """Refresh a registered broker's last-update time (RocketMQ
        ``updateBrokerInfoUpdateTimestamp``); False when the broker is not registered."""
        live = self.broker_live.get((cluster, addr))
        if live is None:
            return False
        live.last_update_ms = now_ms
        return True

    def scan_inactive(self, now_ms: int) -> list[str]:
        """Unregister every broker silent for longer than its timeout (RocketMQ
        ``scanNotActiveBroker``: ``last + timeout < now``). Returns the addresses dropped."""
        expired = [key for key, live in self.broker_live.items()
                   if live.last_update_ms + live.timeout_ms < now_ms]
        for key in expired:
            log.warning("broker expired: %s %s", *key)
            self._destroy(key)
        return [addr for _, addr in expired]

    def connection_closed(self, conn: Hashable) -> None:
        """A connection ended: unregister the broker that registered through it (RocketMQ
        ``onChannelDestroy(Channel)``)."""
        for key, live in list(self.broker_live.items()):
            if live.conn == conn:
                self._destroy(key)
                return

    def _destroy(self, key: _BrokerKey) -> None:
        """RocketMQ ``onChannelDestroy(BrokerAddrInfo)``: find the broker's name and id, unregister."""
        cluster, addr = key
        for data in self.broker_addr.values():
            if data.cluster != cluster:
                continue
            for broker_id, a in data.broker_addrs.items():
                if a == addr:
                    self.unregister_broker(UnRegisterBrokerRequestHeader(
                        broker_name=data.broker_name, broker_addr=addr, cluster_name=cluster,
                        broker_id=broker_id))
                    return
        self.broker_live.pop(key, None)

    def route(self, topic: str) -> TopicRouteData | None:
        """The route of a topic, or None when no live broker serves it (RocketMQ
        ``pickupTopicRouteData``)."""
        queues = self.topic_queue.get(topic)
        if not queues:
            return None
        route = TopicRouteData(queue_datas=[msgspec.structs.replace(q) for q in queues.values()])
        for name in queues:
            data = self.broker_addr.get(name)
            if data is None:
                continue
            route.broker_datas.append(_copy_broker(data))
            for addr in data.broker_addrs.values():
                servers = self.filter_server.get((data.cluster or "", addr))
                if servers:
                    route.filter_server_table[addr] = list(servers)
        return route if route.broker_datas else None

    def cluster_info(self) -> ClusterInfo:
        """Every broker and cluster (RocketMQ ``getAllClusterInfo``)."""
        return ClusterInfo(
            broker_addr_table={n: _copy_broker(d) for n, d in self.broker_addr.items()},
            cluster_addr_table={c: list(names) for c, names in self.cluster_addr.items()})

    def topic_list(self) -> TopicList:
        """Every topic with a route (RocketMQ ``getAllTopicList``)."""
        return TopicList(topic_list=list(self.topic_queue))


def _copy_broker(data: BrokerData) -> BrokerData:
    return BrokerData(cluster=data.cluster, broker_name=data.broker_name,
                      broker_addrs=dict(data.broker_addrs), zone_name=data.zone_name,
                      enable_acting_master=data.enable_acting_master)
