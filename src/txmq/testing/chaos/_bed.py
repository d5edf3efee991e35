"""The failover test bed: a :class:`~txmq.testing.chaos.ClusterSpec`'s processes, each in its own
test host (:class:`txmq.testing.Hosts`), and the executor of a nemesis plan's steps over them.

Every host has its own address, so every process listens on the same fixed port of its host:
controllers :data:`CONTROLLER_PORT` (remoting) and :data:`RAFT_PORT`, the name server
:data:`NAMESRV_PORT`, brokers :data:`BROKER_PORT` (HA on the next port). Brokers run in controller
mode (``--enable-controller-mode``, design of issue 26) with ``controller_addr`` naming the three
controllers, and a clock file each (``TXMQ_TEST_CLOCK_OFFSET_FILE``, the broker clock hook).

The controller and controller-mode brokers come from the ``txmq controller`` command and
``txmq.testing.ControllerProcess``; :func:`controller_unavailable` says when this txmq has
neither, and the bed refuses to start.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import socket
import time
from pathlib import Path
from typing import Any, Protocol

from txmq import limits
from txmq.errors import ConfigError, TxmqError
from txmq.protocol import Command, FrameDecoder, encode_command, parse_address
from txmq.testing._broker import BrokerProcess
from txmq.testing._cluster import NamesrvProcess, master_addrs
from txmq.testing._netns import Hosts
from txmq.testing.chaos._failover import ClusterSpec, Step, Topology, View, topology

__all__ = ["BROKER_PORT", "CONTROLLER_PORT", "NAMESRV_PORT", "RAFT_PORT", "FailoverBed",
           "controller_leader", "controller_unavailable", "wait_for_masters"]

CONTROLLER_PORT = 9878
"""A controller's remoting port in its host (txmq: fixed, each host has its own address)."""
RAFT_PORT = 9877
"""A controller's Raft (pysyncobj) port in its host."""
NAMESRV_PORT = 9876
"""The name server's port (RocketMQ NamesrvConfig listenPort 9876)."""
BROKER_PORT = limits.BROKER_PORT
"""A broker's port in its host (RocketMQ listenPort 10911); HA listens on the next one."""
CONTROLLER_GET_METADATA_INFO = 1005
"""RocketMQ RequestCode.CONTROLLER_GET_METADATA_INFO: a controller names its Raft leader
(``controllerLeaderAddress`` of GetMetaDataResponseHeader)."""
PROBE_TIMEOUT_S = 1.0
"""How long the run waits for a controller's answer when it looks for the leader."""


def controller_leader(addrs: list[str]) -> str:
    """The controller leader's remoting address as the first of ``addrs`` that answers
    CONTROLLER_GET_METADATA_INFO says ("" when none answers or none knows a leader)."""
    for addr in addrs:
        host, port = parse_address(addr)
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
                sock.settimeout(PROBE_TIMEOUT_S)
                sock.sendall(encode_command(Command(CONTROLLER_GET_METADATA_INFO, 1)))
                leader = _answer(sock).get("controllerLeaderAddress", "")
        except (OSError, TxmqError):
            continue
        if leader:
            return leader
    return ""


def _answer(sock: socket.socket) -> dict[str, str]:
    decoder = FrameDecoder()
    while data := sock.recv(65536):
        for cmd in decoder.feed(data):
            if cmd.is_response and cmd.opaque == 1:
                return cmd.ext if cmd.code == 0 else {}
    return {}


class _Proc(Protocol):
    proc: Any

    def start(self) -> None: ...
    def kill(self) -> None: ...
    def stop(self, timeout_s: float = ...) -> None: ...


def controller_unavailable() -> str:
    """Why this txmq cannot run a controller ("" when it can): the ``txmq.controller`` package
    and ``txmq.testing.ControllerProcess`` (issue 26) are both needed."""
    if importlib.util.find_spec("txmq.controller") is None:
        return "this txmq has no controller (`txmq controller`, package txmq.controller)"
    if not hasattr(importlib.import_module("txmq.testing"), "ControllerProcess"):
        return "this txmq has no txmq.testing.ControllerProcess"
    return ""


class FailoverBed:
    """The processes of ``spec`` in their hosts under ``work`` (a directory per host).

    Args:
        work: the run directory.
        spec: the cluster.
        topics: topic → queue count, created on every broker at start.

    Raises:
        NetnsUnavailable: (at :meth:`start`) no network namespaces here.
        ConfigError: (at :meth:`start`) no controller in this txmq (:func:`controller_unavailable`).
    """

    def __init__(self, work: Path, spec: ClusterSpec, topics: dict[str, int]) -> None:
        self.work, self.spec, self.topics = work, spec, topics
        self.topo: Topology = topology(spec)
        self.hosts: Hosts | None = None
        self.procs: dict[str, _Proc] = {}

    def _host(self) -> Hosts:
        if self.hosts is None:
            raise ConfigError("the failover bed is not started")
        return self.hosts

    @property
    def namesrv_addr(self) -> str:
        return f"{self._host().addr(self.topo.namesrv)}:{NAMESRV_PORT}"

    @property
    def controller_addr(self) -> str:
        """``host:port;host:port;…`` of the controllers (BrokerConfig ``controller_addr``)."""
        h = self._host()
        return ";".join(f"{h.addr(c)}:{CONTROLLER_PORT}" for c in self.topo.controllers)

    def addr_of(self, host: str) -> str:
        """The remoting address of the process on ``host``."""
        port = BROKER_PORT if host not in self.topo.controllers else CONTROLLER_PORT
        port = NAMESRV_PORT if host == self.topo.namesrv else port
        return f"{self._host().addr(host)}:{port}"

    def clock_file(self, host: str) -> Path:
        return self.work / host / "clock_offset_ms"

    def start(self) -> None:
        """Make the hosts and start every controller, the name server and every broker."""
        if why := controller_unavailable():
            raise ConfigError(f"a failover run needs the controller: {why}")
        self.hosts = h = Hosts(self.topo.hosts())
        testing = importlib.import_module("txmq.testing")
        raft = {c: f"{h.addr(c)}:{RAFT_PORT}" for c in self.topo.controllers}
        for c in self.topo.controllers:
            self.procs[c] = testing.ControllerProcess(
                self.work / c, h.addr(c), CONTROLLER_PORT, raft[c],
                [r for o, r in raft.items() if o != c], netns=h.netns(c))
        ns = NamesrvProcess(self.work / self.topo.namesrv, host=h.addr(self.topo.namesrv),
                            netns=h.netns(self.topo.namesrv))
        ns.port = NAMESRV_PORT
        self.procs[self.topo.namesrv] = ns
        for group, members in self.topo.groups.items():
            for b in members:
                self.clock_file(b).parent.mkdir(parents=True, exist_ok=True)
                self.clock_file(b).write_text("0")
                self.procs[b] = BrokerProcess(self.work / b, {
                    "host": h.addr(b), "port": BROKER_PORT, "broker_name": group,
                    "namesrv_addr": self.namesrv_addr, "topics": self.topics,
                    "enable_controller_mode": True, "controller_addr": self.controller_addr,
                    "controller_lease_ms": self.spec.controller_lease_ms},
                    env={"TXMQ_TEST_CLOCK_OFFSET_FILE": str(self.clock_file(b))},
                    netns=h.netns(b))
        for p in self.procs.values():
            p.start()

    def apply(self, step: Step) -> None:
        """Carry out one nemesis step (see :class:`~txmq.testing.chaos.Step`)."""
        if step.op == "partition":
            self._host().partition(step.hosts, step.peers)
        elif step.op == "heal":
            self._host().heal()
        elif step.op == "clock":
            for host in step.hosts:
                self.clock_file(host).write_text(str(step.amount_ms))
        else:
            for host in step.hosts:
                self._signal(self.procs[host], step.op)

    @staticmethod
    def _signal(p: _Proc, op: str) -> None:
        alive = p.proc is not None and p.proc.poll() is None
        if op == "kill":
            if alive:
                p.proc.send_signal(signal.SIGCONT)  # a paused process dies as well
            p.kill()
        elif op == "start" and not alive:
            p.start()
        elif op in ("stop", "cont") and alive:
            p.proc.send_signal(signal.SIGSTOP if op == "stop" else signal.SIGCONT)

    def view(self, leader: bool = True) -> View:
        """Each group's master host as the name server lists it now, and (if ``leader``) the
        controller leader's host as the controllers say (each "" when unknown or unreachable)."""
        by_addr = {self.addr_of(h): h for h in self.topo.hosts()}
        try:
            masters = master_addrs(self.namesrv_addr)
        except (OSError, TxmqError):
            masters = {}
        found = controller_leader([self.addr_of(c) for c in self.topo.controllers]) if leader else ""
        return View({g: by_addr.get(masters.get(g, ""), "") for g in self.topo.groups},
                    by_addr.get(found, ""))

    def heal_all(self) -> None:
        """Heal every partition, reset every clock, resume and start every process."""
        self._host().heal()
        for host, p in self.procs.items():
            if self.clock_file(host).exists():
                self.clock_file(host).write_text("0")
            self._signal(p, "cont")
            self._signal(p, "start")

    def close(self) -> None:
        """Stop every process (brokers first), then remove the hosts."""
        for p in reversed(list(self.procs.values())):
            self._signal(p, "cont")
            p.stop()
        if self.hosts is not None:
            self.hosts.close()
            self.hosts = None

    def __enter__(self) -> FailoverBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_masters(bed: FailoverBed, timeout_s: float) -> View:
    """Poll :meth:`FailoverBed.view` until every group has a master. Raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = bed.view()
        if all(v.masters.values()):
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"no master elected in {timeout_s} s for some group: {v.masters}")
        time.sleep(0.2)
