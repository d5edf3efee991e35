"""State tables: one byte per dense integer key, for state that grows with history but must not
cost memory or restart time (the transaction state table: 1 byte per half offset, RocketMQ 3.x's
``tranStateTable`` in spirit).

Value 0 means "nothing recorded". Writes go to a bounded in-memory window
(``limits.TX_STATE_WINDOW_ENTRIES``); a full window is handed over to be written (no disk work in
:meth:`~StateTable.set`, which the broker's event loop calls). :meth:`~StateTable.prepare_sync`
hands the window over on the caller's thread and returns the step that writes every handed-over
window and fsyncs, for another thread; reads look at the window, then at the handed-over windows,
then ``pread`` one byte. The owner makes the table durable before it records anything that relies
on it (the transaction index snapshot).

:meth:`~StateTable.trim` forgets every key below a bound (retention: the records those keys
describe are gone): they read 0 at once, and a file table frees their disk blocks (Linux
``fallocate(PUNCH_HOLE)``; a hole reads as zeros, so the file's format is unchanged) in its next
sync step.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from txmq import limits

__all__ = ["FileStateTable", "StateTable"]

log = logging.getLogger("txmq.store")

_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)
_PUNCH_ALIGN = 4096
"""Holes are punched in whole 4 KiB blocks (smaller holes free nothing)."""
_PENDING_WINDOWS_MAX = 16
"""Handed-over windows kept before :meth:`StateTable.set` writes them itself (nobody syncs)."""
_DENSE_WINDOW_SPAN = 4
"""A window whose keys span less than this many times its size is written with one pwrite of
the whole span (gaps read first: at most 3 bytes read per byte written); a sparser one, one
pwrite per run of neighbouring keys (txmq)."""


def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate(fd, mode, offset, len)``, or None where there is none (not Linux)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name, use_errno=True).fallocate
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
    fn.restype = ctypes.c_int
    return fn


class StateTable:
    """In memory (the :class:`~txmq.store.MemoryStore`'s tables, and the interface)."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._base = 0  # keys below it were trimmed; _data[0] is key _base

    def get(self, key: int) -> int:
        """The value at ``key`` (0 if none; ``key >= 0``)."""
        i = key - self._base
        return self._data[i] if 0 <= i < len(self._data) else 0

    def set(self, key: int, value: int) -> None:
        """Record ``value`` (0..255) at ``key >= 0`` (a key below the trim bound is ignored)."""
        assert key >= 0 and 0 <= value <= 255
        i = key - self._base
        if i < 0:
            return
        if i >= len(self._data):
            self._data.extend(bytes(i + 1 - len(self._data)))
        self._data[i] = value

    @property
    def size(self) -> int:
        """One past the highest key ever written."""
        return self._base + len(self._data)

    @property
    def low(self) -> int:
        """The trim bound: every key below it reads 0 (:meth:`trim`)."""
        return self._base

    def items(self, start: int = 0) -> list[tuple[int, int]]:
        """``(key, value)`` of every non-zero value from ``start`` (reads the whole table: tools
        and tests only)."""
        b = self._base
        return [(b + i, v) for i, v in enumerate(self._data) if v and b + i >= start]

    def trim(self, below: int) -> int:
        """Forget every key below ``below`` (they read 0 from now on); return how many keys the
        bound moved over (0 when it does not move)."""
        moved = below - self._base
        if moved <= 0:
            return 0
        del self._data[:moved]
        self._base = below
        return moved

    def reset(self) -> None:
        """Forget everything (before a full rebuild)."""
        self._data = bytearray()
        self._base = 0

    def sync(self) -> None:
        """Make every value recorded so far durable. Raises OSError."""
        self.prepare_sync()()

    def prepare_sync(self) -> Callable[[], None]:
        """Hand over what is recorded so far (cheap; on the thread that calls :meth:`set`) and
        return the step that writes it and fsyncs (on any one thread; raises OSError)."""
        return _nothing

    def close(self) -> None:
        return None


def _nothing() -> None:
    return None


class FileStateTable(StateTable):
    """A file of one byte per key; see the module docstring. Raises OSError when opened.

    One thread calls :meth:`get`, :meth:`set`, :meth:`trim` and :meth:`prepare_sync`; the step
    :meth:`prepare_sync` returns may run on another (one step at a time).
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._window: dict[int, int] = {}
        self._pending: tuple[dict[int, int], ...] = ()
        """Windows handed over, oldest first, until written (then the file has them)."""
        self._lock = threading.Lock()  # replacing _pending
        self._write_lock = threading.Lock()  # one writer of the file at a time
        self._low = 0
        self._punched = 0  # keys below it are holes in the file
        self._fallocate = _fallocate()

    def get(self, key: int) -> int:
        v = self._window.get(key)
        if v is not None:
            return v
        if key < self._low:
            return 0
        for w in reversed(self._pending):  # (a tuple: replaced, never changed, by the writer)
            v = w.get(key)
            if v is not None:
                return v
        if not 0 <= key < self._size:
            return 0
        b = os.pread(self._fd, 1, key)
        return b[0] if b else 0

    def set(self, key: int, value: int) -> None:
        assert key >= 0 and 0 <= value <= 255
        if key < self._low:
            return
        self._window[key] = value
        if len(self._window) >= limits.TX_STATE_WINDOW_ENTRIES:
            self._hand_over()
            if len(self._pending) > _PENDING_WINDOWS_MAX:  # nobody syncs: write them now
                self._write_pending()

    @property
    def size(self) -> int:
        top = max((max(w, default=-1) for w in (self._window, *self._pending)), default=-1)
        return max(self._size, top + 1)

    @property
    def low(self) -> int:
        return self._low

    def _hand_over(self) -> None:
        if self._window:
            with self._lock:
                self._pending = (*self._pending, self._window)
            self._window = {}

    def _write_pending(self) -> None:
        """Write every handed-over window (oldest first, so a newer value wins) and drop them.
        One writer at a time; hand-overs go on meanwhile."""
        with self._write_lock:
            windows = self._pending
            for w in windows:
                self._write(w)
            with self._lock:
                self._pending = self._pending[len(windows):]

    def _write(self, window: dict[int, int]) -> None:
        if not window:
            return
        lo, hi = min(window), max(window)
        if hi - lo < _DENSE_WINDOW_SPAN * len(window):
            self._write_span(window, lo, hi)
            return
        items = sorted(window.items())
        i = 0
        while i < len(items):  # one pwrite per run of neighbouring keys
            j = i + 1
            while j < len(items) and items[j][0] == items[j - 1][0] + 1:
                j += 1
            os.pwrite(self._fd, bytes(v for _, v in items[i:j]), items[i][0])
            self._size = max(self._size, items[j - 1][0] + 1)
            i = j

    def _write_span(self, window: dict[int, int], lo: int, hi: int) -> None:
        """Write a dense window (the usual one: settlements of neighbouring half offsets) with
        one pwrite of keys ``lo..hi``: the keys it holds take its values, the ones between keep
        what the file holds (read first). A loop over the window, none over runs of keys."""
        buf = bytearray(os.pread(self._fd, hi + 1 - lo, lo))
        if len(buf) < hi + 1 - lo:  # (past the file's end: zeros, as a write past it leaves)
            buf.extend(bytes(hi + 1 - lo - len(buf)))
        for k, v in window.items():
            buf[k - lo] = v
        os.pwrite(self._fd, buf, lo)
        self._size = max(self._size, hi + 1)

    def items(self, start: int = 0) -> list[tuple[int, int]]:
        self._hand_over()
        self._write_pending()
        start = max(start, self._low)
        data = os.pread(self._fd, max(0, self._size - start), start) if self._size > start else b""
        return [(start + k, v) for k, v in enumerate(data) if v]

    def trim(self, below: int) -> int:
        moved = below - self._low
        if moved <= 0:
            return 0
        self._low = below
        self._window = {k: v for k, v in self._window.items() if k >= below}
        return moved

    def reset(self) -> None:
        with self._write_lock, self._lock:
            self._window.clear()
            self._pending = ()
            os.ftruncate(self._fd, 0)
            self._size = self._low = self._punched = 0

    def prepare_sync(self) -> Callable[[], None]:
        self._hand_over()
        low = self._low
        return lambda: self._sync_step(low)

    def _sync_step(self, low: int) -> None:
        self._write_pending()
        os.fdatasync(self._fd)
        self._punch(low)

    def _punch(self, low: int) -> None:
        """Free the disk blocks of keys below ``low`` (whole 4 KiB blocks; where the system has
        no hole punching, the bytes stay and only read 0 through :meth:`get`)."""
        end = min(low, self._size) // _PUNCH_ALIGN * _PUNCH_ALIGN
        if end <= self._punched or self._fallocate is None:
            return
        if self._fallocate(self._fd, _PUNCH_HOLE, self._punched, end - self._punched) != 0:
            err = ctypes.get_errno()
            log.warning("state table %s: cannot free trimmed bytes (%s); they stay on disk",
                        self.path, os.strerror(err))
            self._fallocate = None
            return
        self._punched = end

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self._hand_over()
                self._write_pending()
            finally:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = -1
