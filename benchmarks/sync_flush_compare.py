"""Sync-flush send throughput of the checkout it runs in, with a load generator that costs the
same in every checkout: each of 4 producers builds 4,096 requests before the run and sends them in
turn (64 in flight), so the broker, not the encoding of requests, is what is measured. A checkout
whose ``txmq bench send`` still encodes each request as it goes (before issue 12) is given the same
pre-built generator here. Prints one JSON line: acknowledged messages/s and the broker's CPU µs per
message, over 4 s after a 1 s warm-up. Run it alternately in two checkouts::

    uv run --locked python benchmarks/sync_flush_compare.py
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.cli import _bench_send as b

N = 4096
PRODUCERS = 4
IN_FLIGHT = 64
SECONDS = 4.0


def _makers() -> list[Callable[[int], tuple[bytes, int]]]:
    body = os.urandom(1024)
    raw = [b._send_maker(p, body, 1) for p in range(PRODUCERS)]
    if hasattr(b, "_FRAMES_PER_PRODUCER"):
        return raw

    def pre(m: Callable[[int], tuple[bytes, int]]) -> Callable[[int], tuple[bytes, int]]:
        frames = [m(i)[0] for i in range(N)]
        return lambda i: (frames[i % N], 1)

    def _next(self: Any) -> bytes:
        self.sent += 1
        frame, n = self.make(self.sent)
        self.carried[self.sent % N] = n
        return bytes(frame)

    b._Pipeline._next = _next  # type: ignore[method-assign]
    return [pre(m) for m in raw]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (rate, cpu), _ = b._broker_send("SYNC_FLUSH", _makers(), IN_FLIGHT, SECONDS, Path(tmp) / "s")
    print(json.dumps({"rate": round(rate), "cpu_us_per_msg": round(cpu or 0.0, 1)}))


if __name__ == "__main__":
    main()
