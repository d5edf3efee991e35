"""Every bound and default in txmq, as a named constant with its unit last and its source.

Defaults that exist in Apache RocketMQ keep RocketMQ's value and name the knob they come from, so a
RocketMQ user finds the behaviour they expect. Relationships between limits are asserted at import.
"""

from __future__ import annotations

# --- wire protocol -------------------------------------------------------------------------------
FRAME_SIZE_MAX_BYTES = 16 * 1024 * 1024
"""Largest frame accepted on the wire. RocketMQ NettySystemConfig ``maxFrameSize`` is 16 MiB."""

FRAME_HEADER_MAX_BYTES = 64 * 1024
"""Largest encoded command header (code, opaque, remark, ext fields) accepted."""

MESSAGE_SIZE_MAX_BYTES = 4 * 1024 * 1024
"""Default largest message body. RocketMQ BrokerConfig/MessageStoreConfig ``maxMessageSize`` 4 MiB."""

BATCH_MESSAGES_MAX = 1024
"""Most messages in one batch send request (txmq)."""

PULL_BATCH_MAX = 1024
"""Most messages the broker returns to one pull request (txmq; RocketMQ caps at 32 per pull by
default ``pullBatchSize`` but allows larger ``maxMsgNums``)."""

PULL_BATCH_BYTES_MAX = 8 * 1024 * 1024
"""Most body bytes returned by one pull (txmq)."""

# --- client --------------------------------------------------------------------------------------
REQUEST_TIMEOUT_MS = 10_000
"""Default client request timeout. RocketMQ DefaultMQProducer ``sendMsgTimeout`` is 3 s; txmq waits
longer because an acknowledgement includes an fsync that may queue behind a busy disk."""

HEARTBEAT_INTERVAL_MS = 5_000
"""Client heartbeat period. RocketMQ ClientConfig ``heartbeatBrokerInterval`` is 30 s; txmq beats
faster so a dead client's connection is noticed sooner."""

CLIENT_EXPIRED_MS = 120_000
"""A client silent this long is dropped. RocketMQ ``channelExpiredTimeout`` 120 s."""

PULL_SUSPEND_MS = 15_000
"""Long-polling hold time of a pull with no messages. RocketMQ
``brokerSuspendMaxTimeMillis`` 15 s."""

PULL_BATCH_SIZE = 32
"""Messages per pull of a push consumer. RocketMQ DefaultMQPushConsumer ``pullBatchSize`` 32."""

CONSUME_BATCH_MAX_SIZE = 1
"""Messages per listener call. RocketMQ DefaultMQPushConsumer ``consumeMessageBatchMaxSize`` 1."""

CONSUME_THREADS = 4
"""Default listener threads of a push consumer (RocketMQ ``consumeThreadMin`` is 20; txmq runs on
small machines)."""

PULL_THRESHOLD_FOR_QUEUE = 1000
"""Cached messages per queue before the push consumer pauses pulling. RocketMQ
``pullThresholdForQueue`` 1000."""

REBALANCE_INTERVAL_MS = 20_000
"""Periodic rebalance of a push consumer. RocketMQ ``rebalanceInterval`` 20 s (broker
NOTIFY_CONSUMER_IDS_CHANGED triggers one at once)."""

OFFSET_PERSIST_INTERVAL_MS = 1_000
"""How often a push consumer commits its offsets to the broker. RocketMQ
``persistConsumerOffsetInterval`` is 5 s; txmq commits sooner to shrink redelivery after a crash."""

MAX_RECONSUME_TIMES = 16
"""Retries before a message goes to ``%DLQ%<group>``. RocketMQ ``maxReconsumeTimes`` 16."""

# --- broker --------------------------------------------------------------------------------------
DEFAULT_QUEUE_NUMS = 4
"""Queues of a new topic. RocketMQ BrokerConfig ``defaultTopicQueueNums`` 4 (8 in some versions)."""

TRANSACTION_TIMEOUT_MS = 6_000
"""Minimum age before a half message is first checked. RocketMQ BrokerConfig ``transactionTimeOut``."""

TRANSACTION_CHECK_INTERVAL_MS = 30_000
"""Time between check-backs of one half message. RocketMQ BrokerConfig
``transactionCheckInterval`` (30 s since 5.1.1)."""

TRANSACTION_CHECK_MAX = 15
"""Check-backs before a half message is moved to ``TRANS_CHECK_MAX_TIME_TOPIC``. RocketMQ
BrokerConfig ``transactionCheckMax``."""

TRANSACTION_CHECKS_IN_FLIGHT_MAX = 2_000
"""Most check-back requests outstanding at once (back-pressure). RocketMQ's check executor queue is
2000 (AbstractTransactionalMessageCheckListener)."""

TRANSACTION_CHECK_ANSWER_TIMEOUT_MS = 10_000
"""A check-back unanswered this long frees its in-flight slot (txmq)."""

FILE_RESERVED_TIME_MS = 72 * 3600 * 1000
"""Retention of stored messages. RocketMQ MessageStoreConfig ``fileReservedTime`` 72 h; a half message
older than this is discarded instead of checked (``needSkip``)."""

MESSAGE_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
"""Delay levels. RocketMQ MessageStoreConfig ``messageDelayLevel``."""

RETRY_DELAY_LEVEL_BASE = 3
"""A retried message waits at level ``3 + reconsume times``. RocketMQ ConsumerSendMsgBack."""

SCHEDULE_TICK_MS = 100
"""How often the broker shell runs the delay scheduler and the transaction checker (txmq)."""

CONSUMER_OFFSET_FLUSH_INTERVAL_MS = 5_000
"""How often consumer offsets are written to disk. RocketMQ ``flushConsumerOffsetInterval`` 5 s."""

DISK_MAX_USED_SPACE_RATIO = 0.90
"""Writes are refused above this fraction of disk used. RocketMQ ``diskMaxUsedSpaceRatio`` 75 %
applies to cleaning; txmq refuses writes at 90 % used."""

COMMIT_LOG_SEGMENT_BYTES = 1024 * 1024 * 1024
"""Size of one commit log segment file. RocketMQ ``mappedFileSizeCommitLog`` 1 GiB."""

assert FRAME_HEADER_MAX_BYTES < FRAME_SIZE_MAX_BYTES
assert MESSAGE_SIZE_MAX_BYTES + FRAME_HEADER_MAX_BYTES <= FRAME_SIZE_MAX_BYTES
assert PULL_BATCH_BYTES_MAX + FRAME_HEADER_MAX_BYTES <= FRAME_SIZE_MAX_BYTES
assert TRANSACTION_CHECK_MAX >= 1
assert MESSAGE_DELAY_LEVELS.count(" ") + 1 == 18
