"""A SparkSession that works on this machine and on a standalone cluster (see :func:`spark_session`)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SHUFFLE_PARTITIONS", "spark_session"]

SHUFFLE_PARTITIONS: Final = 4
"""``spark.sql.shuffle.partitions``: the demo's and the tests' data is small (2 cores here)."""


def spark_session(app_name: str, master: str = "local[2]") -> SparkSession:
    """Get or create a SparkSession that works on this machine.

    Sets ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` to this interpreter (workers otherwise start
    the system ``python3`` without pyarrow), :data:`SHUFFLE_PARTITIONS` shuffle partitions, the UI
    and console progress bars off, session time zone UTC, ANSI mode on, driver bound to loopback
    (``SPARK_LOCAL_IP``) for ``local`` masters, log level ERROR.
    Takes about 6 s the first time in a process (JVM start).
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
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
