"""Consumer offsets of every group, persisted as RocketMQ's ``consumerOffset.json``.

The only place that builds or parses the ``"<group>@<topic>@<queue id>"`` keys of that file
(RocketMQ ``ConsumerOffsetManager.offsetTable`` is keyed ``topic@group`` of queue maps; txmq's file
keeps its own flat format, unchanged since the first release). Topic names hold no ``@``
(:func:`~txmq.protocol.check_send_topic`), so the key splits from the right and a group name loaded
from an older file may hold one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import msgspec

from txmq.broker._meta import load_json_meta
from txmq.store import Store

__all__ = ["OFFSETS_META", "OffsetTable"]

log = logging.getLogger("txmq.broker")

OFFSETS_META = "consumerOffset.json"
"""Name of the metadata blob (``meta/consumerOffset.json`` in a ``FileStore``)."""


def _key(group: str, topic: str, queue_id: int) -> str:
    return f"{group}@{topic}@{queue_id}"


def _split(key: str) -> tuple[str, str, int] | None:
    """``"<group>@<topic>@<queue id>"`` → ``(group, topic, queue id)``; None if not of that form."""
    parts = key.rsplit("@", 2)
    if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


class OffsetTable:
    """Committed queue offsets per ``(group, topic, queue id)``; offsets are queue offsets.

    Args:
        store: where ``consumerOffset.json`` is loaded from at construction and saved to by
            :meth:`persist`. A file that does not decode is quarantined (logged) and the table
            starts empty: groups restart from their configured position.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._table: dict[str, int] = load_json_meta(
            store, OFFSETS_META, dict[str, int],
            "consumer offsets start EMPTY: consumer groups restart from their configured "
            "position (CONSUME_FROM_*), and may receive messages again") or {}
        bad = [k for k in self._table if _split(k) is None]
        if bad:  # kept (and saved back) as they were, but never read
            log.error("%s: %d keys are not <group>@<topic>@<queue id> and are ignored: %s",
                      OFFSETS_META, len(bad), bad[:5])
        self._dirty = False
        self.on_change: Callable[[str, str, int, int], None] | None = None
        """Called with ``(group, topic, queue id, offset)`` after :meth:`set` changed an offset or
        :meth:`reset` dropped one (offset -1): a master's system records (``MetaLog``)."""

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's committed offset of the queue, or None if it never committed one."""
        return self._table.get(_key(group, topic, queue_id))

    def set(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Store the group's offset of one queue (in memory; :meth:`persist` saves it)."""
        key = _key(group, topic, queue_id)
        if self._table.get(key) != offset:
            self._table[key] = offset
            self._dirty = True
            if self.on_change is not None:
                self.on_change(group, topic, queue_id, offset)

    def follow(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Apply a system record's offset (-1: forget the key) without calling
        :attr:`on_change`."""
        key = _key(group, topic, queue_id)
        if offset < 0:
            self._dirty = self._table.pop(key, None) is not None or self._dirty
        elif self._table.get(key) != offset:
            self._table[key] = offset
            self._dirty = True

    def items(self) -> Iterator[tuple[str, str, int, int]]:
        """Every stored offset as ``(group, topic, queue id, offset)``, in insertion order."""
        for key, off in list(self._table.items()):
            parts = _split(key)
            if parts is not None:
                yield (*parts, off)

    def group_topics(self) -> dict[str, list[str]]:
        """Group → the topics it has offsets of (sorted), in first-stored order of the groups."""
        out: dict[str, dict[str, None]] = {}
        for group, topic, _, _ in self.items():
            out.setdefault(group, {})[topic] = None
        return {g: sorted(ts) for g, ts in out.items()}

    def reset(self, group: str, topic: str) -> int:
        """Forget every offset of ``group`` on ``topic``; return how many were dropped."""
        drop = [k for k in self._table if (p := _split(k)) is not None and p[:2] == (group, topic)]
        for k in drop:
            del self._table[k]
            if self.on_change is not None and (p := _split(k)) is not None:
                self.on_change(*p, -1)
        self._dirty = self._dirty or bool(drop)
        return len(drop)

    def __len__(self) -> int:
        return len(self._table)

    @property
    def dirty(self) -> bool:
        """Whether something changed since the last :meth:`persist`."""
        return self._dirty

    def snapshot(self) -> dict[str, int]:
        """A copy of the table as ``consumerOffset.json`` holds it (key → offset)."""
        return dict(self._table)

    def persist(self) -> bool:
        """Save the table now if it changed, on this thread; return whether it wrote. Raises
        StoreError (it stays dirty: the next call tries again)."""
        step = self.prepare_persist()
        if step is None:
            return False
        step()
        return True

    def prepare_persist(self) -> Callable[[], None] | None:
        """Copy the table if it changed (on the event loop: one dict copy) and return the step
        that encodes and saves the copy (for a writer thread; temp file, fsync, rename), or None
        when nothing changed. The step raises StoreError, and the table is dirty again then."""
        if not self._dirty:
            return None
        table = dict(self._table)
        self._dirty = False

        def step() -> None:
            try:
                self._store.save_meta(OFFSETS_META, msgspec.json.encode(table))
            except BaseException:
                self._dirty = True  # (one assignment: safe from the writer thread)
                raise

        return step
