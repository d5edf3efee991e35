"""The standalone Spark cluster of the cluster tests: a master and two workers of one core each,
separate JVMs started once per session (:class:`txmq.testing.SparkCluster`). Its JVMs (daemons and
executors) run with :data:`txmq.testing.FAST_START_JAVA_OPTIONS`: the tests' jobs last seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from txmq.testing import FAST_START_JAVA_OPTIONS, SparkCluster


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """Two workers of 1 core and 1g each; stopped (every process group killed) at the end."""
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores_per_worker=1,
                      java_options=FAST_START_JAVA_OPTIONS) as c:
        yield c
