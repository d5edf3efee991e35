"""Crash-safe truncation of the commit log (issue #26; RocketMQ #10666 is the crash it avoids).

A replica whose log diverged from its new master's cuts it at the consistent point (the epoch
file's :meth:`~txmq.store.EpochCache.find_consistent_point`). RocketMQ's ``truncateFiles`` cuts the
commit log, the consume queues and the epoch file one after the other: a crash in between leaves
them disagreeing. txmq first writes an intent marker, durably; then cuts the commit log, the
consume queues, the index and the epoch file, and writes a checkpoint; then removes the marker. A
store opened with a marker present redoes the cut before its recovery, which then rebuilds the
queues and index from the commit log (the checkpoint, possibly older than the cut, is not used).

The marker, ``<store>/truncating`` (big-endian)::

    0        4                12       16
    +--------+----------------+--------+
    | magic  | offset         | crc32  |   magic "TXTR"; offset: cut at and after it;
    | u32    | i64            | u32    |   crc32 of the first 12 bytes
    +--------+----------------+--------+
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

from txmq.errors import StoreError
from txmq.store._commitlog import CommitLog, fsync_dir
from txmq.store._consumequeue import ConsumeQueue
from txmq.store._epoch import EpochFile, write_durably
from txmq.store._index import Index
from txmq.store._quarantine import Quarantine
from txmq.store._recovery import keep_tail

__all__ = ["CUT_REASON", "TRUNCATE_MARKER", "cut_files", "decode_marker", "encode_marker",
           "finish_cut", "read_marker", "redo_cut"]

log = logging.getLogger("txmq.store")

CUT_REASON = "truncated to the consistent point"
"""Why the quarantine holds a cut tail."""

TRUNCATE_MARKER = "truncating"
"""The intent marker's file name in the store directory."""

_MAGIC = 0x54585452  # "TXTR"
_MARKER = struct.Struct(">Iq")
_CRC = struct.Struct(">I")


def encode_marker(offset: int) -> bytes:
    """The marker's 16 bytes for a cut at ``offset``."""
    head = _MARKER.pack(_MAGIC, offset)
    return head + _CRC.pack(zlib.crc32(head))


def decode_marker(data: bytes) -> int:
    """The offset a marker names. Raises StoreError: wrong size, magic or CRC."""
    if len(data) != _MARKER.size + _CRC.size:
        raise StoreError(f"truncation marker is {len(data)} bytes, not 16")
    magic, offset = _MARKER.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, _MARKER.size)
    if magic != _MAGIC or crc != zlib.crc32(data[: _MARKER.size]) or offset < 0:
        raise StoreError("truncation marker damaged (magic, CRC or offset)")
    return int(offset)


def read_marker(root: Path) -> int | None:
    """The offset of an unfinished truncation in store ``root``, None when there is none.

    A marker that fails its check was torn while being written (it is written to a temporary file
    and renamed, so only a damaged disk does that): the cut it named never began, so it is ignored
    (and removed by the caller).
    """
    try:
        return decode_marker((root / TRUNCATE_MARKER).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, StoreError):
        return -1


def cut_files(root: Path, offset: int, clog: CommitLog, queues: list[ConsumeQueue],
              index: Index | None, epochs: EpochFile, quarantine: Quarantine,
              step: Callable[[str], None]) -> int:
    """The stages of a truncation at ``offset`` after the marker: marker, commit log (its tail
    copied to the quarantine first), consume queues and index, epoch file; ``step(stage)`` after
    each. Returns the bytes cut from the commit log. Raises OSError (the marker stays)."""
    write_durably(root / TRUNCATE_MARKER, encode_marker(offset))
    step("marker")
    keep_tail(clog, offset, CUT_REASON, quarantine)
    removed = clog.truncate(offset)
    step("commitlog")
    for cq in queues:
        cq.truncate_from(offset)
    if index is not None:
        index.truncate_from(offset)
    step("queues")
    epochs.truncate_suffix_by_offset(offset)
    step("epochs")
    return removed


def redo_cut(clog: CommitLog, cut: int, quarantine: Quarantine) -> None:
    """Opening found a marker: cut the commit log there again (``cut`` -1, a damaged marker,
    names nothing to cut). The checkpoint may be past the cut: the caller recovers without it."""
    log.warning("commit log %s: a truncation at offset %d did not finish; redoing it", clog.dir,
                cut)
    if 0 <= cut < clog.end:
        keep_tail(clog, cut, CUT_REASON, quarantine)
        clog.truncate(cut)


def finish_cut(root: Path, cut: int, epochs: EpochFile) -> None:
    """After a redone cut and a fresh checkpoint: the epoch file, then the marker goes.
    Raises OSError."""
    if cut >= 0:
        epochs.truncate_suffix_by_offset(cut)
    (root / TRUNCATE_MARKER).unlink(missing_ok=True)
    fsync_dir(root)
