"""CPU of the sans-IO broker per send: no sockets, no fsync, a ``MemoryStore``.

Times 16,000 SEND_MESSAGE requests of 1 KiB with three properties through ``Broker.handle`` (one
at a time) and ``Broker.handle_sends`` (runs of 16, as the server groups the sends of one read),
best of five rounds, and prints microseconds per send. Run it in two checkouts to compare them::

    uv run --locked python benchmarks/send_core.py
"""

from __future__ import annotations

import time

import msgspec

from txmq.broker import Broker, BrokerConfig
from txmq.protocol import Command, RequestCode, SendMessageRequestHeader, to_ext
from txmq.store import MemoryStore

SENDS = 16_000
RUN = 16
PROPERTIES = {"UNIQ_KEY": "AC110001000A2A3B4C5D6E7F80001234", "KEYS": "order-12345", "WAIT": "true"}


def _requests(first_opaque: int) -> list[Command]:
    ext = to_ext(SendMessageRequestHeader(producer_group="pg", topic="orders", queue_id=-1,
                                          properties=PROPERTIES, born_timestamp_ms=1_000_000))
    return [Command(code=RequestCode.SEND_MESSAGE, opaque=first_opaque + i, ext=ext, body=b"x" * 1024)
            for i in range(SENDS)]


def main() -> None:
    config = msgspec.convert({"topics": {"orders": 4}}, BrokerConfig).validate()
    broker = Broker(config, MemoryStore(), 1_000_000)
    best: dict[str, float] = {}
    for rnd in range(5):
        for mode in ("one at a time", f"runs of {RUN}"):
            cmds = _requests(rnd * 2 * SENDS + (SENDS if mode != "one at a time" else 0))
            t = time.perf_counter()
            if mode == "one at a time":
                for c in cmds:
                    broker.handle(1, c, 1_000_000)
            else:
                for i in range(0, SENDS, RUN):
                    broker.handle_sends(1, cmds[i : i + RUN], 1_000_000)
            per_send_us = (time.perf_counter() - t) / SENDS * 1e6
            best[mode] = min(best.get(mode, float("inf")), per_send_us)
    print("| mode | µs per send (best of 5) |\n|---|---:|")
    for mode, us in best.items():
        print(f"| {mode} | {us:.2f} |")


if __name__ == "__main__":
    main()
