"""``txmq store check`` and ``txmq store repair``: verify every commit log record offline, and cut
a damaged log at its first bad record.

A store refuses to open when its commit log is damaged below the last checkpoint (see
:mod:`._recovery`): acknowledged messages are involved, so only an operator may drop them. ``check``
reads every record and verifies its CRC32C, and reports each segment, each damaged range (where
the next good record starts, found by searching for the record magic), and what ``repair`` would
do. ``repair`` moves everything from the first bad record on into the quarantine (the bytes are
kept, not deleted), quarantines the checkpoint, consume queues, index and the derived metadata
(``meta/*.snapshot``, ``meta/*.table``: the transaction index), and opens the store once so they
are rebuilt from the commit log. Run both only while no broker uses the directory.
"""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec

from txmq.errors import CorruptRecord, StoreError
from txmq.store._codec import decode_checkpoint
from txmq.store._commitlog import CommitLog
from txmq.store._config import StoreConfig
from txmq.store._file import FileStore
from txmq.store._quarantine import Quarantine
from txmq.store._recovery import keep_tail, refuse_old_format

__all__ = ["DamagedRange", "SegmentCheck", "StoreCheck", "check_store", "repair_store"]

class SegmentCheck(msgspec.Struct):
    """One segment: its file name, ``[base, end)`` and the good records in it."""

    name: str
    base: int
    end: int
    records: int = 0


class DamagedRange(msgspec.Struct):
    """``[start, end)`` of the log that holds no good record; ``end`` is where the next good
    record starts (the log's end if none follows)."""

    start: int
    end: int
    reason: str


class StoreCheck(msgspec.Struct, kw_only=True):
    """What ``txmq store check`` found.

    Attributes:
        records: good records in the whole log.
        damaged: the damaged ranges, in log order.
        records_after_damage: good records after the first damaged range (repair moves them to the
            quarantine with it).
        checkpoint_offset: the checkpoint's ``D`` (-1 if none or unreadable).
        cut_at: where repair cuts the log (-1: nothing to cut).
        cut_bytes: bytes repair moves to the quarantine.
        torn_tail_only: the only damage is a tail after the checkpoint, which opening cuts itself.
    """

    segments: list[SegmentCheck]
    records: int = 0
    damaged: list[DamagedRange] = msgspec.field(default_factory=list)
    records_after_damage: int = 0
    checkpoint_offset: int = -1
    log_end: int = 0
    cut_at: int = -1
    cut_bytes: int = 0
    torn_tail_only: bool = False

    @property
    def ok(self) -> bool:
        return not self.damaged


def _checkpoint_offset(root: Path) -> int:
    try:
        return decode_checkpoint((root / "checkpoint").read_bytes()).dispatched
    except (OSError, CorruptRecord):
        return -1


def check_store(root: Path | str) -> StoreCheck:
    """Verify every record of the commit log under ``root`` (read only). Raises StoreError when
    the commit log directory cannot be opened."""
    root = Path(root)
    if not (root / "commitlog").is_dir():
        raise StoreError(f"{root} holds no commit log (no {root / 'commitlog'} directory)")
    clog = CommitLog(root / "commitlog", StoreConfig().mapped_file_size_commit_log, threading.Lock())
    try:
        refuse_old_format(clog)
        out = StoreCheck(segments=[SegmentCheck(s.path.name, s.base, s.end) for s in clog.segments],
                         checkpoint_offset=_checkpoint_offset(root), log_end=clog.end)
        pos, i = clog.min_offset, 0
        while pos < clog.end:
            for clo, _, _ in clog.scan(pos):
                while clo >= out.segments[i].end:
                    i += 1
                out.segments[i].records += 1
                out.records += 1
                if out.damaged:
                    out.records_after_damage += 1
            if not clog.scan_error:
                break
            bad = clog.scan_end
            nxt = clog.next_good(bad)
            if nxt is None:  # the next segment, if any, starts the next good stretch
                later = [s.base for s in clog.segments if s.base > bad]
                nxt = later[0] if later else clog.end
            out.damaged.append(DamagedRange(bad, nxt, clog.scan_error))
            pos = nxt
        if out.checkpoint_offset > clog.end:
            out.damaged.append(DamagedRange(clog.end, out.checkpoint_offset,
                                            f"the log ends at {clog.end}, before the checkpoint "
                                            f"offset {out.checkpoint_offset}"))
        if out.damaged:
            out.cut_at = min(d.start for d in out.damaged)
            out.cut_bytes = clog.end - out.cut_at
            out.torn_tail_only = (len(out.damaged) == 1 and out.records_after_damage == 0
                                  and out.cut_at >= out.checkpoint_offset)
        return out
    finally:
        clog.close()


def repair_store(root: Path | str) -> tuple[StoreCheck, list[str]]:
    """Cut the commit log at its first damaged record (the cut part, and every derived file, goes
    to the quarantine), then open the store once to rebuild consume queues and index. Returns the
    check made before, and ``"<path>: <reason>"`` of what was quarantined. Raises StoreError."""
    root = Path(root)
    found = check_store(root)
    if found.ok:
        return found, []
    q = Quarantine(root)
    why = f"txmq store repair: log cut at offset {found.cut_at}"
    clog = CommitLog(root / "commitlog", StoreConfig().mapped_file_size_commit_log, threading.Lock())
    try:
        keep_tail(clog, found.cut_at, why, q)
        clog.truncate(found.cut_at)
    finally:
        clog.close()
    derived = [root / "checkpoint", root / "consumequeue", root / "index",
               *sorted((root / "meta").glob("*.snapshot")), *sorted((root / "meta").glob("*.table"))]
    for path in derived:
        if path.exists():
            q.put(path, f"{why}: rebuilt from the commit log")
    FileStore(root).close()
    return found, [f"{src} -> {dst}: {reason}" for src, dst, reason in q.moved]
