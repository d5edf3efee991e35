"""The store interface shared by :class:`MemoryStore` and :class:`FileStore`.

A store holds the commit log (every message, in append order, addressed by a byte offset) and one
consume queue per (topic, queue id) (dense queue offsets pointing into the commit log). It assigns
queue offsets, reads back by queue offset or commit log offset, and keeps small named metadata blobs
(topic configuration, consumer offsets) that the broker saves. It never reads the clock: store
timestamps come in with the record.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import msgspec

from txmq.protocol import MessageExt

__all__ = ["AppendResult", "Record", "Store"]


class Record(msgspec.Struct, array_like=True, kw_only=True):
    """One stored message. ``queue_offset`` and ``commit_log_offset`` are assigned by the store."""

    topic: str
    queue_id: int
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    reconsume_times: int = 0
    queue_offset: int = -1

    def to_message_ext(self, commit_log_offset: int) -> MessageExt:
        """The consumer view of this record."""
        return MessageExt(
            topic=self.topic, body=self.body, tags=self.tags, keys=self.keys,
            properties=self.properties, queue_id=self.queue_id, queue_offset=self.queue_offset,
            commit_log_offset=commit_log_offset, born_timestamp_ms=self.born_timestamp_ms,
            store_timestamp_ms=self.store_timestamp_ms, reconsume_times=self.reconsume_times,
        )


class AppendResult(msgspec.Struct, frozen=True):
    """Where one record landed: commit log byte offset, queue offset, stored size in bytes."""

    commit_log_offset: int
    queue_offset: int
    size: int


class Store(abc.ABC):
    """Commit log + consume queues + metadata. Single writer; not thread-safe except ``flush``."""

    @abc.abstractmethod
    def append(self, records: list[Record]) -> list[AppendResult]:
        """Append records in order, assigning each its queue offset.

        Either every record is appended or none is.

        Raises:
            DiskFull: no room; nothing was appended.
            StoreError: any other write failure; nothing was appended.
        """

    @property
    @abc.abstractmethod
    def write_offset(self) -> int:
        """Commit log offset one past the last appended byte."""

    @property
    @abc.abstractmethod
    def flushed_offset(self) -> int:
        """Commit log offset up to which appended records are durable (fsynced)."""

    @abc.abstractmethod
    def flush(self) -> int:
        """Make everything appended so far durable; return the new ``flushed_offset``.

        Safe to call from a thread other than the writer's (the group-commit flusher does).
        """

    @abc.abstractmethod
    def read_at(self, commit_log_offset: int) -> MessageExt:
        """The record at a commit log offset.

        Raises:
            CorruptRecord: the record fails its length or CRC32C check, or the offset is not a
                record boundary.
        """

    @abc.abstractmethod
    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]:
        """Up to ``max_count`` durable records from ``offset`` on (at least one if any, whatever
        its size, and never one above ``flushed_offset``: a reader never sees a record that a crash
        could still take back, so an offset always names the same message).

        Raises:
            CorruptRecord: a record in range fails its check.
        """

    @abc.abstractmethod
    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """``(min_offset, max_offset)`` of a consume queue's durable records; max is exclusive."""

    @abc.abstractmethod
    def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of ``topic`` that hold at least one record."""

    @abc.abstractmethod
    def iter_records(self) -> Iterator[tuple[int, Record]]:
        """Every record in commit log order as ``(commit_log_offset, record)`` (recovery scans)."""

    @abc.abstractmethod
    def load_meta(self, name: str) -> bytes | None:
        """A metadata blob saved with :meth:`save_meta`, or None."""

    @abc.abstractmethod
    def save_meta(self, name: str, data: bytes) -> None:
        """Durably replace a named metadata blob (atomic: old or new, never torn)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release files."""
