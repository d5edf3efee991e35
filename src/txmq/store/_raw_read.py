"""A raw read of a consume queue: the stored MessageExt records of a range of queue offsets, as
the bytes a PULL_MESSAGE reply carries (RocketMQ serves pulls from the commit log the same way,
``DefaultMessageStore.getMessage``), sliced from the commit log's map with one slice per run of
records that lie back to back in the log, and nothing decoded."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection

from txmq import limits
from txmq.errors import CorruptRecord
from txmq.store._base import RawRead
from txmq.store._commitlog import CommitLog
from txmq.store._consumequeue import ConsumeQueue

__all__ = ["read_raw"]


def read_raw(log: CommitLog, cq: ConsumeQueue, topic: str, queue_id: int, offset: int, end: int,
             max_bytes: int, tag_hashes: Collection[int] | None) -> RawRead:
    """Queue offsets ``offset .. end - 1`` of ``cq`` (``topic``/``queue_id``, for errors): the
    records whose tag hash is in ``tag_hashes`` (all when None), skipping holes (size 0), cut
    before the record that would take the bytes past ``max_bytes`` (at least one is returned).
    ``next_offset`` is the queue offset after the last entry looked at.

    Raises:
        CorruptRecord: the consume queue cannot be read, or the log does not hold an entry.
    """
    if offset >= end:
        return RawRead(b"", 0, offset)
    try:
        entries = cq.tagged_entries(offset, end)
    except OSError as exc:
        raise CorruptRecord(f"consume queue {topic}/{queue_id} unreadable: {exc}") from exc
    parts: list[bytes | memoryview] = []
    count = total = i = 0
    ends = [c + s for c, s, _ in entries]
    while i < len(entries):
        j, view, at = _raw_span(log, entries, ends, i)
        run = [-1, -1]  # the kept records back to back in the log: one slice for them all
        for k in range(i, j):
            clo, size, h = entries[k]
            if not size or (tag_hashes is not None and h not in tag_hashes):
                continue
            if count and total + size > max_bytes:
                _end_run(parts, view, at, run)
                return RawRead(_joined(parts), count, offset + k)
            if clo != run[1]:
                _end_run(parts, view, at, run)
                run[0] = clo
            run[1] = clo + size
            total, count = total + size, count + 1
        _end_run(parts, view, at, run)
        i = j
    return RawRead(_joined(parts), count, offset + len(entries))


def _raw_span(log: CommitLog, entries: list[tuple[int, int, int]], ends: list[int],
              i: int) -> tuple[int, memoryview, int]:
    """The entries from ``i`` that end within its segment and READ_SPAN_BYTES_MAX (found by
    bisection over ``ends``, which ascend: a hole, an entry of size 0, ends where the next
    record starts), as ``(j, a view of the commit log map over them, where it starts)``.
    Raises CorruptRecord when the log does not hold them all."""
    start = entries[i][0]
    seg = log.segment_at(start)
    if seg is None or ends[i] > seg.end:
        raise CorruptRecord(f"commit log offset {start} is not stored")
    j = max(i + 1, bisect_right(ends, min(seg.end, start + limits.READ_SPAN_BYTES_MAX), i))
    view = log.view(start, ends[j - 1] - start)
    if len(view) != ends[j - 1] - start:
        raise CorruptRecord(f"commit log range [{start}, {ends[j - 1]}) is not all stored")
    return j, view, start


def _end_run(parts: list[bytes | memoryview], view: memoryview, at: int, run: list[int]) -> None:
    """Append ``view``'s bytes of the commit log range ``[run[0], run[1])`` (``view`` starts at
    commit log offset ``at``) to ``parts`` unless the run is empty."""
    if run[1] > run[0]:
        parts.append(view[run[0] - at : run[1] - at])


def _joined(parts: list[bytes | memoryview]) -> bytes:
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
