"""Restart time of a broker against its settled transaction history (issue 11: "Restart time grows
with history"): a data directory with N settled transactions and a fixed number pending, closed
cleanly (or killed), then opened again: ``FileStore(...)`` + ``Broker(...)``, best of three.

Usage::

    uv run --locked python benchmarks/tx_restart.py [--settled 0,50000,200000] [--pending 1000]

Prints one row per N: restart with the transaction index snapshot, the same with the snapshot
removed (the full replay base did on every start), and the ratio to N = 0.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path

import msgspec

from txmq.broker import Broker, BrokerConfig
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    EndTransactionRequestHeader,
)
from txmq.store import FileStore, Record

NOW = 1_700_000_000_000
BATCH = 1000


def _cfg() -> BrokerConfig:
    return msgspec.convert({"topics": {"t": 4}}, BrokerConfig).validate()


def _halves(b: Broker, n: int, seq: int) -> list[tuple[int, int]]:
    recs = [b.tx.half_record(Record(topic="t", queue_id=i % 4, body=b"x" * 100,
                                    properties={PROPERTY_UNIQ_KEY: f"M{seq + i:010d}",
                                                PROPERTY_TRANSACTION_PREPARED: "true"},
                                    born_timestamp_ms=NOW, store_timestamp_ms=NOW), "pg", "c1")
            for i in range(n)]
    results = b.append(recs)
    for r, res in zip(recs, results, strict=True):
        b.tx.on_half_stored(r, res)
    return [(res.queue_offset, res.commit_log_offset) for res in results]


def build(root: Path, settled: int, pending: int) -> None:
    store = FileStore(root)
    b = Broker(_cfg(), store, NOW)
    seq = 0
    while seq < settled:
        n = min(BATCH, settled - seq)
        offs = _halves(b, n, seq)
        b.tx.end_many([EndTransactionRequestHeader(
            producer_group="pg", tran_state_table_offset=q, commit_log_offset=c,
            commit_or_rollback=TRANSACTION_COMMIT_TYPE) for q, c in offs], NOW)
        store.flush()
        seq += n
    _halves(b, pending, seq)
    store.flush()
    b.persist_offsets()
    store.close()


def restart_s(root: Path, snapshot: bool) -> float:
    best = float("inf")
    snap = root / "meta" / "transactionIndex.snapshot"
    saved = snap.read_bytes() if snap.exists() else None
    for _ in range(3):
        if not snapshot:
            snap.unlink(missing_ok=True)
        elif saved is not None:
            snap.write_bytes(saved)
        t0 = time.perf_counter()
        store = FileStore(root)
        b = Broker(_cfg(), store, NOW)
        best = min(best, time.perf_counter() - t0)
        assert len(b.tx.index.pending) >= 0
        store.close()
    if saved is not None:
        snap.write_bytes(saved)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settled", default="0,50000,200000")
    ap.add_argument("--pending", type=int, default=1000)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    print("| settled | pending | restart (snapshot) ms | ratio | restart (full replay) ms | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    base_snap = base_full = 0.0
    for n in (int(x) for x in args.settled.split(",")):
        tmp = Path(tempfile.mkdtemp(prefix="txmq-restart-"))
        try:
            build(tmp, n, args.pending)
            snap, full = restart_s(tmp, True), restart_s(tmp, False)
        finally:
            shutil.rmtree(tmp)
        base_snap, base_full = base_snap or snap, base_full or full
        print(f"| {n:,} | {args.pending:,} | {snap * 1000:.1f} | {snap / base_snap:.2f} | "
              f"{full * 1000:.1f} | {full / base_full:.2f} |", flush=True)


if __name__ == "__main__":
    main()
