"""An in-memory store: the reference model of the contract suite and the simulation's disk.

It keeps the same record bytes as :class:`~txmq.store.FileStore` (RocketMQ MessageExt records,
:mod:`txmq.store._codec`: same sizes, so the same commit log offsets, and the same segment rolling
rule, so retention deletes the same segments) and reads by decoding them.
Nothing survives the process; ``flush`` only moves ``flushed_offset``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Sequence

from txmq.errors import CorruptRecord, DiskFull, StoreError
from txmq.protocol import PROPERTY_UNIQ_KEY, MessageExt
from txmq.store._base import AppendResult, CleanReport, DiskStatus, RawRead, Record, Store
from txmq.store._codec import (
    decode_message,
    decode_record,
    encode_record,
    place_record,
    tag_hash,
    wire_host,
)
from txmq.store._config import StoreConfig
from txmq.store._retention import SegmentInfo, log_report, plan_clean

__all__ = ["MemoryStore"]


class _Segment:
    __slots__ = ("base", "end", "offsets")

    def __init__(self, base: int) -> None:
        self.base = self.end = base
        self.offsets: list[int] = []


class _Queue:
    __slots__ = ("min", "offsets")

    def __init__(self) -> None:
        self.min = 0
        self.offsets: list[int] = []  # commit log offset of queue offset min + i


class MemoryStore(Store):
    """Keeps records in dicts and lists.

    Args:
        config: segment size and retention settings (the rest is ignored); defaults to
            :class:`StoreConfig` defaults.
        disk_usage: returns the "disk" usage ratio 0..1 for :meth:`check_disk` (tests); 0 if None.
    """

    def __init__(self, config: StoreConfig | None = None, *,
                 disk_usage: Callable[[], float] | None = None) -> None:
        super().__init__(config or StoreConfig())
        self._disk_usage = disk_usage
        self._segments = [_Segment(0)]
        self._records: dict[int, Record] = {}
        self._data: dict[int, bytes] = {}
        self._tag_hash: dict[int, int] = {}
        self._store_host = wire_host(self.config.store_host) if self.config.store_host else ""
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._keys: dict[tuple[str, str], list[int]] = {}
        self._ids: dict[str, list[int]] = {}
        self._meta: dict[str, bytes] = {}
        self._write = 0
        self._flushed = 0
        self._writable = True
        self._usage = 0.0

    # -- writing ----------------------------------------------------------------------------------
    def append(self, records: list[Record]) -> list[AppendResult]:
        if not self._writable:
            raise DiskFull(f"disk {self._usage:.0%} used, above disk_space_warning_level_ratio "
                           f"{self.config.disk_space_warning_level_ratio:.0%}: writes refused")
        try:
            encoded = [encode_record(rec, self._store_host) for rec in records]
        except ValueError as exc:
            raise StoreError(f"record does not fit the layout: {exc}") from exc
        sizes = [len(e) for e in encoded]
        seg = self._segments[-1]
        if seg.offsets and seg.end - seg.base + sum(sizes) > self.config.mapped_file_size_commit_log:
            seg = _Segment(self._write)
            self._segments.append(seg)
        out = []
        for rec, data, size in zip(records, encoded, sizes, strict=True):
            q = self._queues.setdefault((rec.topic, rec.queue_id), _Queue())
            rec.queue_offset = q.min + len(q.offsets)
            clo = self._write
            q.offsets.append(clo)
            seg.offsets.append(clo)
            # the queue offset is known only now (FileStore assigns it before encoding)
            data[20:28] = rec.queue_offset.to_bytes(8, "big", signed=True)
            place_record(data, 0, size, clo)
            self._records[clo] = rec
            self._data[clo] = bytes(data)
            self._tag_hash[clo] = tag_hash(rec.tags) if rec.tags else 0
            self._index(rec, clo)
            out.append(AppendResult(clo, rec.queue_offset, size))
            self._write += size
        seg.end = self._write
        return out

    def _index(self, rec: Record, clo: int) -> None:
        if not self.config.message_index_enable:
            return
        for key in rec.keys.split():
            self._keys.setdefault((rec.topic, key), []).append(clo)
        uniq = rec.properties.get(PROPERTY_UNIQ_KEY)
        if uniq:
            self._ids.setdefault(uniq, []).append(clo)

    @property
    def write_offset(self) -> int:
        return self._write

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def min_offset(self) -> int:
        return self._segments[0].base

    @property
    def recovery_offset(self) -> int:
        return self.min_offset

    def flush(self) -> int:
        self._flushed = self._write
        return self._flushed

    def checkpoint(self) -> Callable[[], None]:
        return lambda: None

    def set_store_host(self, host: str) -> None:
        self._store_host = wire_host(host) if host else ""

    def save_meta(self, name: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        self._meta[name] = bytes(data) if isinstance(data, bytes) else b"".join(data)

    def close(self) -> None:
        self.flush()

    # -- reading ----------------------------------------------------------------------------------
    def read_at(self, commit_log_offset: int) -> MessageExt:
        data = self._data.get(commit_log_offset)
        if data is None:
            raise CorruptRecord(f"no record at commit log offset {commit_log_offset}")
        return decode_message(data, 0, commit_log_offset)

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int) -> list[MessageExt]:
        q = self._queues.get((topic, queue_id))
        if q is None or offset < q.min:
            return []
        start = offset - q.min
        end = min(start + max_count, bisect_left(q.offsets, self.visible_offset))
        out: list[MessageExt] = []
        size = 0
        for clo in q.offsets[start:end]:
            msg = self.read_at(clo)
            size += len(msg.body)
            if out and size > max_bytes:
                break
            out.append(msg)
        return out

    def read_queue_raw(self, topic: str, queue_id: int, offset: int, max_count: int,
                       max_bytes: int, tag_hashes: Collection[int] | None = None) -> RawRead:
        q = self._queues.get((topic, queue_id))
        if q is None or offset < q.min or max_count <= 0:
            return RawRead(b"", 0, offset)
        start = offset - q.min
        end = min(start + max_count, bisect_left(q.offsets, self.visible_offset))
        parts: list[bytes] = []
        total = 0
        for i, clo in enumerate(q.offsets[start:end]):
            if tag_hashes is not None and self._tag_hash[clo] not in tag_hashes:
                continue
            data = self._data[clo]
            if parts and total + len(data) > max_bytes:
                return RawRead(b"".join(parts), len(parts), offset + i)
            parts.append(data)
            total += len(data)
        return RawRead(b"".join(parts), len(parts), offset + max(0, end - start))

    def bounds_below(self, topic: str, queue_id: int, commit_log_offset: int) -> tuple[int, int]:
        q = self._queues.get((topic, queue_id))
        if q is None:
            return 0, 0
        return q.min, q.min + bisect_left(q.offsets, min(commit_log_offset, self._flushed))

    def topic_queues(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t, qid in self._queues:
            out[t] = max(out.get(t, 0), qid + 1)
        return out

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(qid for (t, qid) in self._queues if t == topic)

    def commit_log_offset_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        q = self._queues.get((topic, queue_id))
        if q is None or not q.min <= queue_offset < q.min + len(q.offsets):
            return None
        return q.offsets[queue_offset - q.min]

    def iter_records(self, start_offset: int = 0,
                     topics: Collection[str] | None = None) -> Iterator[tuple[int, Record]]:
        offsets = sorted(o for o in self._records if o >= start_offset)
        for clo in offsets:
            rec = self._records.get(clo)
            if rec is not None and (topics is None or rec.topic in topics):
                yield clo, decode_record(self._data[clo], 0, clo)[0]

    def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                     max_count: int) -> list[MessageExt]:
        return self._lookup(self._keys.get((topic, key), []), begin_ms, end_ms, max_count)

    def query_by_msg_id(self, msg_id: str, max_count: int) -> list[MessageExt]:
        return self._lookup(self._ids.get(msg_id, []), -(2**63), 2**63 - 1, max_count)

    def _lookup(self, offsets: list[int], begin_ms: int, end_ms: int,
                max_count: int) -> list[MessageExt]:
        out = []
        for clo in reversed(offsets):
            rec = self._records.get(clo)
            if rec is None or clo >= self._flushed:
                continue
            if begin_ms <= rec.store_timestamp_ms <= end_ms:
                out.append(self.read_at(clo))
                if len(out) >= max_count:
                    break
        return out

    def load_meta(self, name: str) -> bytes | None:
        return self._meta.get(name)

    def _forget_meta(self, name: str) -> None:
        self._meta.pop(name, None)

    # -- retention and disk space -----------------------------------------------------------------
    def _infos(self) -> list[SegmentInfo]:
        out = []
        for seg, nxt in zip(self._segments, self._segments[1:], strict=False):
            first = self._records[nxt.offsets[0]].store_timestamp_ms if nxt.offsets else None
            out.append(SegmentInfo(seg.base, seg.end, first))
        last = self._segments[-1]
        return [*out, SegmentInfo(last.base, last.end, None)]

    def clean(self, now_ms: int, *, delete_hour: bool) -> CleanReport:
        usage = self.check_disk().usage_ratio
        plan = plan_clean(self._infos(), self._flushed, now_ms, self.config, usage, delete_hour,
                          self.retention_needs())
        report = CleanReport(held=plan.held, deleted_needed=plan.deleted_needed, usage_ratio=usage)
        for seg in self._segments[: plan.n_delete]:
            for clo in seg.offsets:
                del self._records[clo]
                del self._data[clo]
                del self._tag_hash[clo]
            report.deleted_segments.append(seg.base)
            report.freed_bytes += seg.end - seg.base
        del self._segments[: plan.n_delete]
        low = self.min_offset
        for q in self._queues.values():
            cut = bisect_left(q.offsets, low)
            q.min += cut
            del q.offsets[:cut]
        report.min_offset = low
        log_report(report, "memory store")
        return report

    def check_disk(self) -> DiskStatus:
        self._usage = self._disk_usage() if self._disk_usage is not None else 0.0
        if self._usage > self.config.disk_space_warning_level_ratio:
            self._writable = False
        elif self._usage <= self.config.disk_space_clean_forcibly_ratio:
            self._writable = True
        return DiskStatus(self._usage, self._writable)
