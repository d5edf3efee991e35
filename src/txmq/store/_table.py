"""State tables: one byte per dense integer key, for state that grows with history but must not
cost memory or restart time (the transaction state table: 1 byte per half offset, RocketMQ 3.x's
``tranStateTable`` in spirit).

Value 0 means "nothing recorded". Writes go to a bounded in-memory window
(``limits.TX_STATE_WINDOW_ENTRIES``) and reach the file when it fills or on :meth:`sync`; reads
look at the window, then ``pread`` one byte. The owner makes the table durable (``sync``) before it
records anything that relies on it (the transaction index snapshot).
"""

from __future__ import annotations

import os
from pathlib import Path

from txmq import limits

__all__ = ["FileStateTable", "StateTable"]


class StateTable:
    """In memory (the :class:`~txmq.store.MemoryStore`'s tables, and the interface)."""

    def __init__(self) -> None:
        self._data = bytearray()

    def get(self, key: int) -> int:
        """The value at ``key`` (0 if none; ``key >= 0``)."""
        return self._data[key] if 0 <= key < len(self._data) else 0

    def set(self, key: int, value: int) -> None:
        """Record ``value`` (0..255) at ``key >= 0``."""
        assert key >= 0 and 0 <= value <= 255
        if key >= len(self._data):
            self._data.extend(bytes(key + 1 - len(self._data)))
        self._data[key] = value

    @property
    def size(self) -> int:
        """One past the highest key ever written."""
        return len(self._data)

    def items(self, start: int = 0) -> list[tuple[int, int]]:
        """``(key, value)`` of every non-zero value from ``start`` (reads the whole table: tools
        and tests only)."""
        return [(k, v) for k, v in enumerate(self._data) if v and k >= start]

    def reset(self) -> None:
        """Forget everything (before a full rebuild)."""
        self._data = bytearray()

    def sync(self) -> None:
        """Make every value recorded so far durable. Raises OSError."""

    def close(self) -> None:
        return None


class FileStateTable(StateTable):
    """A file of one byte per key; see the module docstring. Raises OSError when opened."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._window: dict[int, int] = {}

    def get(self, key: int) -> int:
        v = self._window.get(key)
        if v is not None:
            return v
        if not 0 <= key < self._size:
            return 0
        b = os.pread(self._fd, 1, key)
        return b[0] if b else 0

    def set(self, key: int, value: int) -> None:
        assert key >= 0 and 0 <= value <= 255
        self._window[key] = value
        if len(self._window) >= limits.TX_STATE_WINDOW_ENTRIES:
            self._write_window()

    @property
    def size(self) -> int:
        return max(self._size, max(self._window, default=-1) + 1)

    def _write_window(self) -> None:
        items = sorted(self._window.items())
        i = 0
        while i < len(items):  # one pwrite per run of neighbouring keys
            j = i + 1
            while j < len(items) and items[j][0] == items[j - 1][0] + 1:
                j += 1
            os.pwrite(self._fd, bytes(v for _, v in items[i:j]), items[i][0])
            self._size = max(self._size, items[j - 1][0] + 1)
            i = j
        self._window.clear()

    def items(self, start: int = 0) -> list[tuple[int, int]]:
        self._write_window()
        data = os.pread(self._fd, max(0, self._size - start), start) if self._size > start else b""
        return [(start + k, v) for k, v in enumerate(data) if v]

    def reset(self) -> None:
        self._window.clear()
        os.ftruncate(self._fd, 0)
        self._size = 0

    def sync(self) -> None:
        self._write_window()
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self._write_window()
            finally:
                os.close(self._fd)
                self._fd = -1
