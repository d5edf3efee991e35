"""Fixtures shared by the Spark tests of ``tests/spark`` and ``tests/demo``: one local SparkSession
and one tiny TPC-H data set."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from txmq.demo import tpch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession



def pytest_sessionstart(session: pytest.Session) -> None:
    """With ``TXMQ_REQUIRE_INSTALLED=1`` (``.ci/test``), stop unless txmq is the installed wheel
    (site-packages), not the source tree."""
    import txmq

    where = Path(txmq.__file__).resolve()
    if os.environ.get("TXMQ_REQUIRE_INSTALLED") == "1" and "site-packages" not in where.parts:
        raise pytest.UsageError(f"txmq imported from {where}, not from the installed wheel")


SPARK_TPCH_SF = 0.002
"""3,000 orders, about 12,000 line items: enough for every Q1 group, quick in local Spark."""


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] SparkSession from :func:`txmq.spark.spark_session`, stopped at the end; its JVM
    runs with :data:`txmq.testing.FAST_START_JAVA_OPTIONS` (the tests' jobs last seconds)."""
    from txmq.spark import spark_session
    from txmq.testing import FAST_START_JAVA_OPTIONS

    session = spark_session("txmq-tests",
                            conf={"spark.driver.extraJavaOptions": FAST_START_JAVA_OPTIONS})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_tpch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tpch.generate(SPARK_TPCH_SF, tmp_path_factory.mktemp("spark-tpch"))


@pytest.fixture(scope="session")
def spark_orders(spark_tpch_dir: Path) -> list[tpch.Order]:
    return tpch.load_orders(spark_tpch_dir)


@pytest.fixture(autouse=True)
def _txmq_logger_restored() -> Iterator[None]:
    """Each test leaves the ``txmq`` logger's level and propagation as it found them (a test that
    quiets it must not silence the log records a later test asserts on)."""
    logger = logging.getLogger("txmq")
    level, propagate = logger.level, logger.propagate
    yield
    logger.setLevel(level)
    logger.propagate = propagate
