"""The file store: segmented commit log, persisted consume queues, index, checkpoint, retention.

Layout under ``root`` (RocketMQ's store layout)::

    commitlog/<20-digit base offset>                 segment files (txmq.store._commitlog)
    consumequeue/<topic>/<queue id>/<20-digit>       20-byte entries (txmq.store._consumequeue)
    index/<20-digit first offset>                    key / message id hash index (txmq.store._index)
    checkpoint                                       what derived state is on disk (txmq.store._codec)
    meta/<name>                                      the broker's metadata blobs

Appends write the commit log (one ``pwrite`` per batch) and dispatch each record to its consume
queue and the index in memory. :meth:`FileStore.flush` fsyncs the commit log (group commit: the
broker calls it from one thread while appends go on). :meth:`FileStore.checkpoint` writes the
entries of flushed records to their files and returns the step that fsyncs them and replaces the
checkpoint file. Opening runs :func:`txmq.store._recovery.recover`.

File descriptors of deleted files are closed only by a later checkpoint step (or :meth:`close`),
so the flusher thread never syncs a descriptor that was closed and reused.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path

from txmq import limits
from txmq.errors import CorruptRecord, DiskFull, StoreError, StoreFormatOld
from txmq.protocol import PROPERTY_UNIQ_KEY, MessageExt
from txmq.store._base import AppendResult, CleanReport, DiskStatus, RawRead, Record, Store
from txmq.store._codec import (
    Checkpoint,
    decode_checkpoint,
    decode_message,
    decode_record,
    encode_checkpoint,
    encode_record,
    place_record,
    tag_hash,
    wire_host,
)
from txmq.store._commitlog import CommitLog, fsync_dir
from txmq.store._config import StoreConfig
from txmq.store._consumequeue import ConsumeQueue, topic_dir_problem
from txmq.store._epoch import EpochFile
from txmq.store._index import Index, id_key, key_key
from txmq.store._quarantine import Quarantine
from txmq.store._raw_read import read_raw
from txmq.store._recovery import dispatch_record, recover, sweep_commit_log_dir
from txmq.store._retention import SegmentInfo, log_report, plan_clean
from txmq.store._table import FileStateTable, StateTable
from txmq.store._truncate import TRUNCATE_MARKER, cut_files, finish_cut, read_marker, redo_cut

__all__ = ["MIGRATING_MARKER", "FileStore"]

MIGRATING_MARKER = "MIGRATING"
"""A file ``txmq store migrate`` keeps in the data directory while it swaps the directories in."""

log = logging.getLogger("txmq.store")

_CHECKPOINT = "checkpoint"
_NOOP: Callable[[], None] = lambda: None  # noqa: E731


def _disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _write_atomic(path: Path, data: bytes | Sequence[bytes | memoryview]) -> None:
    """Replace ``path`` with ``data`` (or its parts, in order): temp file, fsync, rename, fsync the
    directory. Raises OSError (the temp file is removed)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb", buffering=0) as f:  # unbuffered: each part is one write (no GIL)
            for part in (data,) if isinstance(data, bytes) else data:
                view = memoryview(part)
                while view:
                    view = view[f.write(view):]
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


class FileStore(Store):
    """The durable store (see the module docstring).

    Args:
        root: data directory (created if missing).
        config: layout, retention and disk-space settings; :class:`StoreConfig` defaults if None.
        disk_usage: returns the used fraction of the disk (tests); ``statvfs(root)`` if None.

    Attributes:
        recovery: what opening did (:class:`~txmq.store._recovery.RecoveryReport`).

    Raises:
        CommitLogDamaged: the commit log is damaged below its last checkpoint (not a torn tail).
        StoreError: the directory cannot be created or a file cannot be opened or repaired.
    """

    def __init__(self, root: Path | str, config: StoreConfig | None = None, *,
                 disk_usage: Callable[[], float] | None = None) -> None:
        super().__init__(config or StoreConfig())
        self.root = Path(root)
        self._disk_usage = disk_usage
        self._lock = threading.Lock()  # the segment list (shared with the flusher), retired fds
        self._sync_lock = threading.Lock()  # one fsync step at a time
        self._retired: list[tuple[int, int]] = []  # (checkpoint generation, fd)
        self._unsynced: set[int] = set()
        """Consume queue and index descriptors written by a checkpoint whose fsync did not happen
        (a later file failed, or the sync failed): the next checkpoint fsyncs them first."""
        self._gen = 0
        self._failed = ""
        self._closed = False
        self._writable, self._usage, self._since_check = True, 0.0, 0
        self.quarantine = Quarantine(self.root)
        """Where opening moved what it could not use (:mod:`txmq.store._quarantine`)."""
        log_: CommitLog | None = None
        if (self.root / MIGRATING_MARKER).exists():
            raise StoreFormatOld(f"{self.root}: `txmq store migrate` was interrupted; run "
                                 f"`txmq store migrate {self.root}` again to finish it")
        try:
            (self.root / "meta").mkdir(parents=True, exist_ok=True)
            sweep_commit_log_dir(self.root / "commitlog", self.quarantine)
            self._log = log_ = CommitLog(self.root / "commitlog",
                                         self.config.mapped_file_size_commit_log, self._lock,
                                         prefill=self.config.warm_mapped_file_enable)
            self._index = Index(self.root / "index", self.config.max_hash_slot_num,
                                self.config.max_index_num) if self.config.message_index_enable else None
            cp = self._load_checkpoint()
            if (cut := read_marker(self.root)) is not None:
                redo_cut(self._log, cut, self.quarantine)
                cp = None
            self._queues, self.recovery = recover(self._log, self.root / "consumequeue",
                                                  self._make_queue, self._index, cp,
                                                  self.quarantine)
            self.epochs = EpochFile(self.root)
            """The epoch file of controller mode (created at its first entry)."""
        except OSError as exc:
            self._abandon(log_)
            raise StoreError(f"cannot open store at {self.root}: {exc}") from exc
        except StoreError:
            self._abandon(log_)
            raise
        self._write = self._flushed = self._log.end
        self._tail = self._flushed_tail = (self._write, self.recovery.last_record)
        self._store_host = wire_host(self.config.store_host) if self.config.store_host else ""
        """(log end, start of the last record): written together, read together by the flusher."""
        self.recovered_records = self.recovery.records
        self.truncated_bytes = self.recovery.truncated_bytes
        self.check_disk()
        self.checkpoint()()
        if cut is not None:
            finish_cut(self.root, cut, self.epochs)

    def truncate_log(self, offset: int, step: Callable[[str], None] = lambda _: None) -> int:
        """Cut the commit log at ``offset`` (a record boundary) and what derives from it, crash-
        safe behind an intent marker (:mod:`txmq.store._truncate`); the cut goes to the
        quarantine. The caller stops appends meanwhile; ``step(stage)`` runs after each stage
        (tests crash there). Returns the bytes removed.

        Raises:
            StoreError: ``offset`` is outside the log, or a file failed (the marker stays:
                reopening the store finishes the cut).
        """
        if not self._log.min_offset <= offset <= self._write:
            raise StoreError(f"cannot truncate the commit log at {offset}: it holds "
                             f"{self._log.min_offset}..{self._write}")
        if offset == self._write:
            return 0
        with self._sync_lock:
            try:
                removed = cut_files(self.root, offset, self._log, [*self._queues.values()],
                                    self._index, self.epochs, self.quarantine, step)
            except OSError as exc:
                self._failed = f"truncation at {offset} failed ({exc}); reopen the store to finish it"
                raise StoreError(self._failed) from exc
            self._write = self._flushed = offset
            self._tail = self._flushed_tail = (offset, -1)  # (-1: no record to verify)
            if self._read_limit is not None and self._read_limit > offset:
                self._read_limit = offset
        self.checkpoint()()
        step("checkpoint")
        (self.root / TRUNCATE_MARKER).unlink()
        fsync_dir(self.root)
        log.warning("store %s: commit log truncated at %d (%d bytes)", self.root, offset, removed)
        return removed

    @staticmethod
    def _abandon(clog: CommitLog | None) -> None:
        """Release what a failed opening holds."""
        if clog is not None:
            clog.close()

    def start_queue_at(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """Make a consume queue that does not exist yet start at ``queue_offset`` instead of 0
        (``txmq store migrate`` keeps the offsets of queues whose head retention deleted).
        Raises StoreError if the queue exists or cannot be a directory."""
        why = topic_dir_problem(topic)
        if (topic, queue_id) in self._queues or why:
            raise StoreError(f"cannot start consume queue {topic}/{queue_id} at {queue_offset}: "
                             f"{why or 'it exists'}")
        cq = self._queues[(topic, queue_id)] = self._make_queue(topic, queue_id)
        cq.reset(queue_offset)

    def _make_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(self.root / "consumequeue" / topic / str(queue_id),
                            self.config.mapped_file_size_consume_queue)

    def _load_checkpoint(self) -> Checkpoint | None:
        path = self.root / _CHECKPOINT
        try:
            return decode_checkpoint(path.read_bytes())
        except FileNotFoundError:
            return None
        except (CorruptRecord, OSError) as exc:
            log.warning("store %s: checkpoint unusable (%s); rebuilding consume queues and index "
                        "from the commit log", self.root, exc)
            self.quarantine.put(path, f"checkpoint unusable: {exc}")
            return None

    # -- writing ----------------------------------------------------------------------------------
    def _refuse(self) -> None:
        if self._failed:
            raise StoreError(self._failed)
        if self._closed:
            raise StoreError(f"store {self.root} is closed")
        if not self._writable:
            raise DiskFull(f"disk {self._usage:.1%} used at {self.root}, above "
                           f"disk_space_warning_level_ratio "
                           f"{self.config.disk_space_warning_level_ratio:.0%}: writes refused until "
                           f"space is freed")

    def append(self, records: list[Record]) -> list[AppendResult]:
        if self._failed or self._closed or not self._writable:
            self._refuse()
        if len(records) == 1:
            return [self._append_one(records[0])]
        self._assign_queue_offsets(records)
        try:
            chunks = [encode_record(r, self._store_host) for r in records]
            pos = base = self._log.place(sum(map(len, chunks)))
            out = []
            for rec, chunk in zip(records, chunks, strict=True):  # each placed before the join:
                size = len(chunk)  # its CRC over the record alone, no view of the batch
                place_record(chunk, 0, size, pos)
                out.append(AppendResult(pos, rec.queue_offset, size))
                pos += size
            data = bytearray().join(chunks)
        except (ValueError, OSError) as exc:
            raise self._append_error(exc) from exc
        if self._index is not None and self._index.may_roll(records):
            self._reserve_index([(r, o.commit_log_offset) for r, o in zip(records, out, strict=True)])
        self._write_log(data, base)
        self._dispatch(records, out)
        self._appended(base, pos, out[-1].commit_log_offset)
        return out

    def _append_one(self, rec: Record) -> AppendResult:
        """:meth:`append` of one record (the common send), without the batch bookkeeping."""
        cq = self._queues.get((rec.topic, rec.queue_id))
        if cq is None:
            self._check_new_queue(rec)
        rec.queue_offset = cq.max if cq is not None else 0
        try:
            data = encode_record(rec, self._store_host)
            size = len(data)
            base = self._log.place(size)
            place_record(data, 0, size, base)
        except (ValueError, OSError) as exc:
            raise self._append_error(exc) from exc
        if self._index is not None and self._index.may_roll_one(rec):
            self._reserve_index([(rec, base)])
        self._write_log(data, base)
        try:
            self._dispatch_one(rec, base, size)
        except OSError as exc:
            self._dispatch_failed(exc)
        self._appended(base, base + size, base)
        return AppendResult(base, rec.queue_offset, size)

    def _reserve_index(self, placed: list[tuple[Record, int]]) -> None:
        """Create the index files the records will need before the commit log is written, so the
        dispatch after the write cannot fail on a full disk or at the fd limit (consume queues
        open no file at dispatch: a checkpoint creates their files, and retries when it fails).
        Raises DiskFull or StoreError with nothing appended."""
        assert self._index is not None
        try:
            self._index.reserve(placed)
        except OSError as exc:
            if _disk_full(exc):
                raise DiskFull(f"disk full creating an index file at {self.root}") from exc
            raise StoreError(f"cannot create an index file at {self.root}: {exc}") from exc

    def _write_log(self, data: bytes | bytearray, base: int) -> None:
        try:
            self._log.append(data, base)
        except OSError as exc:
            if self._index is not None:
                self._index.unreserve()
            raise self._append_error(exc) from exc

    def _dispatch_failed(self, exc: OSError) -> None:
        """The records are in the commit log but not in a consume queue or the index (nothing
        should fail there once :meth:`_reserve_index` succeeded). The append still succeeds (its
        records are stored, and recovery dispatches them again); later writes are refused until
        the store is reopened, as after a failed fsync."""
        self._failed = (f"dispatch to consume queues or index failed ({exc}); the store refuses "
                        f"writes until it is reopened and recovered")
        log.critical("store %s: %s", self.root, self._failed)

    @staticmethod
    def _check_new_queue(rec: Record) -> None:
        """Refuse (before anything is written) a record whose queue could not get a directory: a
        topic and queue id become a path, so nothing reaches it unchecked (the broker's door applies
        RocketMQ's stricter topic rules before this)."""
        why = topic_dir_problem(rec.topic) or (
            "" if 0 <= rec.queue_id < limits.QUEUE_NUMS_MAX else f"queue id {rec.queue_id} out of range")
        if why:
            raise StoreError(f"cannot store a record of topic {rec.topic[:300]!r}: {why}")

    def _append_error(self, exc: ValueError | OSError) -> StoreError:
        if isinstance(exc, ValueError):
            return StoreError(f"record does not fit the layout: {exc}")
        if _disk_full(exc):
            return DiskFull(f"disk full writing the commit log at {self.root}")
        return StoreError(f"write to the commit log failed: {exc}")

    def _appended(self, base: int, end: int, last: int) -> None:
        self._write = end
        self._tail = (end, last)
        self._since_check += end - base
        if self._since_check >= limits.DISK_CHECK_BYTES:
            self.check_disk()

    def _assign_queue_offsets(self, records: list[Record]) -> None:
        next_qo: dict[tuple[str, int], int] = {}
        for rec in records:
            key = (rec.topic, rec.queue_id)
            qo = next_qo.get(key)
            if qo is None:
                cq = self._queues.get(key)
                if cq is None:
                    self._check_new_queue(rec)
                qo = cq.max if cq is not None else 0
            rec.queue_offset, next_qo[key] = qo, qo + 1

    def _dispatch(self, records: list[Record], results: list[AppendResult]) -> None:
        """Build the consume queue entries and index entries of appended records (never raises
        OSError: see :meth:`_dispatch_failed`)."""
        try:
            for rec, res in zip(records, results, strict=True):
                self._dispatch_one(rec, res.commit_log_offset, res.size)
        except OSError as exc:
            self._dispatch_failed(exc)

    def _dispatch_one(self, rec: Record, commit_log_offset: int, size: int) -> None:
        cq = self._queues.get((rec.topic, rec.queue_id))
        if cq is None:
            cq = self._queues[(rec.topic, rec.queue_id)] = self._make_queue(rec.topic, rec.queue_id)
        cq.put(commit_log_offset, size, tag_hash(rec.tags) if rec.tags else 0)
        if self._index is not None:
            self._index.add(rec, commit_log_offset)

    @property
    def write_offset(self) -> int:
        return self._write

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def min_offset(self) -> int:
        return self._log.min_offset

    @property
    def recovery_offset(self) -> int:
        return self.recovery.scanned_from

    def flush(self) -> int:
        with self._sync_lock:
            if self._failed:
                raise StoreError(self._failed)
            tail = self._tail
            target = tail[0]
            if target <= self._flushed:
                return self._flushed
            fds = self._log.sync_fds(self._flushed, target)
            try:
                for fd in fds:
                    os.fdatasync(fd)
            except OSError as exc:
                self._failed = (f"fsync of the commit log failed ({exc}); the store refuses writes "
                                f"until it is reopened and recovered")
                log.critical("store %s: %s", self.root, self._failed)
                raise StoreError(self._failed) from exc
            self._flushed_tail = tail
            self._flushed = target
            return target

    def checkpoint(self) -> Callable[[], None]:
        if self._failed or self._closed:
            return _NOOP
        d, last = self._flushed_tail
        self._gen += 1
        gen = self._gen
        fds: set[int] = set()
        try:
            for cq in self._queues.values():
                fds |= cq.persist(d)
            if self._index is not None:
                fds |= self._index.persist(d)
        except OSError as exc:
            with self._lock:  # written but not fsynced: the next checkpoint's sync covers them
                self._unsynced |= fds
            log.warning("store %s: writing consume queues or index failed (%s); a restart will "
                        "re-dispatch more of the commit log", self.root, exc)
            return _NOOP
        with self._lock:
            fds |= self._unsynced
            self._unsynced = set()
        cp = Checkpoint(dispatched=d, last_record=last,
                        queues=[(t, q, cq.min, cq.persisted) for (t, q), cq in self._queues.items()],
                        index_files=self._index.metas() if self._index is not None else [])
        data = encode_checkpoint(cp)

        def sync() -> None:
            with self._sync_lock:
                try:
                    for fd in fds:
                        os.fdatasync(fd)
                    _write_atomic(self.root / _CHECKPOINT, data)
                except OSError as exc:
                    with self._lock:
                        self._unsynced |= fds
                    log.warning("store %s: checkpoint not written (%s)", self.root, exc)
                    return
                self._close_retired(gen)

        return sync

    def _retire(self, fds: list[int]) -> None:
        with self._lock:
            self._retired += [(self._gen, fd) for fd in fds]

    def _close_retired(self, before_gen: int) -> None:
        with self._lock:
            done = [fd for g, fd in self._retired if g < before_gen]
            self._retired = [(g, fd) for g, fd in self._retired if g >= before_gen]
            self._unsynced.difference_update(done)
        for fd in done:
            os.close(fd)

    # -- replication (issue #25) ------------------------------------------------------------------
    def read_log(self, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` raw commit-log bytes from ``offset`` (never past the end of its
        segment or the log end; b"" at the end): what a master ships to its slaves.

        Raises:
            CorruptRecord: ``offset`` is below the first segment or past the end.
        """
        if offset == self._write:
            return b""
        return self._log.read(offset, min(max_bytes, self._write - offset))

    def append_replica(self, offset: int, data: bytes | bytearray,
                       touched: set[tuple[str, int]] | None = None) -> int:
        """Append a master's commit-log bytes ``data`` (whole records) at ``offset``, which must be
        the end of this log: the log stays byte-identical to the master's. Every record is checked
        (magic, size, physical offset, ``__CRC32#``) before anything is written, then dispatched to
        its consume queue (at the queue offset the record carries) and the index, as recovery
        does; the ``(topic, queue id)`` of each record goes into ``touched`` (the broker wakes the
        pulls held on them). Returns the new end of the log.

        Raises:
            CorruptRecord: ``offset`` is not the end, or a record fails its check (nothing written).
            DiskFull, StoreError: as :meth:`append`.
        """
        if self._failed or self._closed or not self._writable:
            self._refuse()
        if offset != self._write:
            raise CorruptRecord(f"replica bytes at {offset}, but the commit log ends at {self._write}")
        placed = self._check_replica(offset, data)
        if not placed:
            return self._write
        try:
            base = self._log.place(len(data))
        except OSError as exc:
            raise self._append_error(exc) from exc
        assert base == offset, "a commit log segment roll moved the end"
        records = [(r, clo) for r, clo, _ in placed]
        if self._index is not None and self._index.may_roll([r for r, _ in records]):
            self._reserve_index(records)
        self._write_log(data, base)
        try:
            for rec, clo, size in placed:
                dispatch_record(rec, clo, size, self._queues, self._make_queue, self._index)
        except OSError as exc:
            self._dispatch_failed(exc)
        self._appended(base, base + len(data), placed[-1][1])
        if touched is not None:
            touched.update((rec.topic, rec.queue_id) for rec, _, _ in placed)
        return self._write

    @staticmethod
    def _check_replica(offset: int, data: bytes | bytearray) -> list[tuple[Record, int, int]]:
        """The records of ``data`` (which starts at commit log ``offset``) as ``(record, offset,
        size)``. Raises CorruptRecord when one fails its check or the last one is cut short."""
        view, pos, out = memoryview(data), 0, []
        while pos < len(data):
            rec, size = decode_record(view, pos, offset + pos)
            out.append((rec, offset + pos, size))
            pos += size
        return out

    def set_store_host(self, host: str) -> None:
        self._store_host = wire_host(host) if host else ""

    def save_meta(self, name: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        path = self.root / "meta" / name
        try:
            _write_atomic(path, data)
        except OSError as exc:
            if _disk_full(exc):
                raise DiskFull(f"disk full saving {path}") from exc
            raise StoreError(f"cannot save {path}: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        try:
            if not self._failed:
                self.flush()
                self.checkpoint()()
        finally:
            self._closed = True
            for cq in self._queues.values():
                cq.close()
            if self._index is not None:
                self._index.close()
            for table in self._tables.values():
                table.close()
            self._log.close()
            self._close_retired(self._gen + 1)

    # -- reading ----------------------------------------------------------------------------------
    def read_at(self, commit_log_offset: int) -> MessageExt:
        data = self._log.read_record_bytes(commit_log_offset)
        return decode_message(memoryview(data), 0, commit_log_offset)

    def _read_record(self, commit_log_offset: int, size: int) -> Record:
        data = self._log.read_record_bytes(commit_log_offset, size)
        return decode_record(memoryview(data), 0, commit_log_offset)[0]

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]:
        cq = self._queues.get((topic, queue_id))
        if cq is None or offset < cq.min or max_count <= 0:
            return []
        end = min(offset + max_count, cq.visible_max(self.visible_offset))
        if offset >= end:
            return []
        try:
            entries = cq.entries(offset, end)
        except OSError as exc:
            raise CorruptRecord(f"consume queue {topic}/{queue_id} unreadable: {exc}") from exc
        out: list[MessageExt] = []
        body_bytes, i = 0, 0
        while i < len(entries):
            j, data, span_start = self._span(entries, i)
            view = memoryview(data)
            for clo, size in entries[i:j]:
                if size == 0:
                    continue  # a hole left by recovery
                msg = decode_message(view, clo - span_start, clo)
                body_bytes += len(msg.body)
                if out and body_bytes > max_bytes:
                    return out
                out.append(msg)
            i = j
        return out

    def _span(self, entries: Sequence[tuple[int, ...]], i: int) -> tuple[int, bytes, int]:
        """Read entries ``i..j-1`` (``(commit log offset, size, ...)`` neighbours in one segment,
        within READ_SPAN_BYTES_MAX) with one pread; return ``(j, bytes, commit log offset of the
        bytes)``. Raises CorruptRecord when the log does not hold them all."""
        start, size = entries[i][0], entries[i][1]
        seg = self._log.segment_at(start)
        if seg is None:
            raise CorruptRecord(f"commit log offset {start} is not stored")
        end, j = start + size, i + 1
        while j < len(entries):
            c, s = entries[j][0], entries[j][1]
            if c + s > seg.end or c + s - start > limits.READ_SPAN_BYTES_MAX:
                break
            end, j = max(end, c + s), j + 1
        data = self._log.read(start, end - start)
        if len(data) != end - start:
            raise CorruptRecord(f"commit log range [{start}, {end}) is not all stored")
        return j, data, start

    def read_queue_raw(self, topic: str, queue_id: int, offset: int, max_count: int,
                       max_bytes: int, tag_hashes: Collection[int] | None = None) -> RawRead:
        cq = self._queues.get((topic, queue_id))
        if cq is None or offset < cq.min or max_count <= 0:
            return RawRead(b"", 0, offset)
        return read_raw(self._log, cq, topic, queue_id, offset,
                        min(offset + max_count, cq.visible_max(self.visible_offset)), max_bytes, tag_hashes)

    def bounds_below(self, topic: str, queue_id: int, commit_log_offset: int) -> tuple[int, int]:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            return 0, 0
        return cq.min, max(cq.min, cq.visible_max(min(commit_log_offset, self._flushed)))

    def topic_queues(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t, qid in self._queues:
            out[t] = max(out.get(t, 0), qid + 1)
        return out

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(qid for (t, qid) in self._queues if t == topic)

    def commit_log_offset_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        cq = self._queues.get((topic, queue_id))
        if cq is None or not cq.min <= queue_offset < cq.max:
            return None
        try:
            return cq.entry(queue_offset)
        except OSError as exc:
            raise CorruptRecord(f"consume queue {topic}/{queue_id} unreadable: {exc}") from exc

    def iter_records(self, start_offset: int = 0,
                     topics: Collection[str] | None = None) -> Iterator[tuple[int, Record]]:
        start_offset = max(start_offset, self.min_offset)
        if topics is None:
            for clo, rec, _ in self._log.scan(start_offset):
                yield clo, rec
            return
        found: list[tuple[int, int]] = []
        for (t, _), cq in self._queues.items():
            if t in topics:
                lo = cq.first_at_or_after(start_offset) if start_offset > 0 else cq.min
                found += [e for e in cq.entries(lo, cq.max) if e[0] >= start_offset and e[1]]
        for clo, size in sorted(found):
            yield clo, self._read_record(clo, size)

    def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                     max_count: int) -> list[MessageExt]:
        def match(m: MessageExt) -> bool:
            return m.topic == topic and key in m.keys.split()

        return self._query(key_key(topic, key), begin_ms, end_ms, max_count, match)

    def query_by_msg_id(self, msg_id: str, max_count: int) -> list[MessageExt]:
        def match(m: MessageExt) -> bool:
            return m.properties.get(PROPERTY_UNIQ_KEY) == msg_id

        return self._query(id_key(msg_id), -(2**63), 2**63 - 1, max_count, match)

    def _query(self, key: str, begin_ms: int, end_ms: int, max_count: int,
               match: Callable[[MessageExt], bool]) -> list[MessageExt]:
        if self._index is None or max_count <= 0:
            return []
        out: list[MessageExt] = []
        try:
            candidates = self._index.lookup(key, begin_ms, end_ms, 2 * max_count)
        except OSError as exc:
            raise CorruptRecord(f"index unreadable: {exc}") from exc
        for clo in candidates:
            if not self.min_offset <= clo < self._flushed:
                continue
            try:
                m = self.read_at(clo)
            except CorruptRecord:  # an index entry that points at no record: a miss, not a failure
                continue
            if match(m) and begin_ms <= m.store_timestamp_ms <= end_ms:
                out.append(m)
                if len(out) >= max_count:
                    break
        return out

    def load_meta(self, name: str) -> bytes | None:
        try:
            return (self.root / "meta" / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read metadata {name}: {exc}") from exc

    def quarantine_meta(self, name: str, reason: str) -> str:
        path = self.root / "meta" / name
        try:
            if not path.exists() and not path.is_symlink():
                return ""
            return str(self.quarantine.put(path, reason))
        except OSError as exc:
            log.error("store %s: could not quarantine %s (%s): %s", self.root, path, reason, exc)
            return ""

    def _open_table(self, name: str) -> StateTable:
        path = self.root / "meta" / f"{name}.table"
        try:
            return FileStateTable(path)
        except OSError as exc:
            raise StoreError(f"cannot open state table {path}: {exc}") from exc

    # -- retention and disk space -----------------------------------------------------------------
    def _infos(self) -> list[SegmentInfo]:
        segs = self._log.segments
        out = [SegmentInfo(s.base, s.end, self._log.first_ms(n)) for s, n in itertools.pairwise(segs)]
        return [*out, SegmentInfo(segs[-1].base, segs[-1].end, None)]

    def clean(self, now_ms: int, *, delete_hour: bool) -> CleanReport:
        usage = self.check_disk().usage_ratio
        infos = self._infos()
        plan = plan_clean(infos, self._flushed, now_ms, self.config, usage, delete_hour,
                          self.retention_needs())
        report = CleanReport(held=plan.held, deleted_needed=plan.deleted_needed, usage_ratio=usage)
        try:
            gone = self._log.delete_oldest(plan.n_delete)
            self._retire([s.fd for s in gone])
            low = self._log.min_offset
            for cq in self._queues.values():
                self._retire(cq.clean(low))
            if self._index is not None:
                self._retire(self._index.clean(low))
        except OSError as exc:
            log.error("store %s: retention failed: %s", self.root, exc)
            gone = []
        report.deleted_segments = [s.base for s in gone]
        report.freed_bytes = sum(s.size for s in gone)
        report.min_offset = self._log.min_offset
        log_report(report, f"store {self.root}")
        if gone:
            self.check_disk()
        return report

    def check_disk(self) -> DiskStatus:
        self._since_check = 0
        if self._disk_usage is not None:
            usage = self._disk_usage()
        else:
            try:
                st = os.statvfs(self.root)
                usage = (st.f_blocks - st.f_bavail) / st.f_blocks if st.f_blocks else 0.0
            except OSError as exc:
                log.error("store %s: cannot read disk usage: %s", self.root, exc)
                return DiskStatus(self._usage, self._writable)
        was = self._writable
        if usage > self.config.disk_space_warning_level_ratio:
            self._writable = False
        elif usage <= self.config.disk_space_clean_forcibly_ratio:
            self._writable = True
        self._usage = usage
        if was != self._writable:
            log.log(logging.INFO if self._writable else logging.ERROR,
                    "store %s: disk %.1f%% used: writes %s", self.root, usage * 100,
                    "accepted again" if self._writable else "refused (DiskFull)")
        return DiskStatus(usage, self._writable)
