"""``txmq store migrate DATA_DIR``: rewrite a data directory of txmq's TXM1 store format
(:mod:`txmq.store._migrate_txm1`) into RocketMQ MessageExt records (:mod:`txmq.store._codec`).

1. Every TXM1 record is read in commit log order (its CRC32C checked). A record that fails in the
   last segment ends the log (a torn tail, as recovery would cut it); anywhere else it stops the
   migration with nothing changed.
2. The records are appended, in the same order, to a new store in ``DATA_DIR/migrate.new``:
   each keeps its topic, queue, queue offset (a queue whose head retention deleted starts at its
   first stored offset, so consumer offsets stay valid), body, tags, keys, properties, times,
   hosts and flag. Commit log offsets change (records have another size); a commit record gets
   its half's new offset as its prepared transaction offset. Consume queues and the index are
   built as the records are appended.
3. The swap: with ``DATA_DIR/MIGRATING`` present (a store refuses to open meanwhile), the old
   ``commitlog``, ``consumequeue``, ``index``, ``checkpoint`` and the snapshots under ``meta``
   that name commit log offsets (``*.snapshot``, rebuilt from the log at the next start) move to
   ``DATA_DIR/migrate.txm1/`` (kept: delete it once the broker runs), then the new ones move in.
   A migration interrupted during the swap finishes when run again.

Other metadata (topics, consumer offsets, schedule progress, the transaction state table keyed
by half queue offset) is kept as it is: it names queue offsets, which do not change.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec

from txmq.errors import CorruptRecord, StoreError
from txmq.protocol import PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET
from txmq.store._base import Record
from txmq.store._commitlog import fsync_dir
from txmq.store._config import StoreConfig
from txmq.store._file import MIGRATING_MARKER, FileStore
from txmq.store._migrate_txm1 import RECORD_MAGIC, decode_record

__all__ = ["MigrateReport", "migrate_store", "needs_migration"]

_NEW, _OLD = "migrate.new", "migrate.txm1"
_SWAPPED = ("commitlog", "consumequeue", "index", "checkpoint")
_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
_BATCH = 1000
"""Records appended to the new store at a time."""


class MigrateReport(msgspec.Struct, kw_only=True):
    """What :func:`migrate_store` did.

    Attributes:
        records: records rewritten.
        old_bytes: bytes of the old commit log read; new_bytes: of the new one.
        torn_tail_bytes: bytes at the end of the old log that were not a whole record (dropped).
        queues: consume queues written.
        kept_in: where the old files are kept ("" if nothing was migrated).
        already: the directory was already in the current format (nothing done).
    """

    records: int = 0
    old_bytes: int = 0
    new_bytes: int = 0
    torn_tail_bytes: int = 0
    queues: int = 0
    kept_in: str = ""
    already: bool = False


def needs_migration(root: Path) -> bool:
    """Whether ``root`` holds a TXM1 commit log (or an interrupted migration)."""
    if (root / MIGRATING_MARKER).exists():
        return True
    segs = _segments(root / "commitlog")
    for path in segs[:1]:
        with open(path, "rb") as f:
            return f.read(8)[4:8] == RECORD_MAGIC.to_bytes(4, "big")
    return False


def _segments(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if len(p.name) == 20 and p.name.isdigit()
                  and p.stat().st_size > 0)


def _old_records(root: Path, report: MigrateReport) -> Iterator[Record]:
    """The TXM1 records in log order. Raises StoreError on damage that is not a torn tail."""
    segs = _segments(root / "commitlog")
    for n, path in enumerate(segs):
        base = int(path.name)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                pos = 0
                while pos < len(mm):
                    try:
                        rec, size = decode_record(view, pos, base + pos)
                    except CorruptRecord as exc:
                        if n != len(segs) - 1:
                            raise StoreError(f"{path}: {exc}; the log is damaged before its last "
                                             f"segment: nothing was changed") from exc
                        report.torn_tail_bytes = len(mm) - pos
                        break
                    pos += size
                    report.old_bytes += size
                    report.records += 1
                    yield rec
            finally:
                view.release()


def _prepared_offset(store: FileStore, rec: Record, batch: list[Record]) -> None:
    """A commit record's half offset in the new log (RocketMQ ``preparedTransactionOffset``)."""
    qo = rec.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "")
    if qo.isdigit():
        _flush(store, batch)  # the half may be in the batch
        clo = store.commit_log_offset_at(_HALF_TOPIC, 0, int(qo))
        rec.prepared_transaction_offset = clo or 0


def _rewrite(root: Path, new: Path, report: MigrateReport, config: StoreConfig) -> None:
    store = FileStore(new, config)
    try:
        seen: set[tuple[str, int]] = set()
        batch: list[Record] = []
        host = None
        for rec in _old_records(root, report):
            key = (rec.topic, rec.queue_id)
            if rec.store_host != host or key not in seen:
                _flush(store, batch)
                if key not in seen:
                    seen.add(key)
                    if rec.queue_offset > 0:
                        store.start_queue_at(rec.topic, rec.queue_id, rec.queue_offset)
                host = rec.store_host
                store.set_store_host(host)
            _prepared_offset(store, rec, batch)
            batch.append(rec)
            if len(batch) >= _BATCH:
                _flush(store, batch)
        _flush(store, batch)
        report.queues = len(seen)
        report.new_bytes = store.write_offset - store.min_offset
    finally:
        store.close()


def _flush(store: FileStore, batch: list[Record]) -> None:
    if not batch:
        return
    want = [r.queue_offset for r in batch]
    got = [r.queue_offset for r in store.append(batch)]
    if got != want:
        raise StoreError(f"queue offsets would change ({want[:3]}… became {got[:3]}…): the old "
                         f"consume queues have holes; nothing was changed")
    batch.clear()


def _swap(root: Path) -> None:
    """Move the old files aside and the new ones in (idempotent: finishes an interrupted swap)."""
    new, old = root / _NEW, root / _OLD
    marker = root / MIGRATING_MARKER
    marker.touch()
    fsync_dir(root)
    old.mkdir(exist_ok=True)
    for name in _SWAPPED:
        if (new / name).exists() and (root / name).exists():
            os.replace(root / name, old / name)
    (old / "meta").mkdir(exist_ok=True)
    for snap in sorted((root / "meta").glob("*.snapshot")):
        os.replace(snap, old / "meta" / snap.name)
    for name in _SWAPPED:
        if (new / name).exists():
            os.replace(new / name, root / name)
    shutil.rmtree(new, ignore_errors=True)
    fsync_dir(root)
    marker.unlink()
    fsync_dir(root)


def migrate_store(root: Path | str, config: StoreConfig | None = None) -> MigrateReport:
    """Rewrite the TXM1 data directory ``root`` (see the module docstring); no broker may use it.

    Raises:
        StoreError: ``root`` holds no commit log, the old log is damaged before its last
            segment, a leftover ``migrate.txm1`` directory is in the way, or a write failed
            (the old files are untouched until the swap).
    """
    root = Path(root)
    report = MigrateReport()
    if (root / MIGRATING_MARKER).exists():
        _swap(root)
        report.kept_in = str(root / _OLD)
        return report
    if not (root / "commitlog").is_dir():
        raise StoreError(f"{root} holds no commit log (no {root / 'commitlog'} directory)")
    if not needs_migration(root):
        report.already = True
        return report
    if (root / _OLD / "commitlog").exists():
        raise StoreError(f"{root / _OLD} holds an earlier migration's old files: move it away first")
    new = root / _NEW
    shutil.rmtree(new, ignore_errors=True)
    try:
        _rewrite(root, new, report, config or StoreConfig())
    except (StoreError, OSError) as exc:
        shutil.rmtree(new, ignore_errors=True)
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"migrating {root} failed: {exc}; nothing was changed") from exc
    _swap(root)
    report.kept_in = str(root / _OLD)
    return report
