"""The network-namespace test bed (txmq.testing.Hosts): hosts reach each other over TCP, a
partition cuts exactly the pairs it names, heal restores them, a delay and a loss are measurable,
and nothing is left behind. Needs root; ``TXMQ_REQUIRE_NETNS=1`` (CI sets it) makes the skip a
failure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from txmq.testing import ROOT, Hosts, netns_unavailable
from txmq.testing._netns import remove_stale

_WHY = netns_unavailable()
if _WHY and os.environ.get("TXMQ_REQUIRE_NETNS") == "1":
    raise RuntimeError(f"TXMQ_REQUIRE_NETNS=1 but {_WHY}")
pytestmark = pytest.mark.skipif(bool(_WHY), reason=_WHY or "")

_PORT = 9000
_ECHO = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
         "s.bind((sys.argv[1],int(sys.argv[2])));s.listen();print('up',flush=True)\n"
         "while True:\n c,_=s.accept();c.sendall(c.recv(16));c.close()\n")
_PROBE = ("import socket,sys,time\nt=time.monotonic()\ntry:\n"
          " c=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=float(sys.argv[3]))\n"
          " c.sendall(b'ping');assert c.recv(16)==b'ping'\n print(time.monotonic()-t)\n"
          "except OSError:\n print('cut')\n")


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    with Hosts(["a", "b", "c"]) as h:
        servers = [h.popen(n, [sys.executable, "-c", _ECHO, h.addr(n), str(_PORT)],
                           stdout=subprocess.PIPE) for n in h.names]
        try:
            for s in servers:
                assert s.stdout is not None and s.stdout.readline().strip() == b"up"
            yield h
        finally:
            for s in servers:
                s.kill()
                s.wait()
                if s.stdout is not None:
                    s.stdout.close()


def _rtt(h: Hosts, src: str, dst: str, timeout_s: float = 1.0) -> float | None:
    """Seconds for a TCP connect + echo from ``src`` to ``dst``; None when cut."""
    cmd = [sys.executable, "-c", _PROBE, h.addr(dst), str(_PORT), str(timeout_s)]
    out = (subprocess.run(cmd, capture_output=True, text=True, check=True) if src == ROOT
           else h.run(src, cmd, capture_output=True, text=True, check=True)).stdout.strip()
    return None if out == "cut" else float(out)


def test_hosts_reach_each_other_and_the_root_namespace_over_tcp(hosts: Hosts) -> None:
    assert len({hosts.addr(n) for n in hosts.names} | {hosts.bridge_addr}) == 4
    for src in [*hosts.names, ROOT]:
        for dst in hosts.names:
            assert _rtt(hosts, src, dst) is not None, (src, dst)


def test_a_partition_cuts_a_from_b_both_ways_but_not_from_c_and_heal_restores(hosts: Hosts) -> None:
    hosts.partition(["a"], ["b"])
    assert _rtt(hosts, "a", "b") is None and _rtt(hosts, "b", "a") is None
    for src, dst in (("a", "c"), ("c", "a"), ("b", "c"), ("c", "b"), (ROOT, "a")):
        assert _rtt(hosts, src, dst) is not None, (src, dst)
    hosts.heal()
    assert _rtt(hosts, "a", "b") is not None and _rtt(hosts, "b", "a") is not None


_HOLD = ("import socket,sys\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=1)\n"
         "c.sendall(b'one');assert c.recv(16)==b'one';print('connected',flush=True);sys.stdin.readline()\n"
         "try:\n c.sendall(b'two');print('got' if c.recv(16) else 'closed')\n"
         "except OSError:\n print('cut')\n")
_ECHO_MANY = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
              "s.bind((sys.argv[1],int(sys.argv[2])));s.listen();print('up',flush=True)\n"
              "c,_=s.accept()\nwhile (d:=c.recv(16)):\n c.sendall(d)\n")


def test_a_partition_cuts_an_established_connection_too(hosts: Hosts) -> None:
    server = hosts.popen("b", [sys.executable, "-c", _ECHO_MANY, hosts.addr("b"), str(_PORT + 1)],
                         stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"up"
        client = hosts.popen("a", [sys.executable, "-c", _HOLD, hosts.addr("b"), str(_PORT + 1)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == b"connected"
        hosts.partition(["a"], ["b"])
        client.stdin.write(b"go\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == b"cut"  # the echo never came back
        client.wait(5)
        client.stdin.close()
        client.stdout.close()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_isolate_cuts_a_host_from_everyone_the_root_namespace_included(hosts: Hosts) -> None:
    hosts.isolate("c")
    for other in ("a", "b", ROOT):
        assert _rtt(hosts, other, "c") is None, other
    assert _rtt(hosts, "a", "b") is not None
    hosts.heal()
    assert _rtt(hosts, ROOT, "c") is not None


def test_a_delay_measurably_delays_the_hosts_packets_and_heal_removes_it(hosts: Hosts) -> None:
    base = min(_rtt(hosts, "a", "b") or 9.0 for _ in range(3))
    hosts.delay("a", 200)
    # connect (SYN) and the request each leave a once: at least two delays
    delayed = _rtt(hosts, "a", "b", timeout_s=5.0)
    assert delayed is not None and delayed >= 0.4 > base, (base, delayed)
    assert (_rtt(hosts, "b", "c") or 9.0) < 0.4  # other hosts are not delayed
    hosts.heal()
    assert (_rtt(hosts, "a", "b") or 9.0) < 0.4


def test_full_loss_cuts_the_hosts_outgoing_traffic(hosts: Hosts) -> None:
    hosts.loss("b", 100)
    assert _rtt(hosts, "b", "a") is None
    hosts.heal()
    assert _rtt(hosts, "b", "a") is not None


def _ours(stem: str) -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return [w for w in (ns + links).split() if stem in w.replace("-", "")]


def test_close_leaves_no_namespace_and_stale_leftovers_are_removed() -> None:
    h = Hosts(["x", "y"])
    stem = h.stem
    assert _ours(stem)
    h.close()
    assert _ours(stem) == []
    # a crashed run's leftovers: a namespace named for a pid that no longer runs
    dead = subprocess.Popen(["true"])
    dead.wait()
    subprocess.run(["ip", "netns", "add", f"txq-{dead.pid}aa-zz"], check=True)
    time.sleep(0.01)
    assert f"txq-{dead.pid}aa-zz" in remove_stale()
    assert f"txq-{dead.pid}aa-zz" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True, check=True).stdout
