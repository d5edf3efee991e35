"""A raw read of a consume queue: the stored MessageExt records of a range of queue offsets, as
the bytes a PULL_MESSAGE reply carries (RocketMQ serves pulls from the commit log the same way,
``DefaultMessageStore.getMessage``), sliced from the commit log's map with one slice per run of
records that lie back to back in the log, and nothing decoded.

Where the package was built with its C extensions (``hatch_build.py``), the walk over the consume
queue entries (holes, the tag filter, the byte bound, the runs) is ``txmq.store._ccqruns.runs``, one
C pass over the packed entries with no Python object per entry; otherwise, or with
``TXMQ_PURE_PYTHON=1`` (:data:`txmq.native.PURE_PYTHON_ENV`), :func:`_walk` does it in Python, with
the same result (tests run both). Both read the packed entries the same way."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Sequence

from txmq import limits
from txmq.errors import CorruptRecord
from txmq.native import load_extension
from txmq.store._base import RawRead
from txmq.store._codec import CQ_ENTRY
from txmq.store._commitlog import CommitLog
from txmq.store._consumequeue import ConsumeQueue

__all__ = ["read_raw"]

_compiled = load_extension("txmq.store._ccqruns")


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
        packed = cq.packed_entries(offset, end)
    except OSError as exc:
        raise CorruptRecord(f"consume queue {topic}/{queue_id} unreadable: {exc}") from exc
    if _compiled is not None:
        count, looked, runs = _compiled.runs(packed, max_bytes, None if tag_hashes is None
                                             else _as_set(tag_hashes))
        return RawRead(_joined(_slices(log, runs)) if runs else b"", count, offset + looked)
    return _walk(log, list(CQ_ENTRY.iter_unpack(packed)), offset, max_bytes, tag_hashes)


def _walk(log: CommitLog, entries: list[tuple[int, int, int]], offset: int, max_bytes: int,
          tag_hashes: Collection[int] | None) -> RawRead:
    """:func:`read_raw`'s walk in Python over ``entries`` (``CQ_ENTRY`` tuples from queue offset
    ``offset``), span by span of the commit log."""
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


def _as_set(tag_hashes: Collection[int]) -> frozenset[int] | set[int]:
    return tag_hashes if isinstance(tag_hashes, (set, frozenset)) else frozenset(tag_hashes)


def _slices(log: CommitLog, runs: list[tuple[int, int]]) -> list[memoryview]:
    """Views of the commit log's map over ``runs`` (``(start, end)`` offsets, ascending): slices
    of one view when they all lie in one segment (the usual case), else a view per run and
    segment. Raises CorruptRecord when the log does not hold a run."""
    first, last = runs[0][0], runs[-1][1]
    seg = log.segment_at(first)
    if seg is not None and last <= seg.end:
        view = log.view(first, last - first)
        return [view[a - first : b - first] for a, b in runs]
    out: list[memoryview] = []
    for a, b in runs:
        while a < b:  # a run crosses into the next segment only where a record ends a segment
            seg = log.segment_at(a)
            if seg is None:
                raise CorruptRecord(f"commit log offset {a} is not stored")
            stop = min(b, seg.end)
            out.append(log.view(a, stop - a))
            a = stop
    return out


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


def _joined(parts: Sequence[bytes | memoryview]) -> bytes:
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
