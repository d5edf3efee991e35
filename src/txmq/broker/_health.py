"""Timer guards and parking, sans-IO: a poison message or a failing tick part holds back only itself.

:class:`TimerHealth` runs each part of the broker's periodic work (delay scheduler, client expiry,
transaction checker, and the shell's hold expiry, offset persistence, store upkeep and flusher)
under a guard: an exception is counted and logged, rate-limited, with its traceback once per error
type, and never ends the caller. Each part's last successful run is recorded with the ``now_ms``
it was given, for the health check (``GET_BROKER_RUNTIME_INFO``, ``txmq broker status``).

:func:`destination_problem` says why a scheduled message cannot go to its real topic and queue, and
:func:`parked_record` is the copy of such a message in ``TXMQ_SYS_PARKED_TOPIC``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from txmq import limits
from txmq.protocol import (
    PARK_PROPERTY_NAMES,
    PARKED_TOPIC,
    PROPERTY_TXMQ_PARK_ORIGIN_COMMIT_LOG_OFFSET,
    PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_ID,
    PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET,
    PROPERTY_TXMQ_PARK_ORIGIN_TOPIC,
    PROPERTY_TXMQ_PARK_REASON,
    PROPERTY_TXMQ_PARK_SOURCE,
    MessageExt,
    is_broker_topic,
    is_valid_topic,
)
from txmq.store import Record

__all__ = ["PARK_PROPERTIES", "TimerHealth", "destination_problem", "park_properties",
           "parked_record"]

log = logging.getLogger("txmq.broker.health")
T = TypeVar("T")

_QUEUE_ID = re.compile(r"[0-9]{1,9}")


def destination_problem(topic: str | None, queue_id: str | None,
                        queue_nums: Mapping[str, int]) -> str | None:
    """Why a message cannot be delivered to ``topic`` / ``queue_id`` (its ``REAL_TOPIC`` and
    ``REAL_QID`` properties, None when missing), or None when it can.

    A valid topic matches RocketMQ's ``^[%|a-zA-Z0-9_-]+$`` with at most
    ``limits.TOPIC_NAME_MAX_CHARS`` characters, is not a broker-only topic, and exists in
    ``queue_nums`` (topic → queue count); the queue id is a decimal number below its queue count.
    The name rules are the door's (:func:`txmq.protocol.is_valid_topic`, ``is_broker_topic``).
    """
    if not topic:
        return "REAL_TOPIC is missing or empty"
    if not is_valid_topic(topic):
        return f"REAL_TOPIC {topic[:200]!r} is not a valid topic name"
    if is_broker_topic(topic):
        return f"REAL_TOPIC {topic!r} is a system topic"
    n = queue_nums.get(topic)
    if n is None:
        return f"REAL_TOPIC {topic!r} does not exist"
    if queue_id is None or not _QUEUE_ID.fullmatch(queue_id):
        return f"REAL_QID {(queue_id or '')[:40]!r} is not a queue id"
    if int(queue_id) >= n:
        return f"REAL_QID {queue_id} is not a queue of {topic!r} ({n} queues)"
    return None


PARK_PROPERTIES = PARK_PROPERTY_NAMES
"""The properties :func:`park_properties` sets (dropped when a parked message is resumed)."""


def park_properties(source: str, reason: str, origin: MessageExt) -> dict[str, str]:
    """The properties that say why and from where a message was parked."""
    return {PROPERTY_TXMQ_PARK_REASON: reason[:limits.PARK_REASON_MAX_CHARS],
            PROPERTY_TXMQ_PARK_SOURCE: source,
            PROPERTY_TXMQ_PARK_ORIGIN_TOPIC: origin.topic,
            PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_ID: str(origin.queue_id),
            PROPERTY_TXMQ_PARK_ORIGIN_QUEUE_OFFSET: str(origin.queue_offset),
            PROPERTY_TXMQ_PARK_ORIGIN_COMMIT_LOG_OFFSET: str(origin.commit_log_offset)}


def parked_record(m: MessageExt, source: str, reason: str, now_ms: int) -> Record:
    """``m`` as parked in ``TXMQ_SYS_PARKED_TOPIC`` queue 0: body, tags, keys and properties kept,
    plus :func:`park_properties`; stored at ``now_ms``."""
    props = {**m.properties, **park_properties(source, reason, m)}
    return Record(topic=PARKED_TOPIC, queue_id=0, body=m.body, tags=m.tags, keys=m.keys,
                  properties=props, born_timestamp_ms=m.born_timestamp_ms,
                  store_timestamp_ms=now_ms, reconsume_times=m.reconsume_times,
                  born_host=m.born_host)


class TimerHealth:
    """Guards for the broker's timer parts, and what the health check reports about them.

    Attributes:
        last_tick_ms: part name → ``now_ms`` of its last successful run.
        errors: part name → failures caught.
        restarts: task name → restarts by the shell's supervisor.
    """

    def __init__(self) -> None:
        self.last_tick_ms: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.restarts: dict[str, int] = {}
        self._traced: set[tuple[str, str]] = set()
        self._logged_ms: dict[str, int] = {}
        self._quiet: dict[str, int] = {}

    def run(self, name: str, now_ms: int, fn: Callable[[], T]) -> T | None:
        """``fn()``; on an exception: count and log it (see :meth:`failed`) and return None."""
        try:
            out = fn()
        except Exception as exc:  # a timer part never ends the timer (I6)
            self.failed(name, now_ms, exc)
            return None
        self.ok(name, now_ms)
        return out

    def ok(self, name: str, now_ms: int) -> None:
        """Record a successful run of ``name`` at ``now_ms``."""
        self.last_tick_ms[name] = now_ms

    def failed(self, name: str, now_ms: int, exc: BaseException) -> None:
        """Count a failure of ``name``; log its traceback the first time this error type is seen,
        else at most one line per ``limits.TIMER_ERROR_LOG_INTERVAL_MS``."""
        self.errors[name] = self.errors.get(name, 0) + 1
        key = (name, type(exc).__qualname__)
        if key not in self._traced:
            self._traced.add(key)
            self._logged_ms[name] = now_ms
            log.error("timer %s failed (it keeps running): %s", name, exc, exc_info=exc)
            return
        last = self._logged_ms.get(name)
        if last is not None and now_ms - last < limits.TIMER_ERROR_LOG_INTERVAL_MS:
            self._quiet[name] = self._quiet.get(name, 0) + 1
            return
        self._logged_ms[name] = now_ms
        log.error("timer %s failed again: %r (%d more failures not logged)", name, exc,
                  self._quiet.pop(name, 0))

    def restarted(self, name: str) -> None:
        """Count a restart of timer task ``name`` by the supervisor."""
        self.restarts[name] = self.restarts.get(name, 0) + 1
