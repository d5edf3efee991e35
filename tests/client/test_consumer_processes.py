"""A consumer group spread over OS processes under continuous load: members join, leave (SIGTERM)
and are killed (SIGKILL). Every acknowledged message is consumed at least once; in orderly mode no
message of a queue is started before the one before it was finished by someone."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from txmq.client import Message, Producer
from txmq.testing import BrokerProcess, run_broker, wait_until

QUEUES = 8

# Each listener call appends "queue offset msg_id start_ns end_ns pid" lines (one os.write per
# call on an O_APPEND file, so lines of concurrent calls and processes never interleave).
_WORKER = textwrap.dedent("""
    import os, signal, sys, threading, time
    from txmq.client import ConsumeOrderlyStatus, ConsumeStatus, PushConsumer
    endpoints, group, orderly, out = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pid = os.getpid()
    ok = ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeStatus.CONSUME_SUCCESS

    def listener(msgs):
        start = time.monotonic_ns()
        time.sleep(0.002)  # the work
        end = time.monotonic_ns()
        os.write(fd, "".join(f"{m.queue_id} {m.queue_offset} {m.msg_id} {start} {end} {pid}\\n"
                             for m in msgs).encode())
        return ok

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    c = PushConsumer(group, endpoints, listener, orderly=orderly, suspend_ms=1000,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET", consume_threads=4)
    c.subscribe("mp")
    c.start()
    open(out + ".ready", "w").close()
    stop.wait()
    c.shutdown()
""")


class Worker:
    def __init__(self, endpoints: str, group: str, orderly: bool, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, endpoints, group,
                                      "1" if orderly else "0", str(out)])

    def wait_ready(self) -> None:
        wait_until(lambda: Path(str(self.out) + ".ready").exists() or self.proc.poll() is not None)
        assert self.proc.poll() is None, "worker died at start"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        assert self.proc.returncode == 0




class Load:
    """Sends continuously from a thread; remembers every acknowledged message id."""

    def __init__(self, endpoints: str) -> None:
        self.acked: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(endpoints,), daemon=True)
        self._thread.start()

    def _run(self, endpoints: str) -> None:
        with Producer("load", endpoints) as p:
            i = 0
            while not self._stop.is_set():
                self.acked.add(p.send(Message(topic="mp", body=str(i).encode())).msg_id)
                i += 1
                time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def records(tmp: Path) -> list[tuple[int, int, str, int, int, int]]:
    out = []
    for f in tmp.glob("w*.log"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:  # a SIGKILL may cut the last line short
                q, off, mid, start, end, pid = parts
                out.append((int(q), int(off), mid, int(start), int(end), int(pid)))
    return out


def order_violations(recs: list[tuple[int, int, str, int, int, int]]) -> list[str]:
    """Calls that started a queue's message k+1 before anyone had finished message k."""
    first_end: dict[tuple[int, int], int] = {}
    for q, off, _, _, end, _ in recs:
        first_end[(q, off)] = min(end, first_end.get((q, off), end))
    lowest: dict[int, int] = defaultdict(lambda: 1 << 62)
    for q, off, *_ in recs:
        lowest[q] = min(lowest[q], off)
    bad = []
    for q, off, _, start, _, pid in recs:
        if off > lowest[q]:
            prev = first_end.get((q, off - 1))
            if prev is None or start < prev:
                bad.append(f"queue {q} offset {off} started by {pid} before {off - 1} finished")
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_group_members_join_leave_and_die_under_load(tmp_path: Path, orderly: bool) -> None:
    with run_broker(tmp_path / "broker", topics={"mp": QUEUES}) as broker:
        _scenario(broker, tmp_path, orderly)


def _scenario(broker: BrokerProcess, tmp: Path, orderly: bool) -> None:
    group = "mp-orderly" if orderly else "mp-concurrent"
    workers: list[Worker] = []

    def spawn() -> Worker:
        w = Worker(broker.endpoints, group, orderly, tmp / f"w{len(workers)}.log")
        workers.append(w)
        return w

    load = Load(broker.endpoints)
    try:
        first = [spawn(), spawn()]
        for w in first:
            w.wait_ready()
        time.sleep(1.5)
        spawn().wait_ready()  # joins
        time.sleep(1.5)
        workers[0].kill()  # dies
        time.sleep(1.5)
        workers[1].leave()  # leaves
        spawn().wait_ready()  # joins
        time.sleep(1.5)
        spawn().wait_ready()
        workers[2].kill()
        time.sleep(1.5)
        load.stop()
        acked = set(load.acked)
        assert len(acked) > 500
        wait_until(lambda: acked <= {r[2] for r in records(tmp)}, timeout_s=60)
        for w in workers[3:]:
            w.leave()
    finally:
        load.stop()
        for w in workers:
            if w.proc.poll() is None:
                w.kill()
    recs = records(tmp)
    assert acked <= {r[2] for r in recs}
    assert {r[0] for r in recs} == set(range(QUEUES))
    assert len({r[5] for r in recs}) >= 4  # the work really moved between processes
    if orderly:
        assert order_violations(recs) == []
