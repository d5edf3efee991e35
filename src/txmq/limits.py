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

PULL_BATCH_MAX = 4096
"""Most messages the broker returns to one pull request (txmq; RocketMQ caps at 32 per pull by
default ``pullBatchSize`` but allows larger ``maxMsgNums``). 4,096 (1,024 before issue #24) is
one Arrow batch of the Spark source (``txmq.spark._source.ROWS_PER_ARROW_BATCH``): each reply is
yielded as it is, and the decoder's fixed cost per reply (about 0.3 ms) is spread over 4 times
the rows; :data:`PULL_BATCH_BYTES_MAX` still bounds a reply's size."""

PULL_BATCH_BYTES_MAX = 8 * 1024 * 1024
"""Most record bytes returned by one pull (txmq; RocketMQ bounds a pull in memory by
``maxTransferBytesOnMessageInMemory``, 256 KiB)."""

# --- client --------------------------------------------------------------------------------------
REQUEST_TIMEOUT_MS = 10_000
"""Default client request timeout. RocketMQ DefaultMQProducer ``sendMsgTimeout`` is 3 s; txmq waits
longer because an acknowledgement includes an fsync that may queue behind a busy disk."""

HEARTBEAT_INTERVAL_MS = 5_000
"""Client heartbeat period. RocketMQ ClientConfig ``heartbeatBrokerInterval`` is 30 s; txmq beats
faster so a dead client's connection is noticed sooner."""

CONNECT_TIMEOUT_MS = 3_000
"""A client's TCP (and TLS) connect gives up after this. RocketMQ NettyClientConfig
``connectTimeoutMillis`` 3 s; without it an unreachable host holds a connect for the kernel's
SYN retries (~127 s)."""

POLL_NAME_SERVER_INTERVAL_MS = 30_000
"""How often a client refreshes the routes it uses from the name server. RocketMQ ClientConfig
``pollNameServerInterval`` 30 s."""

SEND_RETRY_TIMES = 2
"""Extra attempts of a failed send, each to another broker when there is one. RocketMQ
DefaultMQProducer ``retryTimesWhenSendFailed`` 2."""

CLIENT_LOOP_BACKOFF_MAX_MS = 30_000
"""Longest pause of a client's supervised background loop after repeated failures (txmq; the
first pause is the loop's own period)."""

CLIENT_LOOP_BACKOFF_MIN_MS = 1_000
"""First pause of a consumer's supervised loop (pull, rebalance, persist, lock) after an unexpected
failure, doubled on each further one up to ``CLIENT_LOOP_BACKOFF_MAX_MS`` (txmq; RocketMQ's pull
loop waits ``pullTimeDelayMillsWhenException`` 3 s after an error, a rebalance just waits for the
next round)."""

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

CONSUME_BATCH_SIZE_MAX = 1024
"""Largest ``consume_message_batch_max_size``. RocketMQ checks 1..1024."""

PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES = 100 * 1024 * 1024
"""Cached message bytes per queue before the push consumer pauses pulling. RocketMQ
``pullThresholdSizeForQueue`` 100 MiB."""

CONSUME_CONCURRENTLY_MAX_SPAN = 2000
"""Largest offset span cached per queue in concurrent mode (a slow message at the head holds the
committed offset back; pulling pauses past this). RocketMQ ``consumeConcurrentlyMaxSpan`` 2000."""

CONSUME_TIMEOUT_MS = 15 * 60_000
"""A concurrent listener call running longer counts as RECONSUME_LATER. RocketMQ
``consumeTimeout`` 15 min."""

CONSUME_RETRY_LOCALLY_MS = 5_000
"""When a failed message cannot be sent back to the retry topic, it is consumed again locally after
this long. RocketMQ ``submitConsumeRequestLater`` 5 s."""

SUSPEND_CURRENT_QUEUE_TIME_MS = 1_000
"""Orderly mode: pause of a queue after its listener asks to retry. RocketMQ
``suspendCurrentQueueTimeMillis`` 1 s."""

REBALANCE_LOCK_MAX_LIVE_TIME_MS = 60_000
"""Broker side: an orderly queue lock not renewed for this long expires. RocketMQ
``rocketmq.broker.rebalance.lockMaxLiveTime`` 60 s."""

REBALANCE_LOCK_CLIENT_MAX_LIVE_TIME_MS = 30_000
"""Client side: an orderly consumer stops consuming a queue whose lock it has not renewed for this
long (before the broker could give it away). RocketMQ ``rocketmq.client.rebalance.lockMaxLiveTime``."""

REBALANCE_LOCK_INTERVAL_MS = 20_000
"""How often an orderly consumer renews its queue locks. RocketMQ
``rocketmq.client.rebalance.lockInterval`` 20 s."""

ORDERLY_LOCK_RETRY_INTERVAL_MS = 1_000
"""How often an orderly consumer retries to lock a queue it was given but another member still
holds (txmq; RocketMQ waits for the next rebalance, up to 20 s)."""

CONSUME_SHUTDOWN_WAIT_MS = 30_000
"""How long ``shutdown()`` waits for running listener calls before committing offsets (txmq)."""

# --- broker --------------------------------------------------------------------------------------
DEFAULT_QUEUE_NUMS = 4
"""Queues of a new topic. RocketMQ BrokerConfig ``defaultTopicQueueNums`` 4 (8 in some versions)."""

QUERY_MESSAGE_MAX_NUM = 64
"""Most messages one QUERY_MESSAGE or VIEW_MESSAGE_BY_ID answers. RocketMQ MessageStoreConfig
``maxMsgsNumBatch`` 64 (its clients ask for ``defaultQueryMaxNum`` 32)."""

TRANSACTION_TIMEOUT_MS = 6_000
"""Minimum age before a half message is first checked. RocketMQ BrokerConfig ``transactionTimeOut``."""

TRANSACTION_CHECK_INTERVAL_MS = 30_000
"""Time between check-backs of one half message. RocketMQ BrokerConfig
``transactionCheckInterval`` (30 s since 5.1.1)."""

TRANSACTION_CHECK_MAX = 15
"""Check-backs before a half message is moved to ``TRANS_CHECK_MAX_TIME_TOPIC``. RocketMQ
BrokerConfig ``transactionCheckMax``."""

TRANSACTION_OP_MSG_MAX_SIZE = 4_096
"""Characters of half offsets in one op message body. RocketMQ BrokerConfig
``transactionOpMsgMaxSize``."""

TRANSACTION_HALF_CACHE_BYTES = 16 * 1024 * 1024
"""Bodies of the most recently prepared half messages kept in memory, so a commit that follows
its prepare soon (the common case) builds the real message without reading the half back from the
commit log (txmq; RocketMQ reads it back through the page cache). Oldest evicted first."""

TRANSACTION_CHECKS_IN_FLIGHT_MAX = 2_000
"""Most check-back requests outstanding at once (back-pressure). RocketMQ's check executor queue is
2000 (AbstractTransactionalMessageCheckListener)."""

CLOCK_BACK_TOLERANCE_MS = 1_000
"""A clock that goes back by more than this between two checker rounds counts as a jump: check-backs
scheduled relative to the later time are brought back (txmq; RocketMQ has no such guard)."""

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

# --- store ---------------------------------------------------------------------------------------
COMMIT_LOG_SEGMENT_BYTES = 128 * 1024 * 1024
"""Size of one commit log segment file. RocketMQ ``mappedFileSizeCommitLog`` is 1 GiB because it
maps and pre-allocates whole files; txmq appends with ``pwrite`` and pays nothing per file, so it
picks a smaller unit: retention and the disk high-water mark free space in steps of one segment
(1 GiB would be 10 % of a 10 GiB disk), and recovery after tail damage rescans at most one segment
(128 MiB ≈ 120 k records of 1 KiB, well under a second). A segment holds at least one append batch,
so it is larger only when one batch is."""

COMMIT_LOG_SEGMENT_BYTES_MIN = 64 * 1024
"""Smallest configurable segment (tests use small segments to exercise rolling and retention)."""

CONSUME_QUEUE_FILE_ENTRIES = 300_000
"""Entries per consume queue file (20 bytes each, 6 MB). RocketMQ ``mappedFileSizeConsumeQueue``
is 300 000 × 20 bytes."""

INDEX_HASH_SLOTS = 500_000
"""Hash slots per index file. RocketMQ ``maxHashSlotNum`` is 5 000 000; txmq uses a tenth because
the active file's slot table lives in memory and is rebuilt in Python after a torn checkpoint."""

INDEX_ENTRIES_MAX = 2_000_000
"""Entries per index file before a new one starts. RocketMQ ``maxIndexNum`` is 20 000 000 (a tenth,
as for the slots: 2 M entries × 20 bytes = 40 MB per file)."""

FLUSH_INTERVAL_CONSUME_QUEUE_MS = 1_000
"""How often consume queues and indexes are written, fsynced and checkpointed. RocketMQ
``flushIntervalConsumeQueue`` 1 s. A crash re-dispatches at most this interval from the commit log."""

CLEAN_RESOURCE_INTERVAL_MS = 10_000
"""How often retention runs. RocketMQ ``cleanResourceInterval`` 10 s."""

DISK_CHECK_INTERVAL_MS = 1_000
"""How often the broker shell re-reads disk usage (txmq; the store also re-reads it after every
``DISK_CHECK_BYTES`` written, so a burst cannot run the disk full between two checks)."""

DISK_CHECK_BYTES = 4 * 1024 * 1024
"""The store re-reads disk usage after this many bytes appended (txmq)."""

DELETE_WHEN = "04"
"""Hour(s) of the day (local time, ``;``-separated) when expired segments are deleted even with
disk to spare. RocketMQ ``deleteWhen`` "04"."""

DISK_MAX_USED_SPACE_RATIO = 0.75
"""Above this fraction of the disk used, expired segments are deleted at once instead of waiting for
``DELETE_WHEN``. RocketMQ ``diskMaxUsedSpaceRatio`` 75 %."""

DISK_SPACE_CLEAN_FORCIBLY_RATIO = 0.85
"""Above this fraction, the oldest segments are deleted even before ``fileReservedTime``; below it a
store that refused writes accepts them again. RocketMQ ``diskSpaceCleanForciblyRatio`` 0.85."""

DISK_SPACE_WARNING_LEVEL_RATIO = 0.90
"""Above this fraction the store refuses writes with ``DiskFull`` (RocketMQ marks the store
not writeable: ``diskSpaceWarningLevelRatio`` 0.90)."""

DELETE_FILES_BATCH_MAX = 10
"""Most segments one retention round deletes. RocketMQ ``deleteFileBatchMax`` 10."""

READ_SPAN_BYTES_MAX = 1024 * 1024
"""A pull reads neighbouring records of one segment with one ``pread`` when they lie within this
span (txmq)."""
COMMIT_LOG_MAPS_MAX = 16
"""Commit log segments kept memory-mapped for pulls at once (the least recently mapped one is
unmapped past it), so readers spread over a long log stay far below ``vm.max_map_count``
(65,530 by default) and its address space (txmq; RocketMQ maps every segment, 1 GiB each)."""

REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX = 4096
"""Requests of one connection the broker holds (awaiting fsync) before it stops reading from that
connection until some are answered (back-pressure; txmq). RocketMQ bounds the client side with
``clientAsyncSemaphoreValue`` 65535."""

WRITE_BUFFER_HIGH_BYTES = 8 * 1024 * 1024
"""A connection whose unsent replies exceed this is not read from until they drain (txmq)."""

# --- connection resources: count, buffered bytes, idle time (issue 11, part 2 "resources") ------
CONNECTIONS_MAX = 10_000
"""Upper bound of the default connection limit, which is otherwise the file-descriptor limit
(``RLIMIT_NOFILE``) less ``CONNECTION_FD_RESERVE`` (txmq; RocketMQ sets no cap and lets accept
fail). Set ``max_connections`` in the broker config to choose another limit."""

CONNECTION_FD_RESERVE = 256
"""File descriptors the default connection limit leaves to the store: commit log segments, consume
queue and index files, checkpoint and metadata writes (txmq). With a descriptor limit below twice
this, half of the limit is kept instead."""

CONNECTION_REFUSE_WAIT_MS = 1_000
"""A refused connection's first request is awaited this long, to answer SYSTEM_BUSY with its opaque
(txmq)."""

CONNECTIONS_REFUSING_MAX = 16
"""Refused connections awaiting their first request at once; more are answered and closed at once
(opaque 0), so a flood of refused connections cannot hold the store's descriptors (txmq)."""

BUFFER_BUDGET_BYTES = 256 * 1024 * 1024
"""Global budget for frames being received and replies not yet sent, over all connections (txmq;
Kafka bounds the same memory with ``queued.max.request.bytes``). A frame larger than
``FRAME_UNRESERVED_BYTES_MAX`` reserves its declared size before the rest of it is read; when the
budget is spent its connection is not read from until earlier frames complete."""

FRAME_UNRESERVED_BYTES_MAX = 256 * 1024
"""Bytes of a partial frame a connection may buffer without a reservation from
``BUFFER_BUDGET_BYTES``, so small requests never wait behind big ones (txmq)."""

CHANNEL_IDLE_MAX_MS = 120_000
"""A connection that neither sent nor received bytes for this long is closed, unless it holds a
long-polling pull or waits on the broker. RocketMQ NettyServerConfig
``serverChannelMaxIdleTimeSeconds`` 120 (Netty's all-idle state: no read and no write)."""

ACCEPT_ERROR_LOG_INTERVAL_MS = 60_000
"""At the file-descriptor limit ``accept`` fails (EMFILE) and is retried every second; the error
is logged at most once per this interval, with the count of failures in between (txmq)."""

assert BUFFER_BUDGET_BYTES >= FRAME_SIZE_MAX_BYTES
assert FRAME_UNRESERVED_BYTES_MAX < FRAME_SIZE_MAX_BYTES
assert CHANNEL_IDLE_MAX_MS > 2 * HEARTBEAT_INTERVAL_MS

assert FRAME_HEADER_MAX_BYTES < FRAME_SIZE_MAX_BYTES
assert MESSAGE_SIZE_MAX_BYTES + FRAME_HEADER_MAX_BYTES <= FRAME_SIZE_MAX_BYTES
assert PULL_BATCH_BYTES_MAX + FRAME_HEADER_MAX_BYTES <= FRAME_SIZE_MAX_BYTES
assert TRANSACTION_CHECK_MAX >= 1
assert REBALANCE_LOCK_INTERVAL_MS < REBALANCE_LOCK_CLIENT_MAX_LIVE_TIME_MS < REBALANCE_LOCK_MAX_LIVE_TIME_MS
assert 1 <= CONSUME_BATCH_MAX_SIZE <= CONSUME_BATCH_SIZE_MAX
assert MESSAGE_DELAY_LEVELS.count(" ") + 1 == 18
assert DISK_MAX_USED_SPACE_RATIO < DISK_SPACE_CLEAN_FORCIBLY_RATIO < DISK_SPACE_WARNING_LEVEL_RATIO < 1
assert COMMIT_LOG_SEGMENT_BYTES_MIN <= COMMIT_LOG_SEGMENT_BYTES
assert MESSAGE_SIZE_MAX_BYTES < COMMIT_LOG_SEGMENT_BYTES
assert INDEX_HASH_SLOTS < 2**32 and INDEX_ENTRIES_MAX < 2**32

# --- outbox: the local message table (shieldTXC) -------------------------------------
OUTBOX_RELAY_PERIOD_MS = 1_000
"""Pause of an idle relay worker between two polls. shieldTXC ``tranMessageSendPeriod`` is 5 s; txmq
polls every second because an idle poll is one indexed query, and a worker that claimed a full
batch polls again at once (so the period bounds latency only when the table is nearly empty)."""

OUTBOX_RELAY_INITIAL_DELAY_MS = 0
"""Wait before a relay's first poll. shieldTXC ``tranMessageSendInitialDelay`` 0."""

OUTBOX_RELAY_POOL_SIZE = 1
"""Relay worker threads, each claiming its own batches. shieldTXC ``tranMessageSendCorePoolSize`` 1."""

OUTBOX_RELAY_BATCH_SIZE = 50
"""Events one worker claims per poll. shieldTXC ``queryEventListByStatus`` reads ``limit 50``."""

OUTBOX_RELAY_BATCH_SIZE_MAX = 1_000
"""Largest configurable claim batch (one broker batch request holds at most ``BATCH_MESSAGES_MAX``)."""

OUTBOX_SEND_BATCH_BYTES_MAX = 1024 * 1024
"""Payload bytes per broker batch request built by the relay; a larger claim is split (txmq)."""

OUTBOX_LEASE_MS = 30_000
"""How long a claimed event belongs to the relay that claimed it. After this a PRODUCE_PROCESSING row
is claimable again (shieldTXC lost such rows forever, peers.md §3 defect 3). It must outlast a
send with its timeout (``REQUEST_TIMEOUT_MS``) and the database round trips around it."""

OUTBOX_RETRY_BACKOFF_BASE_MS = 1_000
"""Delay before the second try of a failed send; doubles per attempt (txmq)."""

OUTBOX_RETRY_BACKOFF_MAX_MS = 60_000
"""Cap of the send retry delay: an event is retried for ever, at least once a minute (shieldTXC
retries for ever at its 5 s period; django-outbox-pattern waits 60 s between tries)."""

OUTBOX_MAX_COMMIT_RECONSUME_TIMES = 10
"""Deliveries of a commit event whose handler keeps failing before the downstream gives up and emits
a ROLLBACK event. The shieldTXC blog post says 10 (超过最大消费次数（默认为 10 次）); its code has 3."""

OUTBOX_COMPENSATION_MAX_RECONSUME_TIMES = MAX_RECONSUME_TIMES
"""Retries of a failing compensation before the rollback event goes to ``%DLQ%<group>`` (RocketMQ
``maxReconsumeTimes`` 16, as shieldTXC relies on)."""

OUTBOX_RETENTION_MS = 7 * 24 * 3600 * 1000
"""Default age after which processed outbox and inbox rows may be purged. It must exceed the longest
redelivery window (16 retries at RocketMQ's delay levels, about 4 h 46 min), or a late duplicate
would find no inbox row (django-outbox-pattern keeps 30 days; Eventuate #46)."""

OUTBOX_PURGE_BATCH_ROWS = 1_000
"""Rows one purge statement deletes, so retention never holds long locks (txmq)."""

OUTBOX_STATS_INTERVAL_MS = 5_000
"""How often a relay refreshes the backlog gauges (one aggregate query; txmq)."""

OUTBOX_PURGE_INTERVAL_MS = 10 * 60_000
"""How often a relay configured with a retention purges processed rows (txmq)."""

OUTBOX_APP_ID_MAX_CHARS = 128
"""Longest app id (``VARCHAR(128)``; part of the inbox unique key, which must fit InnoDB's 3072-byte
index limit with utf8mb4)."""

OUTBOX_BIZ_KEY_MAX_CHARS = 255
"""Longest biz key (``VARCHAR(255)``, also in the inbox unique key)."""

OUTBOX_EVENT_TYPE_MAX_CHARS = 64
"""Longest event type (``VARCHAR(64)``; shieldTXC ``event_type`` is an enum name)."""

assert OUTBOX_LEASE_MS >= 2 * REQUEST_TIMEOUT_MS
assert OUTBOX_RETRY_BACKOFF_BASE_MS <= OUTBOX_RETRY_BACKOFF_MAX_MS
assert 1 <= OUTBOX_RELAY_BATCH_SIZE <= OUTBOX_RELAY_BATCH_SIZE_MAX <= BATCH_MESSAGES_MAX
assert MESSAGE_SIZE_MAX_BYTES + OUTBOX_SEND_BATCH_BYTES_MAX + FRAME_HEADER_MAX_BYTES <= FRAME_SIZE_MAX_BYTES
assert OUTBOX_MAX_COMMIT_RECONSUME_TIMES < MAX_RECONSUME_TIMES  # rollback is emitted before the DLQ
assert OUTBOX_RETENTION_MS > 5 * 3600 * 1000
assert (OUTBOX_APP_ID_MAX_CHARS + OUTBOX_BIZ_KEY_MAX_CHARS + 32) * 4 <= 3072

# --- validation at the door (issue 11, part 1: validate) -----------------------------------------
TOPIC_NAME_MAX_CHARS = 127
"""Longest topic name. RocketMQ ``TopicValidator.TOPIC_MAX_LENGTH`` (127). Topic names are ASCII
(``^[%|a-zA-Z0-9_-]+$``), so this is also its length in bytes as a consume queue directory name."""

GROUP_NAME_MAX_CHARS = TOPIC_NAME_MAX_CHARS - len("%RETRY%")
"""Longest producer or consumer group name: 120, so that ``%RETRY%<group>`` and ``%DLQ%<group>`` are
still legal topic names (and file names). Stricter than RocketMQ's 255 (``Validators
.CHARACTER_MAX_LENGTH``), whose retry topic of a 255-character group cannot be created (txmq)."""

QUEUE_NUMS_MAX = 1024
"""Most queues of one topic; a queue id is in ``0 .. QUEUE_NUMS_MAX - 1`` (txmq; RocketMQ's
``defaultTopicQueueNums`` is 8 and its admin tools accept up to 1024 in practice)."""

PROPERTY_KEY_MAX_CHARS = 256
"""Longest message property name (txmq; RocketMQ bounds only the whole properties string)."""

PROPERTY_VALUE_MAX_CHARS = 16 * 1024
"""Longest message property value (txmq; keys and user ids, not payloads)."""

PROPERTIES_MAX_BYTES = 32_767
"""Most bytes of all properties of one message, encoded as RocketMQ does (``name\\u0001value\\u0002``
each). RocketMQ ``DefaultMessageStore.checkMessage``: a properties string longer than
``Short.MAX_VALUE`` is refused with ``PROPERTIES_SIZE_EXCEEDED``."""

CHECK_IMMUNITY_TIME_MAX_S = FILE_RESERVED_TIME_MS // 1000
"""Largest ``CHECK_IMMUNITY_TIME_IN_SECONDS`` accepted: a half message is discarded after the file
reserved time (72 h) anyway, so a longer immunity never takes effect (txmq)."""

TIMESTAMP_MAX_MS = 2**63 - 1
"""Largest timestamp accepted in a request (Java ``Long.MAX_VALUE``, what RocketMQ's headers hold).
Timestamps below 0 are refused, except -1 where a header documents it as "none"."""

VALIDATION_CACHE_NAMES_MAX = 4_096
"""Topic, group and property names remembered per check once they passed it, so the regex of each
runs once per name, not once per send (txmq: the checks cost a durable send about 3 µs before)."""

PENDING_TRANSACTIONS_LIST_MAX = 10_000
"""Most pending half messages one GET_PENDING_TRANSACTIONS answer lists (txmq)."""

assert 0 < GROUP_NAME_MAX_CHARS <= TOPIC_NAME_MAX_CHARS - len("%DLQ%")
assert PROPERTY_KEY_MAX_CHARS + PROPERTY_VALUE_MAX_CHARS <= PROPERTIES_MAX_BYTES

# --- issue 11 part 4 (sched): parking, timer guards, health check --------------------------------
PARK_REASON_MAX_CHARS = 1_000
"""Longest reason stored with a parked message (an exception text can be long; txmq)."""

TIMER_ERROR_LOG_INTERVAL_MS = 60_000
"""A timer that keeps failing logs one line per interval (its traceback once per error type), not
one per tick (txmq)."""

TIMER_TASK_RESTART_DELAY_MS = 1_000
"""Pause before the supervisor restarts a broker timer task that ended (txmq)."""

FLUSHER_IDLE_TICK_MS = 1_000
"""An idle flusher still wakes this often, so its health-check tick stays fresh (txmq)."""

BROKER_TIMER_STALE_MS = 60_000
"""``txmq broker status`` calls a timer stale when its last successful tick is older than this:
6 × the longest timer period (retention, ``CLEAN_RESOURCE_INTERVAL_MS``) (txmq)."""

assert 5 * max(CLEAN_RESOURCE_INTERVAL_MS, CONSUMER_OFFSET_FLUSH_INTERVAL_MS, FLUSHER_IDLE_TICK_MS,
              TIMER_TASK_RESTART_DELAY_MS) <= BROKER_TIMER_STALE_MS

# --- chaos (issue 11, part 6: txmq.testing.chaos) ------------------------------------------------

CHAOS_CLOCK_POLL_MS = 100
"""How often a broker started by the chaos run re-reads its clock-offset test file (txmq: a jump
takes effect within this time; the file is read at most this often, never per request)."""

CHAOS_OFFSET_SAMPLE_INTERVAL_MS = 500
"""How often the chaos run samples each group's committed offsets (QUERY_CONSUMER_OFFSET) (txmq)."""

CHAOS_QUIESCE_TIMEOUT_MS = 90_000
"""Longest wait, after every fault is healed, for the workload to drain before the check (txmq)."""

# --- the gRPC door (issue 13: txmq.broker.grpc; RocketMQ 5 proxy ``ProxyConfig`` defaults) -------

GRPC_PORT_DEFAULT = 8081
"""The port ``txmq broker --grpc-port`` documents (RocketMQ ``ProxyConfig.grpcServerPort``); the
door is off unless ``grpc_port`` is set."""

GRPC_MAX_INBOUND_BYTES = 130 * 1024 * 1024
"""Largest gRPC request accepted (``ProxyConfig.grpcMaxInboundMessageSize``: 32 messages of
4 MiB and their properties); a body above ``max_message_size`` inside it gets
MESSAGE_BODY_TOO_LARGE, a larger request the transport's RESOURCE_EXHAUSTED."""

GRPC_PRODUCER_MAX_ATTEMPTS = 3
"""Send attempts the door tells producers to make (``ProxyConfig.grpcClientProducerMaxAttempts``)."""

GRPC_PRODUCER_BACKOFF_INITIAL_MS = 10
"""First retry backoff told to producers (``grpcClientProducerBackoffInitialMillis``)."""

GRPC_PRODUCER_BACKOFF_MAX_MS = 1_000
"""Longest retry backoff told to producers (``grpcClientProducerBackoffMaxMillis``)."""

GRPC_PRODUCER_BACKOFF_MULTIPLIER = 2
"""Backoff growth told to producers (``grpcClientProducerBackoffMultiplier``)."""

GRPC_LONG_POLLING_MIN_MS = 5_000
"""Shortest long-polling wait of a receive (``grpcClientConsumerMinLongPollingTimeoutMillis``)."""

GRPC_LONG_POLLING_MAX_MS = 20_000
"""Longest long-polling wait of a receive, and the one told to consumers in their settings
(``grpcClientConsumerMaxLongPollingTimeoutMillis``)."""

GRPC_LONG_POLLING_RESERVE_MS = 100
"""Time kept back from a receive's gRPC deadline to answer before it (``longPollingReserveTimeInMillis``)."""

GRPC_RECEIVE_BATCH_SIZE = 32
"""Receive batch size told to consumers, and the most messages one receive returns
(``grpcClientConsumerLongPollingBatchSize``)."""

GRPC_RECEIVE_RECHECK_MS = 1_000
"""How often a parked receive looks again without being woken (txmq: FIFO groups and invisible
times that expire free messages without any append)."""

GRPC_INVISIBLE_DEFAULT_MS = 60_000
"""Invisible time of a receive that names none, as push consumers do (``defaultInvisibleTimeMills``)."""

GRPC_INVISIBLE_MIN_RECV_MS = 10_000
"""Default of ``BrokerConfig.grpc_min_invisible_time_ms``, the shortest invisible time a receive
may ask for (``minInvisibleTimeMillsForRecv``)."""

GRPC_INVISIBLE_MAX_MS = 12 * 3600 * 1000
"""Longest invisible time a receive or ChangeInvisibleDuration may ask for (``maxInvisibleTimeMills``)."""

GRPC_DELAY_MAX_MS = 24 * 3600 * 1000
"""Furthest ahead a message's delivery timestamp may be (``ProxyConfig.maxDelayTimeMills``)."""

GRPC_USER_PROPERTIES_MAX = 128
"""Most user properties on one message (``ProxyConfig.userPropertyMaxNum``)."""

GRPC_USER_PROPERTIES_MAX_BYTES = 16 * 1024
"""Largest total size of one message's user property keys and values (``maxUserPropertySize``)."""

GRPC_MESSAGE_GROUP_MAX_CHARS = 64
"""Longest FIFO message group (``ProxyConfig.maxMessageGroupSize``)."""

GRPC_SEND_DEDUP_ENTRIES = 65_536
"""Recent sends remembered by (topic, message id) so a client's retry of a send that was stored
is answered with the first result and stores nothing (txmq: the 5.x clients retry halves; the
proxy has no such window). Oldest forgotten first."""

GRPC_SEND_DEDUP_WINDOW_MS = 5 * 60_000
"""How long a send is remembered for retries (txmq: far above the clients' 3 attempts of a 3 s
request timeout each)."""

GRPC_SEND_GATHER_MAX_MS = 5
"""Longest a gRPC send waits for an fsync under way to end before it is stored anyway, gathered
with the sends that came meanwhile into one append (txmq)."""

GRPC_CLIENT_IDLE_MS = 120_000
"""A gRPC client with no Telemetry stream and no call for this long is forgotten
(``ProxyConfig.grpcClientIdleTimeMills``)."""

GRPC_CLIENTS_MAX = 10_000
"""Most gRPC clients (client ids) known at once; settings from one more are refused with
TOO_MANY_REQUESTS (txmq, as ``CONNECTIONS_MAX``)."""

GRPC_TELEMETRY_QUEUE_MAX = 1_024
"""Server commands (settings answers, check-backs) queued for one Telemetry stream; beyond it
check-backs are dropped (retried by the next checker round; txmq)."""

# -- recovery (issue 11 part 3) -------------------------------------------------------------------

QUARANTINE_DIR = "quarantine"
"""Directory under the data directory where recovery moves files it cannot use (consume queues,
index files, checkpoint, metadata, a cut commit log tail), one numbered subdirectory per opening,
instead of deleting them or refusing to start (txmq; RocketMQ deletes or aborts)."""

TX_STATE_WINDOW_ENTRIES = 65_536
"""Settled transaction outcomes kept in memory before they are written to the transaction state
table file (1 byte per half offset, RocketMQ 3.x ``tranStateTable`` in spirit; txmq): bounds memory
whatever the settled history."""

TX_SNAPSHOT_VERSION = 1
"""Format version of the transaction index snapshot (``meta/transactionIndex.snapshot``; txmq)."""

TX_SNAPSHOT_ENCODE_CHUNK = 1_000
"""Pending half messages encoded at a time when the writer thread encodes the transaction index
snapshot (about 200 KiB, 1 ms); the event loop gets the GIL between chunks (txmq)."""

FILE_NAME_MAX_BYTES = 255
"""Longest file name the store creates (Linux ``NAME_MAX``): a topic whose name is longer, or not a
plain file name, gets no consume queue directory (txmq; RocketMQ ``TopicValidator`` caps topics at
127 characters, which the door checks)."""

# --- RocketMQ message codecs (issue 12: protocol/_message_codec.py) ------------------------------
MESSAGE_TOPIC_V1_MAX_BYTES = 127
"""Longest topic (UTF-8 bytes) a MessageExt record carries with magic code v1 and its 1-byte
signed topic length; a longer topic is written with magic code v2 (2-byte length). RocketMQ
``CommitLog`` ``autoMessageVersionOnTopicLen``: v2 when the topic is longer than ``Byte.MAX_VALUE``."""

MESSAGE_TOPIC_MAX_BYTES = 32_767
"""Longest topic (UTF-8 bytes) of a v2 MessageExt record: its 2-byte signed length
(``Short.MAX_VALUE``; RocketMQ ``MessageVersion.MESSAGE_VERSION_V2``)."""

MESSAGE_BODY_INFLATED_MAX_BYTES = FRAME_SIZE_MAX_BYTES
"""Largest body a compressed (zlib) MessageExt body may inflate to; a larger one is refused as
malformed rather than allocated (txmq: bounds a decompression bomb; RocketMQ producers compress
bodies of at most ``maxMessageSize``, 4 MiB by default)."""

MESSAGE_HOST_CACHE_ENTRIES = 1_024
"""Host strings (``ip:port``) remembered by the MessageExt codec with their packed bytes, so a
pull body of 32 messages from one broker parses its hosts once (txmq)."""

RECORD_TOPIC_CACHE_ENTRIES = 1_024
"""Topics whose encoded record field (magic code, length, UTF-8 bytes) the store's record
encoder remembers, so a send to a known topic does not encode and check it again (txmq)."""

assert MESSAGE_TOPIC_V1_MAX_BYTES < MESSAGE_TOPIC_MAX_BYTES
assert TOPIC_NAME_MAX_CHARS <= MESSAGE_TOPIC_V1_MAX_BYTES
assert MESSAGE_SIZE_MAX_BYTES <= MESSAGE_BODY_INFLATED_MAX_BYTES

# --- name server (issue 12, part 3) --------------------------------------------------------------
NAMESRV_PORT = 9876
"""Default listen port of ``txmq namesrv``. RocketMQ NettyServerConfig ``listenPort`` of the name
server (NamesrvStartup) 9876."""

BROKER_CHANNEL_EXPIRED_TIME_MS = 120_000
"""A broker that neither registered nor beat for this long is dropped from the routes, unless its
REGISTER_BROKER header names another ``heartbeatTimeoutMillis``. RocketMQ RouteInfoManager
``DEFAULT_BROKER_CHANNEL_EXPIRED_TIME`` 2 min."""

SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS = 5_000
"""How often the name server looks for expired brokers. RocketMQ NamesrvConfig
``scanNotActiveBrokerInterval`` 5 s."""

NAMESRV_REGISTER_CHECK_MS = 1_000
"""How often a broker with name servers looks for new topics to register at once (txmq; RocketMQ
registers a created topic from the request that created it)."""

REGISTER_NAME_SERVER_PERIOD_MS = 30_000
"""How often a broker registers its topics with the name server again. RocketMQ BrokerConfig
``registerNameServerPeriod`` 30 s."""

AUTO_CREATE_TOPIC_QUEUE_NUMS = 8
"""Queues of the default topic TBW102 a broker registers when auto-create is on. RocketMQ BrokerConfig
``defaultTopicQueueNums`` 8 (TopicConfigManager). A client then creates a topic with
min(its ``defaultTopicQueueNums`` 4, this) queues."""

REGISTER_BODY_INFLATED_MAX_BYTES = 64 * 1024 * 1024
"""Largest REGISTER_BROKER body a compressed one may inflate to (txmq; RocketMQ sets no bound). About
300 000 topics of RocketMQ's compressed TopicConfig lines."""

assert SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS < BROKER_CHANNEL_EXPIRED_TIME_MS
assert 3 * REGISTER_NAME_SERVER_PERIOD_MS < BROKER_CHANNEL_EXPIRED_TIME_MS  # two missed registrations pass

# --- issue 12: bounds that were inline ------------------------------------------------------------
FLUSH_INTERVAL_MS = 500
"""Default period of the asynchronous commit log flush (BrokerConfig ``flush_interval_ms``).
RocketMQ MessageStoreConfig ``flushIntervalCommitLog`` 500 ms."""

BROKER_PORT = 10911
"""Default broker listen port. RocketMQ NettyServerConfig ``listenPort`` of a broker 10911."""

PORT_MAX = 65_535
"""Largest TCP port."""

MESSAGE_SIZE_CONFIG_MAX_BYTES = 4 * MESSAGE_SIZE_MAX_BYTES
"""Largest ``max_message_size`` a broker may be configured with: a 16 MiB body still fits one
frame with its header (txmq; RocketMQ ``maxMessageSize`` defaults to 4 MiB)."""

SINK_SEND_BATCH_ROWS = 256
"""Rows per half-message batch request of the Spark sink (≤ ``BATCH_MESSAGES_MAX``; txmq)."""

SINK_SEND_BATCH_BYTES = 2 * 1024 * 1024
"""Body bytes per half-message batch request of the Spark sink (well under the frame size; txmq)."""

SINK_TIMEOUT_S = 600
"""Default ``timeoutSeconds`` of the Spark sink: how long its halves wait for their batch commit
before the broker rolls them back (txmq)."""

SINK_MAX_IN_FLIGHT = 8
"""Default ``maxInFlight`` of the Spark sink: batch requests in flight per task (txmq)."""

SINK_COMMIT_RETRY_INTERVAL_MS = 1_000
"""Pause between two tries of a Spark sink batch commit on a broker group that did not answer (ms;
txmq: a restarted broker answers again within seconds; the tries stop after the sink's
``timeoutSeconds``, when its halves there are rolled back anyway)."""

assert SINK_SEND_BATCH_ROWS <= BATCH_MESSAGES_MAX
assert SINK_SEND_BATCH_BYTES + FRAME_HEADER_MAX_BYTES < FRAME_SIZE_MAX_BYTES

# --- issue 13: pop consumption ------------------------------------------------------------------
RETRY_MAX_TIMES = MAX_RECONSUME_TIMES
"""Default retries of a consumer group before the DLQ (a pop message's max delivery attempts is
this + 1). RocketMQ ``SubscriptionGroupConfig.retryMaxTimes`` 16."""

POP_BATCH_MAX = 32
"""Most messages one pop returns. RocketMQ ``PopMessageProcessor`` refuses ``maxMsgNums`` above
32 (a checkpoint's bitmap is one int)."""

POP_INVISIBLE_TIME_MIN_MS = 10_000
"""Shortest invisible time a receive may ask for; checked by the gRPC door, as the proxy does
(the broker's pop takes any positive time). RocketMQ ``ProxyConfig.minInvisibleTimeMillsForRecv``
10 s."""

POP_INVISIBLE_TIME_MAX_MS = 12 * 3_600_000
"""Longest invisible time of a pop or a change of invisible time. RocketMQ
``ProxyConfig.maxInvisibleTimeMills`` 12 h."""

POP_INVISIBLE_TIME_DEFAULT_MS = 60_000
"""Invisible time when a receive names none. RocketMQ ``ProxyConfig.defaultInvisibleTimeMills``
60 s."""

POP_REVIVE_CHECKPOINTS_PER_TICK_MAX = 256
"""Expired checkpoints revived by one tick (the rest wait for the next), so one tick's append
stays bounded (txmq; RocketMQ ``PopReviveService`` revives in bounded rounds too)."""

POP_READ_BYTES_MAX = 4 * 1024 * 1024
"""Body bytes one pop reads from one queue (txmq; a pop returns at most ``POP_BATCH_MAX``
messages anyway)."""

POP_RETRY_FIRST_EVERY = 5
"""One pop in this many reads the group's retry topic before the topic (the others after it).
RocketMQ ``PopMessageProcessor``: ``randomQ % 5 == 0`` pops the retry topic first."""

POP_RECEIPT_HANDLE_CHARS_MAX = 512
"""Longest receipt handle parsed; a longer one is refused unread (txmq; ours are ~80 chars)."""

# -- outbox transports (RabbitMQ, NATS JetStream, txmq) -----------------------------------------------

OUTBOX_TRANSPORT_CONNECT_TIMEOUT_MS = 5_000
"""How long a transport waits for a RabbitMQ or NATS connection before the send (or subscribe)
fails; the relay then backs off and keeps the rows (txmq)."""

OUTBOX_TRANSPORT_SEND_TIMEOUT_MS = 10_000
"""How long one batch waits for the broker's durable acknowledgement (RabbitMQ publisher confirms,
JetStream publish acks) before it counts as failed (txmq; nats-py ``js.publish`` default 5 s)."""

OUTBOX_TRANSPORT_RETRY_DELAY_MS = 1_000
"""Pause before a failed delivery is offered again (RocketMQ's first delay level is 1 s; RabbitMQ
requeues at once, so the consumer waits this long before its nack; JetStream ``nak`` delay)."""

OUTBOX_TRANSPORT_PREFETCH = 32
"""Unacknowledged deliveries a consumer holds (RabbitMQ ``basic.qos`` prefetch count; JetStream
pull ``fetch`` batch). RocketMQ ``consumeMessageBatchMaxSize`` is 1; 32 is the push consumer's
``pullBatchSize``."""

OUTBOX_TRANSPORT_ACK_WAIT_MS = 30_000
"""JetStream ``ack_wait``: an unacknowledged delivery is redelivered after this (nats-server default
30 s)."""

OUTBOX_NATS_DUPLICATE_WINDOW_MS = 120_000
"""JetStream ``duplicate_window`` of the outbox stream: a resend with the same ``Nats-Msg-Id``
within it is stored once (nats-server default 2 min)."""

OUTBOX_TRANSPORT_DLQ_READ_MAX = 1_000
"""Most dead letters :meth:`Transport.dead_letters` returns in one call (txmq)."""

OUTBOX_TXMQ_TOPIC_ROUTE_WAIT_MS = 10_000
"""How long the txmq transport's ``ensure_topic`` waits, over name servers, for a topic it created
on every master to be routed (ms; txmq: brokers register a created topic within
``NAMESRV_REGISTER_CHECK_MS``, 1 s, and ten of those ride out a loaded machine)."""

OUTBOX_TXMQ_TOPIC_ROUTE_POLL_MS = 200
"""Pause between two looks for that route (ms; txmq)."""

OUTBOX_TRANSPORT_NAME_MAX_CHARS = 127
"""Longest topic or group name a transport maps to a broker name (RocketMQ
``TopicValidator.TOPIC_MAX_LENGTH`` 127; RabbitMQ queue names allow 255 bytes)."""

CONSOLE_SEND_COUNT_MAX = 100_000
"""Most messages one ``txmq send`` sends (``--count``; a console producer, not a benchmark: use
``txmq bench send`` for load) (txmq)."""

CONSOLE_BODY_MAX_BYTES = 4 * 1024 * 1024
"""Largest body ``txmq send`` accepts (RocketMQ ``DefaultMQProducer.maxMessageSize``, 4 MiB)."""

CONSOLE_CONSUME_IDLE_MS = 1_000
"""``txmq consume`` stops after this long without a new message unless ``--follow`` (txmq)."""

CONSOLE_PULL_BATCH = 32
"""Messages one ``txmq consume`` pull asks for per queue (RocketMQ
``DefaultMQPushConsumer.pullBatchSize`` 32)."""

CLUSTER_TOPIC_QUEUE_NUMS = 16
"""Queues of the topic named after the broker's cluster that a broker registers with its name
servers (RocketMQ ``TopicConfig`` default read/write queue numbers, ``TopicConfigManager.init``)."""

# -- metrics (issue 15 item 3: RocketMQ-named /metrics) ------------------------------------------

METRICS_SCRAPE_TIMEOUT_MS = 10_000
"""Longest a ``/metrics`` scrape waits for the broker's event loop to build the metric families
before it fails (Prometheus' default ``scrape_timeout`` is 10 s) (txmq)."""

# -- security (issue 16: ACL) ----------------------------------------------------------------------

ACL_GRPC_DATE_TIME_SKEW_MAX_MS = 15 * 60 * 1000
"""Largest difference between a gRPC call's signed ``x-mq-date-time`` and the broker's clock (beyond
the time zone allowance below) before the call is refused UNAUTHORIZED as stale or replayed.
RocketMQ's proxy does not bound it; 15 minutes is AWS Signature Version 4's limit
(``RequestTimeTooSkewed``), the scheme RocketMQ's ``MQv2-HMAC-SHA1`` header copies."""

ACL_GRPC_ZONE_OFFSET_MIN_MS = -12 * 3600 * 1000
"""Most negative time zone offset allowed in ``x-mq-date-time``: the official clients sign their
*local* time with a ``Z`` suffix (rocketmq-clients python ``signature.py``: ``datetime.now()``), so a
header may be off UTC by the client's zone offset; UTC−12:00 is the westmost zone (IANA tz
``Etc/GMT+12``)."""

ACL_GRPC_ZONE_OFFSET_MAX_MS = 14 * 3600 * 1000
"""Most positive time zone offset allowed in ``x-mq-date-time``: UTC+14:00 is the eastmost zone
(IANA tz ``Pacific/Kiritimati``)."""

ACL_RELOAD_POLL_MS = 1_000
"""How often the broker looks at the accounts file's modification time, size and inode to reload
it (txmq: an edit is in force within a second; ACL 2.0 keeps users in its metadata store instead of
a file)."""

# --- Console browser tests, screenshots and benchmark (issue 15, browser helper) -----------------

BROWSER_INSTALL_TIMEOUT_S = 600
"""Longest one ``apt-get`` step of installing Debian's ``chromium`` may take (about 100 MB of
packages on a slow mirror) (txmq)."""

BROWSER_LAUNCH_TIMEOUT_S = 60
"""Longest Chromium may take to start under Playwright (Playwright's default is 180 s; a cold start
on a loaded 2-core machine takes a few seconds) (txmq)."""

BENCH_CONSOLE_PAGE_BUDGET_MS = 500
"""A console page's load-time goal at 100 topics, 50 groups and 100,000 pending transactions
(issue 15)."""

BROWSER_CONSOLE_START_TIMEOUT_S = 60
"""Longest a ``txmq console`` process may take to answer its first request (imports of FastAPI and
plotly take seconds on a loaded machine) (txmq)."""

# -- web console: API and backend (issue #15, helper "api") ------------------------------------------
CONSOLE_SAMPLE_INTERVAL_MS = 2_000
"""How often the console's History sampler reads rates and backlogs (the lag chart's step; RocketMQ
Dashboard polls its dashboard every few seconds) (txmq)."""

CONSOLE_HISTORY_SAMPLES = 300
"""Samples the console's History keeps: 300 × 2 s = the last 10 minutes (txmq)."""

CONSOLE_PAGE_SIZE_MAX = 1_000
"""Most rows one console API page answers (``limit``, ``size``) (txmq)."""

CONSOLE_PENDING_WINDOW_MAX = 10_000
"""Deepest row (``offset + limit``) of the console's pending-transactions list: the broker sorts
every pending half message per request and answers the oldest ones (txmq)."""

CONSOLE_PARKED_READ_MAX = 10_000
"""Most discarded half messages (``TRANS_CHECK_MAX_TIME_TOPIC``) the console reads for its parked
list (txmq)."""

CONSOLE_EXPORT_MESSAGES_MAX = 100_000
"""Most messages one DLQ export holds (as ``txmq dlq export``'s default) (txmq)."""

CONSOLE_TRACE_OP_SCAN_MAX = 2_048
"""Op records the trace reads, from the decision's time on, to find which one settled a message
that was not decided by an operator (an operator's decision is found through the key index)
(txmq)."""

CONSOLE_BODY_PREVIEW_CHARS = 120
"""Characters of a body shown in the console's message lists (txmq)."""

CONSOLE_SAMPLE_GROUPS_MAX = 200
"""Most consumer groups the History sampler reads the lag of per sample (txmq)."""

# -- web console: pages (issue #15, helper "pages") ------------------------------------------------
CONSOLE_PAGE_ROWS = 100
"""Rows a console page shows of a long list by default (pending and parked transactions): a page,
never the whole list, so 100,000 pending transactions render as fast as 100 (txmq; the API's
``limit`` default)."""

CONSOLE_DLQ_PAGE_ROWS = 50
"""Dead letters per page of ``/dlq/{group}`` (the API's ``size`` default) (txmq)."""

CONSOLE_AUDIT_PAGE_ROWS = 50
"""Newest operator decisions the transactions page shows in its audit log (txmq)."""

CONSOLE_STATIC_MAX_AGE_S = 3_600
"""``Cache-Control: max-age`` of ``/static/plotly.min.js`` (4.8 MB): a browser fetches it once an
hour, not on every page (txmq)."""

# -- web console: login (issue #16 item 4, helper "login") ----------------------------------------
CONSOLE_SESSION_TTL_MS = 8 * 3_600_000
"""How long a console login lasts (ms): a working day, then the login page again (txmq; OWASP's
session guidance asks for an absolute timeout, and 8 h is Grafana's and RocketMQ Dashboard's order
of magnitude)."""

CONSOLE_SESSIONS_MAX = 1_000
"""Most console sessions held at once; beyond it the oldest is logged out (txmq: a bound on the
memory a flood of logins can take)."""

CONSOLE_USER_CLIENTS_MAX = 32
"""Logged-in users whose broker clients the console keeps open; the least recently active user's
are closed beyond it and opened again on its next request (txmq)."""

CONSOLE_BASIC_AUTH_CACHE_MS = 60_000
"""How long the console trusts HTTP Basic credentials the broker accepted before asking it again
(ms); the broker still authorizes every request they sign (txmq)."""

# -- TLS (issue #16 item 3, helper "tls") -----------------------------------------------------------
TLS_HANDSHAKE_TIMEOUT_MS = 10_000
"""Longest a new connection on a TLS port may take to send its first byte, and then to finish the
TLS handshake, before it is closed (Netty ``SslHandler``'s default ``handshakeTimeoutMillis``, which
RocketMQ's remoting server keeps)."""

TLS_LISTEN_BACKLOG = 100
"""Pending connections the TLS-sniffing remoting listener queues (``asyncio.start_server``'s default
``backlog``, used when TLS is off) (txmq)."""

# -- Spark source partitions (issue #17 item 2, helper "speed") -------------------------------------
SPARK_SOURCE_PARTITION_ROWS_MAX = 100_000
"""Most offsets one partition of the ``txmq`` Spark source reads: a queue's range beyond it is split
into equal consecutive pieces, so a large range of one queue keeps several executors busy (Spark's
Kafka source option ``maxRecordsPerPartition``; the value is txmq's: 100,000 rows of 256 B take an
executor about 1-2 s here, far above the per-task overhead)."""

# -- Spark standalone cluster (issue #17 item 1, helper "cluster") ---------------------------------
SPARK_CLUSTER_START_TIMEOUT_S = 120.0
"""Longest :class:`txmq.testing.SparkCluster` waits for its master and workers to start and the
workers to register (s): each is a JVM, about 3-5 s apiece on an idle 2-core machine, much more
under load (txmq)."""

# -- replication: RocketMQ's HA protocol (issue #25, helper "hrepl") -------------------------------
HA_TRANSFER_BATCH_BYTES = 32 * 1024
"""Most commit-log bytes in one master-to-slave transfer frame (RocketMQ MessageStoreConfig
``haTransferBatchSize``, 32 KiB)."""

HA_SEND_HEARTBEAT_INTERVAL_MS = 5_000
"""The master sends an empty transfer frame (a heartbeat) after this long without sending anything
(RocketMQ MessageStoreConfig ``haSendHeartbeatInterval``, 5 s)."""

HA_HOUSEKEEPING_INTERVAL_MS = 20_000
"""Either side of an HA connection closes it after this long without reading anything (RocketMQ
MessageStoreConfig ``haHousekeepingInterval``, 20 s)."""

HA_REPORT_INTERVAL_MS = 5_000
"""A slave reports its max offset at least this often, besides after each append (RocketMQ
``DefaultHAClient``: ``haSendHeartbeatInterval`` as the report period, 5 s)."""

HA_RECONNECT_INTERVAL_MS = 1_000
"""Longest wait between a slave's attempts to connect to its master; the first retries back off
from HA_RECONNECT_MIN_MS. RocketMQ ``HAClient`` waits 5 s after a failed connect; txmq 1 s: a
master restarted within its lease keeps its role with a SyncStateSet of itself until its slave
reconnects and catches up, and a 5 s back-off left it alone long enough for a second fault to
find no election candidate (failover chaos seed 2027: 12-14 s outages). A refused connect a
second costs nothing measurable."""

HA_RECONNECT_MIN_MS = 100
"""A slave's first reconnect delay, doubled per failure up to HA_RECONNECT_INTERVAL_MS (txmq)."""

HA_IDLE_WAIT_MS = 100
"""How long the master's transfer loop waits for new flushed bytes before it looks again
(RocketMQ ``WriteSocketService``: ``waitForRunning(100)``)."""

HA_MAX_GAP_NOT_IN_SYNC_BYTES = 256 * 1024 * 1024
"""A SYNC_MASTER answers SLAVE_NOT_AVAILABLE at once when no slave's acknowledged offset is within
this many bytes of the send's end (RocketMQ MessageStoreConfig ``haMaxGapNotInSync``, 256 MiB)."""

HA_SLAVE_TIMEOUT_MS = 3_000
"""Longest a SYNC_MASTER waits for its slaves' acknowledgements before it answers
FLUSH_SLAVE_TIMEOUT (RocketMQ MessageStoreConfig ``slaveTimeout``, 3 s)."""

HA_READ_BUFFER_BYTES = 4 * 1024 * 1024
"""Most undecoded bytes an HA decoder holds (RocketMQ ``DefaultHAClient`` ``READ_MAX_BUFFER_SIZE``,
4 MiB): a transfer frame is at most HA_TRANSFER_BATCH_BYTES + 12, so more is a protocol error."""

HA_RECORD_SIZE_MAX_BYTES = 64 * 1024 * 1024
"""Largest record size a slave accepts from its master while it joins a record's transfer frames
(the store's ``RECORD_SIZE_MAX``, 64 MiB: txmq's bound on one commit-log record)."""

HA_SLAVES_MAX = 16
"""Most slave connections a master's HA listener serves at once (txmq; RocketMQ has no bound)."""

assert HA_TRANSFER_BATCH_BYTES + 12 <= HA_READ_BUFFER_BYTES
assert HA_RECONNECT_MIN_MS <= HA_RECONNECT_INTERVAL_MS

ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO_PERCENT = 40
"""Share of physical memory a consumer's lag may reach before the master suggests it read from a
slave (RocketMQ MessageStoreConfig ``accessMessageInMemoryMaxRatio``, 40: ``DefaultMessageStore
.getMessage`` sets ``suggestPullingFromSlave`` when ``maxOffsetPy - maxPhyOffsetPulling`` exceeds
it). Used when ``access_message_in_memory_max_bytes`` is 0."""

WHICH_BROKER_WHEN_CONSUME_SLOWLY = 1
"""The broker id a pull answer suggests to a consumer that lags (RocketMQ SubscriptionGroupConfig
``whichBrokerWhenConsumeSlowly``, default 1: the first slave)."""

# --- controller mode, the broker's side (issue #26; docs/replication.md "Controller mode") ---

BROKER_HEARTBEAT_INTERVAL_MS = 1_000
"""How often a broker in controller mode sends BROKER_HEARTBEAT to the controller leader
(RocketMQ BrokerConfig ``brokerHeartbeatInterval``, 1 s)."""

CONTROLLER_LEASE_MS = 3_000
"""A master's write lease, renewed by each answered heartbeat (txmq, beyond RocketMQ #7017): the
master refuses writes once ``time.monotonic()`` passes the heartbeat's send time plus this."""

CONTROLLER_HEARTBEAT_TIMEOUT_MS = 3_000
"""A broker silent this long is inactive to the controller (RocketMQ BrokerConfig
``controllerHeartBeatTimeoutMills``, 10 s; shorter here for failover within 5 s)."""

HA_MAX_TIME_SLAVE_NOT_CATCHUP_MS = 15_000
"""A slave whose acknowledgement has not reached the master's end for this long leaves the
SyncStateSet (RocketMQ MessageStoreConfig ``haMaxTimeSlaveNotCatchup``, 15 s)."""

MIN_IN_SYNC_REPLICAS = 1
"""Smallest SyncStateSet, the master included, a controller-mode master takes a SYNC send with
(RocketMQ MessageStoreConfig ``minInSyncReplicas``, 1)."""

CONTROLLER_ADDRESSES_MAX = 9
"""Most controller addresses ``controller_addr`` may name (txmq: a Raft group beyond 9 voters
gains nothing)."""

# -- RocketMQ 4 message trace (issue #28) -----------------------------------------------------------
TRACE_MSG_BATCH_NUM = 10
"""Trace records a client collects before it sends them as one trace message. RocketMQ ClientConfig
``traceMsgBatchNum`` 10."""

TRACE_MSG_BATCH_NUM_MAX = 20
"""Most trace records in one trace message. RocketMQ ``AsyncTraceDispatcher`` caps ``batchNum`` at 20."""

TRACE_MSG_SIZE_MAX_BYTES = 128_000
"""A trace message's body is cut once it reaches this many bytes. RocketMQ ``AsyncTraceDispatcher``
``maxMsgSize`` (128,000, its trace producer's ``maxMessageSize``)."""

TRACE_QUEUE_SIZE = 2_048
"""Trace records a client holds before it drops new ones (counted). RocketMQ
``AsyncTraceDispatcher.traceContextQueue`` capacity 2,048."""

TRACE_FLUSH_INTERVAL_MS = 5_000
"""Fewer than :data:`TRACE_MSG_BATCH_NUM` records are sent after this long. RocketMQ
``AsyncTraceDispatcher.flushTraceInterval`` 5 s."""

TRACE_SEND_TIMEOUT_MS = 5_000
"""Request timeout of one trace message send. RocketMQ's trace producer ``sendMsgTimeout`` 5 s."""

TRACE_SHUTDOWN_WAIT_MS = 5_000
"""Longest a client's shutdown waits to send the trace records it still holds. RocketMQ
``AsyncTraceDispatcher.WAIT_FOR_SHUTDOWN`` 5 s."""

TRACE_TOPIC_QUEUE_NUMS = 1
"""Queues of a trace topic the broker creates (``trace_topic_enable``). RocketMQ
``TopicConfigManager``: 1 read and 1 write queue for ``msgTraceTopicName``."""

assert 0 < TRACE_MSG_BATCH_NUM <= TRACE_MSG_BATCH_NUM_MAX <= TRACE_QUEUE_SIZE
assert TRACE_MSG_SIZE_MAX_BYTES < MESSAGE_SIZE_MAX_BYTES

# --- the broker's leg of a transaction's trace (issue #28; docs/tracing.md) ---

TRANSACTION_TRACE_MAX = 50_000
"""Pending transactions, and recently settled ones, whose life the broker keeps in memory
(BrokerConfig ``transaction_trace_max``; txmq). A life takes about 0.33 KiB when its producer
settled it, 0.65 KiB with two check-backs answered (tracemalloc, tests/broker/test_tx_trace.py),
so the settled ones take 16 to 32 MiB; at 20,000 transactions a second they are the last 2.5 s."""

TRANSACTION_TRACE_QUERY_MAX = 64
"""Most transaction lives one GET_TRANSACTION_TRACE answers (txmq; a trace id names one business
transaction, which rarely sends more than a few transactional messages)."""
