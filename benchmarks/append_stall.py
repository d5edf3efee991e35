"""How long an append (``os.pwrite`` of 4 KiB) takes while another thread fdatasyncs the same file
back to back, as the broker's loop and flusher thread do: appending past the end of the file (the
commit log today, ``store/_commitlog.py``) against overwriting a file zero-filled beforehand (what
RocketMQ's pre-allocated, warmed segments give, ``MappedFile.warmMappedFile``). Prints one JSON
line per run (wall-clock µs of each append, the longest stall in ms, the fsyncs done meanwhile)::

    uv run --locked python benchmarks/append_stall.py [--appends 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

APPEND_BYTES = 4096
ZEROS_BYTES = 1 << 20


def run(zero_filled: bool, appends: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as d:
        fd = os.open(os.path.join(d, "log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if zero_filled:
            for _ in range(appends * APPEND_BYTES // ZEROS_BYTES + 1):
                os.write(fd, bytes(ZEROS_BYTES))
            os.fsync(fd)
        stop = threading.Event()
        syncs = [0]

        def flusher() -> None:
            while not stop.is_set():
                os.fdatasync(fd)
                syncs[0] += 1

        t = threading.Thread(target=flusher)
        t.start()
        data, lat = os.urandom(APPEND_BYTES), []
        for i in range(appends):
            t0 = time.perf_counter()
            os.pwrite(fd, data, i * APPEND_BYTES)
            lat.append(time.perf_counter() - t0)
        stop.set()
        t.join()
        os.close(fd)
    lat.sort()
    return {"zero_filled": zero_filled, "mean_us": round(statistics.mean(lat) * 1e6, 1),
            "p50_us": round(lat[len(lat) // 2] * 1e6, 1), "p99_us": round(lat[len(lat) * 99 // 100] * 1e6, 1),
            "max_ms": round(lat[-1] * 1e3, 2), "fsyncs": syncs[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for _ in range(args.rounds):
        for zero_filled in (False, True):
            print(json.dumps(run(zero_filled, args.appends)), flush=True)


if __name__ == "__main__":
    main()
