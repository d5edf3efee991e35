"""The state table: 1 byte per key on disk, a bounded window in memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq import limits
from txmq.store import FileStore
from txmq.store._table import FileStateTable


def test_values_survive_a_reopen_and_the_window_stays_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "TX_STATE_WINDOW_ENTRIES", 100)
    t = FileStateTable(tmp_path / "t.table")
    for k in range(0, 1000, 3):
        t.set(k, 1 + k % 3)
        assert len(t._window) < 100
    assert t.get(3) == 1 and t.get(4) == 0 and t.get(10**9) == 0
    t.sync()
    t.close()
    t = FileStateTable(tmp_path / "t.table")
    assert [(k, v) for k, v in t.items() if k < 10] == [(0, 1), (3, 1), (6, 1), (9, 1)]
    t.reset()
    assert t.get(3) == 0 and t.items() == []
    t.close()


def test_a_store_keeps_its_tables_until_closed(tmp_path: Path) -> None:
    s = FileStore(tmp_path)
    s.state_table("x").set(5, 2)
    assert s.state_table("x").get(5) == 2
    s.close()
    s = FileStore(tmp_path)
    assert s.state_table("x").get(5) == 2  # close wrote the window
    s.close()


def test_windows_dense_or_sparse_write_their_values_and_leave_the_others_as_they_were(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense window is written as one span (the keys between keep what the file holds), a
    sparse one run by run; whichever, after every sync the file holds what a dict of every
    value set holds (random windows over values written earlier, past the file's end too)."""
    import random

    monkeypatch.setattr(limits, "TX_STATE_WINDOW_ENTRIES", 10**6)  # windows end at each sync
    rng = random.Random(7)
    t = FileStateTable(tmp_path / "t.table")
    model: dict[int, int] = {}
    for rnd in range(60):
        lo = rng.randrange(0, 5000)
        span = rng.choice((1, 3, 40, 5000))  # neighbours, gaps, and keys far apart
        for _ in range(rng.randrange(1, 40)):
            k = lo + rng.randrange(span) * (1 + rnd % 5)
            model[k] = t_value = rng.randrange(0, 4)
            t.set(k, t_value)
        t.sync()
        data = (tmp_path / "t.table").read_bytes()
        assert {k: data[k] for k in range(len(data)) if data[k]} == \
            {k: v for k, v in model.items() if v}
        assert all(t.get(k) == v for k, v in model.items())
    t.close()
