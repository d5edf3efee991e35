"""CPU per record of the consumers' pull reply decoders, outside Spark and without a broker.

    uv run --locked python benchmarks/decode_pull.py [--records 1024 --records 32] [--json F]

Builds a reply body like those of ``txmq bench spark`` (MessageExt records of a 256-byte body,
``KEYS`` = the record's number, a ``UNIQ_KEY``, IPv4 hosts, topic ``src50000``; with
``--crc-property`` RocketMQ 5's ``__CRC32#`` too) and times, in one process, each decoder this
txmq has: the SDK's ``decode_message_exts`` (per record, the specification) and
``decode_message_exts_bulk``, and the Spark source's ``pull_body_to_record_batch`` (reply → Arrow
batch; with the C extension built, its C path and its pure Python path, side by side) against the
per-message path it replaces (``messages_to_record_batch(decode_message_exts(...))``). Each
figure is the lowest of ``--rounds`` rounds of CPU time (``time.process_time``) divided by the
records decoded. Run it from another checkout to compare builds: ``cd ../base && uv run --locked
python ../hc/benchmarks/decode_pull.py``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

import txmq.protocol as protocol
from txmq.protocol import MessageExt, encode_message_exts
from txmq.spark import _arrow


def reply(records: int, crc_property: bool) -> bytes:
    """One pull reply body of ``records`` records (module docstring)."""
    msgs = [MessageExt(topic="src50000", body=b"x" * 256, keys=str(i),
                       properties={"UNIQ_KEY": f"7F000001279367F24F1485BBBE{i:06X}"},
                       queue_id=1, queue_offset=i, commit_log_offset=400 * i,
                       born_timestamp_ms=1_795_734_873_721 + i, store_timestamp_ms=1_795_734_873_722 + i,
                       born_host="127.0.0.1:36732", store_host="127.0.0.1:10911")
            for i in range(records)]
    data = encode_message_exts(msgs)
    if not crc_property:
        return data
    # RocketMQ 5 appends "__CRC32#\u0001" + 10 digits + "\u0002" to the stored properties
    return encode_message_exts([msgspec.structs.replace(
        m, properties=m.properties | {"__CRC32#": "0123456789"}) for m in msgs])


def per_record_us(fn: Callable[[bytes], Any], data: bytes, records: int, rounds: int) -> float:
    """Lowest CPU µs per record of ``fn(data)`` over ``rounds`` rounds of about 0.2 s."""
    reps = max(1, 200_000 // records)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(reps):
            fn(data)
        best = min(best, (time.process_time() - t0) / reps / records * 1e6)
    return round(best, 3)


def decoders() -> dict[str, Callable[[bytes], Any]]:
    out: dict[str, Callable[[bytes], Any]] = {
        "sdk decode_message_exts": protocol.decode_message_exts,
        "spark per-message path": lambda d: _arrow.messages_to_record_batch(
            protocol.decode_message_exts(d)),
        "spark pull_body_to_record_batch": _arrow.pull_body_to_record_batch,
    }
    compiled = getattr(_arrow, "_compiled", None)
    if compiled is not None:  # the C extension's build: time the pure path too, side by side
        out["spark pull_body_to_record_batch (C)"] = out.pop("spark pull_body_to_record_batch")
        out["spark pull_body_to_record_batch (pure Python)"] = _pure(_arrow.pull_body_to_record_batch)
    bulk = getattr(protocol, "decode_message_exts_bulk", None)
    if bulk is not None:
        out["sdk decode_message_exts_bulk"] = bulk
    return out


def _pure(fn: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``fn`` run with the C extension unused (``txmq.spark._arrow``'s numpy path)."""
    def run(data: bytes) -> Any:
        saved, _arrow._compiled = _arrow._compiled, None
        try:
            return fn(data)
        finally:
            _arrow._compiled = saved
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, action="append", help="records per reply (repeat)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--crc-property", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    for records in args.records or [1024, 32]:
        data = reply(records, args.crc_property)
        out[str(records)] = {name: per_record_us(fn, data, records, args.rounds)
                             for name, fn in decoders().items()}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
