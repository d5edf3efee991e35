"""The official RocketMQ 5 Python client (gRPC) against a txmq broker whose gRPC door serves TLS: a
producer sends, a SimpleConsumer receives, both with the client's ``tls_enable=True`` (run by
``tests/conformance/test_tls_clients.py`` with the client's own environment's python).

The client makes its channel with ``grpc.ssl_channel_credentials()`` and no arguments
(``rocketmq/v5/client/connection/rpc_channel.py``), so it checks the server's certificate against
grpc's default roots; ``--ca-file`` points ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` (read by grpc's core)
at the test CA before grpc loads. Without ``--tls`` the client speaks plaintext.

Usage: rocketmq_grpc_tls.py --endpoints H:P --topic T [--tls --ca-file F] [--count N]
       [--consume-group G] [--ak AK --sk SK]
Events: ``started``, ``sent {key}``, ``received {keys}``, ``error {stage, type, message}``, ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def error(stage: str, e: BaseException) -> None:
    emit("error", stage=stage, type=type(e).__name__, message=str(e)[:500])


def produce(args: argparse.Namespace, cfg: Any, producer_cls: Any, message_cls: Any) -> None:
    p = producer_cls(cfg, topics=(args.topic,), tls_enable=args.tls)
    try:
        p.startup()
    except Exception as e:
        error("startup", e)
    else:
        emit("started")
    try:
        for i in range(args.count):
            m = message_cls()
            m.topic, m.body, m.keys = args.topic, f"tls:{i}".encode(), f"tls-{i}"
            try:
                p.send(m)
            except Exception as e:
                error("send", e)
                continue
            emit("sent", key=f"tls-{i}")
    finally:
        try:
            p.shutdown()
        except Exception as e:
            error("shutdown", e)


def consume(args: argparse.Namespace, cfg: Any, consumer_cls: Any, filter_cls: Any) -> None:
    c = consumer_cls(cfg, args.consume_group, {args.topic: filter_cls()}, await_duration=1,
                     tls_enable=args.tls)
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
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--ca-file", default="")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--consume-group", default="")
    ap.add_argument("--ak", default="")
    ap.add_argument("--sk", default="")
    args = ap.parse_args()
    if args.ca_file:
        os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = args.ca_file
    from rocketmq import (  # after the roots variable: grpc reads it when it loads
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    creds = Credentials(args.ak, args.sk) if args.ak else Credentials()
    cfg = ClientConfiguration(args.endpoints, creds, request_timeout=3)
    produce(args, cfg, Producer, Message)
    if args.consume_group:
        consume(args, cfg, SimpleConsumer, FilterExpression)
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
