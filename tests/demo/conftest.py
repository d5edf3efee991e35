"""Fixtures for the demo tests: one tiny TPC-H data set per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq.demo import tpch

TINY_SF = 0.001
"""1,500 orders, about 6,000 line items."""


@pytest.fixture(scope="session")
def tpch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tpch.generate(TINY_SF, tmp_path_factory.mktemp("tpch"))


@pytest.fixture(scope="session")
def tiny_orders(tpch_dir: Path) -> list[tpch.Order]:
    return tpch.load_orders(tpch_dir)
