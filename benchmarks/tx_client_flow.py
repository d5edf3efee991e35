"""Client CPU of ``send_message_in_transaction`` without the network: the half's send and the
broker are faked (the half is "stored" at once, an END_TRANSACTION_BATCH answered COMMIT at the
next loop turn), so what is timed is the transaction flow itself (the flow's steps, the local
transaction's call, the end's queueing, batching and answer), plus the driver's semaphore.

Prints the best of ``--rounds`` rounds of ``--n`` transactions, ``--in-flight`` at a time, in
CPU µs per transaction (``time.process_time``: steadier than wall time on a shared machine).
``--no-gc`` turns the cyclic garbage collector off (what the flow's allocations cost it). Run it in
two checkouts to compare them::

    uv run --locked python benchmarks/tx_client_flow.py [--n 8000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from typing import Any

from txmq.client import AsyncTransactionProducer, LocalTransactionState, Message
from txmq.client._core import SendResult

try:
    from txmq.serving import new_event_loop
except ImportError:  # a build before it moved there (these scripts also run against older checkouts)
    from txmq.client._sync import new_event_loop  # type: ignore[attr-defined,no-redef]
from txmq.protocol import Command, encode_body

COMMIT = LocalTransactionState.COMMIT_MESSAGE


class _Listener:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return COMMIT

    async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return COMMIT


class _Broker:
    async def request(self, code: int, ext: Any = None, body: bytes = b"") -> Command:
        n = len(json.loads(body))
        await asyncio.sleep(0)
        return Command(0, 1, body=encode_body([{"code": 0, "outcome": "COMMIT"}] * n))


class _Producer(AsyncTransactionProducer):
    offset = 0

    async def send(self, msg: Message, queue_id: Any = None) -> SendResult:
        _Producer.offset += 1
        await asyncio.sleep(0)
        return SendResult(msg_id=msg.properties["UNIQ_KEY"], topic=msg.topic, queue_id=1,
                          queue_offset=self.offset, commit_log_offset=self.offset * 1000,
                          broker_name="b")

    async def master_address(self, broker_name: str, topic: str = "") -> str:
        return "127.0.0.1:1"

    async def connection(self, addr: str) -> Any:
        return _Broker()


async def _run(n: int, rounds: int, in_flight: int) -> float:
    p = _Producer("g", "127.0.0.1:1", _Listener())
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await p.send_message_in_transaction(Message(topic="bench", body=b"x" * 1024))

    await asyncio.gather(*(one() for _ in range(200)))  # warm-up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        await asyncio.gather(*(one() for _ in range(n)))
        best = min(best, (time.process_time() - t0) / n * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--in-flight", type=int, default=128)
    ap.add_argument("--no-gc", action="store_true")
    args = ap.parse_args()
    if args.no_gc:
        gc.disable()
    loop = new_event_loop()
    try:
        us = loop.run_until_complete(_run(args.n, args.rounds, args.in_flight))
    finally:
        loop.close()
    print(f"client transaction flow (half and broker faked): {us:.2f} µs CPU per transaction")


if __name__ == "__main__":
    main()
