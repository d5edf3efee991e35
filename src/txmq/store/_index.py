"""The message index: look records up by key (within a time range) or by message id.

RocketMQ ``IndexFile``: a hash table on disk. Each file is a slot table followed by entries; a slot
holds the number of the newest entry whose key hashes to it, and each entry the number of the
previous one (a chain per slot)::

     +---------------------------------+-------------------------------------------------+
     | slots: slot_count × u32         | entries: up to entries_max × 20 bytes           |
     +---------------------------------+-------------------------------------------------+

     entry:  +----------------+---------------------------+-------------------+----------------+
             | key hash  u32  | commit log offset  u64    | time diff  i32 ms | prev  u32      |
             +----------------+---------------------------+-------------------+----------------+
     entry numbers start at 1 (0 = none); time = file's begin time + diff.

Keys are ``topic \\x01 key`` for each of a message's keys and ``\\x02 UNIQ_KEY`` for its message id;
the hash is CRC32C, so a hit is only a candidate: the store reads the record and compares. Entries
of records not yet flushed stay in memory; a checkpoint writes them, then the slots (only slot values
that point at written entries). File names are the 20-digit commit log offset of the first entry;
which files exist and how many entries each holds is recorded in the store's checkpoint.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from pathlib import Path

import crc32c

from txmq.protocol import PROPERTY_UNIQ_KEY
from txmq.store._base import Record

__all__ = ["Index", "id_key", "key_key"]

log = logging.getLogger("txmq.store")

_ENTRY = struct.Struct(">IQiI")
_ENTRY_SIZE = 20
assert _ENTRY.size == _ENTRY_SIZE
_SLOT_SIZE = 4
_CHUNK_SLOTS = 1024  # slots are written in 4 KiB chunks
_SWAP = sys.byteorder == "little"
_DIFF_MIN, _DIFF_MAX = -(2**31), 2**31 - 1

IndexMeta = tuple[str, int, int, int, int, int, int]
"""``(name, base_ms, min_ms, max_ms, begin_offset, end_offset, entries)`` as kept in the checkpoint;
an entry's time is ``base_ms`` + its diff."""


def key_key(topic: str, key: str) -> str:
    """Index key of one of a message's keys."""
    return f"{topic}\x01{key}"


def id_key(msg_id: str) -> str:
    """Index key of a message id (``UNIQ_KEY``)."""
    return f"\x02{msg_id}"


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _slots_from(data: bytes) -> array[int]:
    a = array("I")
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a


class _File:
    """One index file; ``slots`` is in memory while the file takes entries or has unwritten ones."""

    def __init__(self, path: Path, fd: int, slot_count: int, meta: IndexMeta) -> None:
        self.path, self.fd, self.slot_count = path, fd, slot_count
        _, self.base_ms, self.min_ms, self.max_ms, self.begin_clo, self.end_clo, self.count = meta
        self.slots: array[int] | None = None
        self.buf: list[tuple[int, int, int, int]] = []  # (hash, clo, diff, prev) not yet on disk
        self.dirty: set[int] = set()

    @property
    def entries_start(self) -> int:
        return self.slot_count * _SLOT_SIZE

    @property
    def total(self) -> int:
        return self.count + len(self.buf)

    def meta(self) -> IndexMeta:
        return (self.path.name, self.base_ms, self.min_ms, self.max_ms, self.begin_clo, self.end_clo,
                self.count)

    def entry(self, n: int) -> tuple[int, int, int, int]:
        if n > self.count:
            return self.buf[n - self.count - 1]
        data = os.pread(self.fd, _ENTRY_SIZE, self.entries_start + (n - 1) * _ENTRY_SIZE)
        return _ENTRY.unpack(data) if len(data) == _ENTRY_SIZE else (0, 0, 0, 0)

    def slot(self, s: int) -> int:
        if self.slots is not None:
            return self.slots[s]
        data = os.pread(self.fd, _SLOT_SIZE, s * _SLOT_SIZE)
        return struct.unpack(">I", data)[0] if len(data) == _SLOT_SIZE else 0

    def load_slots(self) -> None:
        """Read the slot table; rebuild it from the entries if it points past ``count`` (a
        checkpoint that wrote slots but died before recording the new count)."""
        self.slots = _slots_from(os.pread(self.fd, self.entries_start, 0).ljust(self.entries_start,
                                                                               b"\0"))
        if self.count and max(self.slots) <= self.count:
            return
        self.slots = array("I", bytes(self.entries_start))
        data = os.pread(self.fd, self.count * _ENTRY_SIZE, self.entries_start)
        for n, (h, _, _, _) in enumerate(_ENTRY.iter_unpack(data), start=1):
            self.slots[h % self.slot_count] = n
        self.dirty = set(range(0, self.slot_count // _CHUNK_SLOTS + 1))


class Index:
    """Index files in ``directory``.

    Args:
        directory: ``<root>/index``.
        slot_count: ``max_hash_slot_num``.
        entries_max: ``max_index_num``.
    """

    def __init__(self, directory: Path, slot_count: int, entries_max: int) -> None:
        self.dir = directory
        self.slot_count = slot_count
        self.entries_max = entries_max
        self.files: list[_File] = []
        self._spare: list[_File] = []  # opened ahead by reserve(), taken by _new_file in order

    # -- opening ----------------------------------------------------------------------------------
    def load(self, metas: list[IndexMeta]) -> bool:
        """Open the files the checkpoint lists and cut them to its entry counts; delete others.
        Returns False (nothing opened) if a listed file is missing or short. Raises OSError."""
        self.dir.mkdir(parents=True, exist_ok=True)
        listed = {m[0] for m in metas}
        for p in self.dir.iterdir():
            if p.name not in listed:
                p.unlink()
        for meta in metas:
            path = self.dir / meta[0]
            if not path.exists():
                self.close()
                return False
            f = _File(path, os.open(path, os.O_RDWR), self.slot_count, meta)
            self.files.append(f)
            expected = f.entries_start + f.count * _ENTRY_SIZE
            size = os.fstat(f.fd).st_size
            if size < expected:
                self.close()
                return False
            if size > expected:
                f.load_slots()
                self._write_slots(f, {})
                os.ftruncate(f.fd, expected)
                f.slots = None
        if self.files:
            self.files[-1].load_slots()
        return True

    def reset(self) -> None:
        """Delete every index file (before a rebuild from the commit log)."""
        self.close()
        if self.dir.exists():
            for p in self.dir.iterdir():
                p.unlink()

    # -- dispatch ---------------------------------------------------------------------------------
    def add(self, rec: Record, clo: int) -> None:
        """Index a record's keys and message id."""
        for key in rec.keys.split():
            self._add(key_key(rec.topic, key), clo, rec.store_timestamp_ms)
        uniq = rec.properties.get(PROPERTY_UNIQ_KEY)
        if uniq:
            self._add(id_key(uniq), clo, rec.store_timestamp_ms)

    def _add(self, key: str, clo: int, ms: int) -> None:
        f = self.files[-1] if self.files else None
        if f is None or f.count + len(f.buf) >= self.entries_max or not (
                _DIFF_MIN <= ms - f.base_ms <= _DIFF_MAX):
            f = self._new_file(clo, ms)
        slots = f.slots
        assert slots is not None
        h = crc32c.crc32c(key.encode())
        s = h % self.slot_count
        f.buf.append((h, clo, ms - f.base_ms, slots[s]))
        slots[s] = f.count + len(f.buf)
        f.dirty.add(s // _CHUNK_SLOTS)
        if ms > f.max_ms:
            f.max_ms = ms
        elif ms < f.min_ms:
            f.min_ms = ms
        f.end_clo = clo

    def may_roll(self, records: list[Record]) -> bool:
        """Cheap test (no allocation per record): could indexing these records start a new file?
        False means :meth:`add` of them opens nothing; True means call :meth:`reserve`."""
        f = self.files[-1] if self.files else None
        if f is None:
            return True
        n = f.count + len(f.buf)
        for rec in records:
            # at most one entry per key (keys are whitespace-separated) plus one for the id
            n += (len(rec.keys) + 1) // 2 + 1
            if n > self.entries_max or not (
                    _DIFF_MIN <= rec.store_timestamp_ms - f.base_ms <= _DIFF_MAX):
                return True
        return False

    def may_roll_one(self, rec: Record) -> bool:
        """:meth:`may_roll` of one record (the common send), without building a list."""
        f = self.files[-1] if self.files else None
        return f is None or f.count + len(f.buf) + (len(rec.keys) + 1) // 2 + 1 > self.entries_max \
            or not _DIFF_MIN <= rec.store_timestamp_ms - f.base_ms <= _DIFF_MAX

    def reserve(self, placed: list[tuple[Record, int]]) -> None:
        """Open now every new file that :meth:`add` of these ``(record, commit log offset)`` pairs
        will roll over to, so that the adds themselves cannot fail: the store calls this before it
        writes the commit log (append stays all-or-nothing at the fd limit or on a full disk).

        Raises:
            OSError: a file cannot be created; nothing is left open or created.
        """
        assert not self._spare
        f = self.files[-1] if self.files else None
        total, base_ms = (f.total, f.base_ms) if f is not None else (self.entries_max, 0)
        try:
            for rec, clo in placed:
                ms = rec.store_timestamp_ms
                n = len(rec.keys.split()) + (1 if rec.properties.get(PROPERTY_UNIQ_KEY) else 0)
                for _ in range(n):
                    if total >= self.entries_max or not _DIFF_MIN <= ms - base_ms <= _DIFF_MAX:
                        self._spare.append(self._open_file(clo, ms))
                        total, base_ms = 0, ms
                    total += 1
        except OSError:
            self.unreserve()
            raise

    def unreserve(self) -> None:
        """Close and delete the files :meth:`reserve` opened and :meth:`add` did not take (the
        commit log write failed after all)."""
        spare, self._spare = self._spare, []
        for f in spare:
            os.close(f.fd)
            f.path.unlink(missing_ok=True)

    def _new_file(self, clo: int, ms: int) -> _File:
        if self._spare:
            f = self._spare.pop(0)
            assert f.begin_clo == clo, (f.path, clo)
        else:  # recovery's dispatch (its OSError is recovery's to handle)
            f = self._open_file(clo, ms)
        self.files.append(f)
        return f

    def _open_file(self, clo: int, ms: int) -> _File:
        """Create the file of a new index file whose first entry is at ``clo``. Raises OSError
        (nothing left open)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{clo:020d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        f = _File(path, fd, self.slot_count, (path.name, ms, ms, ms, clo, clo, 0))
        try:
            os.ftruncate(fd, f.entries_start)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        f.slots = array("I", bytes(self.slot_count * _SLOT_SIZE))
        return f

    # -- lookup -----------------------------------------------------------------------------------
    def lookup(self, key: str, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Commit log offsets of up to ``limit`` candidates for ``key`` stored within
        ``[begin_ms, end_ms]``, newest first (hash matches: the caller checks the record)."""
        h = crc32c.crc32c(key.encode())
        out: list[int] = []
        for f in reversed(self.files):
            if f.max_ms < begin_ms or f.min_ms > end_ms:
                continue
            n = f.slot(h % self.slot_count)
            while n and len(out) < limit:
                eh, clo, diff, prev = f.entry(n)
                if eh == h and begin_ms <= f.base_ms + diff <= end_ms:
                    out.append(clo)
                n = prev if prev < n else 0
            if len(out) >= limit:
                break
        return out

    # -- persistence ------------------------------------------------------------------------------
    def persist(self, below: int) -> set[int]:
        """Write entries of records below commit log offset ``below``, then the slots that point
        only at written entries; return the fds written. Raises OSError."""
        fds: set[int] = set()
        for f in self.files:
            if not f.buf and not f.dirty:
                continue
            n = 0
            while n < len(f.buf) and f.buf[n][1] < below:
                n += 1
            if n:
                data = b"".join(_ENTRY.pack(*e) for e in f.buf[:n])
                _pwrite_all(f.fd, data, f.entries_start + f.count * _ENTRY_SIZE)
                f.count += n
                del f.buf[:n]
            self._write_slots(f, self._unwritten_heads(f))
            fds.add(f.fd)
            if f is not self.files[-1] and not f.buf:
                f.slots = None
        return fds

    @staticmethod
    def _unwritten_heads(f: _File) -> dict[int, int]:
        """Slot → newest *written* entry, for slots whose head is still in memory."""
        assert f.slots is not None
        out: dict[int, int] = {}
        for h, _, _, _ in f.buf:
            s = h % f.slot_count
            if s in out:
                continue
            n = f.slots[s]
            while n > f.count:
                n = f.buf[n - f.count - 1][3]
            out[s] = n
        return out

    def _write_slots(self, f: _File, overrides: dict[int, int]) -> None:
        """Write the dirty slot chunks, with ``overrides`` in place of in-memory values."""
        assert f.slots is not None
        if not f.dirty:
            return
        data = array("I", f.slots)
        for s, n in overrides.items():
            data[s] = n
        if _SWAP:
            data.byteswap()
        raw = memoryview(data).cast("B")
        chunk_bytes = _CHUNK_SLOTS * _SLOT_SIZE
        if len(f.dirty) * 8 > f.slot_count // _CHUNK_SLOTS:
            _pwrite_all(f.fd, raw, 0)
        else:
            for c in sorted(f.dirty):
                _pwrite_all(f.fd, raw[c * chunk_bytes : (c + 1) * chunk_bytes], c * chunk_bytes)
        f.dirty = {s // _CHUNK_SLOTS for s in overrides}

    def metas(self) -> list[IndexMeta]:
        """What the checkpoint records (written entries only)."""
        return [f.meta() for f in self.files if f.count]

    # -- recovery and retention -------------------------------------------------------------------
    def truncate_from(self, clo: int) -> None:
        """Forget entries of records at or after ``clo`` (the commit log was cut there).
        Raises OSError."""
        while self.files and self.files[-1].begin_clo >= clo:
            f = self.files.pop()
            os.close(f.fd)
            f.path.unlink()
        if not self.files:
            return
        f = self.files[-1]
        f.buf = [e for e in f.buf if e[1] < clo]
        lo, hi = 0, f.count
        while lo < hi:
            mid = (lo + hi) // 2
            if f.entry(mid + 1)[1] < clo:
                lo = mid + 1
            else:
                hi = mid
        if lo < f.count:
            f.count = lo
            os.ftruncate(f.fd, f.entries_start + lo * _ENTRY_SIZE)
            f.slots = array("I", [0])  # force the rebuild below
            f.buf = []
            f.load_slots()

    def clean(self, commit_log_min: int) -> list[int]:
        """Unlink files whose entries all point below ``commit_log_min`` (never the last);
        return their fds to close later. Raises OSError."""
        gone = [f for f in self.files[:-1] if f.end_clo < commit_log_min and not f.buf]
        for f in gone:
            f.path.unlink()
        self.files = [f for f in self.files if f not in gone]
        return [f.fd for f in gone]

    def close(self) -> None:
        self.unreserve()
        for f in self.files:
            os.close(f.fd)
        self.files = []
