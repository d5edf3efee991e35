"""Storage: the commit log, consume queues, index, checkpoint and retention behind one interface.

:class:`FileStore` is the durable engine; :class:`MemoryStore` is its in-memory model (same offsets,
same segment rolling), used by the contract suite and the sans-IO simulations.
"""

from txmq.extras import require_extra as _require_extra

_require_extra("broker", "txmq.store", "crc32c")

from txmq.store._base import (
    AppendResult,
    CleanReport,
    DiskStatus,
    RawRead,
    Record,
    RetentionHook,
    Store,
)
from txmq.store._check import StoreCheck, check_store, repair_store
from txmq.store._codec import tag_hash
from txmq.store._commitlog import read_commit_log
from txmq.store._config import StoreConfig, is_delete_hour
from txmq.store._epoch import EpochCache, EpochEntry, EpochFile, write_durably
from txmq.store._file import FileStore
from txmq.store._memory import MemoryStore
from txmq.store._migrate import MigrateReport, migrate_store, needs_migration
from txmq.store._recovery import RecoveryReport
from txmq.store._table import StateTable

__all__ = [
    "AppendResult",
    "CleanReport",
    "DiskStatus",
    "EpochCache",
    "EpochEntry",
    "EpochFile",
    "FileStore",
    "MemoryStore",
    "MigrateReport",
    "RawRead",
    "Record",
    "RecoveryReport",
    "RetentionHook",
    "StateTable",
    "Store",
    "StoreCheck",
    "StoreConfig",
    "check_store",
    "is_delete_hour",
    "migrate_store",
    "needs_migration",
    "read_commit_log",
    "repair_store",
    "tag_hash",
    "write_durably",
]
