"""Official RocketMQ 5 Python client scenarios, run by the conformance tests in a subprocess.

Runs with the python of the environment made by ``client_envs.rocketmq_grpc.ensure_env()`` (PyPI
``rocketmq-python-client`` 5.1.2 and its pinned dependencies), never with txmq's own python: it imports
only the standard library and ``rocketmq``. Every event is one JSON object per stdout line:

    {"event": "started", "settings": bool}           the client started (and got the server's settings)
    {"event": "sent", "key", "body", "mode", "message_id", "transaction_id", "offset", "group",
     "delivery_s"}
    {"event": "local", "key", "answer"}               a transaction's local decision (transact)
    {"event": "check", "key", "message_id", "topic", "body", "tag", "props", "answer"}
                                                       a check-back answered by the TransactionChecker
    {"event": "received", "key", "keys", "body", "tag", "topic", "attempt", "message_id", "props",
     "group", "delivery_ms", "born_ms", "corrupted", "n", "t"}   n: local receipt count of message_id
    {"event": "acked" | "changed", "key", "message_id", "attempt"[, "seconds"]}
    {"event": "refused", "case", "error", "message"}  a send the client or the door refused (probe)
    {"event": "error", "stage", "error"}
    {"event": "done"}

Sub-commands (``--endpoints`` is txmq's gRPC door, ``host:port``):

    produce   --topic T --count N [--mode normal|delay|fifo] [--prefix P] [--tag TAG] [--delay-s S]
              [--groups G]
    transact  --topic T --plan commit,rollback,unknown,... [--prefix P]
              [--check-answer commit|rollback|unknown|marker:PATH] [--expect-checks N]
              [--expect-check-keys KEY,...] [--linger S]
              [--die-after-half --marker PATH]
    probe     --topic T --body-size N [--unknown-topic U]
    consume   --group G --topic T [--expect N] [--idle S] [--timeout S] [--invisible S] [--await S]
              [--batch N] [--rule KEY=ACTION,ACTION...]... [--max-errors N] [--poll-timeout S]

A consume rule lists what to do with a message at its 1st, 2nd, ... receipt (the last one repeats):
``ack``, ``skip`` (leave it to come back after its invisible time), ``cid:S`` (change its invisible
duration to S seconds, no ack), or several joined by ``+`` (``cid:1+ack``: ack with the handle the
change returned). Messages without a rule are acked.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

_OUT_LOCK = threading.Lock()
_ANSWERS = {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK,
            "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED}
SETTINGS_WAIT_S = 5.0


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": round(time.time(), 3), **fields})
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def config(args: argparse.Namespace) -> ClientConfiguration:
    return ClientConfiguration(args.endpoints, Credentials(), request_timeout=args.request_timeout)


def key_of(m: Message) -> str:
    return sorted(m.keys)[0] if m.keys else ""


def make_message(topic: str, prefix: str, i: int, tag: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = f"{prefix}:{i}".encode()
    m.tag = tag
    m.keys = f"{prefix}-{i}"
    m.add_property("origin", "python")
    return m


def wait_settings(client: Producer | SimpleConsumer) -> bool:
    """Whether the server answered the client's Telemetry settings in time (``reset_setting`` ran)."""
    event = getattr(client, "_init_settings_event", None)
    return bool(event is not None and event.wait(SETTINGS_WAIT_S))


def cmd_produce(args: argparse.Namespace) -> None:
    p = Producer(config(args), topics=(args.topic,))
    p.startup()
    emit("started", settings=wait_settings(p))
    try:
        for i in range(args.count):
            m = make_message(args.topic, args.prefix, i, args.tag)
            group, delivery_s = "", 0
            if args.mode == "fifo":
                group = f"{args.prefix}-g{i % args.groups}"
                m.message_group = group
            elif args.mode == "delay":
                delivery_s = int(time.time()) + args.delay_s
                m.delivery_timestamp = delivery_s
            try:
                r = p.send(m)
            except Exception as e:
                emit("error", stage="send", key=f"{args.prefix}-{i}", error=repr(e))
                continue
            emit("sent", key=f"{args.prefix}-{i}", body=m.body.decode(), mode=args.mode,
                 message_id=r.message_id, transaction_id=r.transaction_id, offset=r.offset,
                 group=group, delivery_s=delivery_s)
    finally:
        p.shutdown()


class Checker(TransactionChecker):
    """Answers check-backs: a fixed answer, or ``marker:PATH`` = commit the keys listed in PATH."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.checked: list[str] = []
        self.lock = threading.Lock()

    def check(self, message: Message) -> TransactionResolution:
        key = key_of(message)
        if self.answer.startswith("marker:"):
            marker = Path(self.answer.split(":", 1)[1])
            listed = marker.read_text().split() if marker.exists() else []
            answer = "commit" if key in listed else "rollback"
        else:
            answer = self.answer
        emit("check", key=key, message_id=message.message_id, topic=message.topic,
             body=(message.body or b"").decode("utf-8", "replace"), tag=message.tag,
             props=dict(message.properties), answer=answer)
        with self.lock:
            self.checked.append(key)
        return _ANSWERS[answer]

    def done(self, count: int, keys: set[str]) -> bool:
        with self.lock:
            return len(self.checked) >= count and keys <= set(self.checked)


def cmd_transact(args: argparse.Namespace) -> None:
    checker = Checker(args.check_answer)
    p = Producer(config(args), topics=(args.topic,), checker=checker)
    p.startup()
    emit("started", settings=wait_settings(p))
    try:
        for i, answer in enumerate(a for a in args.plan.split(",") if a):
            key = f"{args.prefix}-{i}"
            tx = p.begin_transaction()
            m = make_message(args.topic, args.prefix, i, args.tag)
            try:
                r = p.send(m, tx)
            except Exception as e:
                emit("error", stage="send-half", key=key, error=repr(e))
                continue
            emit("sent", key=key, body=m.body.decode(), mode="transaction", message_id=r.message_id,
                 transaction_id=r.transaction_id, offset=r.offset, group="", delivery_s=0)
            if args.die_after_half:
                with open(args.marker, "a") as f:
                    f.write(key + "\n")
                emit("local", key=key, answer="die")
                os.kill(os.getpid(), signal.SIGKILL)
            emit("local", key=key, answer=answer)
            try:
                if answer == "commit":
                    tx.commit()
                elif answer == "rollback":
                    tx.rollback()
            except Exception as e:
                emit("error", stage=f"end-{answer}", key=key, error=repr(e))
        deadline = time.monotonic() + args.linger
        keys = {k for k in args.expect_check_keys.split(",") if k}
        while not checker.done(args.expect_checks, keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        if args.expect_checks or keys:
            time.sleep(0.5)  # the checker's EndTransaction is sent after check() returns
    finally:
        p.shutdown()


def cmd_probe(args: argparse.Namespace) -> None:
    """Sends the door must refuse: to a topic it does not have, and a body over the max_body_size its
    settings gave (the client itself refuses that one, from the settings). Each attempt reports
    "refused" (exception class and message) or "sent"."""
    p = Producer(config(args), topics=(args.topic,))
    p.startup()
    emit("started", settings=wait_settings(p))
    try:
        for case, topic, size in (("unknown-topic", args.unknown_topic, 8),
                                  ("oversized", args.topic, args.body_size)):
            m = Message()
            m.topic = topic
            m.body = b"x" * size
            try:
                r = p.send(m)
            except Exception as e:
                emit("refused", case=case, error=type(e).__name__, message=str(e))
            else:
                emit("sent", case=case, key=case, message_id=r.message_id)
    finally:
        p.shutdown()


def parse_rules(rules: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in rules:
        key, _, actions = r.partition("=")
        out[key] = actions.split(",")
    return out


def handle(c: SimpleConsumer, m: Message, n: int, actions: list[str]) -> None:
    key = key_of(m)
    for action in actions[min(n, len(actions)) - 1].split("+"):
        try:
            if action == "ack":
                c.ack(m)
                emit("acked", key=key, message_id=m.message_id, attempt=m.delivery_attempt)
            elif action.startswith("cid:"):
                seconds = int(action.split(":", 1)[1])
                c.change_invisible_duration(m, seconds)  # the message takes the new receipt handle
                emit("changed", key=key, message_id=m.message_id, attempt=m.delivery_attempt,
                     seconds=seconds)
        except Exception as e:
            emit("error", stage=action, key=key, error=repr(e))
            return


def report(m: Message, n: int) -> None:
    emit("received", key=key_of(m), keys=sorted(m.keys), body=(m.body or b"").decode("utf-8", "replace"),
         tag=m.tag, topic=m.topic, attempt=m.delivery_attempt, message_id=m.message_id,
         props=dict(m.properties), group=m.message_group, delivery_ms=m.delivery_timestamp,
         born_ms=m.born_timestamp, corrupted=m.corrupted, n=n)


def cmd_consume(args: argparse.Namespace) -> None:
    rules = parse_rules(args.rule)
    cfg = ClientConfiguration(args.endpoints, Credentials(), request_timeout=args.poll_timeout)
    c = SimpleConsumer(cfg, args.group, {args.topic: FilterExpression(args.tag_filter)},
                       await_duration=args.await_s)
    c.startup()
    emit("started", settings=wait_settings(c))
    seen: dict[str, int] = {}
    received = failures = 0
    deadline = time.monotonic() + args.timeout
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if received >= args.expect and time.monotonic() - last_new >= args.idle:
                break
            try:
                msgs = c.receive(args.batch, args.invisible)
            except Exception as e:
                emit("error", stage="receive", error=repr(e))
                failures += 1
                if failures >= args.max_errors:
                    break
                time.sleep(0.2)
                continue
            failures = 0
            for m in msgs:
                n = seen[m.message_id] = seen.get(m.message_id, 0) + 1
                received += 1
                last_new = time.monotonic()
                report(m, n)
                handle(c, m, n, rules.get(key_of(m), ["ack"]))
    finally:
        c.shutdown()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--request-timeout", type=int, default=3)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("produce")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--mode", choices=("normal", "delay", "fifo"), default="normal")
    p.add_argument("--prefix", default="m")
    p.add_argument("--tag", default="py")
    p.add_argument("--delay-s", type=int, default=2)
    p.add_argument("--groups", type=int, default=1)

    t = sub.add_parser("transact")
    t.add_argument("--topic", required=True)
    t.add_argument("--plan", default="")
    t.add_argument("--prefix", default="tx")
    t.add_argument("--tag", default="py")
    t.add_argument("--check-answer", default="commit")
    t.add_argument("--expect-checks", type=int, default=0)
    t.add_argument("--expect-check-keys", default="", help="linger until these keys were checked")
    t.add_argument("--linger", type=float, default=0.0)
    t.add_argument("--die-after-half", action="store_true")
    t.add_argument("--marker", default="")

    b = sub.add_parser("probe")
    b.add_argument("--topic", required=True)
    b.add_argument("--unknown-topic", default="py-no-such-topic")
    b.add_argument("--body-size", type=int, required=True)

    c = sub.add_parser("consume")
    c.add_argument("--group", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--tag-filter", default=FilterExpression.TAG_EXPRESSION_SUB_ALL)
    c.add_argument("--expect", type=int, default=0)
    c.add_argument("--idle", type=float, default=2.0)
    c.add_argument("--timeout", type=float, default=30.0)
    c.add_argument("--invisible", type=int, default=15)
    c.add_argument("--await", dest="await_s", type=int, default=0,
                   help="long polling (s); 0: the door holds an empty receive until the rpc deadline")
    c.add_argument("--poll-timeout", type=int, default=1,
                   help="the consumer's request timeout (s): an empty receive's deadline is this + --await")
    c.add_argument("--batch", type=int, default=16)
    c.add_argument("--rule", action="append", default=[])
    c.add_argument("--max-errors", type=int, default=3, help="failed receives in a row before giving up")
    return ap


def main() -> int:
    args = parser().parse_args()
    run = {"produce": cmd_produce, "transact": cmd_transact, "consume": cmd_consume,
           "probe": cmd_probe}[args.command]
    try:
        run(args)
    except Exception as e:
        emit("error", stage=args.command, error=repr(e))
        emit("done")
        return 1
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
