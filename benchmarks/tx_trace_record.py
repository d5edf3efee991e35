"""CPU of the broker's record of transactions' lives alone (``TransactionTraces``, docs/tracing.md
"The broker's leg"): what the sans-IO core adds per transaction its producer commits, the half's
life begun and ended, a ring of the default size full and turning over; best of ``--rounds``.

Usage::

    uv run --locked python benchmarks/tx_trace_record.py [--n 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

from txmq import limits
from txmq.broker.transaction import HalfEntry, TransactionTraces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    entries = [HalfEntry(half_offset=i, commit_log_offset=i * 1_100, producer_group="pg",
                         sender_client_id="10.0.0.1@4242@c0ffee", msg_id=f"AC11000100{i:022X}",
                         real_topic="orders", keys="", born_ms=0, first_check_ms=0,
                         next_check_ms=0) for i in range(args.n)]
    props = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    best = float("inf")
    for _ in range(args.rounds):
        traces = TransactionTraces(limits.TRANSACTION_TRACE_MAX,
                                   limits.TRANSACTION_CHECK_ANSWER_TIMEOUT_MS)
        t0 = time.perf_counter()
        for e in entries:
            traces.half(e, props, 1, "10.0.0.1:50000")
            traces.ended(e, "COMMIT", 2, "producer", e.sender_client_id, "10.0.0.1:50000")
        best = min(best, (time.perf_counter() - t0) / args.n * 1e6)
    print(f"record of one transaction's life (half + end): {best:.2f} µs")


if __name__ == "__main__":
    main()
