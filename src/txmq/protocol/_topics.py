"""Names of the topics RocketMQ derives from a consumer group (RocketMQ ``MixAll``), defined once
for the broker and the SDK."""

from __future__ import annotations

__all__ = [
    "DLQ_PREFIX",
    "HALF_TOPIC",
    "OP_TOPIC",
    "RETRY_PREFIX",
    "REVIVE_TOPIC_PREFIX",
    "SCHEDULE_TOPIC",
    "SINK_BATCH_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "dlq_topic",
    "retry_topic",
    "revive_topic",
]

RETRY_PREFIX = "%RETRY%"
"""RocketMQ ``MixAll.RETRY_GROUP_TOPIC_PREFIX``."""
DLQ_PREFIX = "%DLQ%"
"""RocketMQ ``MixAll.DLQ_GROUP_TOPIC_PREFIX``."""

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
"""Where half messages wait (RocketMQ ``TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC``)."""
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
"""Op messages: one per decided half (RocketMQ ``TopicValidator.RMQ_SYS_TRANS_OP_HALF_TOPIC``)."""
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
"""Half messages discarded after ``transactionCheckMax`` (RocketMQ ``TopicValidator``)."""
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
"""Delay messages until their time (RocketMQ ``TopicValidator.RMQ_SYS_SCHEDULE_TOPIC``)."""
REVIVE_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
"""Pop checkpoint and ack records: ``rmq_sys_REVIVE_LOG_<brokerClusterName>`` (RocketMQ
``PopAckConstants.REVIVE_TOPIC``); a broker topic by its ``rmq_sys_`` prefix."""
SINK_BATCH_TOPIC = "TXMQ_SINK_BATCH_TOPIC"
"""txmq: the Spark sink's batch markers."""


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where a group's failed messages wait for redelivery
    (RocketMQ ``MixAll.getRetryTopic``)."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``: where messages go after ``maxReconsumeTimes`` failures
    (RocketMQ ``MixAll.getDLQTopic``)."""
    return DLQ_PREFIX + group


def revive_topic(cluster: str) -> str:
    """``rmq_sys_REVIVE_LOG_<cluster>``: the pop checkpoint (CK) and ack records of a cluster's
    brokers (RocketMQ ``PopAckConstants.buildClusterReviveTopic``)."""
    return REVIVE_TOPIC_PREFIX + cluster
