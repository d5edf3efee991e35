"""Delay levels: messages parked in ``SCHEDULE_TOPIC_XXXX`` until due (RocketMQ
``ScheduleMessageService``). Retries use the same machinery (level 3 + reconsume times)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import takewhile

import msgspec

from txmq.broker._health import parked_record
from txmq.broker._meta import load_json_meta
from txmq.errors import CorruptRecord, StoreError
from txmq.protocol import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    RETRY_PREFIX,
    SCHEDULE_TOPIC,
    MessageExt,
)
from txmq.store import AppendResult, Record, Store

__all__ = ["SCHEDULE_TOPIC", "ScheduleService"]

log = logging.getLogger("txmq.broker.schedule")


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
        destination_problem: ``(REAL_TOPIC, REAL_QID) -> reason | None``: why a message cannot be
            delivered there (the broker's :func:`~txmq.broker._health.destination_problem`).
    """

    def __init__(self, levels_ms: list[int], store: Store,
                 append: Callable[[list[Record]], list[AppendResult]],
                 destination_problem: Callable[[str | None, str | None], str | None]) -> None:
        self.levels_ms = levels_ms
        self.store = store
        self._append = append
        self._problem = destination_problem
        self.parked: dict[str, int] = {}
        """Park source kind (``schedule``, ``retry``) → messages parked since start."""
        saved = load_json_meta(store, _META, dict[str, int],
                               "delay levels restart from the start of their schedule queues "
                               "(delayed messages may be delivered again)") or {}
        self.offsets = {lvl: saved.get(str(lvl), 0) for lvl in range(1, len(levels_ms) + 1)}
        self._saved = dict(self.offsets)
        self._save_failed = False  # the last save raised: the next prepare_persist saves again
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
        """Deliver every due message; return how many were delivered or parked.

        A message that cannot be delivered (no valid real topic or queue, a record that does not
        decode, an append that fails because of the message) is parked in ``PARKED_TOPIC`` with
        the reason, and the level moves on to the next message in the same tick (I6). A store
        failure (disk full, I/O) stops the level until the next tick; nothing is skipped.

        Raises:
            Exception: the first unexpected failure of a level, after every other level had its
                turn (the broker's timer guard logs and counts it).
        """
        moved = 0
        failure: Exception | None = None
        for level, delay in enumerate(self.levels_ms, start=1):
            try:
                moved += self._drain(level, delay, now_ms)
            except Exception as exc:  # one level's failure holds back only that level
                failure = failure or exc
        if failure is not None:
            raise failure
        return moved

    def _drain(self, level: int, delay: int, now_ms: int) -> int:
        moved = 0
        while True:
            off = self.offsets[level]
            batch = self._read(level, off, now_ms)
            if batch is None:
                continue  # a corrupt record was parked; read on from the next one
            due = list(takewhile(lambda m: m.store_timestamp_ms + delay <= now_ms, batch))
            if not due:
                return moved
            done = self._deliver(level, off, due, now_ms)
            moved += done
            if done < len(due) or len(due) < len(batch):
                return moved

    def _read(self, level: int, off: int, now_ms: int) -> list[MessageExt] | None:
        """Up to ``_SCAN_BATCH`` messages of the level from ``off``; where a record does not
        decode, the messages before it, or (the first one being bad) None after parking it."""
        try:
            return self.store.read_queue(SCHEDULE_TOPIC, level - 1, off, _SCAN_BATCH, 1 << 24)
        except CorruptRecord:
            pass
        try:
            return self.store.read_queue(SCHEDULE_TOPIC, level - 1, off, 1, 1 << 24)
        except CorruptRecord as exc:
            clo = self.store.commit_log_offset_at(SCHEDULE_TOPIC, level - 1, off)
            stub = MessageExt(topic=SCHEDULE_TOPIC, body=b"", queue_id=level - 1, queue_offset=off,
                              commit_log_offset=-1 if clo is None else clo)
            rec = parked_record(stub, f"schedule:{level}", f"record does not decode: {exc}", now_ms)
            if self._commit(level, off, [rec], ["schedule"]) == 0:
                return []  # the store refused: try again next tick
            return None

    def _route(self, m: MessageExt, level: int, now_ms: int) -> tuple[Record, str, bool]:
        """The delivered copy of ``m``, or its parked copy: (record, park source kind, parked)."""
        props = m.properties
        kind = "retry" if PROPERTY_RETRY_TOPIC in props or props.get(
            PROPERTY_REAL_TOPIC, "").startswith(RETRY_PREFIX) else "schedule"
        try:
            problem = self._problem(props.get(PROPERTY_REAL_TOPIC),
                                    props.get(PROPERTY_REAL_QUEUE_ID))
            if problem is None:
                return _delivered(m, now_ms), kind, False
        except Exception as exc:  # I6: whatever this message is, it holds back only itself
            problem = f"cannot route: {type(exc).__name__}: {exc}"
        return self._parked(m, level, kind, problem, now_ms), kind, True

    @staticmethod
    def _parked(m: MessageExt, level: int, kind: str, reason: str, now_ms: int) -> Record:
        log.warning("schedule level %d: message %s at queue offset %d parked: %s", level,
                    m.msg_id, m.queue_offset, reason)
        return parked_record(m, "retry" if kind == "retry" else f"schedule:{level}", reason, now_ms)

    def _deliver(self, level: int, off: int, due: list[MessageExt], now_ms: int) -> int:
        """Append the due messages (delivered or parked) in one append; if that fails for a
        reason other than the store, one by one, parking each one that still fails."""
        routed = [self._route(m, level, now_ms) for m in due]
        try:
            return self._commit(level, off, [r for r, _, _ in routed],
                                [k if p else None for _, k, p in routed], raise_other=True)
        except Exception:  # the failure is one message's: find it
            log.exception("schedule level %d: batch delivery failed; delivering one by one", level)
        done = 0
        for m, (rec, kind, parked) in zip(due, routed, strict=True):
            try:
                n = self._commit(level, off + done, [rec], [kind if parked else None],
                                 raise_other=True)
            except Exception as exc:
                reason = f"delivery failed: {type(exc).__name__}: {exc}"
                n = self._commit(level, off + done, [self._parked(m, level, kind, reason, now_ms)],
                                 [kind])
            if n == 0:
                break
            done += 1
        return done

    def _commit(self, level: int, off: int, records: list[Record], parked: list[str | None], *,
                raise_other: bool = False) -> int:
        """Append ``records`` (those of queue offsets ``off``…) and advance the level past them;
        returns how many (0 when the store refused: retried next tick). ``parked`` names the
        park source kind of each parked record (None for a delivered one). Another failure is
        raised with ``raise_other``, else logged and the records skipped (progress first)."""
        try:
            results = self._append(records)
        except StoreError:
            log.exception("schedule level %d: delivery failed; will retry", level)
            return 0
        except Exception:
            if raise_other:
                raise
            log.exception("schedule level %d: could not park queue offset %d; skipped", level, off)
            self.offsets[level] = off + len(records)
            return len(records)
        self.offsets[level] = off + len(records)
        last = results[-1]
        self._unflushed.append((level, off + len(records), last.commit_log_offset + last.size))
        for kind in parked:
            if kind is not None:
                self.parked[kind] = self.parked.get(kind, 0) + 1
        return len(records)

    def follow(self, level: int, offset: int) -> None:
        """Apply a system record (``rmq_sys_DELAY_OFFSET``): ``level`` delivered up to ``offset``.
        The record follows the deliveries in the log, so they are durable when it is: the progress
        is saved with the next :meth:`prepare_persist`. An unknown level is ignored."""
        if level in self.offsets and offset > self.offsets[level]:
            self.offsets[level] = offset
            self._unflushed.append((level, offset, 0))

    def persist(self) -> None:
        """Save per-level progress up to deliveries the store has flushed, now, on this thread.
        Raises StoreError (tried again next time)."""
        step = self.prepare_persist()
        if step is not None:
            step()

    def prepare_persist(self) -> Callable[[], None] | None:
        """Take in the progress of deliveries the store has flushed (on the event loop: O(levels))
        and return the step that saves a copy of it (for a writer thread), or None when it did not
        move and the last save did not fail. The step raises StoreError (tried again next
        time)."""
        flushed = self.store.flushed_offset
        keep = []
        changed = self._save_failed
        for level, nxt, end in self._unflushed:
            if end <= flushed:
                self._saved[level] = max(self._saved[level], nxt)
                changed = True
            else:
                keep.append((level, nxt, end))
        self._unflushed = keep
        if not changed:
            return None
        saved = {str(k): v for k, v in self._saved.items()}
        self._save_failed = False

        def step() -> None:
            try:
                self.store.save_meta(_META, msgspec.json.encode(saved))
            except BaseException:
                self._save_failed = True  # (one assignment: safe from the writer thread)
                raise

        return step


def _delivered(m: MessageExt, now_ms: int) -> Record:
    """The due message back in its real topic and queue, without the schedule properties."""
    props = dict(m.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC)
    qid = int(props.pop(PROPERTY_REAL_QUEUE_ID))
    props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
    return Record(topic=topic, queue_id=qid, body=m.body, tags=m.tags, keys=m.keys,
                  properties=props, born_timestamp_ms=m.born_timestamp_ms,
                  store_timestamp_ms=now_ms, reconsume_times=m.reconsume_times)
