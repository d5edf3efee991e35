"""CPU of the sans-IO broker per send: no sockets, no fsync, a ``MemoryStore``.

Times 16,000 SEND_MESSAGE_V2 requests of 1 KiB with three properties, built as txmq's SDK builds
them, best of five rounds, and prints microseconds per send for:

* ``handle``: through ``Broker.handle`` one at a time, the command already decoded;
* ``handle_sends``: runs of 16, as the server groups the sends of one read;
* ``wire (JSON)`` / ``wire (ROCKETMQ)``: the same runs from frame bytes, with the header codec
  named: ``FrameDecoder.feed`` + ``handle_sends`` + ``encode_command`` of every reply, which is
  what the server's event loop spends per send.

Run it in two checkouts to compare them::

    uv run --locked python benchmarks/send_core.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from txmq.broker import Broker, BrokerConfig, Reply
from txmq.client._core import send_request_header
from txmq.protocol import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Command,
    FrameDecoder,
    Message,
    RequestCode,
    encode_command,
)
from txmq.store import MemoryStore

SENDS = 16_000
RUN = 16
PROPERTIES = {"UNIQ_KEY": "AC110001000A2A3B4C5D6E7F80001234", "WAIT": "true"}


def _requests(first_opaque: int, serialize_type: int = SERIALIZE_JSON) -> list[Command]:
    msg = Message(topic="orders", body=b"x" * 1024, keys="order-12345", properties=PROPERTIES)
    ext = send_request_header(msg, "pg", -1, 1_000_000)
    return [Command(RequestCode.SEND_MESSAGE_V2, first_opaque + i, ext=ext, body=msg.body,
                    serialize_type=serialize_type) for i in range(SENDS)]


def _one_at_a_time(broker: Broker, cmds: list[Command]) -> Callable[[], None]:
    def run() -> None:
        for c in cmds:
            broker.handle(1, c, 1_000_000)
    return run


def _runs(broker: Broker, cmds: list[Command]) -> Callable[[], None]:
    def run() -> None:
        for i in range(0, SENDS, RUN):
            broker.handle_sends(1, cmds[i : i + RUN], 1_000_000)
    return run


def _wire(broker: Broker, cmds: list[Command]) -> Callable[[], None]:
    reads = [b"".join(encode_command(c) for c in cmds[i : i + RUN]) for i in range(0, SENDS, RUN)]

    def run() -> None:
        decoder = FrameDecoder()
        for data in reads:
            for a in broker.handle_sends(1, decoder.feed(data), 1_000_000):
                if isinstance(a, Reply):
                    encode_command(a.command)
    return run


def main() -> None:
    config = msgspec.convert({"topics": {"orders": 4}}, BrokerConfig).validate()
    broker = Broker(config, MemoryStore(), 1_000_000)
    modes = {"handle": (_one_at_a_time, SERIALIZE_JSON), f"handle_sends ({RUN})": (_runs, SERIALIZE_JSON),
             "wire (JSON)": (_wire, SERIALIZE_JSON), "wire (ROCKETMQ)": (_wire, SERIALIZE_ROCKETMQ)}
    best: dict[str, float] = {}
    for rnd in range(5):
        for k, (mode, (make, kind)) in enumerate(modes.items()):
            run = make(broker, _requests((rnd * len(modes) + k) * SENDS, kind))
            t = time.perf_counter()
            run()
            best[mode] = min(best.get(mode, float("inf")), (time.perf_counter() - t) / SENDS * 1e6)
    print("| mode | µs per send (best of 5) |\n|---|---:|")
    for mode, us in best.items():
        print(f"| {mode} | {us:.2f} |")


if __name__ == "__main__":
    main()
