"""Run the RocketMQ C++-core scenario script (``clients/rocketmq_cpp_scenarios.py``) as processes and
read the JSON lines they print."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.errors import ResponseCode
from txmq.protocol import (
    PULL_FLAG_SUBSCRIPTION,
    Command,
    FrameDecoder,
    GetMaxOffsetRequestHeader,
    MessageExt,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    RequestCode,
    decode_message_exts,
    encode_command,
    from_ext,
    to_ext,
)
from txmq.testing import wait_until

SCENARIOS = Path(__file__).resolve().parent / "clients" / "rocketmq_cpp_scenarios.py"
PROCESS_TIMEOUT_S = 120.0
# Retries of a consumer's RECONSUME_LATER use delay levels 3 + reconsumeTimes (RocketMQ
# SendMessageProcessor), up to level 18 for the 16th retry: every level is short here.
DELAY_LEVELS = " ".join(["100ms"] * 18)
FAST_TX = {"transaction_timeout_ms": 500, "transaction_check_interval_ms": 300}
Event = dict[str, Any]


class CppClient:
    """One scenario process (``produce``, ``transact`` or ``consume``) against ``namesrv``.

    Its stdout events are collected by a thread as they arrive (:attr:`events`); its stderr (the C++
    core's and Python's complaints) goes to ``log_path``.
    """

    def __init__(self, python: Path, namesrv: str, command: str, *args: str, log_path: Path) -> None:
        self.argv = [str(python), str(SCENARIOS), command, "--namesrv", namesrv, *args]
        self.log_path = log_path
        self.events: list[Event] = []
        self._lock = threading.Lock()
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.events.append(json.loads(line))

    def of(self, event: str) -> list[Event]:
        """The events named ``event`` so far, in order."""
        with self._lock:
            return [e for e in self.events if e["event"] == event]

    def wait_for(self, event: str, n: int = 1, timeout_s: float = 60.0) -> list[Event]:
        """Wait until ``n`` events named ``event`` arrived; fail naming the process's log otherwise."""
        try:
            wait_until(lambda: len(self.of(event)) >= n or self.proc.poll() is not None, timeout_s)
        except AssertionError:
            msg = f"{n} {event!r} events not seen in {timeout_s}s: {self.describe()}"
            raise AssertionError(msg) from None
        self._reader.join(0.5 if self.proc.poll() is not None else 0)
        got = self.of(event)
        assert len(got) >= n, f"{n} {event!r} events expected: {self.describe()}"
        return got

    def finish(self, timeout_s: float = PROCESS_TIMEOUT_S) -> int:
        """Wait for the process to exit (killing it after ``timeout_s``); return its exit status."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running after {timeout_s}s: {self.describe()}") from None
        self._reader.join(5)
        return rc

    def ok(self, timeout_s: float = PROCESS_TIMEOUT_S) -> list[Event]:
        """Wait for a clean exit (status 0) and return every event."""
        rc = self.finish(timeout_s)
        assert rc == 0, f"exit status {rc}: {self.describe()}"
        return list(self.events)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def describe(self) -> str:
        tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        errors = self.of("error")
        return f"{' '.join(self.argv[2:])}\n errors: {errors}\n events: {self.events[-8:]}\n stderr: {tail}"


CppFactory = Callable[..., CppClient]
"""The ``cpp`` fixture: ``cpp(command, *args)`` starts a :class:`CppClient` against the test's broker."""


def keys(events: list[Event], event: str = "received", answer: str | None = None) -> list[str]:
    """The message keys of ``event`` events (only those answered ``answer`` when given), in order."""
    return [e["key"] for e in events if e["event"] == event and (answer is None or e.get("answer") == answer)]


def settle(seconds: float) -> None:
    """Give the system time to show something that must NOT happen (a rolled-back message delivered)."""
    time.sleep(seconds)


AUDIT_GROUP = "txmq-cluster-audit"
AUDIT_PULL_BATCH = 32  # messages per PULL_MESSAGE of the store audit
AUDIT_TIMEOUT_S = 10.0  # one request of the store audit


class StoreReader:
    """What one broker stored, read over remoting with a plain socket (not the txmq SDK): GET_MAX_OFFSET
    and PULL_MESSAGE (from offset 0, no suspend) under :data:`AUDIT_GROUP`, which commits nothing.

    Raises ``OSError`` when the broker does not answer and ``AssertionError`` on an error response.
    """

    def __init__(self, endpoints: str) -> None:
        host, port = endpoints.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=AUDIT_TIMEOUT_S)
        self._decoder = FrameDecoder()
        self._opaque = 0

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()

    def _call(self, code: RequestCode, ext: dict[str, str]) -> Command:
        self._opaque += 1
        self._sock.sendall(encode_command(Command(code=code, opaque=self._opaque, ext=ext)))
        while True:
            data = self._sock.recv(1 << 20)
            if not data:
                raise OSError("the broker closed the connection")
            for cmd in self._decoder.feed(data):
                if cmd.is_response and cmd.opaque == self._opaque:
                    return cmd

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (messages stored in it, the queue starting at 0)."""
        resp = self._call(RequestCode.GET_MAX_OFFSET, to_ext(GetMaxOffsetRequestHeader(topic=topic,
                                                                                     queue_id=queue_id)))
        assert resp.code == ResponseCode.SUCCESS, f"GET_MAX_OFFSET {topic}/{queue_id}: {resp.remark}"
        return from_ext(resp.ext, OffsetResponseHeader).offset

    def messages(self, topic: str, queue_id: int) -> list[MessageExt]:
        """Every message of the queue, in queue order."""
        got: list[MessageExt] = []
        end = self.max_offset(topic, queue_id)
        while len(got) < end:
            h = PullMessageRequestHeader(consumer_group=AUDIT_GROUP, topic=topic, queue_id=queue_id,
                                         queue_offset=len(got), max_msg_nums=AUDIT_PULL_BATCH,
                                         sys_flag=PULL_FLAG_SUBSCRIPTION, subscription="*")
            resp = self._call(RequestCode.PULL_MESSAGE, to_ext(h))
            assert resp.code == ResponseCode.SUCCESS, f"PULL {topic}/{queue_id}@{len(got)}: {resp.remark}"
            got.extend(decode_message_exts(resp.body))
        return got


def stored(endpoints: str, topic: str, queues: int) -> list[MessageExt]:
    """Every message of ``topic`` (queues ``0 .. queues-1``) stored by the broker at ``endpoints``."""
    with StoreReader(endpoints) as r:
        return [m for q in range(queues) for m in r.messages(topic, q)]
