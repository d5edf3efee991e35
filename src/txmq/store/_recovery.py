"""Recovery of a :class:`~txmq.store.FileStore` when it opens.

1. The commit log's segments must be contiguous; a gap (a lost segment tail) cuts the log there.
2. The checkpoint says up to which commit log offset ``D`` consume queues and indexes are on disk,
   and where the record ending at ``D`` starts. That record is read and its CRC32C checked; if it
   fails (or the log is shorter than ``D``) the tail was damaged after the checkpoint, and the scan
   starts instead at the beginning of the segment holding it, with queues and index cut back there.
3. Consume queues and index files are opened and cut to what the checkpoint recorded; a queue or
   index whose files are missing or short is rebuilt from the oldest segment on.
4. The log is scanned from the start point: every record's CRC32C is verified and it is dispatched
   to its consume queue and the index. The scan stops at the first record that fails, and the log
   is truncated there (a torn or corrupt tail: it was never acknowledged, since an acknowledgement
   waits for the fsync that would have made it whole).
5. What was done is logged and returned as a :class:`RecoveryReport`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec

from txmq.errors import CorruptRecord, StoreError
from txmq.store._base import Record
from txmq.store._codec import RECORD_MAGIC, Checkpoint, decode_record, tag_hash
from txmq.store._commitlog import CommitLog
from txmq.store._consumequeue import ConsumeQueue
from txmq.store._index import Index

__all__ = ["RecoveryReport", "recover"]

log = logging.getLogger("txmq.store")

QueueKey = tuple[str, int]


class RecoveryReport(msgspec.Struct, kw_only=True):
    """What opening a :class:`~txmq.store.FileStore` did.

    Attributes:
        checkpoint_offset: ``D`` of the checkpoint found (-1 if none or unreadable).
        checkpoint_trusted: whether the record ending at ``D`` checked out.
        scanned_from: commit log offset the scan started at (records after it were re-dispatched).
        records: records scanned and dispatched from ``scanned_from``.
        truncated_at: where the log was cut (-1 if it was not).
        truncated_bytes: bytes cut off (torn or corrupt tail, or segments after a gap).
        reason: why the log was cut ("" if it was not).
        rebuilt_queues: ``topic/queue_id`` of consume queues rebuilt from the commit log.
        index_rebuilt: whether the index was rebuilt from the commit log.
        last_record: start of the last record in the log (-1 if unknown or none).
    """

    checkpoint_offset: int = -1
    checkpoint_trusted: bool = False
    scanned_from: int = 0
    records: int = 0
    truncated_at: int = -1
    truncated_bytes: int = 0
    reason: str = ""
    rebuilt_queues: list[str] = msgspec.field(default_factory=list)
    index_rebuilt: bool = False
    last_record: int = -1


def _cut(clog: CommitLog, at: int, reason: str, report: RecoveryReport) -> None:
    removed = clog.truncate(at)
    if removed:
        report.truncated_at = at if report.truncated_at < 0 else min(at, report.truncated_at)
        report.truncated_bytes += removed
        report.reason = reason
        log.warning("commit log %s: %s; truncated %d bytes at offset %d", clog.dir, reason, removed,
                    at)


def _start_point(clog: CommitLog, cp: Checkpoint | None, report: RecoveryReport) -> int:
    """Where the scan starts: ``D`` if the checkpoint's last record checks out, else the start of
    the segment holding it (or of the log, without a checkpoint)."""
    if cp is None:
        return clog.min_offset
    report.checkpoint_offset = cp.dispatched
    d = cp.dispatched
    if clog.min_offset <= d <= clog.end:
        if cp.last_record < 0 or cp.last_record < clog.min_offset:
            report.checkpoint_trusted = True
            return d
        try:
            data = clog.read_record_bytes(cp.last_record)
            _, size = decode_record(memoryview(data), 0, cp.last_record)
            if cp.last_record + size == d:
                report.checkpoint_trusted = True
                return d
        except CorruptRecord as exc:
            log.warning("checkpoint's last record at %d fails its check: %s", cp.last_record, exc)
    seg = clog.segment_at(min(max(cp.last_record, clog.min_offset), clog.end - 1))
    start = seg.base if seg is not None else clog.segments[-1].base
    log.warning("commit log %s is damaged before checkpoint offset %d (log ends at %d); "
                "rescanning from segment %d", clog.dir, d, clog.end, start)
    return start


def _open_queues(cq_root: Path, cp: Checkpoint | None, make: Callable[[str, int], ConsumeQueue],
                 queues: dict[QueueKey, ConsumeQueue]) -> set[QueueKey]:
    """Load the queues the checkpoint lists; return those that must be rebuilt."""
    damaged: set[QueueKey] = set()
    listed = {(t, q) for t, q, _, _ in cp.queues} if cp is not None else set()
    if cq_root.exists():
        for tdir in cq_root.iterdir():
            for qdir in tdir.iterdir() if tdir.is_dir() else []:
                if not qdir.name.isdigit() or (tdir.name, int(qdir.name)) not in listed:
                    shutil.rmtree(qdir)
    for topic, qid, lo, hi in cp.queues if cp is not None else []:
        cq = queues[(topic, qid)] = make(topic, qid)
        if not cq.load(lo, hi):
            log.warning("consume queue %s/%d: files missing or short (checkpoint has %d..%d); "
                        "rebuilding it from the commit log", topic, qid, lo, hi)
            cq.reset(None)
            damaged.add((topic, qid))
    return damaged


def _dispatch(rec: Record, clo: int, size: int, queues: dict[QueueKey, ConsumeQueue],
              make: Callable[[str, int], ConsumeQueue], index: Index | None) -> None:
    key = (rec.topic, rec.queue_id)
    cq = queues.get(key)
    if cq is None:
        cq = queues[key] = make(*key)
        cq.reset(None)
    cq.put_at(rec.queue_offset, clo, size, tag_hash(rec.tags))
    if index is not None:
        index.add(rec, clo)


def _rebuild(clog: CommitLog, start: int, damaged: set[QueueKey], rebuild_index: bool,
             queues: dict[QueueKey, ConsumeQueue], make: Callable[[str, int], ConsumeQueue],
             index: Index | None) -> None:
    """Dispatch ``[min offset, start)`` to the damaged queues (and the index if rebuilt). A bad
    record here does not cut the log (the checkpoint vouched for it); the rebuild stops there."""
    subset = {k: queues[k] for k in damaged}
    for clo, rec, size in clog.scan(clog.min_offset):
        if clo >= start:
            return
        if (rec.topic, rec.queue_id) in subset:
            _dispatch(rec, clo, size, subset, make, None)
        if rebuild_index and index is not None:
            index.add(rec, clo)
    if clog.scan_error and clog.scan_end < start:
        log.error("rebuild stopped at commit log offset %d (%s); entries after it are missing "
                  "until offset %d", clog.scan_end, clog.scan_error, start)


def _refuse_foreign(clog: CommitLog) -> None:
    """Without a checkpoint, a log whose first record does not even start like one is not ours
    (another format, another program): refuse rather than truncate it to nothing."""
    head = clog.read(clog.min_offset, 8) if clog.end > clog.min_offset else b""
    if len(head) == 8 and head[4:8] != RECORD_MAGIC.to_bytes(4, "big") and any(head):
        raise StoreError(f"{clog.dir} does not hold a txmq commit log of this format (first record "
                         f"starts {head.hex()}); move it away or point the store elsewhere")


def recover(clog: CommitLog, cq_root: Path, make: Callable[[str, int], ConsumeQueue],
            index: Index | None, cp: Checkpoint | None) -> tuple[dict[QueueKey, ConsumeQueue],
                                                                  RecoveryReport]:
    """Bring log, queues and index to a consistent state (see the module docstring).

    Raises:
        OSError: a file could not be read, truncated or deleted.
        StoreError: the log is not a txmq commit log of this format.
    """
    report = RecoveryReport()
    if cp is None:
        _refuse_foreign(clog)
    gap = clog.first_gap()
    if gap is not None:
        _cut(clog, gap, f"segment after offset {gap} does not start there (lost tail)", report)
    start = _start_point(clog, cp, report)
    queues: dict[QueueKey, ConsumeQueue] = {}
    damaged = _open_queues(cq_root, cp, make, queues)
    for key, cq in queues.items():  # a retention round after the checkpoint deleted segments
        if key not in damaged:
            for fd in cq.clean(clog.min_offset):
                os.close(fd)
    rebuild_index = False
    if index is not None and (cp is None or not index.load(cp.index_files)):
        rebuild_index = cp is not None
        index.reset()
    if start < (cp.dispatched if cp is not None else 0):
        for key, cq in queues.items():
            if key not in damaged:
                cq.truncate_from(start)
        if index is not None and not rebuild_index:
            index.truncate_from(start)
    if damaged or rebuild_index:
        _rebuild(clog, start, damaged, rebuild_index, queues, make, index)
        report.rebuilt_queues = sorted(f"{t}/{q}" for t, q in damaged)
        report.index_rebuilt = rebuild_index
    report.scanned_from = start
    if report.checkpoint_trusted and cp is not None and start == cp.dispatched:
        report.last_record = cp.last_record
    for clo, rec, size in clog.scan(start):
        _dispatch(rec, clo, size, queues, make, index)
        report.records += 1
        report.last_record = clo
    if clog.scan_error:
        _cut(clog, clog.scan_end, clog.scan_error, report)
    log.info("store %s recovered: checkpoint %d (%s), scanned %d records from %d, log ends at %d%s",
             clog.dir.parent, report.checkpoint_offset,
             "verified" if report.checkpoint_trusted else "not used", report.records, start,
             clog.end, f", rebuilt {report.rebuilt_queues}" if damaged else "")
    return queues, report
