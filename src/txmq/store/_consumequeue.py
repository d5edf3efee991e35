"""Consume queues: per (topic, queue id), fixed 20-byte entries pointing into the commit log.

Entry ``i`` (the message at queue offset ``i``) lives in the file named by the 20-digit byte offset
``(i - i % entries_per_file) * 20`` (RocketMQ names consume queue files the same way), at byte
``(i % entries_per_file) * 20``; the layout is drawn in :mod:`txmq.store._codec`.

Entries are built by the dispatcher (the store's append, and recovery) and kept in memory until a
checkpoint writes those of flushed records to the files; the checkpoint file says how many entries
of each queue are on disk, so a queue can always be checked against it and rebuilt from the commit
log. A hole (an entry of size 0) stands for a queue offset whose record recovery could not find; it
is skipped by readers and logged when made.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_left
from pathlib import Path

from txmq import limits
from txmq.store._codec import CQ_ENTRY, CQ_ENTRY_SIZE

__all__ = ["ConsumeQueue", "topic_dir_problem"]

log = logging.getLogger("txmq.store")


def topic_dir_problem(topic: str) -> str:
    """Why ``topic`` cannot name a directory under ``consumequeue/`` ("" if it can): empty, ``.``
    or ``..``, a path separator or NUL, or longer than ``limits.FILE_NAME_MAX_BYTES`` in UTF-8."""
    if topic in ("", ".", ".."):
        return f"topic name {topic!r} is not a file name"
    if "/" in topic or "\0" in topic:
        return f"topic name {topic!r} holds a path separator or NUL"
    if len(topic.encode("utf-8", "surrogatepass")) > limits.FILE_NAME_MAX_BYTES:
        return f"topic name of {len(topic.encode('utf-8', 'surrogatepass'))} bytes is over the " \
               f"file name limit ({limits.FILE_NAME_MAX_BYTES})"
    return ""


class _File:
    __slots__ = ("fd", "first", "path")

    def __init__(self, first: int, path: Path, fd: int) -> None:
        self.first, self.path, self.fd = first, path, fd


class ConsumeQueue:
    """One consume queue: ``[min, persisted)`` in files, ``[persisted, max)`` in memory.

    Args:
        directory: ``<root>/consumequeue/<topic>/<queue id>`` (created on first write).
        entries_per_file: ``mapped_file_size_consume_queue``.
    """

    def __init__(self, directory: Path, entries_per_file: int) -> None:
        self.dir = directory
        self.per_file = entries_per_file
        self.files: list[_File] = []
        self.min = 0
        self.persisted = 0
        self._clo = array("q")  # commit log offsets of [persisted, max), for bisecting
        self._packed = bytearray()  # the same entries, encoded
        self._fresh = False
        self.last_persisted: tuple[int, int] | None = None
        """``(commit log offset, size)`` of the newest entry written to a file."""
        self._last_clo: tuple[int, int, int] | None = None
        """(queue offset, persisted count, commit log offset) of the last persisted entry."""

    @property
    def max(self) -> int:
        """Next queue offset to assign."""
        return self.persisted + len(self._clo)

    # -- opening ----------------------------------------------------------------------------------
    def load(self, min_offset: int, max_offset: int) -> bool:
        """Open the files and cut them to ``[min_offset, max_offset)`` (the checkpoint's view).

        Returns False (and opens nothing) when files are missing or short: the caller rebuilds the
        queue from the commit log. Raises OSError.
        """
        self._last_clo = None
        self.min, self.persisted = min(min_offset, max_offset), max_offset
        if max_offset == self.min:
            self._remove_files_from(0)
            return True
        names = sorted(p for p in self.dir.iterdir() if p.name.isdigit()) if self.dir.exists() else []
        firsts = [int(p.name) // CQ_ENTRY_SIZE for p in names]
        have = 0 if not names else firsts[0]
        for first, path in zip(firsts, names, strict=True):
            if first != have or first % self.per_file:
                break
            if first >= max_offset:
                break
            count = path.stat().st_size // CQ_ENTRY_SIZE
            self.files.append(_File(first, path, os.open(path, os.O_RDWR)))
            have = first + min(count, self.per_file)
            if count < self.per_file:
                break
        ok = bool(self.files) and self.files[0].first <= self.min and have >= max_offset
        if not ok:
            self.close()
            return False
        self._remove_files_from(self.files[-1].first + self.per_file)
        last = self.files[-1]
        os.ftruncate(last.fd, (max_offset - last.first) * CQ_ENTRY_SIZE)
        return True

    def reset(self, start: int | None) -> None:
        """Forget everything (files included) and start empty at queue offset ``start``, or with
        None at whatever offset the first dispatched record has (a rebuild)."""
        self._last_clo = None
        self.close()
        self._remove_files_from(0)
        self.min = self.persisted = start or 0
        self._fresh = start is None
        del self._clo[:], self._packed[:]

    def _remove_files_from(self, first: int) -> None:
        if not self.dir.exists():
            return
        for p in self.dir.iterdir():
            if p.name.isdigit() and int(p.name) // CQ_ENTRY_SIZE >= first:
                p.unlink()

    # -- dispatch ---------------------------------------------------------------------------------
    def put(self, commit_log_offset: int, size: int, tag_hash: int) -> int:
        """Append the entry of the next queue offset; return that offset."""
        self._clo.append(commit_log_offset)
        self._packed += CQ_ENTRY.pack(commit_log_offset, size, tag_hash)
        return self.max - 1

    def put_at(self, queue_offset: int, commit_log_offset: int, size: int, tag_hash: int) -> None:
        """Recovery's dispatch: the record claims ``queue_offset``. An offset already present is
        ignored; an empty queue (its records deleted by retention) restarts there; any other jump
        leaves holes (logged) so later offsets stay where the log says."""
        if self._fresh:
            self.min = self.persisted = queue_offset
            self._fresh = False
        elif self.min == self.max < queue_offset:  # everything before it went with retention
            self.reset(queue_offset)
        if queue_offset < self.max:
            return
        if queue_offset > self.max:
            log.error("consume queue %s: queue offsets %d..%d are missing from the commit log; "
                      "readers will skip them", self.dir, self.max, queue_offset - 1)
            while self.max < queue_offset:
                self.put(commit_log_offset, 0, 0)
        self.put(commit_log_offset, size, tag_hash)

    def truncate_from(self, commit_log_offset: int) -> None:
        """Drop entries of records at or after ``commit_log_offset`` (the log was cut there)."""
        self._last_clo = None
        cut = self._first_at_or_after(commit_log_offset, self.min)
        if cut >= self.persisted:
            n = cut - self.persisted
            del self._clo[n:], self._packed[n * CQ_ENTRY_SIZE :]
            return
        del self._clo[:], self._packed[:]
        self.persisted = max(cut, self.min)
        keep = [f for f in self.files if f.first < self.persisted]
        for f in self.files:
            if f not in keep:
                os.close(f.fd)
                f.path.unlink()
        self.files = keep
        if self.files:
            last = self.files[-1]
            os.ftruncate(last.fd, max(0, self.persisted - last.first) * CQ_ENTRY_SIZE)

    # -- persistence ------------------------------------------------------------------------------
    def persist(self, below: int) -> set[int]:
        """Write the in-memory entries of records below commit log offset ``below`` to the files;
        return the fds written (to fsync). Raises OSError (nothing is counted as persisted)."""
        n = bisect_left(self._clo, below)
        if n == 0:
            return set()
        fds: set[int] = set()
        i = 0
        while i < n:
            idx = self.persisted + i
            f = self._file_for(idx, create=True)
            room = f.first + self.per_file - idx
            k = min(room, n - i)
            data = self._packed[i * CQ_ENTRY_SIZE : (i + k) * CQ_ENTRY_SIZE]
            written = 0
            while written < len(data):
                written += os.pwrite(f.fd, data[written:], (idx - f.first) * CQ_ENTRY_SIZE + written)
            fds.add(f.fd)
            i += k
        self.persisted += n
        self.last_persisted = CQ_ENTRY.unpack_from(self._packed, (n - 1) * CQ_ENTRY_SIZE)[:2]
        del self._clo[:n], self._packed[: n * CQ_ENTRY_SIZE]
        return fds

    def _file_for(self, idx: int, create: bool = False) -> _File:
        first = idx - idx % self.per_file
        if self.files:
            k = (first - self.files[0].first) // self.per_file
            if 0 <= k < len(self.files):
                return self.files[k]
        assert create and (not self.files or first == self.files[-1].first + self.per_file)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{first * CQ_ENTRY_SIZE:020d}"
        f = _File(first, path, os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
        self.files.append(f)
        return f

    # -- reading ----------------------------------------------------------------------------------
    def visible_max(self, below: int) -> int:
        """One past the last entry whose record starts below commit log offset ``below`` (the
        flushed offset, or controller mode's lower read limit, which persisted entries may pass:
        they are then bisected on disk). Raises OSError."""
        clo = self._clo
        if clo and clo[0] < below:
            return self.persisted + bisect_left(clo, below)
        if self.persisted <= self.min or self._persisted_clo(self.persisted - 1) < below:
            return self.persisted
        return self._first_at_or_after(below, self.min)

    def _persisted_clo(self, i: int) -> int:
        """Commit log offset of persisted entry ``i`` (the last one's is cached)."""
        last = self._last_clo
        if last is not None and last[0] == i and last[1] == self.persisted:
            return last[2]
        c = self.entries(i, i + 1)[0][0]
        if i == self.persisted - 1:
            self._last_clo = (i, self.persisted, c)
        return c

    def entries(self, start: int, end: int) -> list[tuple[int, int]]:
        """``(commit log offset, size)`` of queue offsets ``[start, end)`` within ``[min, max)``.
        Raises OSError."""
        return [(clo, size) for clo, size, _ in self.tagged_entries(start, end)]

    def tagged_entries(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """``(commit log offset, size, tag hash)`` of queue offsets ``[start, end)`` within
        ``[min, max)``. Raises OSError."""
        return list(CQ_ENTRY.iter_unpack(self.packed_entries(start, end)))

    def packed_entries(self, start: int, end: int) -> bytes:
        """The 20-byte entries (``CQ_ENTRY``) of queue offsets ``[start, end)`` within
        ``[min, max)``, back to back, as stored. Raises OSError."""
        start, end = max(start, self.min), min(end, self.max)
        out: list[bytes] = []
        i = start
        while i < min(end, self.persisted):
            f = self._file_for(i)
            k = min(end, self.persisted, f.first + self.per_file) - i
            data = os.pread(f.fd, k * CQ_ENTRY_SIZE, (i - f.first) * CQ_ENTRY_SIZE)
            if len(data) < k * CQ_ENTRY_SIZE:
                raise OSError(f"consume queue file {f.path} is short")
            out.append(data)
            i += k
        a, b = max(i, self.persisted) - self.persisted, end - self.persisted
        if b > a:
            out.append(bytes(self._packed[a * CQ_ENTRY_SIZE : b * CQ_ENTRY_SIZE]))
        return out[0] if len(out) == 1 else b"".join(out)

    def entry(self, i: int) -> int:
        """Commit log offset of queue offset ``i`` (``min <= i < max``). Raises OSError."""
        if i >= self.persisted:
            return self._clo[i - self.persisted]
        return self.entries(i, i + 1)[0][0]

    def first_at_or_after(self, commit_log_offset: int) -> int:
        """The first queue offset whose record is at or after ``commit_log_offset`` (binary search;
        ``max`` if none). Raises OSError."""
        return self._first_at_or_after(commit_log_offset, self.min)

    def _first_at_or_after(self, commit_log_offset: int, lo: int) -> int:
        hi = self.max
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid) < commit_log_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- retention --------------------------------------------------------------------------------
    def clean(self, commit_log_min: int) -> list[int]:
        """Move ``min`` past entries of deleted records and unlink files wholly below it; return
        the fds to close once no checkpoint uses them. Raises OSError."""
        self.min = self._first_at_or_after(commit_log_min, self.min)
        gone = [f for f in self.files if f.first + self.per_file <= self.min]
        for f in gone:
            f.path.unlink()
        self.files = self.files[len(gone):]
        return [f.fd for f in gone]

    def close(self) -> None:
        for f in self.files:
            os.close(f.fd)
        self.files = []
