"""Apache Spark (PySpark >= 4.2 Python Data Source API) connectors for txmq.

Importing this package does not import pyspark; :func:`register` and attribute access do.

Source ``format("txmq")`` (:class:`txmq.spark._source.TxmqDataSource`): committed messages of one or
more topics, one row per message, as a micro-batch stream (``spark.readStream``: admission control
with ``maxOffsetsPerTrigger``, ``Trigger.AvailableNow``, offsets ``{"<topic>/<queue_id>":
next_offset}`` kept in the Spark checkpoint) or a batch (``spark.read`` with
``startingOffsets``/``endingOffsets``, or by store time with ``startingTimestamp``/``endingTimestamp``).
A replayed offset range yields the same rows. Options, schema and guarantees are documented in
:mod:`txmq.spark._source`; the sink's order and exactly-once in :mod:`txmq.spark._sink`.

Example::

    import txmq.spark

    txmq.spark.register(spark)
    df = (
        spark.readStream.format("txmq")
        .option("endpoints", "127.0.0.1:10911")
        .option("topic", "orders")
        .option("maxOffsetsPerTrigger", "10000")
        .load()
    )

``txmq.spark`` holds only the connectors, :func:`spark_session` and :mod:`txmq.spark.reconcile`;
the demo's TPC-H pipeline is :mod:`txmq.demo.spark_pipeline`.

Workers run in separate Python processes: they must be able to import ``txmq`` (and pyarrow),
e.g. by setting ``PYSPARK_PYTHON`` to the interpreter of this environment.
"""

from __future__ import annotations

from txmq.extras import require_extra as _require_extra

_require_extra("spark", "txmq.spark", "pyspark", "pyarrow", "numpy")

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

from txmq.spark._session import SHUFFLE_PARTITIONS, spark_session

__all__ = ["SHUFFLE_PARTITIONS", "SOURCE_FORMAT", "TxmqDataSource", "register", "spark_session"]

SOURCE_FORMAT = "txmq"
"""The format name of the source: ``spark.readStream.format(SOURCE_FORMAT)``."""


def register(spark: SparkSession) -> None:
    """Register the ``txmq`` source with ``spark`` (required before ``format("txmq")``).

    Registration is per SparkSession and may be repeated. Imports pyspark and pyarrow.
    """
    from txmq.spark._source import TxmqDataSource

    spark.dataSource.register(TxmqDataSource)


def __getattr__(name: str) -> Any:
    """Lazy access to ``TxmqDataSource`` without importing pyspark at package import."""
    if name == "TxmqDataSource":
        from txmq.spark._source import TxmqDataSource

        return TxmqDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
