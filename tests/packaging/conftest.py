"""Fixtures of the packaging tests: the wheel, uv.lock's versions as constraints, and one fresh
virtualenv per extra set, made once per session and shared by the tests that use it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_helpers import install_venv, uv


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$TXMQ_WHEEL`` (``.ci/test`` builds it once), else one ``uv build --wheel`` of this tree."""
    if os.environ.get("TXMQ_WHEEL"):
        return Path(os.environ["TXMQ_WHEEL"])
    out = tmp_path_factory.mktemp("dist")
    uv("build", "--quiet", "--wheel", "--out-dir", str(out))
    return next(out.glob("txmq-*.whl"))


@pytest.fixture(scope="session")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    uv("export", "--quiet", "--locked", "--all-extras", "--no-dev", "--no-emit-project", "--no-hashes",
       "--output-file", str(path))
    return path


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path,
         constraints: Path) -> Callable[[str], Path]:
    """``venv("outbox")``: the python of a virtualenv holding ``txmq[outbox]`` (``""``: the core
    alone), made on first use and shared for the session."""
    made: dict[str, Path] = {}

    def get(extras: str) -> Path:
        if extras not in made:
            where = tmp_path_factory.mktemp("venv") / (extras.replace(",", "-") or "core")
            made[extras] = install_venv(where, wheel, constraints, extras)
        return made[extras]

    return get
