"""Fixtures of the third-party client conformance tests.

``cpp_python`` builds (once, cached; see ``client_envs.rocketmq_cpp``) the separate environment with the
RocketMQ C++ client core. When it cannot be built (no PyPI, an unsupported platform) the tests are
skipped with the reason, never silently, and with ``TXMQ_REQUIRE_ROCKETMQ_CPP=1`` (set by ``.ci/run``)
they fail instead: CI must run them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq_cpp_helpers import DELAY_LEVELS, FAST_TX, CppClient, CppFactory

from client_envs.rocketmq_cpp import CppClientUnavailable, ensure_env
from txmq.testing import BrokerProcess, run_broker

REQUIRE_ENV = "TXMQ_REQUIRE_ROCKETMQ_CPP"
TOPIC_QUEUES = 4


@pytest.fixture(scope="session")
def cpp_python() -> Path:
    try:
        return ensure_env()
    except CppClientUnavailable as e:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the RocketMQ C++ client environment cannot be built: {e}")
        pytest.skip(f"RocketMQ C++ client environment cannot be built here (is PyPI reachable?): {e}")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A txmq broker answering route lookups itself (``namesrvAddr`` = the broker)."""
    topics = {name: TOPIC_QUEUES for name in ("cpp-tx", "cpp-plain", "cpp-retry", "cpp-mixed")}
    with run_broker(tmp_path / "broker", topics=topics, message_delay_level=DELAY_LEVELS, **FAST_TX) as b:
        yield b


@pytest.fixture
def cpp(cpp_python: Path, broker: BrokerProcess, tmp_path: Path) -> Iterator[CppFactory]:
    """``cpp("produce", "--topic", ...)`` starts a scenario process against ``broker``; every process
    still running at the end of the test is killed."""
    started: list[CppClient] = []
    n = itertools.count()

    def start(command: str, *args: str) -> CppClient:
        c = CppClient(cpp_python, broker.endpoints, command, *args,
                      log_path=tmp_path / f"cpp-{next(n)}-{command}.log")
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()
