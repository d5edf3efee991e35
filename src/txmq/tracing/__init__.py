"""OpenTelemetry tracing for txmq: W3C trace context in message properties, and spans named and
attributed by OpenTelemetry's messaging semantic conventions (docs/tracing.md).

``opentelemetry-api`` is optional (``pip install 'txmq[tracing]'``); without it, or while the
application has not imported OpenTelemetry, nothing is traced and no property is added. Every
producer and consumer takes ``tracing=``: True (the default: the global tracer provider), False,
or a :class:`Tracing` (e.g. ``Tracing(tracer_provider=provider)``).

Propagation (:meth:`Tracing.inject`, :meth:`Tracing.extract`) goes through OpenTelemetry's global
propagator (W3C ``traceparent`` / ``tracestate`` by default) over a mapping of message properties.
The span helpers (:meth:`Tracing.send_span`, :meth:`~Tracing.process_span`,
:meth:`~Tracing.settle_span`, :meth:`~Tracing.receive_span`, :meth:`~Tracing.internal_span`) take
the operation's name, its destination and the messages' properties, set ``messaging.system``,
``messaging.operation.type`` / ``.name`` and ``messaging.destination.name``, choose the span kind,
parent and links as the conventions say, and yield the span (None when not tracing).
"""

from txmq.tracing._semconv import (
    ERROR_TYPE,
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_CLIENT_ID,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_PARTITION_ID,
    MESSAGING_MESSAGE_ID,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_ROCKETMQ_CONSUMPTION_MODEL,
    MESSAGING_ROCKETMQ_MESSAGE_DELAY_TIME_LEVEL,
    MESSAGING_ROCKETMQ_MESSAGE_KEYS,
    MESSAGING_ROCKETMQ_MESSAGE_RECONSUME_TIMES,
    MESSAGING_ROCKETMQ_MESSAGE_TAG,
    MESSAGING_ROCKETMQ_MESSAGE_TYPE,
    MESSAGING_ROCKETMQ_NAMESPACE,
    MESSAGING_ROCKETMQ_TRANSACTION_CHECK_TIMES,
    MESSAGING_ROCKETMQ_TRANSACTION_OUTCOME,
    MESSAGING_ROCKETMQ_TRANSACTION_STATE,
    MESSAGING_SYSTEM,
    OPERATION_CREATE,
    OPERATION_PROCESS,
    OPERATION_RECEIVE,
    OPERATION_SEND,
    OPERATION_SETTLE,
    ROCKETMQ,
    ROCKETMQ_MESSAGE_TYPE_DELAY,
    ROCKETMQ_MESSAGE_TYPE_FIFO,
    ROCKETMQ_MESSAGE_TYPE_NORMAL,
    ROCKETMQ_MESSAGE_TYPE_TRANSACTION,
    SCHEMA_URL,
)
from txmq.tracing._tracing import (
    TRACE_LINKS_MAX,
    TRACEPARENT,
    TRACER_NAME,
    TRACESTATE,
    Attributes,
    Tracing,
    available,
    error_type,
    set_error,
)

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
    "TRACEPARENT",
    "TRACER_NAME",
    "TRACESTATE",
    "TRACE_LINKS_MAX",
    "Attributes",
    "Tracing",
    "available",
    "error_type",
    "set_error",
]
