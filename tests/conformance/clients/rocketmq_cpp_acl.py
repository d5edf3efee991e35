"""The RocketMQ C++ client core (PyPI ``rocketmq-client-python`` with ``librocketmq.so``) against a txmq
broker with ACL on: a producer with the given session credentials sends messages, and optionally a push
consumer with the same credentials consumes them; what happened is printed as JSON lines (run by
``tests/conformance/test_acl_clients.py`` with the client's own environment's python).

Usage: rocketmq_cpp_acl.py produce|consume --namesrv H:P --topic T --group G [--ak AK --sk SK]
       [--count N] [--timeout S]

(One role per process.)

Events: ``started``, ``sent {key, status}``, ``received {key}``, ``error {stage, error}``, ``done``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import threading
import time
from typing import Any

from rocketmq.client import ConsumeStatus, Message, Producer, PushConsumer, ReceivedMessage
from rocketmq.ffi import dll

CHANNEL = "ALIYUN"  # SessionCredentials' default auth channel (the C++ core's "OnsChannel" field)
# The C++ core crashes shutting down a push consumer with message trace closed (the default); with it
# open the shutdown is clean (as rocketmq_cpp_scenarios.py does).
_TRACE_OPEN = 0
dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def produce(a: argparse.Namespace) -> None:
    p = Producer(a.group)
    p.set_name_server_address(a.namesrv)
    if a.ak:
        p.set_session_credentials(a.ak, a.sk, CHANNEL)
    p.set_timeout(3000)
    p.start()
    emit("started")
    try:
        for i in range(a.count):
            m = Message(a.topic)
            m.set_keys(f"acl-{i}")
            m.set_body(f"acl:{i}")
            try:
                r = p.send_sync(m)
            except Exception as e:
                emit("error", stage="send", error=repr(e)[:800])
                continue
            emit("sent", key=f"acl-{i}", status=int(r.status))
    finally:
        p.shutdown()


def consume(a: argparse.Namespace) -> None:
    got: list[str] = []
    lock = threading.Lock()

    def on_message(msg: ReceivedMessage) -> ConsumeStatus:
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else str(msg.keys)
        with lock:
            got.append(key)
        emit("received", key=key)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(a.group)
    c.set_name_server_address(a.namesrv)
    dll.SetPushConsumerMessageTrace(c._handle, _TRACE_OPEN)
    if a.ak:
        c.set_session_credentials(a.ak, a.sk, CHANNEL)
    c.subscribe(a.topic, on_message, "*")
    c.start()
    emit("started")
    deadline = time.monotonic() + a.timeout
    try:
        while time.monotonic() < deadline:
            with lock:
                if len(set(got)) >= a.count:
                    break
            time.sleep(0.1)
    finally:
        c.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("produce", "consume"))
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--ak", default="")
    ap.add_argument("--sk", default="")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    if a.role == "produce":
        produce(a)
    else:
        consume(a)
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
