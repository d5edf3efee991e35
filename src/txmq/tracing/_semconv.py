"""Span attribute names and values: OpenTelemetry's messaging semantic conventions, and the few
txmq adds for what they do not cover (RocketMQ's transactions and retries).

Source: open-telemetry/semantic-conventions v1.44.0 (2026-08-04), ``model/messaging/registry.yaml``
(the attribute registry), ``model/messaging/rocketmq.yaml`` (RocketMQ's send, receive and process
spans) and ``docs/messaging/messaging-spans.md`` (span names, operation types, span kinds, trace
structure). The messaging conventions are at the status *development* there. The constants are
plain strings, so the optional ``opentelemetry-api`` need not be installed to import them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ERROR_TYPE",
    "MESSAGING_BATCH_MESSAGE_COUNT",
    "MESSAGING_CLIENT_ID",
    "MESSAGING_CONSUMER_GROUP_NAME",
    "MESSAGING_DESTINATION_NAME",
    "MESSAGING_DESTINATION_PARTITION_ID",
    "MESSAGING_MESSAGE_ID",
    "MESSAGING_OPERATION_NAME",
    "MESSAGING_OPERATION_TYPE",
    "MESSAGING_ROCKETMQ_CONSUMPTION_MODEL",
    "MESSAGING_ROCKETMQ_MESSAGE_DELAY_TIME_LEVEL",
    "MESSAGING_ROCKETMQ_MESSAGE_KEYS",
    "MESSAGING_ROCKETMQ_MESSAGE_RECONSUME_TIMES",
    "MESSAGING_ROCKETMQ_MESSAGE_TAG",
    "MESSAGING_ROCKETMQ_MESSAGE_TYPE",
    "MESSAGING_ROCKETMQ_NAMESPACE",
    "MESSAGING_ROCKETMQ_TRANSACTION_CHECK_TIMES",
    "MESSAGING_ROCKETMQ_TRANSACTION_OUTCOME",
    "MESSAGING_ROCKETMQ_TRANSACTION_STATE",
    "MESSAGING_SYSTEM",
    "OPERATION_CREATE",
    "OPERATION_PROCESS",
    "OPERATION_RECEIVE",
    "OPERATION_SEND",
    "OPERATION_SETTLE",
    "ROCKETMQ",
    "ROCKETMQ_MESSAGE_TYPE_DELAY",
    "ROCKETMQ_MESSAGE_TYPE_FIFO",
    "ROCKETMQ_MESSAGE_TYPE_NORMAL",
    "ROCKETMQ_MESSAGE_TYPE_TRANSACTION",
    "SCHEMA_URL",
]

SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.44.0"
"""The semantic conventions version these names follow (the tracer's schema URL)."""

# -- the messaging registry (model/messaging/registry.yaml) -----------------------------------------
MESSAGING_SYSTEM: Final = "messaging.system"
"""``rocketmq`` for txmq's SDK (rocketmq.yaml: "MUST be set to rocketmq")."""
MESSAGING_DESTINATION_NAME: Final = "messaging.destination.name"
"""The topic (or the retry / dead-letter topic a message is moved to)."""
MESSAGING_DESTINATION_PARTITION_ID: Final = "messaging.destination.partition.id"
"""The queue id, as a string."""
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
"""One of the ``OPERATION_*`` values."""
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
"""The system-specific name of the operation (``send``, ``send_half``, ``end_transaction`` …)."""
MESSAGING_MESSAGE_ID: Final = "messaging.message.id"
"""The client message id (``UNIQ_KEY``), on spans of a single message."""
MESSAGING_BATCH_MESSAGE_COUNT: Final = "messaging.batch.message_count"
"""Messages of a batching operation (set on batch APIs only, as the registry says)."""
MESSAGING_CLIENT_ID: Final = "messaging.client.id"
"""The client id the SDK generated (``host@pid@salt``; rocketmq.md: the SDK's own id)."""
MESSAGING_CONSUMER_GROUP_NAME: Final = "messaging.consumer.group.name"
"""The consumer group (rocketmq.yaml: required on receive and process spans)."""

OPERATION_CREATE: Final = "create"
OPERATION_SEND: Final = "send"
OPERATION_RECEIVE: Final = "receive"
OPERATION_PROCESS: Final = "process"
OPERATION_SETTLE: Final = "settle"

ROCKETMQ: Final = "rocketmq"
"""The ``messaging.system`` value of Apache RocketMQ."""

# -- the RocketMQ registry (registry.yaml, group registry.messaging.rocketmq) -------------------------
MESSAGING_ROCKETMQ_MESSAGE_TYPE: Final = "messaging.rocketmq.message.type"
"""One of the ``ROCKETMQ_MESSAGE_TYPE_*`` values."""
MESSAGING_ROCKETMQ_MESSAGE_TAG: Final = "messaging.rocketmq.message.tag"
MESSAGING_ROCKETMQ_MESSAGE_KEYS: Final = "messaging.rocketmq.message.keys"
"""A string array: the message's keys (``KEYS``, separated by spaces on the wire)."""
MESSAGING_ROCKETMQ_MESSAGE_DELAY_TIME_LEVEL: Final = "messaging.rocketmq.message.delay_time_level"
MESSAGING_ROCKETMQ_CONSUMPTION_MODEL: Final = "messaging.rocketmq.consumption_model"
"""``clustering`` or ``broadcasting`` (consumer spans)."""
MESSAGING_ROCKETMQ_NAMESPACE: Final = "messaging.rocketmq.namespace"
"""RocketMQ 5's resource namespace; txmq has none, so its spans leave it out."""

ROCKETMQ_MESSAGE_TYPE_NORMAL: Final = "normal"
ROCKETMQ_MESSAGE_TYPE_FIFO: Final = "fifo"
ROCKETMQ_MESSAGE_TYPE_DELAY: Final = "delay"
ROCKETMQ_MESSAGE_TYPE_TRANSACTION: Final = "transaction"

# -- txmq's own, in the system's namespace as the conventions ask ("Messaging system-specific
# attributes MUST be defined in the corresponding messaging.{system} namespace"); not in the
# registry -----------------------------------------------------------------------------------------
MESSAGING_ROCKETMQ_TRANSACTION_STATE: Final = "messaging.rocketmq.transaction.state"
"""The local transaction's state: ``commit``, ``rollback`` or ``unknown`` (RocketMQ
``LocalTransactionState`` COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW, in lower case)."""
MESSAGING_ROCKETMQ_TRANSACTION_OUTCOME: Final = "messaging.rocketmq.transaction.outcome"
"""What the broker recorded for an end request: ``COMMIT``, ``ROLLBACK``, ``PENDING`` (UNKNOWN:
check-back settles it), ``SENT`` (one-way, no answer awaited) or ``UNKNOWN_END`` (not confirmed)."""
MESSAGING_ROCKETMQ_TRANSACTION_CHECK_TIMES: Final = "messaging.rocketmq.transaction.check_times"
"""Which check-back of its half message this is (RocketMQ's ``TRANSACTION_CHECK_TIMES`` property,
1 for the first)."""
MESSAGING_ROCKETMQ_MESSAGE_RECONSUME_TIMES: Final = "messaging.rocketmq.message.reconsume_times"
"""Deliveries of the message before this one (RocketMQ ``MessageExt.reconsumeTimes``); on a retry
or dead-letter span, the count the message leaves with."""

# -- general (model/error, registry) ----------------------------------------------------------------
ERROR_TYPE: Final = "error.type"
"""Set on a failed operation: the broker's response code name (``TOPIC_NOT_EXIST``,
``SYSTEM_BUSY`` …), a txmq error's ``code``, or the exception's class name."""
