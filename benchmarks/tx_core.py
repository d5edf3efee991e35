"""CPU of the sans-IO broker per transaction: no sockets, no fsync, a ``FileStore`` in a temporary
directory (its appends and dispatch, not its fsyncs).

Times ``--n`` 1 KiB messages, built as txmq's SDK builds them, from frame bytes as the server's
event loop sees them (``FrameDecoder.feed`` + the broker + ``encode_command`` of every reply),
runs of 16 requests per read, best of ``--rounds``, and prints microseconds per message for:

* ``plain send``: SEND_MESSAGE_V2;
* ``half send``: the same with ``TRAN_MSG`` / ``PGROUP`` (a half message);
* ``end, batched``: one END_TRANSACTION_BATCH of 16 commits per read;
* ``end, one-way``: 16 one-way END_TRANSACTION commits per read (the server groups them as it
  groups sends: ``Broker.handle_ends`` where it exists, else one ``Broker.handle`` each).

Run it in two checkouts to compare them::

    uv run --locked python benchmarks/tx_core.py [--n 16000] [--rounds 5] [--profile half]

``--trace-compare`` times each kind with the broker's record of transactions' lives off
(``transaction_trace_max = 0``) and on (the default), rounds alternating, every half carrying a
W3C ``traceparent``, and prints the ratio on / off (docs/tracing.md, "The broker's leg").
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections.abc import Callable
from functools import partial
from itertools import count

import msgspec

from txmq.broker import Broker, BrokerConfig, Reply
from txmq.client._core import send_request_header
from txmq.protocol import (
    FLAG_ONEWAY,
    TRANSACTION_COMMIT_TYPE,
    Command,
    EndTransactionRequestHeader,
    FrameDecoder,
    Message,
    RequestCode,
    encode_body,
    encode_command,
    to_ext,
)
from txmq.store import FileStore, MemoryStore

RUN = 16
NOW = 1_000_000
_MEMORY = False
"""``--memory``: a MemoryStore instead of the FileStore (no file writes: less noise from other
processes' disk traffic on a shared machine)."""
_ids = count(1)


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _send(tx: bool) -> Command:
    props = {"UNIQ_KEY": f"AC110001000A2A3B4C5D{next(_ids):012X}", "WAIT": "true"}
    if tx:
        props |= {"TRAN_MSG": "true", "PGROUP": "pg", "traceparent": TRACEPARENT}
    msg = Message(topic="orders", body=b"x" * 1024, keys="order-12345", properties=props)
    ext = send_request_header(msg, "pg", -1, NOW)
    return Command(RequestCode.SEND_MESSAGE_V2, next(_ids), ext=ext, body=msg.body)


def _handle(broker: Broker, cmds: list[Command]) -> list[object]:
    if cmds[0].code == RequestCode.END_TRANSACTION and hasattr(broker, "handle_ends"):
        return list(broker.handle_ends(1, cmds, NOW))
    if len(cmds) > 1 and cmds[0].code == RequestCode.SEND_MESSAGE_V2:
        return list(broker.handle_sends(1, cmds, NOW))
    return [a for c in cmds for a in broker.handle(1, c, NOW)]


def _wire(broker: Broker, reads: list[bytes]) -> None:
    decoder = FrameDecoder()
    for data in reads:
        for a in _handle(broker, decoder.feed(data)):
            if isinstance(a, Reply):
                encode_command(a.command)


def _halves(broker: Broker, n: int) -> list[EndTransactionRequestHeader]:
    """Store ``n`` halves and return the end requests committing them."""
    out = []
    for i in range(0, n, RUN):
        for a in broker.handle_sends(1, [_send(True) for _ in range(min(RUN, n - i))], NOW):
            assert isinstance(a, Reply)
            ext = a.command.ext
            out.append(EndTransactionRequestHeader(
                producer_group="pg", tran_state_table_offset=int(ext["queueOffset"]),
                commit_log_offset=int(ext["msgId"][16:], 16),
                commit_or_rollback=TRANSACTION_COMMIT_TYPE, msg_id=ext["msgId"]))
    return out


def _reads(kind: str, broker: Broker, n: int) -> list[bytes]:
    if kind in ("plain send", "half send"):
        cmds = [_send(kind == "half send") for _ in range(n)]
        return [b"".join(encode_command(c) for c in cmds[i:i + RUN]) for i in range(0, n, RUN)]
    ends = _halves(broker, n)
    if kind == "end, batched":
        return [encode_command(Command(RequestCode.END_TRANSACTION_BATCH, next(_ids),
                                       body=encode_body([to_ext(h) for h in ends[i:i + RUN]])))
                for i in range(0, n, RUN)]
    return [b"".join(encode_command(Command(RequestCode.END_TRANSACTION, next(_ids), FLAG_ONEWAY,
                                            ext=to_ext(h))) for h in ends[i:i + RUN])
            for i in range(0, n, RUN)]


def _time(kind: str, n: int, rounds: int, profile: bool, **config_keys: object) -> float:
    best = float("inf")
    rounds += profile
    config = msgspec.convert({"topics": {"orders": 4}, **config_keys}, BrokerConfig).validate()
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="txmq-txcore-") as d:
            store = MemoryStore() if _MEMORY else FileStore(d)
            broker = Broker(config, store, NOW)
            broker.handle(1, Command(RequestCode.HEART_BEAT, 1, body=b'{"clientID":"c1",'
                                     b'"producerDataSet":[{"groupName":"pg"}]}'), NOW)
            reads = _reads(kind, broker, n)
            run: Callable[[], None] = partial(_wire, broker, reads)
            if profile:  # this round profiled, not timed
                prof = cProfile.Profile()
                prof.runcall(run)
                pstats.Stats(prof).sort_stats("tottime").print_stats(30)
                profile = False
                store.close()
                continue
            t0 = time.perf_counter()
            run()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
            store.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", default="", help="cProfile one round of this kind first")
    ap.add_argument("--memory", action="store_true", help="a MemoryStore, not a FileStore")
    ap.add_argument("--trace-compare", action="store_true",
                    help="the record of transactions' lives off against on, per kind")
    args = ap.parse_args()
    global _MEMORY
    _MEMORY = args.memory
    if args.trace_compare:
        for kind in ("half send", "end, batched", "end, one-way"):
            best = {"off": float("inf"), "on": float("inf")}
            for _ in range(args.rounds):  # alternate, so drifting load hits both alike
                best["off"] = min(best["off"], _time(kind, args.n, 1, False, transaction_trace_max=0))
                best["on"] = min(best["on"], _time(kind, args.n, 1, False))
            print(f"{kind:14} off {best['off']:6.2f} µs/msg, on {best['on']:6.2f} µs/msg, "
                  f"on / off {best['on'] / best['off']:.3f}")
        return
    for kind in ("plain send", "half send", "end, batched", "end, one-way"):
        us = _time(kind, args.n, args.rounds, args.profile == kind)
        print(f"{kind:14} {us:6.2f} µs/msg")


if __name__ == "__main__":
    main()
