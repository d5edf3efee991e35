"""Names of the topics RocketMQ derives from a consumer group (RocketMQ ``MixAll``), defined once
for the broker and the SDK."""

from __future__ import annotations

__all__ = ["DLQ_PREFIX", "RETRY_PREFIX", "dlq_topic", "retry_topic"]

RETRY_PREFIX = "%RETRY%"
"""RocketMQ ``MixAll.RETRY_GROUP_TOPIC_PREFIX``."""
DLQ_PREFIX = "%DLQ%"
"""RocketMQ ``MixAll.DLQ_GROUP_TOPIC_PREFIX``."""


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where a group's failed messages wait for redelivery
    (RocketMQ ``MixAll.getRetryTopic``)."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``: where messages go after ``maxReconsumeTimes`` failures
    (RocketMQ ``MixAll.getDLQTopic``)."""
    return DLQ_PREFIX + group
