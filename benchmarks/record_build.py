"""CPU of building one stored record: a 1 KiB body, two properties and keys, as a send stores it.

Prints the process CPU µs per record (``time.process_time``, so other work on the machine counts
less than with a wall clock), best of 7 rounds of 100,000. In a checkout before issue #24 (the
txmq record, ``encode_record`` with the offset) it times that; after it,
``encode_record`` + ``place_record`` (the RocketMQ MessageExt record with its ``__CRC32#``
property). Run it alternately in two checkouts::

    uv run --locked python benchmarks/record_build.py
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from typing import Any

from txmq.store import Record, codec

ROUNDS = 7
NUMBER = 100_000
STORE_HOST = "127.0.0.1:10911"


def _builder(rec: Record) -> Callable[[], Any]:
    c: Any = codec
    if not hasattr(c, "place_record"):  # before issue #24: the offset is known up front
        host = c.host_bytes(STORE_HOST)
        return lambda: c.encode_record(rec, 4096, host)

    def build() -> bytearray:
        buf: bytearray = c.encode_record(rec, STORE_HOST)
        c.place_record(buf, 0, len(buf), 4096)
        return buf
    return build


def main() -> None:
    rec = Record(topic="orders", queue_id=1, body=b"x" * 1024, keys="order-12345",
                 properties={"UNIQ_KEY": "AC110001000A2A3B4C5D6E7F80001234", "WAIT": "true"},
                 born_timestamp_ms=1_000_000, store_timestamp_ms=1_000_000,
                 born_host="127.0.0.1:5555", queue_offset=7)
    best = min(timeit.repeat(_builder(rec), timer=time.process_time, number=NUMBER, repeat=ROUNDS))
    print(f"{best / NUMBER * 1e6:.2f} µs CPU per record")


if __name__ == "__main__":
    main()
