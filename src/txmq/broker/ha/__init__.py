"""Master-slave replication of the commit log with RocketMQ's HA protocol (docs/replication.md):
sans-IO cores (:mod:`txmq.broker.ha._core`) and their asyncio shell (:mod:`txmq.broker.ha._shell`)."""

from txmq.broker.ha._core import AckTable, ReplicaWait, SlaveCore
from txmq.broker.ha._shell import HaMaster, HaSlave, Replication, SyncWait
from txmq.broker.ha._switch import RoleSwitch, exchange_ha_info

__all__ = ["AckTable", "HaMaster", "HaSlave", "ReplicaWait", "Replication", "RoleSwitch", "SlaveCore",
           "SyncWait", "exchange_ha_info"]
