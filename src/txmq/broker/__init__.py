"""The broker: sans-IO logic over a store (:class:`Broker`) and its asyncio shell."""

from txmq.broker._actions import Action, Close, Hold, Reply, SendTo
from txmq.broker._broker import Broker
from txmq.broker._config import BrokerConfig, load_config, parse_delay_levels
from txmq.protocol import dlq_topic, retry_topic

__all__ = [
    "Action",
    "Broker",
    "BrokerConfig",
    "Close",
    "Hold",
    "Reply",
    "SendTo",
    "dlq_topic",
    "load_config",
    "parse_delay_levels",
    "retry_topic",
]
