"""Parked messages and the broker's runtime info: what clients read of the broker's health.

A message the broker's schedulers cannot deliver (a delay or retry entry in ``SCHEDULE_TOPIC_XXXX``
without a valid real topic or queue, or a record that does not decode) is *parked*: copied, with the
reason and where it came from, to the broker-only topic :data:`PARKED_TOPIC` (one queue), and the
scheduler moves on (invariant I6). A half message that can never be committed is discarded to
``TRANS_CHECK_MAX_TIME_TOPIC`` (resumable, I5) with the same reason properties. RocketMQ has no such
topic: its ``ScheduleMessageService`` drops a delay message whose real topic is the half topic
("[BUG] the real topic of schedule msg is ..., discard the msg").

``GET_BROKER_RUNTIME_INFO`` (RocketMQ ``RequestCode`` 28) answers with RocketMQ's ``KVTable`` body,
a JSON map of strings ``{"table": {...}}``; :class:`BrokerRuntimeInfo` is its typed view.
"""

from __future__ import annotations

import msgspec

from txmq.errors import MalformedFrame

__all__ = [
    "BROKER_TIMERS",
    "PARKED_TOPIC",
    "PARKED_TOPICS",
    "PARK_PROPERTY_NAMES",
    "PARK_SOURCES",
    "PROPERTY_TXMQ_PARK_ORIGIN_COMMIT_LOG_OFFSET",
    "PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_ID",
    "PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET",
    "PROPERTY_TXMQ_PARK_ORIGIN_TOPIC",
    "PROPERTY_TXMQ_PARK_REASON",
    "PROPERTY_TXMQ_PARK_SOURCE",
    "BrokerRuntimeInfo",
    "park_source_kind",
]

PARKED_TOPIC = "TXMQ_SYS_PARKED_TOPIC"
"""Broker-only system topic (1 queue) of messages a scheduler could not deliver."""
PROPERTY_TXMQ_PARK_REASON = "TXMQ_PARK_REASON"
"""Why the message was parked (or discarded), in words."""
PROPERTY_TXMQ_PARK_SOURCE = "TXMQ_PARK_SOURCE"
"""Who parked it: ``schedule:<delay level>``, ``retry`` or ``transaction``."""
PROPERTY_TXMQ_PARK_ORIGIN_TOPIC = "TXMQ_PARK_ORIGIN_TOPIC"
"""The topic it was parked from (``SCHEDULE_TOPIC_XXXX``, ``RMQ_SYS_TRANS_HALF_TOPIC``)."""
PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_ID = "TXMQ_PARK_ORIGIN_QID"
PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET = "TXMQ_PARK_ORIGIN_QUEUE_OFFSET"
PROPERTY_TXMQ_PARK_ORIGIN_COMMIT_LOG_OFFSET = "TXMQ_PARK_ORIGIN_COMMIT_LOG_OFFSET"
"""Commit log offset of the original record (-1 when it could not be read)."""

PARK_PROPERTY_NAMES = (PROPERTY_TXMQ_PARK_REASON, PROPERTY_TXMQ_PARK_SOURCE,
                       PROPERTY_TXMQ_PARK_ORIGIN_TOPIC, PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_ID,
                       PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET,
                       PROPERTY_TXMQ_PARK_ORIGIN_COMMIT_LOG_OFFSET)
"""Every property a parked or reason-discarded record carries (broker-only: clients may not set them)."""

PARKED_TOPICS = (PARKED_TOPIC, "TRANS_CHECK_MAX_TIME_TOPIC")
"""Where parked messages are: the parked topic, and the discard topic of half messages (those of
its records that carry :data:`PROPERTY_TXMQ_PARK_REASON`; the others reached transactionCheckMax)."""

PARK_SOURCES = ("schedule", "retry", "transaction")
"""The kinds of :data:`PROPERTY_TXMQ_PARK_SOURCE` (metric label ``source``)."""


BROKER_TIMERS = ("schedule", "clients", "transaction", "holds", "offsets", "disk", "checkpoint",
                 "retention", "flusher", "reaper")
"""The broker's timer parts (:class:`BrokerRuntimeInfo` ``timers`` keys): delay and retry scheduler,
client expiry, transaction checker, long-poll hold expiry, offset persistence, disk check, store
checkpoint, retention, group-commit flusher, and the connection reaper (buffer budget grants, idle
connections)."""


def park_source_kind(source: str) -> str:
    """``schedule:3`` → ``schedule``; the kind of a park source."""
    return source.split(":", 1)[0]


class BrokerRuntimeInfo(msgspec.Struct, kw_only=True):
    """The broker's health as ``GET_BROKER_RUNTIME_INFO`` reports it.

    Attributes:
        now_ms: the broker's clock when it answered (ages are computed against it, not the
            caller's clock).
        boot_ms: when the broker state was loaded.
        timers: timer (tick part) name → time of its last successful run, ms since the epoch.
        timer_errors: timer name → failures caught since boot.
        task_restarts: timer task name → restarts by the supervisor since boot.
        parked: park source kind (:data:`PARK_SOURCES`) → messages parked since boot.
        parked_stored: messages in :data:`PARKED_TOPIC` now.
        pending_transactions: unsettled half messages.
        commit_log_min_offset: first commit log byte still held (RocketMQ ``commitLogMinOffset``).
        commit_log_max_offset: next commit log byte to be written (``commitLogMaxOffset``); max -
            min is the store's size in commit log bytes.
        commit_log_disk_ratio: used fraction (0..1) of the disk holding the commit log
            (``commitLogDiskRatio``); 0.0 for a memory store or an older broker.
    """

    now_ms: int
    boot_ms: int
    timers: dict[str, int] = msgspec.field(default_factory=dict)
    timer_errors: dict[str, int] = msgspec.field(default_factory=dict)
    task_restarts: dict[str, int] = msgspec.field(default_factory=dict)
    parked: dict[str, int] = msgspec.field(default_factory=dict)
    parked_stored: int = 0
    pending_transactions: int = 0
    commit_log_min_offset: int = 0
    commit_log_max_offset: int = 0
    commit_log_disk_ratio: float = 0.0

    _MAPS = (("timers", "timerLastTick."), ("timer_errors", "timerErrors."),
             ("task_restarts", "taskRestarts."), ("parked", "parked."))
    _SCALARS = (("now_ms", "nowTimestamp"), ("boot_ms", "bootTimestamp"),
                ("parked_stored", "parkedStored"), ("pending_transactions", "pendingTransactions"),
                ("commit_log_min_offset", "commitLogMinOffset"),
                ("commit_log_max_offset", "commitLogMaxOffset"))

    def encode(self) -> bytes:
        """The response body: RocketMQ ``KVTable`` JSON, every value a string."""
        table = {key: str(getattr(self, attr)) for attr, key in self._SCALARS}
        table["commitLogDiskRatio"] = repr(self.commit_log_disk_ratio)
        for attr, prefix in self._MAPS:
            for name, value in getattr(self, attr).items():
                table[prefix + name] = str(value)
        return msgspec.json.encode({"table": table})

    @classmethod
    def decode(cls, body: bytes) -> BrokerRuntimeInfo:
        """Parse a ``KVTable`` body; unknown keys are ignored (RocketMQ's own keys, newer ones).

        Raises:
            MalformedFrame: not a KVTable, or a known key whose value is not an integer.
        """
        try:
            table = msgspec.json.decode(body, type=dict[str, dict[str, str]])["table"]
            fields: dict[str, object] = {attr: int(table[key]) for attr, key in cls._SCALARS
                                         if key in table}
            if "commitLogDiskRatio" in table:
                fields["commit_log_disk_ratio"] = float(table["commitLogDiskRatio"])
            for attr, prefix in cls._MAPS:
                fields[attr] = {k[len(prefix):]: int(v) for k, v in table.items()
                                if k.startswith(prefix)}
            return msgspec.convert(fields, cls)
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError, ValueError) as exc:
            raise MalformedFrame(f"bad broker runtime info body: {exc}") from exc
