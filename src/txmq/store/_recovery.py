"""Recovery of a :class:`~txmq.store.FileStore` when it opens.

1. The commit log's segments must be contiguous; a gap (a lost segment tail) cuts the log there.
2. The checkpoint says up to which commit log offset ``D`` consume queues and indexes are on disk,
   and where the record ending at ``D`` starts. Everything below ``D`` was fsynced before the
   checkpoint was written, so damage there (that record fails its CRC32C, the log is shorter than
   ``D``, a gap below ``D``) is not a torn tail: opening stops with :class:`CommitLogDamaged`, whose
   message names ``txmq store check`` and ``txmq store repair`` (see :mod:`._check`).
3. Consume queues and index files are opened and cut to what the checkpoint recorded. What cannot
   be used (a file where a directory belongs, a directory name that is not a topic or a queue id,
   files missing, short or unreadable, entries that do not point at their queue's records, an index
   that fails its check) is moved to the quarantine (:mod:`._quarantine`), named in the log with
   the reason, and rebuilt from the oldest segment on. A topic whose name cannot be a directory
   gets no consume queue (its records stay in the log).
4. The log is scanned from the start point: every record's CRC32C is verified and it is dispatched
   to its consume queue and the index. The scan stops at the first record that fails, and the log
   is cut there (a torn tail: it was never acknowledged, since an acknowledgement waits for the
   fsync that would have made it whole); the cut bytes are kept in the quarantine. Without a
   checkpoint, a bad record followed by a good one, or in a segment that is not the last one, is
   damage, not a torn tail (a crash tears only the end of what was written).
5. What was done is logged and returned as a :class:`RecoveryReport`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec

from txmq.errors import CommitLogDamaged, CorruptRecord, StoreError, StoreFormatOld
from txmq.store._base import Record
from txmq.store._codec import RECORD_MAGICS, Checkpoint, decode_record, tag_hash
from txmq.store._commitlog import CommitLog
from txmq.store._consumequeue import ConsumeQueue, topic_dir_problem
from txmq.store._index import Index
from txmq.store._quarantine import Quarantine

__all__ = ["RecoveryReport", "damaged_error", "dispatch_record", "keep_tail", "recover",
           "refuse_old_format", "sweep_commit_log_dir"]

TXM1_MAGIC_BYTES = b"TXM1"
"""Bytes 4-8 of a record of txmq's earlier store format (:mod:`txmq.store._migrate_txm1`)."""

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
        quarantined: ``"<path>: <reason>"`` of everything moved to the quarantine.
        unqueued_topics: topics whose records got no consume queue (name not a file name).
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
    quarantined: list[str] = msgspec.field(default_factory=list)
    unqueued_topics: list[str] = msgspec.field(default_factory=list)


def damaged_error(clog: CommitLog, at: int, reason: str, checkpoint_offset: int) -> CommitLogDamaged:
    """The error that stops opening: damage at ``at`` that is not a torn tail."""
    root = clog.dir.parent
    where = (f"before the last checkpoint (offset {checkpoint_offset}), so acknowledged messages "
             f"are affected" if checkpoint_offset >= 0 else
             "with good records after it (or in a segment that is not the last one)")
    return CommitLogDamaged(
        f"commit log {clog.dir} is damaged at offset {at} ({reason}), {where}: this is not a torn "
        f"tail, and nothing was changed. Run `txmq store check {root}` to see the damage, then "
        f"`txmq store repair {root} --yes` to cut the log there (the cut part is kept under "
        f"{root}/quarantine/) and rebuild the consume queues and index.")


def keep_tail(clog: CommitLog, at: int, reason: str, quarantine: Quarantine | None) -> None:
    """Copy what a cut at ``at`` removes into the quarantine (best effort: a torn tail was never
    acknowledged, so a failure to copy it is logged, not fatal)."""
    if quarantine is None or at >= clog.end:
        return
    try:
        for seg in clog.segments:
            if seg.end > at and seg.size:
                quarantine.put_bytes(seg.path, max(0, at - seg.base), reason)
    except OSError as exc:
        log.error("commit log %s: could not keep a copy of the tail cut at %d: %s", clog.dir, at,
                  exc)


def _cut(clog: CommitLog, at: int, reason: str, report: RecoveryReport,
         quarantine: Quarantine | None = None) -> None:
    keep_tail(clog, at, reason, quarantine)
    removed = clog.truncate(at)
    if removed:
        report.truncated_at = at if report.truncated_at < 0 else min(at, report.truncated_at)
        report.truncated_bytes += removed
        report.reason = reason
        log.warning("commit log %s: %s; truncated %d bytes at offset %d", clog.dir, reason, removed,
                    at)


def _start_point(clog: CommitLog, cp: Checkpoint | None, report: RecoveryReport) -> int:
    """Where the scan starts: ``D`` if the checkpoint's last record checks out (the start of the
    log without a checkpoint). Raises CommitLogDamaged when it does not."""
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
            raise damaged_error(clog, cp.last_record, f"the record there is {size} bytes long, not "
                          f"{d - cp.last_record}", d)
        except CorruptRecord as exc:
            raise damaged_error(clog, cp.last_record, str(exc), d) from exc
    if d < clog.min_offset:  # retention deleted segments after the checkpoint was written
        return clog.min_offset
    raise damaged_error(clog, clog.end, f"the log ends at {clog.end}", d)


def _quarantine(q: Quarantine | None, path: Path, reason: str, report: RecoveryReport) -> None:
    """Move ``path`` aside (or, without a quarantine, delete it) and note it in the report."""
    report.quarantined.append(f"{path}: {reason}")
    if q is not None:
        q.put(path, reason)
    elif path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _sweep_queue_dirs(cq_root: Path, listed: set[QueueKey], q: Quarantine | None,
                      report: RecoveryReport) -> None:
    """Quarantine what cannot be a consume queue directory; delete the queues the checkpoint does
    not list (they are rebuilt from the log)."""
    if not cq_root.exists() or not cq_root.is_dir():
        if cq_root.exists() or cq_root.is_symlink():
            _quarantine(q, cq_root, "not a directory", report)
        return
    for tdir in sorted(cq_root.iterdir()):
        why = ("not a directory" if not tdir.is_dir() or tdir.is_symlink()
               else topic_dir_problem(tdir.name))
        if why:
            _quarantine(q, tdir, why, report)
            continue
        for qdir in sorted(tdir.iterdir()):
            why = ("queue directory name is not a queue id" if not qdir.name.isdigit()
                   else "not a directory" if not qdir.is_dir() or qdir.is_symlink() else "")
            if why:
                _quarantine(q, qdir, why, report)
            elif (tdir.name, int(qdir.name)) not in listed:
                try:
                    shutil.rmtree(qdir)
                except OSError as exc:
                    _quarantine(q, qdir, f"not in the checkpoint and cannot be deleted: {exc}",
                                report)


def sweep_commit_log_dir(directory: Path, q: Quarantine) -> None:
    """Quarantine what is not a segment (a 20-digit name) in the commit log directory, so a stray
    file or directory does not stop the start. Raises OSError."""
    if not directory.is_dir():
        return
    for path in sorted(directory.iterdir()):
        if path.name.endswith(".tmp"):
            continue
        if len(path.name) != 20 or not path.name.isdigit():
            q.put(path, "not a commit log segment (its name is not a 20-digit offset)")
        elif not path.is_file():
            q.put(path, "a commit log segment name, but not a regular file")


def _verify_queue(clog: CommitLog, cq: ConsumeQueue, topic: str, qid: int) -> str:
    """Why the loaded files of ``cq`` cannot be trusted ("" if they can): the first and last entry
    of each file must point, in order, at records of this queue with that queue offset."""
    lo, hi = max(cq.min, 0), cq.persisted
    probes = {lo, hi - 1}
    for f in cq.files:
        probes |= {f.first, f.first + cq.per_file - 1}
    prev = -1
    for i in sorted(p for p in probes if lo <= p < hi):
        clo, size = cq.entries(i, i + 1)[0]
        if size == 0 or clo < clog.min_offset:
            continue  # a hole, or a record retention deleted
        if clo < prev or clo + size > clog.end:
            return f"entry {i} points at commit log offset {clo}, out of order or past the log end"
        try:
            rec, _ = decode_record(memoryview(clog.read_record_bytes(clo, size)), 0, clo)
        except CorruptRecord as exc:
            return f"entry {i} points at no record: {exc}"
        if (rec.topic, rec.queue_id, rec.queue_offset) != (topic, qid, i):
            return (f"entry {i} points at {rec.topic}/{rec.queue_id} offset {rec.queue_offset}, "
                    f"a record of another queue")
        prev = clo
    return ""


def _open_queues(clog: CommitLog, cq_root: Path, cp: Checkpoint | None,
                 make: Callable[[str, int], ConsumeQueue], queues: dict[QueueKey, ConsumeQueue],
                 q: Quarantine | None, report: RecoveryReport) -> set[QueueKey]:
    """Load the queues the checkpoint lists; return those that must be rebuilt."""
    damaged: set[QueueKey] = set()
    listed = {(t, n) for t, n, _, _ in cp.queues} if cp is not None else set()
    _sweep_queue_dirs(cq_root, listed, q, report)
    for topic, qid, lo, hi in cp.queues if cp is not None else []:
        if topic_dir_problem(topic) or qid < 0:
            continue  # recorded by an older version; its records are dispatched to no queue
        cq = queues[(topic, qid)] = make(topic, qid)
        try:
            why = "" if cq.load(lo, hi) else f"files missing or short (checkpoint has {lo}..{hi})"
            why = why or _verify_queue(clog, cq, topic, qid)
        except OSError as exc:
            why = f"unreadable: {exc}"
        if why:
            cq.close()
            log.warning("consume queue %s/%d: %s; rebuilding it from the commit log", topic, qid,
                        why)
            if cq.dir.exists():
                _quarantine(q, cq.dir, why, report)
            cq.reset(None)
            damaged.add((topic, qid))
    return damaged


def _verify_index(index: Index, clog: CommitLog) -> str:
    """Why the loaded index files cannot be trusted ("" if they can): each file's first and last
    entries must point at records within the file's recorded range."""
    for f in index.files:
        for n in {1, f.count} if f.count else ():
            _, clo, _, prev = f.entry(n)
            if not f.begin_clo <= clo <= max(f.end_clo, f.begin_clo) or prev >= n:
                return f"index file {f.path.name}: entry {n} is not one of its records"
            if clog.min_offset <= clo < clog.end:
                try:
                    decode_record(memoryview(clog.read_record_bytes(clo)), 0, clo)
                except CorruptRecord as exc:
                    return f"index file {f.path.name}: entry {n} points at no record ({exc})"
    return ""


def _open_index(index: Index, clog: CommitLog, cp: Checkpoint | None, q: Quarantine | None,
                report: RecoveryReport) -> bool:
    """Load the index files; quarantine them if they fail. Returns whether to rebuild it."""
    if cp is None:
        try:
            index.reset()
        except OSError as exc:
            index.close()
            _quarantine(q, index.dir, f"cannot clear it: {exc}", report)
        index.dir.mkdir(parents=True, exist_ok=True)
        return False
    try:
        why = "" if index.load(cp.index_files) else "files missing or short"
        why = why or _verify_index(index, clog)
    except OSError as exc:
        why = f"unreadable: {exc}"
    if not why:
        return False
    index.close()
    log.warning("index %s: %s; rebuilding it from the commit log", index.dir, why)
    if why != "files missing or short" and index.dir.exists():
        _quarantine(q, index.dir, why, report)
    index.reset()
    index.dir.mkdir(parents=True, exist_ok=True)
    return True


def _dispatch(rec: Record, clo: int, size: int, queues: dict[QueueKey, ConsumeQueue],
              make: Callable[[str, int], ConsumeQueue], index: Index | None,
              report: RecoveryReport | None = None) -> None:
    key = (rec.topic, rec.queue_id)
    cq = queues.get(key)
    if cq is None:
        why = topic_dir_problem(rec.topic) or ("negative queue id" if rec.queue_id < 0 else "")
        if why:
            if report is not None and rec.topic not in report.unqueued_topics:
                report.unqueued_topics.append(rec.topic)
                log.warning("records of topic %r stay in the commit log without a consume queue: "
                            "%s", rec.topic[:300], why)
            if index is not None:
                index.add(rec, clo)
            return
        cq = queues[key] = make(*key)
        cq.reset(None)
    cq.put_at(rec.queue_offset, clo, size, tag_hash(rec.tags))
    if index is not None:
        index.add(rec, clo)


def dispatch_record(rec: Record, clo: int, size: int, queues: dict[QueueKey, ConsumeQueue],
                    make: Callable[[str, int], ConsumeQueue], index: Index | None) -> None:
    """Recovery's dispatch of the record ``rec`` stored at ``clo`` (``size`` bytes): its consume
    queue entry at the queue offset the record carries, and its index entries. A replica (issue
    #25) builds its queues with this, from the master's bytes."""
    _dispatch(rec, clo, size, queues, make, index)


def _rebuild(clog: CommitLog, start: int, damaged: set[QueueKey], rebuild_index: bool,
             queues: dict[QueueKey, ConsumeQueue], make: Callable[[str, int], ConsumeQueue],
             index: Index | None, cp_offset: int) -> None:
    """Dispatch ``[min offset, start)`` to the damaged queues (and the index if rebuilt). The
    checkpoint vouched for this part of the log: a bad record here raises CommitLogDamaged."""
    subset = {k: queues[k] for k in damaged}
    for clo, rec, size in clog.scan(clog.min_offset):
        if clo >= start:
            return
        if (rec.topic, rec.queue_id) in subset:
            _dispatch(rec, clo, size, subset, make, None)
        if rebuild_index and index is not None:
            index.add(rec, clo)
    if clog.scan_error and clog.scan_end < start:
        raise damaged_error(clog, clog.scan_end, clog.scan_error, cp_offset)


def refuse_old_format(clog: CommitLog) -> None:
    """Raise :class:`~txmq.errors.StoreFormatOld` when the log's first record is a TXM1 record
    (txmq's format before MessageExt records), naming the command that rewrites it."""
    head = clog.read(clog.min_offset, 8) if clog.end > clog.min_offset else b""
    if len(head) == 8 and head[4:8] == TXM1_MAGIC_BYTES:
        root = clog.dir.parent
        raise StoreFormatOld(
            f"{root} was written by an older txmq (TXM1 records, before the store held RocketMQ "
            f"MessageExt records); nothing was changed. Run `txmq store migrate {root}` to rewrite "
            f"it (queue offsets, and so consumer offsets, stay valid), then start again.")


def _refuse_foreign(clog: CommitLog) -> None:
    """Without a checkpoint, a log whose first record does not even start like one is not ours
    (another format, another program): refuse rather than truncate it to nothing."""
    head = clog.read(clog.min_offset, 8) if clog.end > clog.min_offset else b""
    if len(head) == 8 and int.from_bytes(head[4:8], "big") not in RECORD_MAGICS and any(head):
        raise StoreError(f"{clog.dir} does not hold a txmq commit log of this format (first record "
                         f"starts {head.hex()}); move it away or point the store elsewhere")


def recover(clog: CommitLog, cq_root: Path, make: Callable[[str, int], ConsumeQueue],
            index: Index | None, cp: Checkpoint | None, quarantine: Quarantine | None = None,
            ) -> tuple[dict[QueueKey, ConsumeQueue], RecoveryReport]:
    """Bring log, queues and index to a consistent state (see the module docstring).

    Raises:
        OSError: a file could not be read, truncated, deleted or moved.
        CommitLogDamaged: the log is damaged below the checkpoint (not a torn tail).
        StoreError: the log is not a txmq commit log of this format.
    """
    report = RecoveryReport()
    refuse_old_format(clog)
    if cp is None:
        _refuse_foreign(clog)
    gap = clog.first_gap()
    if gap is not None:
        reason = f"segment after offset {gap} does not start there (lost tail)"
        if cp is not None and gap < cp.dispatched:
            raise damaged_error(clog, gap, reason, cp.dispatched)
        _cut(clog, gap, reason, report, quarantine)
    start = _start_point(clog, cp, report)
    queues: dict[QueueKey, ConsumeQueue] = {}
    damaged = _open_queues(clog, cq_root, cp, make, queues, quarantine, report)
    for key, cq in queues.items():  # a retention round after the checkpoint deleted segments
        if key not in damaged:
            for fd in cq.clean(clog.min_offset):
                os.close(fd)
    rebuild_index = index is not None and _open_index(index, clog, cp, quarantine, report)
    if damaged or rebuild_index:
        _rebuild(clog, start, damaged, rebuild_index, queues, make, index,
                 cp.dispatched if cp is not None else -1)
        report.rebuilt_queues = sorted(f"{t}/{q}" for t, q in damaged)
        report.index_rebuilt = rebuild_index
    report.scanned_from = start
    if report.checkpoint_trusted and cp is not None and start == cp.dispatched:
        report.last_record = cp.last_record
    for clo, rec, size in clog.scan(start):
        _dispatch(rec, clo, size, queues, make, index, report)
        report.records += 1
        report.last_record = clo
    if clog.scan_error:
        if cp is None and (clog.scan_end < clog.segments[-1].base
                           or clog.next_good(clog.scan_end) is not None):
            raise damaged_error(clog, clog.scan_end, clog.scan_error, -1)
        _cut(clog, clog.scan_end, clog.scan_error, report, quarantine)
    if dropped := clog.drop_prefill():  # (zeros written ahead of the end, never a record)
        log.info("commit log %s: %d bytes of zeros written ahead of offset %d dropped", clog.dir,
                 dropped, clog.end)
    log.info("store %s recovered: checkpoint %d (%s), scanned %d records from %d, log ends at %d%s",
             clog.dir.parent, report.checkpoint_offset,
             "verified" if report.checkpoint_trusted else "not used", report.records, start,
             clog.end, f", rebuilt {report.rebuilt_queues}" if damaged else "")
    return queues, report
