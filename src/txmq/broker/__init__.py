"""The broker: sans-IO logic over a store (:class:`Broker`) and its asyncio shell."""

from txmq.extras import require_extra as _require_extra

_require_extra("broker", "txmq.broker", "crc32c", "prometheus_client")

from txmq.broker._actions import Action, Close, Hold, Reply, SendTo
from txmq.broker._broker import Broker
from txmq.broker._config import (
    BrokerConfig,
    SubscriptionGroupConfig,
    load_config,
    parse_delay_levels,
)
from txmq.broker._offset_table import OffsetTable
from txmq.broker._pop import Popped, PopService
from txmq.broker._send import SendOutcome, SendRequest
from txmq.broker._tls import TlsConfig, grpc_server_credentials
from txmq.broker._topic_admin import TopicAdmin
from txmq.broker._topic_table import TopicTable
from txmq.broker._traffic import MESSAGE_TYPES, GroupLag, TrafficStats, consumer_lag
from txmq.protocol import dlq_topic, retry_topic

__all__ = [
    "MESSAGE_TYPES",
    "Action",
    "Broker",
    "BrokerConfig",
    "Close",
    "GroupLag",
    "Hold",
    "OffsetTable",
    "PopService",
    "Popped",
    "Reply",
    "SendOutcome",
    "SendRequest",
    "SendTo",
    "SubscriptionGroupConfig",
    "TlsConfig",
    "TopicAdmin",
    "TopicTable",
    "TrafficStats",
    "consumer_lag",
    "dlq_topic",
    "grpc_server_credentials",
    "load_config",
    "parse_delay_levels",
    "retry_topic",
]
