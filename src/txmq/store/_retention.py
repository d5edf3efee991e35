"""Retention decisions, pure: which of the oldest segments one round may delete.

RocketMQ ``DefaultMessageStore.CleanCommitLogService``: a segment older than ``fileReservedTime`` goes
at the ``deleteWhen`` hour or as soon as the disk is above ``diskMaxUsedSpaceRatio``; above
``diskSpaceCleanForciblyRatio`` the oldest go even if younger; at most ``deleteFileBatchMax`` per
round; the segment being written is never deleted. txmq adds retention hooks: what a consumer group,
the transaction index or the delay queues still need is kept, or, under disk pressure and only if
configured, deleted with an error naming the hook (never silently).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from txmq.store._base import CleanReport
from txmq.store._config import StoreConfig

__all__ = ["SegmentInfo", "log_report", "plan_clean"]

log = logging.getLogger("txmq.store")


class SegmentInfo(NamedTuple):
    """A sealed or active segment: ``[base, end)`` and an upper bound of its newest store
    timestamp in ms (None when unknown: such a segment never counts as expired)."""

    base: int
    end: int
    newest_ms: int | None


class Plan(NamedTuple):
    """How many of the oldest segments to delete, and what hooks said."""

    n_delete: int
    held: dict[str, int]
    deleted_needed: dict[str, int]


def plan_clean(segments: list[SegmentInfo], flushed: int, now_ms: int, cfg: StoreConfig,
               usage_ratio: float, delete_hour: bool, needs: dict[str, int]) -> Plan:
    """Decide one retention round.

    Args:
        segments: every segment, oldest first; the last one is active and never deleted.
        flushed: the flushed offset; a segment ending after it is never deleted.
        now_ms: the current time.
        cfg: reserved time, ratios, batch size, and ``clean_needed_under_pressure``.
        usage_ratio: disk usage now, 0..1.
        delete_hour: whether it is a ``delete_when`` hour.
        needs: retention hooks' needs, name → lowest needed commit log offset.

    Returns:
        a :class:`Plan`; the segments to delete are ``segments[:plan.n_delete]``.
    """
    expired_may_go = delete_hour or usage_ratio > cfg.disk_max_used_space_ratio
    forced = usage_ratio > cfg.disk_space_clean_forcibly_ratio
    count = 0
    held: dict[str, int] = {}
    violated: dict[str, int] = {}
    for seg in segments[:-1]:
        if count >= cfg.delete_files_batch_max or seg.end > flushed:
            break
        expired = seg.newest_ms is not None and seg.newest_ms + cfg.file_reserved_time_ms <= now_ms
        if not (forced or (expired and expired_may_go)):
            break
        needed_by = {name: off for name, off in needs.items() if off < seg.end}
        if needed_by:
            if not (forced and cfg.clean_needed_under_pressure):
                held = needed_by
                break
            for name, off in needed_by.items():
                violated.setdefault(name, off)
        count += 1
    return Plan(count, held, violated)


def log_report(report: CleanReport, where: str) -> None:
    """Log a retention round: deletions at INFO, holds at WARNING, deleted needs at ERROR."""
    if report.deleted_segments:
        log.info("%s: retention deleted %d segment(s) %s (%d bytes, disk %.0f%% used); commit "
                 "log now starts at %d", where, len(report.deleted_segments),
                 report.deleted_segments, report.freed_bytes, report.usage_ratio * 100,
                 report.min_offset)
    for name, off in report.held.items():
        log.warning("%s: retention keeps expired segments: %s still needs commit log offset %d",
                    where, name, off)
    for name, off in report.deleted_needed.items():
        log.error("%s: disk %.0f%% used: retention deleted records that %s still needed (from "
                  "commit log offset %d); they are lost to it", where, report.usage_ratio * 100,
                  name, off)
