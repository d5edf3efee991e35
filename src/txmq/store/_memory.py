"""An in-memory store: the reference implementation and the simulation's disk."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

import msgspec

from txmq.errors import CorruptRecord
from txmq.protocol import MessageExt
from txmq.store._base import AppendResult, Record, Store

__all__ = ["MemoryStore"]

_enc = msgspec.msgpack.Encoder()


class MemoryStore(Store):
    """Keeps records in lists; ``flush`` is immediate. Offsets are the encoded sizes, so commit log
    offsets look like a real log's."""

    def __init__(self) -> None:
        self._log: list[tuple[int, Record]] = []
        self._by_offset: dict[int, Record] = {}
        self._queues: dict[tuple[str, int], list[int]] = {}
        self._meta: dict[str, bytes] = {}
        self._write = 0
        self._flushed = 0

    def append(self, records: list[Record]) -> list[AppendResult]:
        out = []
        for rec in records:
            q = self._queues.setdefault((rec.topic, rec.queue_id), [])
            rec.queue_offset = len(q)
            size = len(_enc.encode(rec)) + 8
            q.append(self._write)
            self._log.append((self._write, rec))
            self._by_offset[self._write] = rec
            out.append(AppendResult(self._write, rec.queue_offset, size))
            self._write += size
        return out

    @property
    def write_offset(self) -> int:
        return self._write

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    def flush(self) -> int:
        self._flushed = self._write
        return self._flushed

    def read_at(self, commit_log_offset: int) -> MessageExt:
        rec = self._by_offset.get(commit_log_offset)
        if rec is None:
            raise CorruptRecord(f"no record at commit log offset {commit_log_offset}")
        return rec.to_message_ext(commit_log_offset)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]:
        q = self._queues.get((topic, queue_id), [])
        out: list[MessageExt] = []
        size = 0
        end = min(offset + max_count, bisect_left(q, self._flushed))
        for clo in q[max(offset, 0) : end]:
            msg = self.read_at(clo)
            size += len(msg.body)
            if out and size > max_bytes:
                break
            out.append(msg)
        return out

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        return 0, bisect_left(self._queues.get((topic, queue_id), []), self._flushed)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(qid for (t, qid) in self._queues if t == topic)

    def iter_records(self) -> Iterator[tuple[int, Record]]:
        return iter(list(self._log))

    def load_meta(self, name: str) -> bytes | None:
        return self._meta.get(name)

    def save_meta(self, name: str, data: bytes) -> None:
        self._meta[name] = bytes(data)

    def close(self) -> None:
        self.flush()
