"""The epoch file of controller mode (issue #26): which master epoch wrote which part of the commit
log, as RocketMQ 5's ``EpochFileCache`` keeps it.

Each entry says "epoch ``e`` began writing at commit log offset ``startOffset``"; an entry ends where
the next begins, the last one at :data:`OFFSET_MAX` (RocketMQ ``Long.MAX_VALUE``). A slave joining a
master compares the two files (:meth:`EpochCache.find_consistent_point`) and truncates its log to
the last offset both wrote in the same epoch.

:class:`EpochCache` is the sans-IO part (entries, rules, encoding); :class:`EpochFile` keeps one on
disk. The file is RocketMQ's text format plus a CRC line::

    2\\n            entry count (RocketMQ CheckpointFile)
    1-0\\n          "<epoch>-<startOffset>", oldest first
    3-81920\\n
    crc32:1a2b3c4d\\n  txmq: CRC32 (hex) of every byte above this line

It is written crash-safe (temporary file, fsync, rename, fsync the directory) and then copied the
same way to ``<name>.bak`` (RocketMQ keeps a ``.bak`` too); a read checks the CRC and falls back to
the ``.bak`` copy when the file is missing, torn or corrupt.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from txmq.errors import StoreError

__all__ = ["EPOCH_FILE_NAME", "OFFSET_MAX", "EpochCache", "EpochEntry", "EpochFile",
           "decode_epochs", "encode_epochs", "write_durably"]

EPOCH_FILE_NAME = "epochFileCheckpoint"
"""The epoch file's name in the store directory (RocketMQ ``StorePathConfigHelper
.getEpochFilePath``: ``<storePathRootDir>/epochFileCheckpoint``)."""

OFFSET_MAX = 2**63 - 1
"""End offset of the newest entry (RocketMQ ``EpochEntry`` endOffset ``Long.MAX_VALUE``)."""

EPOCH_ENTRIES_MAX = 1_000_000
"""Most entries a read accepts (txmq: one per election; a file claiming more is corrupt)."""

_CRC_PREFIX = "crc32:"


class EpochEntry(msgspec.Struct, frozen=True):
    """Epoch ``epoch`` wrote commit log offsets ``[start_offset, end_offset)`` (RocketMQ
    ``EpochEntry``)."""

    epoch: int
    start_offset: int
    end_offset: int = OFFSET_MAX


class EpochCache:
    """The entries, oldest first (RocketMQ ``EpochFileCache``, in memory)."""

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._entries: list[EpochEntry] = []
        for epoch, start in entries:
            if not self.append(epoch, start):
                raise StoreError(f"epoch entry {epoch}-{start} does not follow the one before")

    def entries(self) -> list[EpochEntry]:
        """Every entry with its end offset, oldest first."""
        out = []
        for i, e in enumerate(self._entries):
            end = self._entries[i + 1].start_offset if i + 1 < len(self._entries) else OFFSET_MAX
            out.append(EpochEntry(e.epoch, e.start_offset, end))
        return out

    def pairs(self) -> list[tuple[int, int]]:
        """``(epoch, start_offset)`` of every entry, oldest first."""
        return [(e.epoch, e.start_offset) for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def last_epoch(self) -> int:
        """The newest epoch, 0 if none (RocketMQ ``lastEpoch``)."""
        return self._entries[-1].epoch if self._entries else 0

    def last_entry(self) -> EpochEntry | None:
        return self.entries()[-1] if self._entries else None

    def append(self, epoch: int, start_offset: int) -> bool:
        """Add ``epoch`` beginning at ``start_offset``; False (nothing changes) unless both are
        strictly larger than the newest entry's (RocketMQ ``appendEntry``) and not negative."""
        if epoch < 0 or start_offset < 0:
            return False
        if self._entries:
            last = self._entries[-1]
            if last.epoch >= epoch or last.start_offset >= start_offset:
                return False
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def find_by_epoch(self, epoch: int) -> EpochEntry | None:
        return next((e for e in self.entries() if e.epoch == epoch), None)

    def find_by_offset(self, offset: int) -> EpochEntry | None:
        """The entry whose ``[start, end)`` holds ``offset`` (RocketMQ ``findEpochEntryByOffset``)."""
        return next((e for e in self.entries() if e.start_offset <= offset < e.end_offset), None)

    def next_entry(self, epoch: int) -> EpochEntry | None:
        """The entry after ``epoch``'s (RocketMQ ``nextEntry``), None for the newest."""
        return next((e for e in self.entries() if e.epoch > epoch), None)

    def find_consistent_point(self, other: EpochCache, end: int = OFFSET_MAX) -> int:
        """The offset up to which this log and ``other``'s agree: from the newest local entry back,
        the first epoch ``other`` has with the same start offset gives ``min`` of the two end
        offsets (RocketMQ ``findConsistentPoint``); -1 when they share none. ``end`` caps the
        newest local entry (the log's own end, RocketMQ ``setLastEpochEntryEndOffset``)."""
        theirs = {e.epoch: e for e in other.entries()}
        mine = self.entries()
        for i in range(len(mine) - 1, -1, -1):
            local = mine[i]
            peer = theirs.get(local.epoch)
            if peer is not None and peer.start_offset == local.start_offset:
                local_end = min(local.end_offset, end) if i == len(mine) - 1 else local.end_offset
                return min(local_end, peer.end_offset)
        return -1

    def truncate_suffix_by_epoch(self, epoch: int) -> None:
        """Drop every entry of ``epoch`` or later (RocketMQ ``truncateSuffixByEpoch``)."""
        self._entries = [e for e in self._entries if e.epoch < epoch]

    def truncate_suffix_by_offset(self, offset: int) -> None:
        """Drop every entry starting at or after ``offset`` (RocketMQ ``truncateSuffixByOffset``):
        the log was cut there."""
        self._entries = [e for e in self._entries if e.start_offset < offset]

    def truncate_prefix_by_offset(self, offset: int) -> None:
        """Forget what lies before ``offset`` (RocketMQ ``truncatePrefixByOffset``, after old
        segments were deleted): entries ending at or before it go, the first one left starts at
        ``offset`` at the earliest."""
        kept = [e for e in self.entries() if e.end_offset > offset]
        if kept and kept[0].start_offset < offset:
            kept[0] = EpochEntry(kept[0].epoch, offset)
        self._entries = [EpochEntry(e.epoch, e.start_offset) for e in kept]


def encode_epochs(cache: EpochCache) -> bytes:
    """The file's bytes (module docstring)."""
    body = "".join([f"{len(cache)}\n", *(f"{e}-{s}\n" for e, s in cache.pairs())]).encode()
    return body + f"{_CRC_PREFIX}{zlib.crc32(body):08x}\n".encode()


def decode_epochs(data: bytes) -> EpochCache:
    """Parse the file's bytes. Raises StoreError: torn, CRC mismatch, bad count or entry, or
    entries out of order."""
    head, sep, crc_line = data.rstrip(b"\n").rpartition(b"\n")
    body = head + sep
    text = crc_line.decode("ascii", "replace")
    if not sep or not text.startswith(_CRC_PREFIX):
        raise StoreError("epoch file has no CRC line (torn?)")
    try:
        want = int(text[len(_CRC_PREFIX):], 16)
    except ValueError as exc:
        raise StoreError(f"epoch file CRC line {text[:40]!r} is not hex") from exc
    if zlib.crc32(body) != want:
        raise StoreError("epoch file CRC mismatch")
    lines = body.decode("ascii", "replace").splitlines()
    try:
        count = int(lines[0])
        pairs = [tuple(int(x) for x in ln.split("-", 1)) for ln in lines[1:]]
    except (ValueError, IndexError) as exc:
        raise StoreError(f"epoch file entry is not <epoch>-<startOffset>: {exc}") from exc
    if count != len(pairs) or not 0 <= count <= EPOCH_ENTRIES_MAX or any(len(p) != 2 for p in pairs):
        raise StoreError(f"epoch file says {lines[0][:20]!r} entries, holds {len(pairs)}")
    return EpochCache((p[0], p[1]) for p in pairs)


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temporary file, fsync, rename, fsync the directory.
    Raises OSError (the temporary file is removed)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EpochFile:
    """An :class:`EpochCache` kept in ``<directory>/epochFileCheckpoint`` (and ``.bak``).

    Args:
        directory: the store's data directory (created if missing).
        write: how a file is replaced durably (:func:`write_durably`; tests inject failures).

    Raises:
        StoreError: (on open) both the file and its ``.bak`` exist but neither reads back.
    """

    def __init__(self, directory: Path,
                 write: Callable[[Path, bytes], None] = write_durably) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / EPOCH_FILE_NAME
        self.bak = self.path.with_name(EPOCH_FILE_NAME + ".bak")
        self._write = write
        self.cache = self._load()

    def _load(self) -> EpochCache:
        problems = []
        for p in (self.path, self.bak):
            try:
                return decode_epochs(p.read_bytes())
            except FileNotFoundError:
                continue
            except (OSError, StoreError) as exc:
                problems.append(f"{p.name}: {exc}")
        if problems:
            raise StoreError("epoch file unreadable, and no good .bak copy: " + "; ".join(problems))
        return EpochCache()

    def persist(self) -> None:
        """Write the cache to the file, then to ``.bak``. Raises OSError."""
        data = encode_epochs(self.cache)
        self._write(self.path, data)
        self._write(self.bak, data)

    def last_epoch(self) -> int:
        return self.cache.last_epoch()

    def append(self, epoch: int, start_offset: int) -> bool:
        """Append and persist (:meth:`EpochCache.append`); False when refused."""
        if not self.cache.append(epoch, start_offset):
            return False
        self.persist()
        return True

    def truncate_suffix_by_offset(self, offset: int) -> None:
        self.cache.truncate_suffix_by_offset(offset)
        self.persist()

    def truncate_suffix_by_epoch(self, epoch: int) -> None:
        self.cache.truncate_suffix_by_epoch(epoch)
        self.persist()

    def truncate_prefix_by_offset(self, offset: int) -> None:
        self.cache.truncate_prefix_by_offset(offset)
        self.persist()
