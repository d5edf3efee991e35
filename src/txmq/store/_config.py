"""Store configuration: RocketMQ ``MessageStoreConfig`` knobs (in snake_case) with their defaults."""

from __future__ import annotations

import msgspec

from txmq import limits
from txmq.errors import ConfigError

__all__ = ["StoreConfig", "is_delete_hour"]


class StoreConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How a store lays out, keeps and refuses data. Sizes in bytes, times in ms, ratios in 0..1.

    Attributes:
        mapped_file_size_commit_log: bytes per commit log segment file.
        mapped_file_size_consume_queue: entries (20 bytes each) per consume queue file.
        max_hash_slot_num: hash slots per index file.
        max_index_num: entries per index file.
        message_index_enable: build the key / message id index.
        file_reserved_time_ms: segments older than this are deleted (at ``delete_when`` or under
            disk pressure).
        delete_when: local hours of the day (``"04"`` or ``"03;04"``) when expired segments go.
        disk_max_used_space_ratio: above it, expired segments go at once.
        disk_space_clean_forcibly_ratio: above it, the oldest segments go even if not expired;
            below it, writes refused for a full disk are accepted again.
        disk_space_warning_level_ratio: above it, appends raise ``DiskFull``.
        delete_files_batch_max: most segments deleted per retention round.
        clean_needed_under_pressure: above the clean-forcibly ratio, delete segments even if a
            retention hook still needs them (logged as an error naming the hook). When false the
            store keeps them and refuses writes once the warning level is reached.
        store_host: ``ip:port`` written into every record as its store host.
        warm_mapped_file_enable: keep 2-4 MiB of zeros written ahead of the commit log's end
            (docs/storage.md, "Zeros written ahead"): a lone durable append's latency was 0.85-0.90x
            in the benchmark, a CPU-bound sync-flush load's throughput 0.90x (median of seven
            pairs, within noise), so it is off by default, as RocketMQ's ``warmMapedFileEnable``
            is. Recovery drops such zeros either way.
    """

    mapped_file_size_commit_log: int = limits.COMMIT_LOG_SEGMENT_BYTES
    mapped_file_size_consume_queue: int = limits.CONSUME_QUEUE_FILE_ENTRIES
    max_hash_slot_num: int = limits.INDEX_HASH_SLOTS
    max_index_num: int = limits.INDEX_ENTRIES_MAX
    message_index_enable: bool = True
    file_reserved_time_ms: int = limits.FILE_RESERVED_TIME_MS
    delete_when: str = limits.DELETE_WHEN
    disk_max_used_space_ratio: float = limits.DISK_MAX_USED_SPACE_RATIO
    disk_space_clean_forcibly_ratio: float = limits.DISK_SPACE_CLEAN_FORCIBLY_RATIO
    disk_space_warning_level_ratio: float = limits.DISK_SPACE_WARNING_LEVEL_RATIO
    delete_files_batch_max: int = limits.DELETE_FILES_BATCH_MAX
    clean_needed_under_pressure: bool = True
    store_host: str = ""
    warm_mapped_file_enable: bool = False

    def validate(self) -> StoreConfig:
        """Check ranges; return self. Raises ConfigError."""
        if self.mapped_file_size_commit_log < limits.COMMIT_LOG_SEGMENT_BYTES_MIN:
            raise ConfigError(f"mapped_file_size_commit_log must be at least "
                              f"{limits.COMMIT_LOG_SEGMENT_BYTES_MIN} bytes")
        for name in ("mapped_file_size_consume_queue", "max_hash_slot_num", "max_index_num",
                     "file_reserved_time_ms", "delete_files_batch_max"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not (0 < self.disk_max_used_space_ratio <= self.disk_space_clean_forcibly_ratio
                <= self.disk_space_warning_level_ratio <= 1):
            raise ConfigError("need 0 < disk_max_used_space_ratio <= disk_space_clean_forcibly_ratio"
                              " <= disk_space_warning_level_ratio <= 1")
        parse_delete_when(self.delete_when)
        return self


def parse_delete_when(spec: str) -> frozenset[int]:
    """``"04"`` or ``"03;04"`` → the set of hours. Raises ConfigError."""
    try:
        hours = frozenset(int(tok) for tok in spec.split(";") if tok.strip())
    except ValueError as exc:
        raise ConfigError(f"delete_when {spec!r} is not ';'-separated hours") from exc
    if not hours or not all(0 <= h <= 23 for h in hours):
        raise ConfigError(f"delete_when {spec!r}: hours must be 0..23")
    return hours


def is_delete_hour(delete_when: str, local_hour: int) -> bool:
    """Whether ``local_hour`` (0..23) is one of RocketMQ's ``deleteWhen`` hours."""
    return local_hour in parse_delete_when(delete_when)
