"""The name server: route tables fed by broker registrations, answering clients' route lookups
(RocketMQ ``namesrv``), a sans-IO core, an asyncio shell, and the broker's registration requests."""

from txmq.namesrv._core import NameServerCore, topic_not_exist_remark
from txmq.namesrv._register import BrokerRegistration
from txmq.namesrv._server import NameServer, run_namesrv

__all__ = ["BrokerRegistration", "NameServer", "NameServerCore", "run_namesrv", "topic_not_exist_remark"]
