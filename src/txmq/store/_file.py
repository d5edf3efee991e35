"""A file-backed store: one commit log file of CRC-checked records, consume queues rebuilt on open.

Commit log record layout (one after another, no padding)::

     0          4          8                          8+N
     +----------+----------+--------------------------+
     | N: u32   | crc: u32 | payload: msgpack Record  |
     +----------+----------+--------------------------+
     crc = CRC32C(payload), big-endian fields

On open the log is scanned from the start; each record's length and CRC32C are verified, and the file
is truncated at the first record that does not check out (a torn or corrupt tail), which is logged.
Consume queues are rebuilt in memory from the scan. (Segment files, persisted consume queues and a
checkpoint are the storage engine's own work; this layout is the simple first version.)
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path

import crc32c
import msgspec

from txmq.errors import CorruptRecord, DiskFull, StoreError
from txmq.protocol import MessageExt
from txmq.store._base import AppendResult, Record, Store

__all__ = ["FileStore"]

log = logging.getLogger("txmq.store")

_HEAD = struct.Struct(">II")  # N: u32 payload length, crc: u32 CRC32C of payload
_SEGMENT_NAME = f"{0:020d}"  # RocketMQ names segments by their 20-digit base offset
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Record)
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024


class FileStore(Store):
    """Commit log in ``<root>/commitlog/00000000000000000000``; metadata in ``<root>/meta/``.

    Args:
        root: data directory (created if missing).

    Raises:
        StoreError: the directory cannot be created or the log cannot be opened.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        try:
            (self.root / "commitlog").mkdir(parents=True, exist_ok=True)
            (self.root / "meta").mkdir(parents=True, exist_ok=True)
            self._path = self.root / "commitlog" / _SEGMENT_NAME
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open store at {self.root}: {exc}") from exc
        self._queues: dict[tuple[str, int], array[int]] = {}
        self._write = 0
        self.recovered_records = 0
        self.truncated_bytes = 0
        self._recover()
        self._flushed = self._write

    # -- recovery ---------------------------------------------------------------------------------
    def _recover(self) -> None:
        size = os.fstat(self._fd).st_size
        end = 0
        for offset, rec in self._scan(size):
            self._index(offset, rec)
            self.recovered_records += 1
            end = self._end_of
        if end < size:
            self.truncated_bytes = size - end
            log.warning("commit log %s: truncated %d bytes of torn or corrupt tail at offset %d",
                        self._path, size - end, end)
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        self._write = end
        log.info("commit log %s: recovered %d records, %d bytes", self._path,
                 self.recovered_records, end)

    def _scan(self, size: int) -> Iterator[tuple[int, Record]]:
        """Valid records from offset 0 up to the first bad one; sets ``_end_of`` after each."""
        self._end_of = 0
        pos = 0
        with open(self._path, "rb", buffering=_SCAN_CHUNK_BYTES) as f:
            while pos + _HEAD.size <= size:
                n, crc = _HEAD.unpack(f.read(_HEAD.size))
                if n == 0 or pos + _HEAD.size + n > size:
                    return
                payload = f.read(n)
                if len(payload) < n or crc32c.crc32c(payload) != crc:
                    return
                try:
                    rec = _dec.decode(payload)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    return
                self._end_of = pos + _HEAD.size + n
                yield pos, rec
                pos = self._end_of

    def _index(self, offset: int, rec: Record) -> None:
        q = self._queues.get((rec.topic, rec.queue_id))
        if q is None:
            q = self._queues[(rec.topic, rec.queue_id)] = array("q")
        assert rec.queue_offset == len(q), "queue offsets in the log must be dense"
        q.append(offset)

    # -- writing ----------------------------------------------------------------------------------
    def append(self, records: list[Record]) -> list[AppendResult]:
        out: list[AppendResult] = []
        chunks: list[bytes] = []
        pos = self._write
        next_qo: dict[tuple[str, int], int] = {}
        for rec in records:
            key = (rec.topic, rec.queue_id)
            qo = next_qo.get(key)
            if qo is None:
                qo = len(self._queues.get(key, ()))
            rec.queue_offset = qo
            next_qo[key] = qo + 1
            payload = _enc.encode(rec)
            chunks.append(_HEAD.pack(len(payload), crc32c.crc32c(payload)))
            chunks.append(payload)
            out.append(AppendResult(pos, qo, _HEAD.size + len(payload)))
            pos += _HEAD.size + len(payload)
        self._write_all(b"".join(chunks))
        for rec, res in zip(records, out, strict=True):
            self._index(res.commit_log_offset, rec)
        self._write = pos
        return out

    def _write_all(self, data: bytes) -> None:
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], self._write + written)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._write)
            except OSError:
                log.exception("could not truncate commit log after a failed write")
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"disk full writing commit log {self._path}") from exc
            raise StoreError(f"write to commit log failed: {exc}") from exc

    @property
    def write_offset(self) -> int:
        return self._write

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    def flush(self) -> int:
        target = self._write
        if target > self._flushed:
            os.fsync(self._fd)
            self._flushed = max(self._flushed, target)
        return self._flushed

    # -- reading ----------------------------------------------------------------------------------
    def _read_record(self, offset: int) -> Record:
        head = os.pread(self._fd, _HEAD.size, offset)
        if len(head) < _HEAD.size or offset >= self._write:
            raise CorruptRecord(f"no record at commit log offset {offset}")
        n, crc = _HEAD.unpack(head)
        payload = os.pread(self._fd, n, offset + _HEAD.size)
        if len(payload) != n or crc32c.crc32c(payload) != crc:
            raise CorruptRecord(f"record at commit log offset {offset} fails its CRC32C check")
        try:
            return _dec.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CorruptRecord(f"record at commit log offset {offset} does not decode") from exc

    def read_at(self, commit_log_offset: int) -> MessageExt:
        return self._read_record(commit_log_offset).to_message_ext(commit_log_offset)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]:
        q = self._queues.get((topic, queue_id))
        if q is None or offset < 0:
            return []
        out: list[MessageExt] = []
        size = 0
        end = min(offset + max_count, bisect_left(q, self._flushed))
        for clo in q[offset:end]:
            msg = self.read_at(clo)
            size += len(msg.body)
            if out and size > max_bytes:
                break
            out.append(msg)
        return out

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        q = self._queues.get((topic, queue_id))
        return (0, bisect_left(q, self._flushed)) if q is not None else (0, 0)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(qid for (t, qid) in self._queues if t == topic)

    def iter_records(self) -> Iterator[tuple[int, Record]]:
        return self._scan(self._write)

    # -- metadata ---------------------------------------------------------------------------------
    def load_meta(self, name: str) -> bytes | None:
        try:
            return (self.root / "meta" / name).read_bytes()
        except FileNotFoundError:
            return None

    def save_meta(self, name: str, data: bytes) -> None:
        path = self.root / "meta" / name
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"disk full saving {path}") from exc
            raise StoreError(f"cannot save {path}: {exc}") from exc

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1
