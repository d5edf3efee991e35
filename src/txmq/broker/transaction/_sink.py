"""Micro-batches of a transactional Spark sink: an atomic, idempotent commit per (sink, batch).

A sink task stores its rows as half messages tagged ``TXMQ_SINK_BATCH = "<sink id>/<batch id>"`` and
``TXMQ_SINK_TASK = "<partition>.<attempt>"``. The driver's commit names the task attempts Spark
accepted and how many rows each wrote; the broker then

1. writes a batch marker (``TXMQ_SINK_BATCH_TOPIC``) naming those task attempts — the marker, written
   first, is the decision;
2. commits every pending half of those attempts (real message + op record);
3. rolls back every other pending half of the batch (failed or duplicate attempts: orphans),

and answers once all of it is durable.

A second commit of a committed batch (Spark re-runs a batch after a failure, docs/pyspark.md §3)
rolls back the re-run's halves and answers "committed before"; an abort after a commit changes
nothing. Sink halves are never checked back with a producer: when their immunity time (the sink's
timeout) passes without a commit, the broker rolls them back itself. Recovery re-commits the halves
of a marker whose real messages were torn off by a crash, so a batch is all or nothing.
"""

from __future__ import annotations

import msgspec

from txmq.protocol import SINK_BATCH_TOPIC

__all__ = ["PROPERTY_TXMQ_SINK_BATCH", "PROPERTY_TXMQ_SINK_TASK", "SINK_BATCH_TOPIC", "BatchMarker",
           "SinkBatches"]

PROPERTY_TXMQ_SINK_BATCH = "TXMQ_SINK_BATCH"
PROPERTY_TXMQ_SINK_TASK = "TXMQ_SINK_TASK"


class BatchMarker(msgspec.Struct, array_like=True):
    """Body of a marker record: the batch and the task attempts (task key → row count) it commits."""

    batch: str
    tasks: dict[str, int]


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(BatchMarker)


def encode_marker(m: BatchMarker) -> bytes:
    return _enc.encode(m)


def decode_marker(data: bytes) -> BatchMarker:
    return _dec.decode(data)


class SinkBatches:
    """Pending sink halves grouped by batch and task attempt, and the committed batches."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, dict[int, None]]] = {}
        """batch key → task key → pending half offsets (an ordered set, in append order)."""
        self.committed: dict[str, dict[str, int]] = {}
        """batch key → the task attempts its marker committed."""

    def add(self, batch: str, task: str, half_offset: int) -> None:
        self.pending.setdefault(batch, {}).setdefault(task, {})[half_offset] = None

    def remove(self, batch: str, task: str, half_offset: int) -> None:
        tasks = self.pending.get(batch)
        if tasks is None or task not in tasks:
            return
        offsets = tasks[task]
        offsets.pop(half_offset, None)
        if not offsets:
            del tasks[task]
        if not tasks:
            del self.pending[batch]

    def halves(self, batch: str) -> dict[str, list[int]]:
        """A copy of the pending halves of ``batch`` by task attempt."""
        return {t: list(offs) for t, offs in self.pending.get(batch, {}).items()}
