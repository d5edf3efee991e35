"""The official RocketMQ 5 Python client (gRPC) against a txmq broker with ACL on: one producer with the
given credentials sends messages, and reports what happened as JSON lines (run by
``tests/conformance/test_acl_clients.py`` with the client's own environment's python).

Usage: rocketmq_grpc_acl.py --endpoints H:P --topic T [--ak AK --sk SK] [--count N]
       [--date-skew-s S] [--consume-group G]

``--date-skew-s`` shifts the client's clock for its ``x-mq-date-time`` header (an expired signature).
With ``--consume-group`` a SimpleConsumer of that group then receives from the topic and reports the
keys it got.
Events: ``started``, ``sent {key}``, ``received {keys}``, ``error {stage, type, code, message}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.v5.util import signature


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def error(stage: str, e: BaseException) -> None:
    code = getattr(e, "code", None)
    emit("error", stage=stage, type=type(e).__name__, code=code if isinstance(code, int) else None,
         message=str(e)[:500])


def shift_clock(seconds: int) -> None:
    """Make the client sign ``x-mq-date-time`` with a clock ``seconds`` off (the real client's code)."""
    class Shifted(_dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return _dt.datetime.now(tz) + _dt.timedelta(seconds=seconds)
    signature.datetime = Shifted  # type: ignore[attr-defined,misc]


def produce(args: argparse.Namespace, cfg: ClientConfiguration) -> None:
    p = Producer(cfg, topics=(args.topic,))
    try:
        p.startup()
    except Exception as e:
        error("startup", e)
    else:
        emit("started")
    try:
        for i in range(args.count):
            m = Message()
            m.topic, m.body, m.keys = args.topic, f"acl:{i}".encode(), f"acl-{i}"
            try:
                p.send(m)
            except Exception as e:
                error("send", e)
                continue
            emit("sent", key=f"acl-{i}")
    finally:
        try:
            p.shutdown()
        except Exception as e:
            error("shutdown", e)


def consume(args: argparse.Namespace, cfg: ClientConfiguration) -> None:
    c = SimpleConsumer(cfg, args.consume_group, {args.topic: FilterExpression()}, await_duration=1)
    try:
        c.startup()
        keys: list[str] = []
        deadline = time.time() + 20
        while len(keys) < args.count and time.time() < deadline:
            for m in c.receive(16, 15) or []:
                keys += sorted(m.keys)
                c.ack(m)
        emit("received", keys=keys)
    except Exception as e:
        error("receive", e)
    finally:
        try:
            c.shutdown()
        except Exception as e:
            error("shutdown", e)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--ak", default="")
    ap.add_argument("--sk", default="")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--date-skew-s", type=int, default=0)
    ap.add_argument("--consume-group", default="")
    args = ap.parse_args()
    if args.date_skew_s:
        shift_clock(args.date_skew_s)
    creds = Credentials(args.ak, args.sk) if args.ak else Credentials()
    cfg = ClientConfiguration(args.endpoints, creds, request_timeout=3)
    produce(args, cfg)
    if args.consume_group:
        consume(args, cfg)
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
