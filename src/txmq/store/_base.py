"""The store interface shared by :class:`MemoryStore` and :class:`FileStore`.

A store holds the commit log (every message, in append order, addressed by a byte offset), one
consume queue per (topic, queue id) (dense queue offsets pointing into the commit log), an index by
key and by message id, and small named metadata blobs (topic configuration, consumer offsets) that
the broker saves. It assigns queue offsets, reads back by queue offset or commit log offset, deletes
old segments (retention) and refuses writes when the disk is nearly full. It never reads the clock:
store timestamps and ``now_ms`` come in.

Threads: one writer thread calls everything except :meth:`Store.flush` and the function returned by
:meth:`Store.checkpoint`, which may run in one other thread (the broker's group-commit flusher).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Collection, Iterator, Sequence

import msgspec

from txmq.errors import StoreError
from txmq.protocol import MessageExt
from txmq.store._config import StoreConfig
from txmq.store._table import StateTable

__all__ = ["AppendResult", "CleanReport", "DiskStatus", "RawRead", "Record", "RetentionHook", "Store"]

log = logging.getLogger("txmq.store")

RetentionHook = Callable[[], "int | None"]
"""Returns the lowest commit log offset its owner still needs, or None when it needs nothing."""


class Record(msgspec.Struct, array_like=True, kw_only=True):
    """One stored message. ``queue_offset`` and ``commit_log_offset`` are assigned by the store.

    Hosts are ``"ip:port"`` strings (anything else is stored as ``0.0.0.0:0``); ``flag`` is the
    producer's integer flag (RocketMQ ``Message.flag``). ``sys_flag`` holds RocketMQ
    ``MessageSysFlag`` bits (the store sets the transaction type from the properties: see
    :func:`txmq.store._codec.encode_record`); ``prepared_transaction_offset`` is, on a commit
    record, its half's commit log offset (RocketMQ ``preparedTransactionOffset``).
    """

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
    flag: int = 0
    born_host: str = ""
    store_host: str = ""
    sys_flag: int = 0
    prepared_transaction_offset: int = 0

    def to_message_ext(self, commit_log_offset: int) -> MessageExt:
        """The consumer view of this record."""
        return MessageExt(
            topic=self.topic, body=self.body, tags=self.tags, keys=self.keys,
            properties=self.properties, queue_id=self.queue_id, queue_offset=self.queue_offset,
            commit_log_offset=commit_log_offset, born_timestamp_ms=self.born_timestamp_ms,
            store_timestamp_ms=self.store_timestamp_ms, reconsume_times=self.reconsume_times,
            born_host=self.born_host, store_host=self.store_host, sys_flag=self.sys_flag,
            prepared_transaction_offset=self.prepared_transaction_offset,
        )


class AppendResult(msgspec.Struct, frozen=True):
    """Where one record landed: commit log byte offset, queue offset, stored size in bytes."""

    commit_log_offset: int
    queue_offset: int
    size: int


class RawRead(msgspec.Struct, frozen=True):
    """Stored records of one consume queue, as they lie in the commit log (a pull reply's body).

    Attributes:
        body: the records back to back (RocketMQ MessageExt layout, see
            :mod:`txmq.store._codec`), or b"" when none matched.
        count: records in ``body``.
        next_offset: the queue offset after the last entry looked at (matching or not).
    """

    body: bytes
    count: int
    next_offset: int


class DiskStatus(msgspec.Struct, frozen=True):
    """Disk usage as last measured: ``usage_ratio`` in 0..1, and whether appends are accepted."""

    usage_ratio: float
    writable: bool


class CleanReport(msgspec.Struct, kw_only=True):
    """What one retention round did.

    Attributes:
        deleted_segments: base offsets of the commit log segments deleted.
        freed_bytes: their total size.
        min_offset: the commit log's first offset afterwards.
        held: hooks that kept expired segments, name → the offset they need.
        deleted_needed: hooks whose needed records were deleted under disk pressure, name → offset.
        usage_ratio: disk usage measured before the round.
    """

    deleted_segments: list[int] = msgspec.field(default_factory=list)
    freed_bytes: int = 0
    min_offset: int = 0
    held: dict[str, int] = msgspec.field(default_factory=dict)
    deleted_needed: dict[str, int] = msgspec.field(default_factory=dict)
    usage_ratio: float = 0.0


class Store(abc.ABC):
    """Commit log + consume queues + index + metadata. Single writer (see the module docstring)."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config.validate()
        """Layout, retention and disk-space settings."""
        self._hooks: dict[str, RetentionHook] = {}
        self._tables: dict[str, StateTable] = {}
        self._read_limit: int | None = None

    # -- read visibility --------------------------------------------------------------------------
    def set_read_limit(self, offset: int | None) -> None:
        """Cap what readers see (consume queue reads and :meth:`queue_bounds`) at commit log
        ``offset`` besides ``flushed_offset``: controller mode's confirm offset, up to which the
        SyncStateSet holds the log (RocketMQ ``MessageStoreConfig.readUnCommitted`` false,
        ``DefaultMessageStore.getMaxOffsetInQueue(committed)``). The cap only rises, so an offset
        a reader saw never leaves the visible range (only :meth:`truncate_log` lowers it, to the
        cut); ``None`` lifts it (every mode but controller mode)."""
        if offset is None or self._read_limit is None or offset > self._read_limit:
            self._read_limit = offset

    @property
    def read_limit(self) -> int | None:
        """The cap :meth:`set_read_limit` set (None: readers see every durable record)."""
        return self._read_limit

    @property
    def visible_offset(self) -> int:
        """Commit log offset below which readers see records: ``flushed_offset``, capped by
        :meth:`set_read_limit`."""
        f = self.flushed_offset
        lim = self._read_limit
        return f if lim is None or lim >= f else lim

    def queue_durable_max(self, topic: str, queue_id: int) -> int:
        """One past a consume queue's last durable entry, whatever the read limit (a pull's
        offset up to it is only not visible yet; past it, it is out of range)."""
        return self.bounds_below(topic, queue_id, self.flushed_offset)[1]

    # -- writing ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def append(self, records: list[Record]) -> list[AppendResult]:
        """Append records in order, assigning each its queue offset and commit log offset.

        Either every record is appended or none is.

        Raises:
            DiskFull: the disk is above ``disk_space_warning_level_ratio`` or a write ran out of
                space; nothing was appended. Retriable once space returns.
            StoreError: any other write failure (or an earlier failed fsync); nothing was appended.
        """

    @property
    @abc.abstractmethod
    def write_offset(self) -> int:
        """Commit log offset one past the last appended byte."""

    @property
    @abc.abstractmethod
    def flushed_offset(self) -> int:
        """Commit log offset up to which appended records are durable (fsynced)."""

    @property
    @abc.abstractmethod
    def min_offset(self) -> int:
        """First commit log offset still stored (retention moves it up)."""

    @property
    @abc.abstractmethod
    def recovery_offset(self) -> int:
        """Commit log offset from which this store, when opened, re-dispatched records because no
        checkpoint covered them (0 for a store that persists no derived state). Records before
        it were covered by the checkpoint; callers that rebuild their own state from the log
        (the transaction index) only need to re-scan from here."""

    @abc.abstractmethod
    def flush(self) -> int:
        """Make everything appended so far durable; return the new ``flushed_offset``.

        Safe to call from one thread other than the writer's (the group-commit flusher).

        Raises:
            StoreError: fsync failed; the store refuses appends from then on (a failed fsync may
                have dropped written pages, so only a restart's recovery can say what is on disk).
        """

    @abc.abstractmethod
    def checkpoint(self) -> Callable[[], None]:
        """Write consume queue and index entries of flushed records (writer thread) and return the
        step that makes them durable and records how far they go (fsyncs and the checkpoint file).

        The returned function may run in the flusher's thread; call it once. A store that
        persists no derived state returns a function that does nothing. Never raises: a failure is
        logged and only means a longer recovery.
        """

    def set_store_host(self, host: str) -> None:
        """The ``ip:port`` written into records appended from now on as their store host (the
        broker calls it once it knows the port it listens on). Stores that keep no host ignore it."""
        return None

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` raw commit-log bytes from ``offset`` (replication, issue #25).
        Raises StoreError: this store keeps no byte log (only :class:`FileStore` does)."""
        raise StoreError(f"{type(self).__name__} cannot serve replication")

    def append_replica(self, offset: int, data: bytes | bytearray,
                       touched: set[tuple[str, int]] | None = None) -> int:
        """Append a master's commit-log bytes at ``offset`` (replication, issue #25), adding the
        ``(topic, queue id)`` of each record to ``touched``; returns the new end. Raises
        StoreError: this store keeps no byte log (only :class:`FileStore` does)."""
        raise StoreError(f"{type(self).__name__} cannot be a replica")

    @abc.abstractmethod
    def save_meta(self, name: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        """Durably replace a named metadata blob (atomic: old or new, never torn). ``data`` may
        come in parts, written in order without joining them (a large blob saved from a thread
        then never holds the GIL for one big copy). May be called from one thread other than the
        store's owner (the broker's writer thread), for names nothing else writes meanwhile.

        Raises:
            DiskFull: no room. StoreError: another write failure.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Flush, checkpoint and release files."""

    # -- reading ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def read_at(self, commit_log_offset: int) -> MessageExt:
        """The record at a commit log offset (flushed or not).

        Raises:
            CorruptRecord: the record fails its length, offset or CRC32C check, the offset is not
                a record boundary, or it was deleted by retention.
        """

    @abc.abstractmethod
    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]:
        """Up to ``max_count`` durable records from ``offset`` on (at least one if any, whatever
        its size, and never one above ``flushed_offset``: a reader never sees a record that a crash
        could still take back, so an offset always names the same message). ``max_bytes`` bounds
        the body bytes. An offset below the queue's minimum returns nothing.

        Raises:
            CorruptRecord: a record in range fails its check.
        """

    @abc.abstractmethod
    def read_queue_raw(self, topic: str, queue_id: int, offset: int, max_count: int,
                       max_bytes: int, tag_hashes: Collection[int] | None = None) -> RawRead:
        """Up to ``max_count`` durable entries of a consume queue from ``offset`` (visibility as
        :meth:`read_queue`), the records whose consume queue tag hash is in ``tag_hashes`` (all
        with None) copied out of the commit log as stored, with no decoding: RocketMQ
        ``DefaultMessageStore.getMessage`` filtering by tags code. ``max_bytes`` bounds the
        record bytes (at least one record is returned if any matches). An offset below the
        queue's minimum returns nothing with ``next_offset`` = ``offset``.

        Raises:
            CorruptRecord: the consume queue or the commit log range cannot be read.
        """

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """``(min_offset, max_offset)`` of a consume queue's visible records (durable, and below
        the read limit); max is exclusive."""
        return self.bounds_below(topic, queue_id, self.visible_offset)

    @abc.abstractmethod
    def bounds_below(self, topic: str, queue_id: int, commit_log_offset: int) -> tuple[int, int]:
        """``(min_offset, max_offset)`` of a consume queue counting the entries whose records
        start below ``commit_log_offset`` (at most ``flushed_offset``); max is exclusive."""

    @abc.abstractmethod
    def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of ``topic`` that hold at least one record (now or before retention)."""

    @abc.abstractmethod
    def commit_log_offset_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """Commit log offset of the entry at ``queue_offset``, or None if there is none (yet)."""

    @abc.abstractmethod
    def iter_records(self, start_offset: int = 0,
                     topics: Collection[str] | None = None) -> Iterator[tuple[int, Record]]:
        """Stored records as ``(commit_log_offset, record)`` in commit log order, from
        ``start_offset`` (at least ``min_offset``) to ``write_offset``; with ``topics``, only those
        topics' records, found through their consume queues instead of a scan of the log.

        Raises:
            CorruptRecord: a record in range fails its check (only when ``topics`` is given: a
                scan stops at the first bad record, like recovery).
        """

    @abc.abstractmethod
    def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                     max_count: int) -> list[MessageExt]:
        """Durable messages of ``topic`` whose keys include ``key`` and whose store timestamp lies in
        ``[begin_ms, end_ms]``, newest first, at most ``max_count`` (RocketMQ ``queryMessage``).
        Empty if the index is disabled."""

    @abc.abstractmethod
    def query_by_msg_id(self, msg_id: str, max_count: int) -> list[MessageExt]:
        """Durable messages whose ``UNIQ_KEY`` is ``msg_id`` (the message and its half, retry or
        DLQ copies), newest first (RocketMQ ``viewMessage`` by unique key)."""

    @abc.abstractmethod
    def load_meta(self, name: str) -> bytes | None:
        """A metadata blob saved with :meth:`save_meta`, or None."""

    def topic_queues(self) -> dict[str, int]:
        """Topics that have a consume queue, with one more than their highest queue id (how the
        broker re-derives its topic table when ``topics.json`` is lost)."""
        return {}

    def quarantine_meta(self, name: str, reason: str) -> str:
        """Move a metadata blob that does not parse out of the way (a file store keeps it under
        ``quarantine/``), log it with ``reason``, and return where it went ("" if it was not there).
        Never raises: a failure is logged and the blob is left in place."""
        log.warning("metadata %s dropped: %s", name, reason)
        self._forget_meta(name)
        return ""

    def _forget_meta(self, name: str) -> None:
        return None

    def state_table(self, name: str) -> StateTable:
        """The named :class:`~txmq.store._table.StateTable` (1 byte per dense key), opened once and
        kept until :meth:`close`. Raises StoreError if it cannot be opened."""
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = self._open_table(name)
        return table

    def _open_table(self, name: str) -> StateTable:
        return StateTable()

    # -- retention and disk space -----------------------------------------------------------------
    def set_retention_hook(self, name: str, hook: RetentionHook | None) -> None:
        """Register (or with None remove) what ``name`` still needs: retention never deletes a
        segment at or above the offset a hook returns, except under disk pressure when
        ``clean_needed_under_pressure`` allows it, and then it logs an error naming the hook."""
        if hook is None:
            self._hooks.pop(name, None)
        else:
            self._hooks[name] = hook

    def retention_needs(self) -> dict[str, int]:
        """What each hook needs now: name → lowest needed commit log offset (hooks that need
        nothing, or fail, are left out; a failing hook is logged and holds everything)."""
        out: dict[str, int] = {}
        for name, hook in self._hooks.items():
            try:
                off = hook()
            except Exception:  # a hook bug must not delete data: hold everything
                log.exception("retention hook %r failed; holding all segments", name)
                off = 0
            if off is not None:
                out[name] = off
        return out

    @abc.abstractmethod
    def clean(self, now_ms: int, *, delete_hour: bool) -> CleanReport:
        """One retention round (RocketMQ ``CleanCommitLogService``): delete whole segments older
        than ``file_reserved_time_ms`` when ``delete_hour`` is true or the disk is above
        ``disk_max_used_space_ratio``; above ``disk_space_clean_forcibly_ratio`` delete the oldest
        even if younger. The active segment is never deleted; retention hooks are honoured as
        described in :meth:`set_retention_hook`. Derived files (consume queues, index) follow."""

    @abc.abstractmethod
    def check_disk(self) -> DiskStatus:
        """Measure disk usage now and update whether appends are accepted: refused above
        ``disk_space_warning_level_ratio``, accepted again at or below
        ``disk_space_clean_forcibly_ratio`` (RocketMQ's hysteresis)."""
