"""The commit log: ordered segment files named by their 20-digit base offset.

Segments are contiguous: each starts where the previous one ends (a segment ends at its last record,
no end-of-file filler), so a commit log offset is a plain byte position in the concatenation. A new
segment starts when the next append batch would push the current one past the segment size; one
batch always lands in one segment (one ``pwrite``), which keeps "all of a batch or none" true.

Nothing here knows about queues; :mod:`txmq.store._file` composes it with the consume queues.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from txmq import limits
from txmq.errors import CorruptRecord, StoreError
from txmq.store._base import Record
from txmq.store._codec import (
    RECORD_MAGICS,
    RECORD_SIZE_MAX,
    RECORD_SIZE_MIN,
    decode_record,
    peek_size,
    store_timestamp,
)

__all__ = ["CommitLog", "Segment"]

log = logging.getLogger("txmq.store")

_SCAN_CHUNK_BYTES = 4 * 1024 * 1024
PREFILL_BYTES = 4 * 1024 * 1024
"""Zeros kept written ahead of the last segment's end (:meth:`CommitLog.append`): one file-size
change, and so one journalled ``fdatasync``, per 2-4 MiB of appends instead of one per fsync group
(txmq's choice; RocketMQ writes a whole 1 GiB segment ahead when ``warmMapedFileEnable`` is on)."""
PREFILL_LOW_BYTES = 2 * 1024 * 1024
"""Fewer zeros than this ahead of the end: write more (up to ``PREFILL_BYTES``)."""


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _find_any(mm: mmap.mmap, needles: list[bytes], start: int) -> int:
    """The first position at or after ``start`` where one of ``needles`` occurs (-1 if none)."""
    hits = [h for n in needles if (h := mm.find(n, start)) >= 0]
    return min(hits) if hits else -1


class Segment:
    """One segment file: ``[base, base + size)`` of the commit log."""

    __slots__ = ("alloc", "base", "fd", "first_ms", "mm", "path", "size")

    def __init__(self, base: int, path: Path, fd: int, size: int) -> None:
        self.base, self.path, self.fd, self.size = base, path, fd, size
        self.alloc = size
        """Bytes of the file (``size`` and the zeros written ahead of it, :meth:`CommitLog.append`)."""
        self.first_ms: int | None = None  # store timestamp of its first record, read lazily
        self.mm: mmap.mmap | None = None
        """A read-only map of the segment's first ``len(mm)`` bytes (:meth:`CommitLog.view`).
        Dropped, never closed: a view still using it keeps it mapped until it is released."""

    @property
    def end(self) -> int:
        return self.base + self.size


class CommitLog:
    """Segment files in ``directory``.

    Args:
        directory: where the segments live (created if missing).
        segment_bytes: nominal segment size (``mapped_file_size_commit_log``).
        lock: held while the segment list changes or is copied (the flusher thread reads it).
        prefill: keep zeros written ahead of the end (:data:`PREFILL_BYTES`; the store's
            ``warm_mapped_file_enable``).

    Raises:
        StoreError: the directory or a segment cannot be opened, or a file name is not a
            20-digit offset.
    """

    def __init__(self, directory: Path, segment_bytes: int, lock: threading.Lock, *,
                 prefill: bool = False) -> None:
        self.dir = directory
        self._lock = lock
        self.segment_bytes = segment_bytes
        self.prefill = prefill
        """Write zeros ahead of the end (:meth:`_prefill`)."""
        self.scan_end, self.scan_error, self.scan_prefill = 0, "", False
        self.segments: list[Segment] = []
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for path in sorted(directory.iterdir()):
                if path.name.endswith(".tmp"):
                    continue
                if len(path.name) != 20 or not path.name.isdigit():
                    raise StoreError(f"unexpected file in commit log directory: {path}")
                fd = os.open(path, os.O_RDWR)
                self.segments.append(Segment(int(path.name), path, fd, os.fstat(fd).st_size))
        except OSError as exc:
            raise StoreError(f"cannot open commit log {directory}: {exc}") from exc
        if not self.segments:
            self.segments.append(self._create(0))
        self._bases = [s.base for s in self.segments]
        self._mapped: OrderedDict[int, Segment] = OrderedDict()
        """Segments with a map, least recently mapped first (at most COMMIT_LOG_MAPS_MAX)."""

    # -- layout -----------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments[0].base

    @property
    def end(self) -> int:
        return self.segments[-1].end

    def _create(self, base: int) -> Segment:
        path = self.dir / f"{base:020d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fsync_dir(self.dir)
        return Segment(base, path, fd, 0)

    def segment_at(self, offset: int) -> Segment | None:
        """The segment holding ``offset`` (None if below the first or at/after the end)."""
        i = bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        seg = self.segments[i]
        return seg if offset < seg.end else None

    def first_gap(self) -> int | None:
        """Offset where segment ``i`` ends but segment ``i+1`` does not start (a lost tail)."""
        for a, b in zip(self.segments, self.segments[1:], strict=False):
            if a.end != b.base:
                return a.end
        return None

    # -- writing ----------------------------------------------------------------------------------
    def append(self, data: bytes | bytearray, base_offset: int) -> None:
        """Write one batch at ``base_offset`` (== :attr:`end`, which :meth:`place` returned).

        Raises:
            OSError: the write failed; the segment was truncated back, nothing was appended.
        """
        seg = self.segments[-1]
        assert base_offset == seg.end
        written = 0
        try:
            while written < len(data):
                written += os.pwrite(seg.fd, data[written:] if written else data,
                                     seg.size + written)
        except OSError:
            try:
                os.ftruncate(seg.fd, seg.size)
                seg.alloc = seg.size
            except OSError:
                log.exception("could not truncate commit log segment %s after a failed write",
                              seg.path)
            raise
        seg.size += len(data)
        seg.alloc = max(seg.alloc, seg.size)
        if self.prefill and seg.alloc - seg.size < PREFILL_LOW_BYTES:
            self._prefill(seg)

    def _prefill(self, seg: Segment) -> None:
        """Write zeros ahead of the end of the last segment, up to ``PREFILL_BYTES`` past it (never
        past the segment size), so that later appends overwrite allocated blocks of a file whose
        size does not change: their ``fdatasync`` then writes data only, not the file's new size
        and blocks through the file system's journal (RocketMQ warms its segments the same way,
        ``MappedFile.warmMappedFile``; ``benchmarks/append_stall.py`` measures the difference).
        Best effort: a failure (a full disk) leaves the log as it was and is retried at the next
        append. Recovery drops the zeros (:meth:`drop_prefill`)."""
        target = min(self.segment_bytes, seg.size + PREFILL_BYTES)
        if target <= seg.alloc:
            return
        try:
            os.pwrite(seg.fd, bytes(target - seg.alloc), seg.alloc)
        except OSError as exc:
            log.debug("commit log %s: no zeros written ahead: %s", seg.path, exc)
            return
        seg.alloc = target

    def place(self, nbytes: int) -> int:
        """Where a batch of ``nbytes`` goes: the current end, after rolling to a new segment if the
        current one is not empty and would pass the segment size. Raises OSError."""
        seg = self.segments[-1]
        if seg.size and seg.size + nbytes > self.segment_bytes:
            self._cut_prefill(seg)  # (durably, before the next segment exists: no gap after a crash)
            new = self._create(seg.end)
            with self._lock:
                self.segments.append(new)
                self._bases.append(new.base)
        return self.segments[-1].end

    @staticmethod
    def _cut_prefill(seg: Segment) -> None:
        """Shorten ``seg``'s file to its records (drop the zeros written ahead), durably.
        Raises OSError."""
        if seg.alloc > seg.size:
            os.ftruncate(seg.fd, seg.size)
            os.fsync(seg.fd)
            seg.alloc = seg.size

    def drop_prefill(self) -> int:
        """After a scan that stopped at the zeros written ahead (:attr:`scan_prefill`), cut them
        off; returns the bytes dropped (0 when the scan did not stop there). Raises OSError."""
        if not self.scan_prefill:
            return 0
        seg = self.segments[-1]
        dropped = seg.end - self.scan_end
        seg.size = seg.alloc = self.scan_end - seg.base
        seg.mm = None
        self._mapped.pop(seg.base, None)
        os.ftruncate(seg.fd, seg.size)
        os.fsync(seg.fd)
        self.scan_prefill = False
        return dropped

    def sync_fds(self, start: int, end: int) -> list[int]:
        """File descriptors of the segments overlapping ``[start, end)`` (any thread)."""
        with self._lock:
            return [s.fd for s in self.segments if s.end > start and s.base < end]

    def truncate(self, offset: int) -> int:
        """Cut everything at and after ``offset``: shorten its segment, delete later ones.
        Returns the bytes removed. Raises OSError."""
        removed = 0
        while len(self.segments) > 1 and self.segments[-1].base >= offset:
            with self._lock:
                seg = self.segments.pop()
                self._bases.pop()
            removed += seg.size
            seg.mm = None
            self._mapped.pop(seg.base, None)
            os.close(seg.fd)
            seg.path.unlink()
        seg = self.segments[-1]
        keep = max(0, offset - seg.base)
        if keep < seg.size:
            removed += seg.size - keep
            seg.mm = None
            os.ftruncate(seg.fd, keep)
            os.fsync(seg.fd)
            seg.size = seg.alloc = keep
        fsync_dir(self.dir)
        return removed

    def delete_oldest(self, count: int) -> list[Segment]:
        """Unlink the ``count`` oldest segments (never the last); return them so their fds can be
        closed once no flush uses them. Raises OSError."""
        count = min(count, len(self.segments) - 1)
        gone = self.segments[:count]
        for seg in gone:
            seg.mm = None
            self._mapped.pop(seg.base, None)
            seg.path.unlink()
        with self._lock:
            del self.segments[:count]
            del self._bases[:count]
        if gone:
            fsync_dir(self.dir)
        return gone

    # -- reading ----------------------------------------------------------------------------------
    def read(self, offset: int, nbytes: int) -> bytes:
        """Up to ``nbytes`` from ``offset``, never past the end of its segment.

        Raises:
            CorruptRecord: ``offset`` is not stored (below the first segment or past the end).
        """
        seg = self.segment_at(offset)
        if seg is None:
            raise CorruptRecord(f"commit log offset {offset} is not stored (log holds "
                                f"[{self.min_offset}, {self.end}))")
        n = min(nbytes, seg.end - offset)
        try:
            return os.pread(seg.fd, n, offset - seg.base)
        except OSError as exc:
            raise CorruptRecord(f"cannot read commit log offset {offset}: {exc}") from exc

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Up to ``nbytes`` from ``offset`` (never past the end of its segment) as a view of the
        segment's read-only map: no copy (the map is made, or made again when the segment grew
        past it, here). Release the view before the segment can be truncated.

        Raises:
            CorruptRecord: ``offset`` is not stored, or the segment cannot be mapped.
        """
        seg = self.segment_at(offset)
        if seg is None:
            raise CorruptRecord(f"commit log offset {offset} is not stored (log holds "
                                f"[{self.min_offset}, {self.end}))")
        rel = offset - seg.base
        n = min(nbytes, seg.size - rel)
        if seg.mm is None or rel + n > len(seg.mm):
            try:
                seg.mm = mmap.mmap(seg.fd, seg.size, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise CorruptRecord(f"cannot map commit log segment {seg.path}: {exc}") from exc
            self._mapped[seg.base] = seg
            self._mapped.move_to_end(seg.base)
            while len(self._mapped) > limits.COMMIT_LOG_MAPS_MAX:
                self._mapped.popitem(last=False)[1].mm = None
        return memoryview(seg.mm)[rel : rel + n]

    def read_record_bytes(self, offset: int, size_hint: int = 0) -> bytes:
        """The bytes of the record at ``offset`` (its declared size; checked by the decoder)."""
        data = self.read(offset, max(size_hint, 4096))
        size = peek_size(data)
        if RECORD_SIZE_MIN <= size <= RECORD_SIZE_MAX and size > len(data):
            data = self.read(offset, size)
        return data

    def _first_ms(self, seg: Segment) -> int | None:
        if seg.size < RECORD_SIZE_MIN:
            return None
        return store_timestamp(os.pread(seg.fd, RECORD_SIZE_MIN, 0))

    def first_ms(self, seg: Segment) -> int | None:
        """Store timestamp of a segment's first record (cached; None if empty)."""
        if seg.first_ms is None:
            seg.first_ms = self._first_ms(seg)
        return seg.first_ms

    def scan(self, start: int) -> Iterator[tuple[int, Record, int]]:
        """Valid records from ``start`` (a record boundary) as ``(offset, record, size)``, across
        segments, stopping at the first record that fails its check or at a gap between
        segments. Afterwards :attr:`scan_end` is the end of the last good record and
        :attr:`scan_error` says why the scan stopped early ("" at the clean end)."""
        self.scan_end, self.scan_error, self.scan_prefill = start, "", False
        i = max(0, bisect_right(self._bases, start) - 1)
        for seg in self.segments[i:]:
            if start < seg.base:
                self.scan_error = f"gap in the commit log: segment {seg.base} after offset {start}"
                return
            yield from self._scan_segment(seg, start)
            if self.scan_error:
                return
            start = self.scan_end

    def _scan_segment(self, seg: Segment, start: int) -> Iterator[tuple[int, Record, int]]:
        pos = start
        buf, buf_at = b"", start
        while pos < seg.end:
            rel = pos - buf_at
            need = peek_size(buf, rel) if len(buf) - rel >= 4 else RECORD_SIZE_MIN
            need = max(need, RECORD_SIZE_MIN)
            if len(buf) - rel < need:
                if need > RECORD_SIZE_MAX or pos + need > seg.end:
                    if self._zeros_to_end(seg, pos):
                        self.scan_prefill = True  # the zeros written ahead: the end of the log
                    else:
                        self.scan_error = f"torn or bad record at commit log offset {pos}"
                    return
                buf = os.pread(seg.fd, max(need, _SCAN_CHUNK_BYTES), pos - seg.base)
                buf_at, rel = pos, 0
            try:
                rec, size = decode_record(memoryview(buf), rel, pos)
            except CorruptRecord as exc:
                if peek_size(buf, rel) == 0 and self._zeros_to_end(seg, pos):
                    self.scan_prefill = True  # the zeros written ahead: the end of the log
                else:
                    self.scan_error = str(exc)
                return
            yield pos, rec, size
            pos += size
            self.scan_end = pos

    def _zeros_to_end(self, seg: Segment, pos: int) -> bool:
        """Whether ``seg`` is the last segment and holds only zero bytes from ``pos`` to its end
        (what :meth:`_prefill` writes; a record never starts with a zero size). Raises OSError."""
        if seg is not self.segments[-1]:
            return False
        at = pos - seg.base
        while at < seg.size:
            chunk = os.pread(seg.fd, min(_SCAN_CHUNK_BYTES, seg.size - at), at)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            at += len(chunk)
        return True

    def next_good(self, offset: int) -> int | None:
        """Start of the first record after ``offset`` in the same segment that checks out (found by
        searching for the record magic), or None: tells damage in the middle of a segment from a
        torn tail. Reads the rest of the segment. Raises OSError."""
        seg = self.segment_at(offset)
        if seg is None or seg.end - offset <= RECORD_SIZE_MIN:
            return None
        magics = [m.to_bytes(4, "big") for m in RECORD_MAGICS]
        with mmap.mmap(seg.fd, seg.size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                pos = offset - seg.base + 1
                while (hit := _find_any(mm, magics, pos + 4)) >= 0:
                    try:
                        decode_record(view, hit - 4, seg.base + hit - 4)
                        return seg.base + hit - 4
                    except CorruptRecord:
                        pos = hit - 3
                return None
            finally:
                view.release()

    def close(self) -> None:
        self._mapped.clear()
        for seg in self.segments:
            seg.mm = None
            with contextlib.suppress(OSError):  # (recovery drops them otherwise)
                self._cut_prefill(seg)
            os.close(seg.fd)
        self.segments = []
        self._bases = []


def read_commit_log(store_dir: Path) -> bytes:
    """The records of the commit log under ``store_dir`` (its ``commitlog`` segment files joined in
    offset order), without the zeros written ahead of the last segment's end; b"" if there is none.
    Exact because every record ends with its properties' separator (0x02, the ``__CRC32#``
    property's), never a zero byte. For tests and tools comparing logs byte for byte (a slave's
    with its master's). Raises OSError."""
    d = store_dir / "commitlog"
    if not d.is_dir():
        return b""
    files = sorted(p for p in d.iterdir() if p.is_file() and len(p.name) == 20 and p.name.isdigit())
    return b"".join(p.read_bytes() for p in files).rstrip(b"\0")

