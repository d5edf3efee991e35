"""Storage: the commit log, consume queues and metadata behind one interface."""

from txmq.store._base import AppendResult, Record, Store
from txmq.store._file import FileStore
from txmq.store._memory import MemoryStore

__all__ = ["AppendResult", "FileStore", "MemoryStore", "Record", "Store"]
