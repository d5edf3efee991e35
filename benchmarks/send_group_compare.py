"""Group commit's three send figures in the checkout it runs in, with the same pre-built load
generator in every checkout (``txmq.cli._bench_send``'s makers, 4,096 frames per producer):

* ``sync``: SEND_MESSAGE_V2, sync flush, 4 producers x 64 in flight (``txmq bench send``'s
  "send, sync flush");
* ``batch``: SEND_BATCH_MESSAGE of 16, sync flush, 4 producers x 4 in flight (its "batch send");
* ``lone``: one producer with one send in flight: messages/s is 1 / the latency of a lone durable
  send (an fsync and a round trip each).

Prints one JSON line per run: messages/s and the broker's CPU µs per message (and for ``lone`` the
mean latency in µs). With ``--perf`` (needs ``perf`` and the right to trace the broker), also the
broker's ``fdatasync`` calls (fsync groups) and ``epoll_pwait`` calls (uvloop's event loop turns) per 1,000
messages over the same measured seconds. Run it alternately in two checkouts::

    uv run --locked python benchmarks/send_group_compare.py [--seconds 3] [--perf] [sync batch lone]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from txmq.cli import _bench_send as b

RUNS = {"sync": (1, 4, 64), "batch": (16, 4, 4), "lone": (1, 1, 1)}
"""run -> (messages per request, producers, requests in flight per producer)."""

EVENTS = {"fsyncs": "syscalls:sys_enter_fdatasync", "turns": "syscalls:sys_enter_epoll_pwait"}


class _Perf:
    """Counts the broker's syscalls between the two CPU readings ``_drive`` takes (the measured
    seconds): wraps the bench module's CPU reader (``process_cpu_s``, ``_cpu_s`` before issue 12)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = "process_cpu_s" if hasattr(b, "process_cpu_s") else "_cpu_s"
        self.read = getattr(b, self.name)
        setattr(b, self.name, self._cpu)

    def _cpu(self, pid: int) -> float | None:
        cpu = self.read(pid)
        if self.proc is None:
            self.proc = subprocess.Popen(["perf", "stat", "-x,", "-o", str(self.out), "-p", str(pid),
                                          "-e", ",".join(EVENTS.values())])
        else:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait()
            self.proc = None
        return cpu

    def counts(self) -> dict[str, int]:
        by_event = {line.split(",")[2]: int(line.split(",")[0])
                    for line in self.out.read_text().splitlines() if line.count(",") > 2}
        return {k: by_event[e] for k, e in EVENTS.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--perf", action="store_true", help="count fsyncs and loop turns (perf)")
    ap.add_argument("runs", nargs="*", help=f"any of {', '.join(RUNS)} (default: all)")
    args = ap.parse_args()
    unknown = set(args.runs) - set(RUNS)
    if unknown:
        ap.error(f"unknown runs: {sorted(unknown)}")
    body = os.urandom(1024)
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs or list(RUNS):
            batch, producers, in_flight = RUNS[name]
            makers = [b._send_maker(p, body, batch) for p in range(producers)]
            perf = _Perf(Path(tmp) / f"{name}.perf") if args.perf else None
            (rate, cpu), _ = b._broker_send("SYNC_FLUSH", makers, in_flight, args.seconds,
                                            Path(tmp) / name)
            out[name] = round(rate)
            out[f"{name}_cpu_us"] = round(cpu or 0.0, 1)
            if perf is not None:
                setattr(b, perf.name, perf.read)
                n = rate * args.seconds / 1000
                for k, v in perf.counts().items():
                    out[f"{name}_{k}_per_kmsg"] = round(v / n, 1)
            if name == "lone":
                out["lone_latency_us"] = round(1e6 / rate)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
