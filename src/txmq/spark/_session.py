"""A SparkSession that works on this machine and on a standalone cluster (see :func:`spark_session`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SHUFFLE_PARTITIONS", "spark_session"]

SHUFFLE_PARTITIONS: Final = 4
"""``spark.sql.shuffle.partitions``: the demo's and the tests' data is small (2 cores here)."""

_LOOPBACK: Final = frozenset({"127.0.0.1", "localhost", "::1"})


def _is_loopback_master(master: str) -> bool:
    """``local[...]``, or a ``spark://`` master on this machine's loopback address."""
    if master.startswith("local"):
        return True
    hosts = [urlsplit("spark://" + hp).hostname for hp in master.removeprefix("spark://").split(",")]
    return all(h in _LOOPBACK for h in hosts)


def spark_session(app_name: str, master: str = "local[2]",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """Get or create a SparkSession that works on this machine or on a standalone cluster.

    Args:
        app_name: ``spark.app.name``.
        master: ``local[N]`` (default ``local[2]``: the 2 cores of the project's machines) or a
            standalone master ``spark://host:port`` (e.g. :attr:`txmq.testing.SparkCluster.master_url`).
        conf: more Spark settings, applied last (they override the ones below).

    Sets ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` to this interpreter (workers otherwise start
    the system ``python3`` without pyarrow), :data:`SHUFFLE_PARTITIONS` shuffle partitions, the UI
    and console progress bars off, session time zone UTC, ANSI mode on, log level ERROR; the driver
    is bound to loopback (``SPARK_LOCAL_IP``) for ``local`` masters and ``spark://`` masters on
    loopback. For a ``spark://`` master also ``spark.executorEnv.PYSPARK_PYTHON`` (the executors'
    Python: this interpreter's path, which must exist on every worker host, as for a virtualenv at
    the same path) and ``spark.executor.cores=1`` (one executor per core of a worker).
    Takes about 6 s the first time in a process (JVM start); on a cluster, the executors start
    when the first job needs them.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.ansi.enabled", "true")
    )
    if _is_loopback_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if master.startswith("spark://"):
        builder = builder.config("spark.executorEnv.PYSPARK_PYTHON", sys.executable).config(
            "spark.executor.cores", "1")
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
