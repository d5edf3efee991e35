"""Script form of ``txmq bench send`` (same measurements, same JSON keys).

    uv run --locked python benchmarks/bench_send.py [--seconds 5] [--json bench-send.json]

See ``txmq bench send --help`` for every option and docs/bench-send.md for the figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from txmq.cli._bench_send import bench_send


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    r = bench_send(args.seconds, args.producers, args.in_flight, args.message_bytes)
    text = json.dumps(r, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
