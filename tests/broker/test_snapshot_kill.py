"""A real broker process saving a large transaction index snapshot all the time (every tick, a few
MB each), SIGKILLed at random moments again and again: every start finds a loadable snapshot
(never quarantined), and the index always has every pending transaction.

``TXMQ_SNAPSHOT_KILL_SEED=<seed>`` replays a kill schedule (the machine's timing still varies).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txmq.broker.transaction._snapshot import decode_snapshot
from txmq.store import FileStore, Record
from txmq.testing import BrokerHarness

pytestmark = pytest.mark.slow

PENDING = 20_000
"""Pending halves born now: no check-back settles them during the test (no producer is online)."""
KILLS = 8

_LAUNCH = """
import asyncio, itertools, logging, sys
from txmq import limits
from txmq.broker import BrokerConfig
from txmq.broker.server import run_server
from txmq.broker.transaction import TransactionService
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
limits.CONSUMER_OFFSET_FLUSH_INTERVAL_MS = 0  # save at every tick
_n = itertools.count()
TransactionService._signature = lambda self: (next(_n),)  # and always the whole snapshot
asyncio.run(run_server(BrokerConfig(port=0, data_dir=sys.argv[1], topics={"t": 2}),
                       port_file=sys.argv[2]))
"""


def _build(data: Path) -> None:
    h = BrokerHarness(FileStore(data), now_ms=int(time.time() * 1000), topics={"t": 2})
    recs = [h.broker.tx.half_record(Record(topic="t", queue_id=i % 2, body=b"x" * 100, keys="k",
                                           properties={"UNIQ_KEY": f"M{i:08d}"},
                                           born_timestamp_ms=h.now_ms), "pg", "c1")
            for i in range(PENDING)]
    for i in range(0, PENDING, 1000):
        for r, res in zip(recs[i:i + 1000], h.broker.append(recs[i:i + 1000]), strict=True):
            h.broker.tx.on_half_stored(r, res)
    h.broker.persist_offsets()
    h.store.close()


def test_sigkill_during_snapshot_saves_never_leaves_an_unloadable_snapshot(tmp_path: Path) -> None:
    seed = int(os.environ.get("TXMQ_SNAPSHOT_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    data = tmp_path / "data"
    _build(data)
    log_path = tmp_path / "broker.log"
    for kill in range(KILLS):
        port_file = tmp_path / "port"
        port_file.unlink(missing_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(data), str(port_file)],
                                    stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, f"seed {seed}: broker died at start; see {log_path}"
            assert time.monotonic() < deadline, f"seed {seed}: broker did not start"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.15, 0.9))  # some saves, then a kill in the middle of one, or not
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        snap = decode_snapshot((data / "meta" / "transactionIndex.snapshot").read_bytes())
        assert len(snap.pending) == PENDING, f"seed {seed}, kill {kill}"
    text = log_path.read_text()
    assert "snapshot unusable" not in text, f"seed {seed}: {text[-2000:]}"
    assert text.count("transaction index recovered") == KILLS
    assert not (data / "quarantine").exists() or not any((data / "quarantine").iterdir())
    h = BrokerHarness(FileStore(data), topics={"t": 2})
    assert len(h.broker.tx.index.pending) == PENDING
    h.store.close()
