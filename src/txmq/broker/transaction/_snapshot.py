"""The transaction index snapshot: what recovery needs besides the log after ``log_offset``.

Saved with the consumer offsets (``Broker.prepare_persist``, every few seconds by the broker
shell's writer thread, and at shutdown) as ``meta/transactionIndex.snapshot``, after the state table
of decided outcomes is fsynced::

     +-----------------+-----------------+-----------------+-----------------------+
     | magic  u32      | crc32c  u32     | length  u32     | payload (msgpack)     |
     +-----------------+-----------------+-----------------+-----------------------+

Its size is O(pending transactions) (plus discarded ones and committed Spark sink batches, which
operators and sinks look up). On start the broker loads it and replays only the transaction records
stored at or after ``log_offset``; a snapshot ahead of the log (a crash cut the log below it) is
quarantined and the index is rebuilt from the whole log, as without a snapshot.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import crc32c
import msgspec

from txmq import limits
from txmq.broker.transaction._index import HalfEntry
from txmq.errors import CorruptRecord
from txmq.store.codec import seal, unseal

__all__ = ["TxSnapshot", "decode_snapshot", "encode_snapshot", "snapshot_parts"]

_MAGIC = 0x54585349  # "TXSI"


class TxSnapshot(msgspec.Struct, array_like=True, kw_only=True):
    """The index as of commit log offset ``log_offset`` (every record below it is reflected).

    Attributes:
        pending: pending half messages, with their check counts and schedule.
        discarded: half offset → commit log offset of its copy in TRANS_CHECK_MAX_TIME_TOPIC.
        discarded_ids: message id → half offset of discarded transactions.
        resumed: half offsets of discarded transactions an operator resumed.
        settled_counts: decided transactions per outcome (metrics).
        sink_committed: batch → committed task attempts.
        torn: batch → (tasks, halves) that a recovered marker still has to settle.
    """

    version: int
    log_offset: int
    pending: list[HalfEntry]
    discarded: dict[int, int]
    discarded_ids: dict[str, int]
    resumed: list[int]
    settled_counts: dict[str, int]
    sink_committed: dict[str, dict[str, int]]
    torn: dict[str, tuple[dict[str, int], dict[str, list[int]]]]


class _Tail(msgspec.Struct, array_like=True):
    """The fields of :class:`TxSnapshot` after ``pending``, encoded as its array's tail."""

    discarded: dict[int, int]
    discarded_ids: dict[str, int]
    resumed: list[int]
    settled_counts: dict[str, int]
    sink_committed: dict[str, dict[str, int]]
    torn: dict[str, tuple[dict[str, int], dict[str, list[int]]]]


_dec = msgspec.msgpack.Decoder(TxSnapshot)
_enc = msgspec.msgpack.Encoder()
_HEAD = struct.Struct(">III")
"""``magic | crc32c | length``: :func:`txmq.store.codec.seal`'s header (a test holds them equal)."""


def _array_head(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (fixarray, array 16, array 32)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _no_pause() -> None:
    return None


def encode_snapshot(snap: TxSnapshot) -> bytes:
    """The snapshot file's bytes (:func:`txmq.store.codec.seal`)."""
    return seal(_MAGIC, snap)


def snapshot_parts(snap: TxSnapshot, pause: Callable[[], None] = _no_pause
                   ) -> list[bytes | memoryview]:
    """:func:`encode_snapshot`'s bytes in parts, to be written in order (``Store.save_meta``
    takes them), built without one large copy: the pending halves are encoded
    ``limits.TX_SNAPSHOT_ENCODE_CHUNK`` at a time and ``pause`` is called after each chunk (an
    encode holds the GIL: on a writer thread, ``pause`` lets the event loop run between chunks);
    the CRC32C is computed part by part."""
    n_fields = len(TxSnapshot.__struct_fields__)
    entries = snap.pending
    parts: list[bytes | memoryview] = [
        _array_head(n_fields) + _enc.encode(snap.version) + _enc.encode(snap.log_offset)
        + _array_head(len(entries))]
    chunk = limits.TX_SNAPSHOT_ENCODE_CHUNK
    for i in range(0, len(entries), chunk):
        part = entries[i:i + chunk]
        parts.append(memoryview(_enc.encode(part))[len(_array_head(len(part))):])
        pause()
    tail = _Tail(snap.discarded, snap.discarded_ids, snap.resumed, snap.settled_counts,
                 snap.sink_committed, snap.torn)
    parts.append(memoryview(_enc.encode(tail))[len(_array_head(n_fields - 3)):])
    crc = length = 0
    for p in parts:
        crc = crc32c.crc32c(p, crc)
        length += len(p)
    return [_HEAD.pack(_MAGIC, crc, length), *parts]


def decode_snapshot(data: bytes) -> TxSnapshot:
    """Parse a snapshot file. Raises CorruptRecord on any damage or an unknown version."""
    snap = unseal(_MAGIC, data, _dec, "transaction index snapshot")
    if snap.version != limits.TX_SNAPSHOT_VERSION:
        raise CorruptRecord(f"transaction index snapshot version {snap.version} is not "
                            f"{limits.TX_SNAPSHOT_VERSION}")
    return snap
