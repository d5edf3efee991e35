"""RocketMQ C++-core client scenarios, run by the conformance tests in a subprocess.

Runs with the python of the environment made by ``client_envs.rocketmq_cpp.ensure_env()`` (which holds
``rocketmq-client-python`` 2.0.0 and the C++ core ``librocketmq.so``), never with txmq's own python: it
imports only the standard library and ``rocketmq``. Every event is one JSON object per stdout line:

    {"event": "started", ...}
    {"event": "sent", "mode": "sync"|"oneway"|"orderly"|"transaction", "key", "status", "msg_id", "offset"}
    {"event": "local", "key", "answer"}                  the local transaction ran (transaction mode)
    {"event": "check", "key", "msg_id", "answer", "transaction_id", "topic"}   a check-back answered
    {"event": "received", "topic", "key", "body", "msg_id", "reconsume_times", "queue_id", "tags",
     "queue_offset", "props": {...}, "answer"}
    {"event": "failed", "mode": "sync", "key", "error"}  a sync send raised (produce --keep-going)
    {"event": "error", "stage", "error"}
    {"event": "done", ...}

Sub-commands (``--namesrv`` is the name server or broker address, ``host:port``):

    produce   --topic T --group G --count N [--mode sync|oneway|orderly] [--prefix P] [--shards S]
              [--keep-going] [--interval S] [--log-dir DIR] [--trace]
    transact  --topic T --group G --plan commit,rollback,unknown,... [--prefix P] [--trace]
              [--check-answer commit|rollback|unknown|marker:PATH] [--expect-checks N] [--linger S]
              (--expect-checks: distinct messages checked back; --linger: the most to wait for them)
              [--die-in-local --marker PATH]
    consume   --topic T --group G [--expect N] [--timeout S] [--idle S]
              [--later KEY,...] [--later-times N] [--orderly] [--stop-file PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rocketmq.client import (
    ConsumeStatus,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    TransactionMQProducer,
    TransactionStatus,
)
from rocketmq.ffi import dll

_OUT_LOCK = threading.Lock()
_PROPS = ("UNIQ_KEY", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "__SHARDINGKEY", "TRAN_MSG", "origin")
_ANSWERS = {"commit": TransactionStatus.COMMIT, "rollback": TransactionStatus.ROLLBACK,
            "unknown": TransactionStatus.UNKNOWN}


# C API CTraceModel: OPEN = 0, CLOSE = 1. The C++ core 2.1.0 crashes (SIGSEGV in
# DefaultMQPushConsumerImpl::shutdownMessageTraceInnerProducer) when a push consumer with trace closed,
# the default, is shut down; with trace open it shuts down cleanly (unregister, offsets persisted).
_TRACE_OPEN = 0
dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
# A producer's message trace (``--trace``): the C API's SetProducerMessageTrace, which the Python
# wrapper does not expose; set before start (the C++ core creates its trace threads at start).
dll.SetProducerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": round(time.time(), 3), **fields})
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _text(v: bytes | str | None) -> str | None:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def make_message(topic: str, key: str, body: str, tags: str = "cpp") -> Message:
    m = Message(topic)
    m.set_keys(key)
    m.set_tags(tags)
    m.set_body(body)
    m.set_property("origin", "cpp")
    return m


def describe(msg: ReceivedMessage) -> dict[str, Any]:
    props = {p: _text(msg.get_property(p)) for p in _PROPS}
    return {"topic": msg.topic, "key": _text(msg.keys), "body": _text(msg.body), "msg_id": msg.id,
            "reconsume_times": msg.reconsume_times, "queue_id": msg.queue_id, "tags": _text(msg.tags),
            "queue_offset": msg.queue_offset, "props": {k: v for k, v in props.items() if v}}


def cmd_produce(a: argparse.Namespace) -> int:
    p = Producer(a.group, orderly=a.mode == "orderly")
    p.set_name_server_address(a.namesrv)
    if a.trace:
        dll.SetProducerMessageTrace(p._handle, _TRACE_OPEN)
    if a.log_dir:
        dll.SetProducerLogPath(p._handle, a.log_dir.encode())
    p.start()
    emit("started", role="producer", group=a.group)
    try:
        for i in range(a.count):
            key = f"{a.prefix}-{i}"
            msg = make_message(a.topic, key, f"{a.prefix}:{i}")
            if a.mode == "oneway":
                p.send_oneway(msg)
                emit("sent", mode="oneway", key=key)
                continue
            if a.mode == "orderly":
                shard = f"shard-{i % a.shards}"
                r = p.send_orderly_with_sharding_key(msg, shard)
                emit("sent", mode="orderly", key=key, shard=shard, status=int(r.status), msg_id=r.msg_id,
                     offset=r.offset)
                continue
            try:
                r = p.send_sync(msg)
            except Exception as e:
                if not a.keep_going:
                    raise
                emit("failed", mode="sync", key=key, error=repr(e))
            else:
                emit("sent", mode="sync", key=key, status=int(r.status), msg_id=r.msg_id, offset=r.offset)
            time.sleep(a.interval)
    except Exception as e:
        emit("error", stage="send", error=repr(e))
        return 1
    finally:
        time.sleep(a.linger)
        p.shutdown()
    emit("done", role="producer")
    return 0


def _checker(a: argparse.Namespace, checks: list[str]) -> Any:
    def check(msg: ReceivedMessage) -> TransactionStatus:
        key = _text(msg.keys) or ""
        if a.check_answer.startswith("marker:"):
            path = a.check_answer.split(":", 1)[1]
            done = os.path.exists(path) and key in Path(path).read_text().split()
            answer = "commit" if done else "rollback"
        else:
            answer = a.check_answer
        emit("check", key=key, msg_id=msg.id, answer=answer, topic=msg.topic,
             transaction_id=_text(msg.get_property("UNIQ_KEY")), reconsume_times=msg.reconsume_times)
        checks.append(key)
        return _ANSWERS[answer]
    return check


def cmd_transact(a: argparse.Namespace) -> int:
    checks: list[str] = []
    p = TransactionMQProducer(a.group, _checker(a, checks))
    p.set_name_server_address(a.namesrv)
    if a.trace:
        dll.SetProducerMessageTrace(p._handle, _TRACE_OPEN)
    p.start()
    emit("started", role="transaction-producer", group=a.group, pid=os.getpid())

    def local(msg: ReceivedMessage, plan: Any) -> TransactionStatus:
        key = _text(msg.keys) or ""
        if a.die_in_local:
            with open(a.marker, "a") as f:
                f.write(key + "\n")
            emit("local", key=key, answer="die")
            os.kill(os.getpid(), signal.SIGKILL)
        emit("local", key=key, answer=plan)
        return _ANSWERS[plan]

    try:
        for i, plan in enumerate(x for x in a.plan.split(",") if x):
            key = f"{a.prefix}-{i}"
            r = p.send_message_in_transaction(make_message(a.topic, key, f"{a.prefix}:{i}"),
                                              lambda m, _u, plan=plan: local(m, plan))
            emit("sent", mode="transaction", key=key, plan=plan, status=int(r.status), msg_id=r.msg_id,
                 offset=r.offset)
        deadline = time.monotonic() + a.linger
        while time.monotonic() < deadline and len(set(checks)) < a.expect_checks:
            time.sleep(0.1)
        time.sleep(a.settle)  # the end request answering the last check is one-way: let it leave
    except Exception as e:
        emit("error", stage="transaction", error=repr(e))
        return 1
    finally:
        p.shutdown()
    emit("done", role="transaction-producer", checks=len(checks))
    return 0 if len(set(checks)) >= a.expect_checks else 2


def cmd_consume(a: argparse.Namespace) -> int:
    later = {k for k in a.later.split(",") if k}
    seen: dict[str, int] = {}
    state = {"ok": 0, "last": time.monotonic()}
    lock = threading.Lock()

    def on_message(msg: ReceivedMessage) -> ConsumeStatus:
        d = describe(msg)
        with lock:
            n = seen[d["key"] or ""] = seen.get(d["key"] or "", 0) + 1
            retry = d["key"] in later and (a.later_times < 0 or n <= a.later_times)
            if not retry:
                state["ok"] += 1
            state["last"] = time.monotonic()
        answer = "later" if retry else "success"
        emit("received", answer=answer, **d)
        return ConsumeStatus.RECONSUME_LATER if retry else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(a.group, orderly=a.orderly)
    c.set_name_server_address(a.namesrv)
    c.set_thread_count(a.threads)
    dll.SetPushConsumerMessageTrace(c._handle, _TRACE_OPEN)
    c.subscribe(a.topic, on_message, a.expression)
    c.start()
    emit("started", role="consumer", group=a.group, topic=a.topic)
    start = time.monotonic()
    try:
        while time.monotonic() - start < a.timeout:
            time.sleep(0.1)
            with lock:
                enough = a.expect >= 0 and state["ok"] >= a.expect
                idle = time.monotonic() - state["last"] >= a.idle
            if (enough and idle) or (a.stop_file and os.path.exists(a.stop_file)):
                break
    finally:
        c.shutdown()
    emit("done", role="consumer", ok=state["ok"], deliveries=sum(seen.values()))
    return 0 if a.expect < 0 or state["ok"] >= a.expect else 2


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("produce", "transact", "consume"):
        s = sub.add_parser(name)
        s.add_argument("--namesrv", required=True)
        s.add_argument("--topic", required=True)
        s.add_argument("--group", required=True)
        s.add_argument("--prefix", default="cpp")
        s.add_argument("--linger", type=float, default=0.0, help="seconds to stay up after the sends")
        if name != "consume":  # a consumer always traces (see _TRACE_OPEN)
            s.add_argument("--trace", action="store_true", help="turn the producer's message trace on")
    p = sub.choices["produce"]
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--mode", choices=("sync", "oneway", "orderly"), default="sync")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--keep-going", action="store_true", help="a failed sync send: a 'failed' event, go on")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between sync sends")
    p.add_argument("--log-dir", default="", help="the C++ core's log directory (default /logs/...)")
    t = sub.choices["transact"]
    t.add_argument("--plan", default="commit")
    t.add_argument("--check-answer", default="unknown")
    t.add_argument("--expect-checks", type=int, default=0)
    t.add_argument("--settle", type=float, default=1.0)
    t.add_argument("--die-in-local", action="store_true")
    t.add_argument("--marker", default="")
    c = sub.choices["consume"]
    c.add_argument("--expect", type=int, default=-1, help="stop once this many were consumed OK")
    c.add_argument("--timeout", type=float, default=60.0)
    c.add_argument("--idle", type=float, default=1.0, help="then stop after this long without a message")
    c.add_argument("--later", default="", help="keys answered RECONSUME_LATER")
    c.add_argument("--later-times", type=int, default=-1, help="for this many deliveries; -1: always")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--expression", default="*")
    c.add_argument("--orderly", action="store_true", help="orderly consumption (queue locks, 41/42)")
    c.add_argument("--stop-file", default="", help="shut down cleanly once this file exists")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    return {"produce": cmd_produce, "transact": cmd_transact, "consume": cmd_consume}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
