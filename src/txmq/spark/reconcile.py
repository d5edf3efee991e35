"""Reconciliation: compare a service's database with what a topic holds, with Spark.

The database side is read through SQLAlchemy (any URL it supports: SQLite, PostgreSQL, MySQL …) and
handed to Spark; the topic side is read with the txmq batch source over its whole offset range, on
every broker group of the topic's route when a name server is given (a topic spread over a cluster).
The join reports

- **missing**: keys the database has (committed business rows) that no message carries;
- **phantom**: keys a message carries that the database does not have;
- **duplicated**: keys carried by more than one message.

A consistent pipeline has all three empty. pyspark is imported lazily. Reading the database needs
SQLAlchemy (the ``outbox`` extra, or ``postgresql`` / ``mysql`` with their drivers) besides ``spark``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from txmq.errors import ConfigError
from txmq.extras import require_extra

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ReconcileReport", "reconcile"]

SAMPLE_KEYS = 20
"""How many example keys of each kind a report lists."""


class ReconcileReport(msgspec.Struct):
    """Counts (and a sample of keys) of each kind of disagreement."""

    topic: str
    db_keys: int
    topic_messages: int
    missing: int
    phantom: int
    duplicated: int
    missing_sample: list[str]
    phantom_sample: list[str]
    duplicated_sample: list[str]

    @property
    def consistent(self) -> bool:
        return self.missing == 0 and self.phantom == 0 and self.duplicated == 0


def _db_keys(url: str, table: str, key_column: str, where: str) -> list[str]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        t = sa.Table(table, sa.MetaData(), autoload_with=engine)
        query = sa.select(t.c[key_column])
        if where:
            query = query.where(sa.text(where))
        with engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(query)]
    finally:
        engine.dispose()


def reconcile(spark: SparkSession, *, endpoints: str = "", topic: str, db_url: str, table: str,
              key_column: str, where: str = "", namesrv_addr: str = "") -> ReconcileReport:
    """Compare ``table.key_column`` (rows matching ``where``) with the keys of ``topic``'s messages.

    ``endpoints`` is a broker (``host:port``), ``namesrv_addr`` name servers (``host:port;…``):
    with name servers, the messages of every broker group holding the topic are read.

    Raises:
        txmq.errors.ConfigError: neither ``endpoints`` nor ``namesrv_addr``.
        txmq.errors.BrokerUnavailable, txmq.errors.RemoteError: the topic cannot be read.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
        txmq.errors.MissingExtra: SQLAlchemy is not installed (``pip install 'txmq[outbox]'``).
    """
    require_extra("outbox", "txmq.spark.reconcile", "sqlalchemy")
    from pyspark.sql import functions as F

    import txmq.spark

    if not endpoints and not namesrv_addr:
        raise ConfigError("reconcile needs endpoints (a broker) or namesrv_addr (name servers)")

    txmq.spark.register(spark)
    reader = spark.read.format("txmq").option("topic", topic)
    if endpoints:
        reader = reader.option("endpoints", endpoints)
    if namesrv_addr:
        reader = reader.option("namesrvAddr", namesrv_addr)
    msgs = (reader
            .option("startingOffsets", "earliest").option("endingOffsets", "latest").load()
            .select(F.col("key").alias("k")))
    db = spark.createDataFrame([(k,) for k in _db_keys(db_url, table, key_column, where)], "k STRING")
    counts = msgs.groupBy("k").count().cache()
    missing = db.join(counts, "k", "left_anti")
    phantom = counts.join(db, "k", "left_anti")
    duplicated = counts.where(F.col("count") > 1)

    def sample(df: Any) -> list[str]:
        return sorted(r["k"] for r in df.orderBy("k").limit(SAMPLE_KEYS).collect())

    report = ReconcileReport(
        topic=topic, db_keys=db.count(), topic_messages=msgs.count(), missing=missing.count(),
        phantom=phantom.count(), duplicated=duplicated.count(), missing_sample=sample(missing),
        phantom_sample=sample(phantom), duplicated_sample=sample(duplicated))
    counts.unpersist()
    return report
