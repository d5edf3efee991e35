"""Delay levels: messages parked in ``SCHEDULE_TOPIC_XXXX`` until due (RocketMQ
``ScheduleMessageService``). Retries use the same machinery (level 3 + reconsume times)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import takewhile

import msgspec

from txmq.broker._meta import load_json_meta
from txmq.errors import CorruptRecord, StoreError
from txmq.protocol import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    MessageExt,
)
from txmq.store import AppendResult, Record, Store

__all__ = ["SCHEDULE_TOPIC", "ScheduleService"]

log = logging.getLogger("txmq.broker.schedule")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_META = "delayOffset.json"
_SCAN_BATCH = 256


class ScheduleService:
    """One queue per delay level; each is FIFO with one delay, so only its head needs looking at.

    Progress (the next schedule-queue offset per level) is saved only up to messages whose
    delivered copies are durable, so a crash replays a delivery (at least once) but never loses
    one. Parked messages live in the commit log, so delays survive a restart.

    Args:
        levels_ms: delay of level 1, 2, … in ms (``BrokerConfig.message_delay_level``).
        store: holds the schedule queues and the per-level progress (metadata ``delayOffset.json``).
        append: appends the due messages to their real topic.
    """

    def __init__(self, levels_ms: list[int], store: Store,
                 append: Callable[[list[Record]], list[AppendResult]]) -> None:
        self.levels_ms = levels_ms
        self.store = store
        self._append = append
        saved = load_json_meta(store, _META, dict[str, int],
                               "delay levels restart from the start of their schedule queues "
                               "(delayed messages may be delivered again)") or {}
        self.offsets = {lvl: saved.get(str(lvl), 0) for lvl in range(1, len(levels_ms) + 1)}
        self._saved = dict(self.offsets)
        self._unflushed: list[tuple[int, int, int]] = []  # (level, next offset, durable end)
        stranded = {k: v for k, v in saved.items() if int(k) > len(levels_ms)}
        if stranded:
            log.warning("delay levels %s no longer configured; their messages stay parked",
                        sorted(stranded))

    def schedule_record(self, rec: Record, level: int) -> Record:
        """The parked copy of ``rec`` for delay ``level`` (clamped to 1..highest level, as
        RocketMQ clamps ``delayTimeLevel`` to ``maxDelayLevel``)."""
        level = max(1, min(level, len(self.levels_ms)))
        props = dict(rec.properties)
        props[PROPERTY_REAL_TOPIC] = rec.topic
        props[PROPERTY_REAL_QUEUE_ID] = str(rec.queue_id)
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        return msgspec.structs.replace(rec, topic=SCHEDULE_TOPIC, queue_id=level - 1,
                                       properties=props)

    def due_ms(self, level: int, store_timestamp_ms: int) -> int:
        """When a message parked at ``level`` at ``store_timestamp_ms`` is due (ms)."""
        return store_timestamp_ms + self.levels_ms[max(1, min(level, len(self.levels_ms))) - 1]

    def tick(self, now_ms: int) -> int:
        """Deliver every due message; return how many. A corrupt record is skipped and logged."""
        moved = 0
        for level, delay in enumerate(self.levels_ms, start=1):
            moved += self._drain(level, delay, now_ms)
        return moved

    def _drain(self, level: int, delay: int, now_ms: int) -> int:
        moved = 0
        while True:
            off = self.offsets[level]
            try:
                batch = self.store.read_queue(SCHEDULE_TOPIC, level - 1, off, _SCAN_BATCH, 1 << 24)
            except CorruptRecord:
                log.error("schedule level %d: corrupt record at queue offset %d skipped", level, off)
                self.offsets[level] = off + 1
                continue
            due = list(takewhile(lambda m: m.store_timestamp_ms + delay <= now_ms, batch))
            if not due:
                return moved
            try:
                results = self._append([_delivered(m, now_ms) for m in due])
            except StoreError:
                log.exception("schedule level %d: delivery failed; will retry", level)
                return moved
            self.offsets[level] = off + len(due)
            last = results[-1]
            self._unflushed.append((level, off + len(due), last.commit_log_offset + last.size))
            moved += len(due)
            if len(due) < len(batch):
                return moved

    def persist(self) -> None:
        """Save per-level progress up to deliveries the store has flushed."""
        flushed = self.store.flushed_offset
        keep = []
        changed = False
        for level, nxt, end in self._unflushed:
            if end <= flushed:
                self._saved[level] = max(self._saved[level], nxt)
                changed = True
            else:
                keep.append((level, nxt, end))
        self._unflushed = keep
        if changed:
            self.store.save_meta(_META, msgspec.json.encode({str(k): v for k, v in
                                                             self._saved.items()}))


def _delivered(m: MessageExt, now_ms: int) -> Record:
    """The due message back in its real topic and queue, without the schedule properties."""
    props = dict(m.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC)
    qid = int(props.pop(PROPERTY_REAL_QUEUE_ID))
    props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    return Record(topic=topic, queue_id=qid, body=m.body, tags=m.tags, keys=m.keys,
                  properties=props, born_timestamp_ms=m.born_timestamp_ms,
                  store_timestamp_ms=now_ms, reconsume_times=m.reconsume_times)
