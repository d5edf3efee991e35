"""Replay every committed fuzz input (tests/fuzz_corpus/<target>/) through its target: seeds and
the inputs that once found a bug must raise nothing unexpected. Inputs of a KNOWN_OPEN class
(fixed on another branch) xfail with the class name."""

from __future__ import annotations

from pathlib import Path

import pytest
from known_open import KNOWN_OPEN, classify

from txmq.testing.fuzz import TARGETS, replay

CORPUS = Path(__file__).parents[1] / "fuzz_corpus"
FILES = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


def test_every_target_has_a_corpus() -> None:
    assert {p.parent.name for p in FILES} == set(TARGETS)


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_corpus_input(path: Path) -> None:
    exc = replay(path.parent.name, path.read_bytes())
    if exc is None:
        return
    name = classify(exc)
    if name is not None:
        pytest.xfail(f"known-open {name} ({KNOWN_OPEN[name][0]}): {exc!r}"[:300])
    raise exc
