"""The reference source of ``txmq bench spark``: the best a Python streaming data source can do.

``format("txmq-reference")`` is a minimal PySpark streaming source with the ``txmq`` source's
schema and partitioning (one partition per queue) whose ``read`` only hands over Arrow record
batches that are already in memory. Its rows/s is the ceiling of PySpark's Python data source API
on a machine: whatever the ``txmq`` source does on top (network, broker, decoding) shows as the
ratio ``source / reference`` below 1.

"Already in memory": before timing, :func:`write_reference` writes each queue's batches, exactly
the ones the ``txmq`` source yielded for that queue, as one Arrow IPC file under ``/dev/shm``
(tmpfs, so RAM). ``read`` runs in Spark's Python worker, another process than the one that built
them, so the batches must cross a process boundary somehow; it memory-maps the file and yields its
batches without copying or decoding (Arrow IPC is Arrow's in-memory layout). Pickling the batches
into the partition instead would make Spark ship them through the JVM with the task, which costs
more than the mapping. The files must be on the host that runs the executors (``local[*]``, or a
standalone cluster whose workers share the host, as ``txmq.testing.SparkCluster`` does).

Option ``path``: the directory :func:`write_reference` filled. Offsets are ``{"<queue>": rows}``.

The module imports nothing of txmq: Spark imports it in the Python process it starts for each
streaming query (its source runner) and in every Python worker, and ``txmq.cli`` (where the
benchmark lives) would cost them seconds of imports that are not the API's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

__all__ = ["SCHEMA_DDL", "ReferenceDataSource", "write_reference"]

_COUNTS = "counts.json"

SCHEMA_DDL = (
    "key STRING, tags STRING, body BINARY, topic STRING, queue_id INT, queue_offset BIGINT, "
    "message_id STRING, born_timestamp TIMESTAMP, store_timestamp TIMESTAMP, "
    "properties MAP<STRING,STRING>"
)
"""The ``txmq`` source's schema (``txmq.spark._source.SCHEMA_DDL``, copied: see the docstring)."""


def write_reference(directory: Path, queues: Iterable[tuple[int, Iterable[pa.RecordBatch]]]) -> int:
    """Write each ``(queue_id, batches)`` to ``directory/<queue_id>.arrow`` (Arrow IPC file) and
    the row counts to ``counts.json``; returns the total rows. Put ``directory`` on a tmpfs."""
    directory.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for queue_id, batches in queues:
        rows, writer = 0, None
        with pa.OSFile(str(directory / f"{queue_id}.arrow"), "wb") as sink:
            for batch in batches:
                if writer is None:
                    writer = pa.ipc.new_file(sink, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is not None:
                writer.close()
        counts[str(queue_id)] = rows
    (directory / _COUNTS).write_text(json.dumps(counts))
    return sum(counts.values())


@dataclass(frozen=True)
class _QueueFile(InputPartition):
    path: str


class _ReferenceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"<queue>": rows}``: all rows are available at once; one partition per queue."""

    def __init__(self, directory: str) -> None:
        self._dir = Path(directory)
        self._counts: dict[str, int] = json.loads((self._dir / _COUNTS).read_text())

    def initialOffset(self) -> dict[str, int]:
        return dict.fromkeys(self._counts, 0)

    def prepareForTriggerAvailableNow(self) -> None:
        """Nothing to pin: the files do not grow."""

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return dict(self._counts)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [_QueueFile(str(self._dir / f"{q}.arrow")) for q in sorted(end, key=int)
                if end[q] > start.get(q, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _QueueFile)
        reader = pa.ipc.open_file(pa.memory_map(partition.path))
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release."""


class ReferenceDataSource(DataSource):
    """``format("txmq-reference")``: batches from ``option("path", dir)`` (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "txmq-reference"

    def schema(self) -> str:
        """:data:`SCHEMA_DDL`."""
        return SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _ReferenceStreamReader(self.options["path"])
