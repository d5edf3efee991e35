"""Bodies and headers of the topic administration requests (``txmq topic …``, mqadmin's
``topicList``, ``topicStatus`` and ``deleteTopic``), in RocketMQ's names.

GET_ALL_TOPIC_CONFIG (21) answers the ``TopicConfigSerializeWrapper`` of ``_route``. Sources:
RocketMQ ``DeleteTopicFromNamesrvRequestHeader`` (DELETE_TOPIC_IN_NAMESRV 216),
``GetTopicStatsInfoRequestHeader``, ``TopicStatsTable`` and ``TopicOffset``
(GET_TOPIC_STATS_INFO 202).
"""

from __future__ import annotations

import msgspec

__all__ = ["DeleteTopicFromNamesrvRequestHeader", "GetTopicStatsInfoRequestHeader",
           "QueueTopicOffset", "TopicStatsTable"]


class GetTopicStatsInfoRequestHeader(msgspec.Struct, kw_only=True, rename="camel"):
    """GET_TOPIC_STATS_INFO (202): RocketMQ ``GetTopicStatsInfoRequestHeader``."""

    topic: str


class DeleteTopicFromNamesrvRequestHeader(msgspec.Struct, kw_only=True, rename="camel"):
    """DELETE_TOPIC_IN_NAMESRV (216): RocketMQ ``DeleteTopicFromNamesrvRequestHeader``; without
    ``cluster_name`` the topic's routes on every broker go."""

    topic: str
    cluster_name: str | None = None


class QueueTopicOffset(msgspec.Struct, kw_only=True, rename="camel"):
    """One queue's entry of a :class:`TopicStatsTable`: RocketMQ ``TopicOffset`` (``minOffset``,
    ``maxOffset``: queue offsets, max = next offset to be written; ``lastUpdateTimestamp``: store
    time of the newest message in ms since the epoch, 0 when the queue is empty) with the
    ``MessageQueue`` key's fields (``topic``, ``brokerName``, ``queueId``) inlined, because
    RocketMQ's map keyed by objects is not JSON."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0


class TopicStatsTable(msgspec.Struct, kw_only=True, rename="camel"):
    """GET_TOPIC_STATS_INFO's body: one :class:`QueueTopicOffset` per queue, by queue id."""

    offset_table: list[QueueTopicOffset] = msgspec.field(default_factory=list)
