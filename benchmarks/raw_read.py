"""The broker's raw read of a consume queue in-process (``FileStore.read_queue_raw``, what a
PULL_MESSAGE reply's body is cut from): CPU µs per record, for 200,000 records of 256-byte bodies
in 4 queues, laid out two ways: ``interleaved`` (neighbouring records belong to different queues,
as a round-robin producer writes them: every record is its own run) and ``runs512`` (batches of
512 to one queue, as ``txmq bench spark`` loads its topic). Pulls of ``--pull`` records, best of
``--rounds`` passes over every queue. Prints one JSON line. With ``TXMQ_PURE_PYTHON=1`` the walk
over the entries is the pure-Python loop instead of ``txmq.store._ccqruns``::

    uv run --locked python benchmarks/raw_read.py [--pull 4096] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from txmq.store import FileStore, Record

ROWS = 200_000
QUEUES = 4
BODY = b"x" * 256


def _load(store: FileStore, layout: str) -> None:
    for i in range(0, ROWS, 512):
        store.append([Record(topic="src", queue_id=(q % QUEUES) if layout == "interleaved"
                             else (i // 512) % QUEUES, body=BODY, keys=str(i + q),
                             born_timestamp_ms=1, store_timestamp_ms=1) for q in range(512)])
    store.flush()


def _pass(store: FileStore, pull: int) -> tuple[float, int]:
    t, n = time.process_time(), 0
    for q in range(QUEUES):
        offset = 0
        while (got := store.read_queue_raw("src", q, offset, pull, 8 << 20)).count:
            n, offset = n + got.count, got.next_offset
    return time.process_time() - t, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pull", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    out: dict[str, float] = {}
    for layout in ("interleaved", "runs512"):
        with tempfile.TemporaryDirectory(prefix="txmq-raw-read-") as d:
            store = FileStore(Path(d))
            _load(store, layout)
            best = min(s / n for s, n in (_pass(store, args.pull) for _ in range(args.rounds)))
            out[f"{layout}_cpu_us_per_record"] = round(best * 1e6, 3)
            store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
