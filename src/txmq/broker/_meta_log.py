"""Broker metadata through the replicated commit log (issue #25 item 4, docs/replication.md).

Consumer offsets, delay (schedule) progress and topic configuration are written by the master as
**system records** in its own commit log, one reserved topic per kind, named in RocketMQ 5's style
(``TopicValidator.SYSTEM_TOPIC_PREFIX`` ``rmq_sys_``, as ``rmq_sys_REVIVE_LOG_<cluster>`` of
``PopAckConstants.REVIVE_TOPIC`` and ``rmq_sys_SYNC_BROKER_MEMBER_`` are):

- ``rmq_sys_CONSUMER_OFFSET``: ``{"e": [[group, topic, queue id, offset], ...]}``, coalesced;
- ``rmq_sys_DELAY_OFFSET``: ``{"e": [[delay level, next schedule queue offset], ...]}``, coalesced;
- ``rmq_sys_TOPIC_CONFIG``: ``{"t": topic, "n": queue count}`` (0: deleted), at each change.

All on queue 0, bodies in msgspec JSON; an offset of -1 forgets the key (a reset). The records are
ordinary MessageExt records, so the store's ``__CRC32#`` check covers them on every read, on
replication and at recovery; a body that does not decode or holds an illegal value is refused by
:func:`decode_meta` (CorruptRecord, logged, skipped: it changes nothing).

Coalescing (:class:`MetaCoalescer`, sans-IO): an offset commit only marks its key changed; every
``META_RECORD_INTERVAL_MS`` the changed keys go out as one record per kind (at most
``META_RECORD_ENTRIES_MAX`` entries each), so an offset-commit storm writes one record per kind per
interval (per 4,096 changed keys), whatever its rate.

Followers (:class:`MetaLog.follow`): a SLAVE applies the system records of its (durable) log as
they arrive, so its offsets are those of the master's log at the slave's position, never older than
the data it serves (RocketMQ #1094). Every broker replays them at start from where its
``meta/metaLogPosition.json`` (saved after ``consumerOffset.json`` and ``delayOffset.json``, which
are checkpoints) says, so a record newer than those files wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from txmq import limits
from txmq.broker._meta import load_json_meta
from txmq.errors import CorruptRecord, InvalidRequest, StoreError
from txmq.protocol import MessageExt, check_topic
from txmq.store import AppendResult, Record, Store

if TYPE_CHECKING:  # (the tables import this module's topic names)
    from txmq.broker._offset_table import OffsetTable
    from txmq.broker._schedule import ScheduleService
    from txmq.broker._topic_table import TopicTable

__all__ = [
    "CONSUMER_OFFSET_TOPIC",
    "DELAY_OFFSET_TOPIC",
    "META_POSITION_META",
    "META_RECORD_ENTRIES_MAX",
    "META_RECORD_INTERVAL_MS",
    "META_TOPICS",
    "TOPIC_CONFIG_TOPIC",
    "DelayBody",
    "MetaCoalescer",
    "MetaLog",
    "OffsetBody",
    "TopicBody",
    "decode_meta",
    "encode_meta",
]

log = logging.getLogger("txmq.broker")

CONSUMER_OFFSET_TOPIC = "rmq_sys_CONSUMER_OFFSET"
"""Consumer offset records (txmq; RocketMQ 5 ``SYSTEM_TOPIC_PREFIX`` naming)."""
DELAY_OFFSET_TOPIC = "rmq_sys_DELAY_OFFSET"
"""Delay level progress records (txmq; RocketMQ 5 ``SYSTEM_TOPIC_PREFIX`` naming)."""
TOPIC_CONFIG_TOPIC = "rmq_sys_TOPIC_CONFIG"
"""Topic create/update/delete records (txmq; RocketMQ 5 ``SYSTEM_TOPIC_PREFIX`` naming)."""
META_TOPICS = (CONSUMER_OFFSET_TOPIC, DELAY_OFFSET_TOPIC, TOPIC_CONFIG_TOPIC)

META_POSITION_META = "metaLogPosition.json"
"""Metadata blob: system topic → the next queue offset this broker has not applied."""

META_RECORD_INTERVAL_MS = 1_000
"""Longest an offset commit waits for its system record (txmq). RocketMQ copies offsets to a slave
every 10 s (``SlaveSynchronize.syncAll``) and flushes them to disk every 5 s
(``flushConsumerOffsetInterval``); 1 s keeps a slave at most 1 s of commits behind its master's
memory, and a commit storm at one record per kind per second."""

META_RECORD_ENTRIES_MAX = 4_096
"""Entries in one offset record (txmq): an entry is at most ~300 bytes of JSON (two names of
``TOPIC_NAME_MAX_CHARS``), so a record stays well under ``MESSAGE_SIZE_MAX_BYTES`` (4 MiB); more
changed keys make more records."""

META_FOLLOW_BATCH = 512
"""System records read from one topic per :meth:`MetaLog.follow` step (txmq)."""

_NO_OFFSET = -1


class OffsetBody(msgspec.Struct, forbid_unknown_fields=True):
    """A ``rmq_sys_CONSUMER_OFFSET`` body: ``(group, topic, queue id, offset)``; offset -1 forgets."""

    e: list[tuple[str, str, int, int]]


class DelayBody(msgspec.Struct, forbid_unknown_fields=True):
    """A ``rmq_sys_DELAY_OFFSET`` body: ``(delay level, next schedule queue offset)``."""

    e: list[tuple[int, int]]


class TopicBody(msgspec.Struct, forbid_unknown_fields=True):
    """A ``rmq_sys_TOPIC_CONFIG`` body: topic ``t`` now has ``n`` queues (0: deleted)."""

    t: str
    n: int


MetaBody = OffsetBody | DelayBody | TopicBody
_DECODERS: dict[str, msgspec.json.Decoder[OffsetBody] | msgspec.json.Decoder[DelayBody]
                | msgspec.json.Decoder[TopicBody]] = {
    CONSUMER_OFFSET_TOPIC: msgspec.json.Decoder(OffsetBody),
    DELAY_OFFSET_TOPIC: msgspec.json.Decoder(DelayBody),
    TOPIC_CONFIG_TOPIC: msgspec.json.Decoder(TopicBody),
}
_ENC = msgspec.json.Encoder()


def encode_meta(body: MetaBody) -> bytes:
    """The JSON body of a system record."""
    return _ENC.encode(body)


def _check(body: MetaBody) -> str:
    """Why ``body`` holds an illegal value ("" if it does not)."""
    try:
        if isinstance(body, OffsetBody):
            if len(body.e) > META_RECORD_ENTRIES_MAX:
                return f"{len(body.e)} entries, more than {META_RECORD_ENTRIES_MAX}"
            for group, topic, qid, off in body.e:
                check_topic(topic)
                if not group or len(group) > limits.TOPIC_NAME_MAX_CHARS:
                    return f"group name {group[:80]!r} is empty or too long"
                if not 0 <= qid < limits.QUEUE_NUMS_MAX or off < _NO_OFFSET:
                    return f"queue id {qid} or offset {off} out of range"
        elif isinstance(body, DelayBody):
            if any(not 0 < lvl <= limits.QUEUE_NUMS_MAX or off < 0 for lvl, off in body.e):
                return "a delay level or offset out of range"
        else:
            check_topic(body.t)
            if not 0 <= body.n <= limits.QUEUE_NUMS_MAX:
                return f"queue count {body.n} not in 0..{limits.QUEUE_NUMS_MAX}"
    except InvalidRequest as exc:
        return str(exc)
    return ""


def decode_meta(topic: str, body: bytes, queue_offset: int) -> MetaBody:
    """Decode and check the body of the system record at ``queue_offset`` of ``topic``.

    Raises:
        CorruptRecord: not a system topic, the body does not decode as its kind, or a value is
            illegal (a bad name, a negative offset, a queue id or count out of range); the message
            names the topic and queue offset.
    """
    dec = _DECODERS.get(topic)
    if dec is None:
        raise CorruptRecord(f"{topic[:80]!r} is not a system metadata topic")
    try:
        out = dec.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptRecord(f"system record {topic} queue offset {queue_offset} refused: its "
                            f"body does not decode ({exc})") from None
    why = _check(out)
    if why:
        raise CorruptRecord(f"system record {topic} queue offset {queue_offset} refused: {why}")
    return out


class MetaCoalescer:
    """Sans-IO: collects offset and delay changes and turns them into at most one record body per
    kind per ``interval_ms`` (``META_RECORD_INTERVAL_MS``), the latest value of each key only.

    Args:
        interval_ms: least time between two takes that return bodies.
        entries_max: most entries per body (``META_RECORD_ENTRIES_MAX``).
    """

    def __init__(self, interval_ms: int = META_RECORD_INTERVAL_MS,
                 entries_max: int = META_RECORD_ENTRIES_MAX) -> None:
        self.interval_ms, self.entries_max = interval_ms, entries_max
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._delays: dict[int, int] = {}
        self._recorded_delays: dict[int, int] = {}
        self._last_ms: int | None = None

    def offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """A committed offset changed (-1: the key was forgotten by a reset)."""
        self._offsets[(group, topic, queue_id)] = offset

    def delays(self, offsets: dict[int, int]) -> None:
        """The delay levels' progress now (level → next queue offset): what moved since the last
        record is taken next."""
        for lvl, off in offsets.items():
            if self._recorded_delays.get(lvl) != off:
                self._delays[lvl] = off

    def delays_known(self, offsets: dict[int, int]) -> None:
        """The delay progress the log already holds (at start): only moves after it are taken."""
        self._recorded_delays = dict(offsets)

    @property
    def pending(self) -> int:
        """Changed keys not yet taken."""
        return len(self._offsets) + len(self._delays)

    def take(self, now_ms: int) -> list[tuple[str, bytes]]:
        """``(system topic, body)`` s to append now: none before ``interval_ms`` since the last
        take that returned some, or when nothing changed. The taken keys are forgotten; give them
        back with :meth:`untake` if the append fails."""
        if not self.pending or (self._last_ms is not None
                                and now_ms - self._last_ms < self.interval_ms):
            return []
        self._last_ms = now_ms
        out: list[tuple[str, bytes]] = []
        items = [(g, t, q, o) for (g, t, q), o in self._offsets.items()]
        for i in range(0, len(items), self.entries_max):
            out.append((CONSUMER_OFFSET_TOPIC, encode_meta(OffsetBody(items[i:i + self.entries_max]))))
        if self._delays:
            out.append((DELAY_OFFSET_TOPIC, encode_meta(DelayBody(sorted(self._delays.items())))))
            self._recorded_delays.update(self._delays)
        self._offsets, self._delays = {}, {}
        return out

    def untake(self, taken: list[tuple[str, bytes]]) -> None:
        """Give back what :meth:`take` returned (its append failed), unless newer values came."""
        for topic, body in taken:
            dec = decode_meta(topic, body, -1)
            if isinstance(dec, OffsetBody):
                for g, t, q, o in dec.e:
                    self._offsets.setdefault((g, t, q), o)
            elif isinstance(dec, DelayBody):
                for lvl, off in dec.e:
                    self._recorded_delays.pop(lvl, None)
                    self._delays.setdefault(lvl, off)
        self._last_ms = None


class MetaLog:
    """The broker's side of the system records: writes them on a master, applies them on a slave
    and, at start, on every broker (see the module docstring).

    Args:
        store: the broker's store (system records are read through its consume queues, so only
            durable ones are applied).
        offsets, topics, schedule: the tables the records change (their ``follow`` methods apply a
            record without writing one back; their ``on_change`` hooks are set on a master).
        append: the broker's append (a master's records go through it).
        slave: whether the broker is a SLAVE (it applies and never writes).
    """

    def __init__(self, store: Store, offsets: OffsetTable, topics: TopicTable,
                 schedule: ScheduleService, append: Callable[[list[Record]], list[AppendResult]],
                 *, slave: bool) -> None:
        self._store, self._offsets, self._topics, self._schedule = store, offsets, topics, schedule
        self._append, self.slave = append, slave
        self.coalescer = MetaCoalescer()
        saved = load_json_meta(store, META_POSITION_META, dict[str, int],
                               "system records are applied again from their first one") or {}
        self.position = {t: max(0, saved.get(t, 0)) for t in META_TOPICS}
        """System topic → next queue offset not applied (or, on a master, not written)."""
        self._saved_position: dict[str, int] = dict(self.position) if saved else {}
        self._stuck: dict[str, int] = {}  # topic -> queue offset whose read failed
        self.applied = 0
        """System records applied since start."""
        self.refused = 0
        """System records refused (did not decode or held an illegal value) since start."""
        if not slave:
            offsets.on_change = self.coalescer.offset
            topics.on_change = self._topic_changed

    def set_slave(self, slave: bool) -> None:
        """The broker's role changed (controller mode): a new master first applies every system
        record it replicated, then writes; a new slave stops writing (what its coalescer holds
        is dropped: the new master's records win)."""
        if slave == self.slave:
            return
        if not slave:
            self.follow()
            self.coalescer.delays_known(self._schedule.offsets)
        self.slave = slave
        self._offsets.on_change = None if slave else self.coalescer.offset
        self._topics.on_change = None if slave else self._topic_changed

    def recover(self) -> int:
        """Apply the system records after the saved position (the saved tables are checkpoints);
        returns how many were applied. A position past the recovered log (a torn tail was cut)
        goes back to its end."""
        for topic in META_TOPICS:
            lo, hi = self._store.queue_bounds(topic, 0)
            self.position[topic] = min(max(self.position[topic], lo), hi)
        n = self.follow()
        self.coalescer.delays_known(self._schedule.offsets)
        if n or self.refused:
            log.info("system records: %d applied at start, %d refused", n, self.refused)
        return n

    def tick(self, now_ms: int) -> None:
        """A master writes what the coalescer holds once its interval passed; a slave applies what
        replication made durable. Raises StoreError (the broker's timer health records it)."""
        if self.slave:
            self.follow()
        else:
            self.write(now_ms)

    def write(self, now_ms: int) -> int:
        """Append the coalesced offset and delay records (see :class:`MetaCoalescer`); returns
        how many. An append that fails gives the changes back (tried next time) and raises."""
        self.coalescer.delays(self._schedule.offsets)
        taken = self.coalescer.take(now_ms)
        if not taken:
            return 0
        try:
            self._write(taken)
        except Exception:
            self.coalescer.untake(taken)
            raise
        return len(taken)

    def _write(self, bodies: list[tuple[str, bytes]]) -> None:
        results = self._append([Record(topic=t, queue_id=0, body=b) for t, b in bodies])
        for (topic, _), res in zip(bodies, results, strict=True):
            self.position[topic] = res.queue_offset + 1

    def _topic_changed(self, topic: str, queue_nums: int) -> None:
        """TopicTable hook (a master): record a create, widen (its new count) or delete (0)."""
        try:
            self._write([(TOPIC_CONFIG_TOPIC, encode_meta(TopicBody(topic, queue_nums)))])
        except Exception as exc:  # (Fail, StoreError) the table is saved: only slaves miss it
            log.error("topic %r changed (%d queues) but its system record was not written: %s; "
                      "slaves do not see the change until the next one", topic, queue_nums, exc)

    def follow(self) -> int:
        """Apply the durable system records after :attr:`position`; returns how many. A record
        that fails its check in the store stops this topic's round (logged, tried again next
        time); a body :func:`decode_meta` refuses is logged and skipped."""
        total = 0
        for topic in META_TOPICS:
            lo, hi = self._store.queue_bounds(topic, 0)
            pos = max(self.position[topic], lo)  # (retention deleted what was not applied)
            while pos < hi:
                try:
                    msgs = self._store.read_queue(topic, 0, pos, META_FOLLOW_BATCH,
                                                  limits.MESSAGE_SIZE_MAX_BYTES)
                except StoreError as exc:
                    if self._stuck.get(topic) != pos:  # (logged once per place, not every tick)
                        self._stuck[topic] = pos
                        log.error("system records of %s not applied from queue offset %d: %s",
                                  topic, pos, exc)
                    break
                if not msgs:
                    break
                for m in msgs:
                    self._apply(m)
                    pos = m.queue_offset + 1
                total += len(msgs)
            self.position[topic] = pos
        return total

    def _apply(self, m: MessageExt) -> None:
        try:
            body = decode_meta(m.topic, m.body, m.queue_offset)
        except CorruptRecord as exc:
            self.refused += 1
            log.error("%s; skipped, nothing changed", exc)
            return
        self.applied += 1
        if isinstance(body, OffsetBody):
            for group, topic, qid, off in body.e:
                self._offsets.follow(group, topic, qid, off)
        elif isinstance(body, DelayBody):
            for lvl, off in body.e:
                self._schedule.follow(lvl, off)
        else:
            try:
                self._topics.follow(body.t, body.n)
            except StoreError as exc:  # in memory already; saved with the next change
                log.error("topic %r from a system record not saved: %s", body.t, exc)

    def prepare_persist(self) -> Callable[[], None] | None:
        """The step that saves a copy of :attr:`position` (run it only after the offset and delay
        tables copied at the same moment were saved), or None when it did not move. Raises
        StoreError (tried again next time)."""
        if self.position == self._saved_position:
            return None
        copy = dict(self.position)

        def step() -> None:
            self._store.save_meta(META_POSITION_META, msgspec.json.encode(copy))
            self._saved_position = copy  # (one assignment: safe from the writer thread)

        return step
