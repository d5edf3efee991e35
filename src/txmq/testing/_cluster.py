"""Run a real RocketMQ-style cluster: one ``txmq namesrv`` process and N ``txmq broker`` processes
(broker groups ``broker-a``, ``broker-b``, … each a master, id 0) registered with it."""

from __future__ import annotations

import contextlib
import string
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from txmq.errors import BrokerUnavailable
from txmq.testing._broker import BrokerProcess
from txmq.testing._process import ServerProcess

__all__ = ["ClusterProcess", "NamesrvProcess", "master_addrs", "run_cluster"]

CLUSTER_BROKERS_MAX = 26
"""Broker names run from ``broker-a`` to ``broker-z``."""
_REGISTERED_TIMEOUT_S = 30.0


class NamesrvProcess(ServerProcess):
    """A ``txmq namesrv`` subprocess; ``addr`` is ``<host>:<port>`` (the port survives
    restarts). ``host`` and ``netns`` as for :class:`txmq.testing.BrokerProcess`."""

    def __init__(self, work_dir: Path, log_path: Path | None = None, host: str = "127.0.0.1",
                 netns: str | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        super().__init__("name server", log_path or self.work_dir / "namesrv.log", host=host,
                         netns=netns)

    def start(self) -> None:
        """Start the process and wait until it listens. Raises BrokerUnavailable."""
        self._launch(["namesrv"], self.work_dir / "namesrv.port")


class ClusterProcess:
    """A name server and broker groups, each a master (``broker_id`` 0), all on loopback.

    Attributes:
        namesrv: the name server process; ``namesrv_addr`` is its address, what clients take.
        brokers: broker name (``broker-a``, ``broker-b``, …) → its :class:`BrokerProcess`.
    """

    def __init__(self, namesrv: NamesrvProcess, brokers: dict[str, BrokerProcess]) -> None:
        self.namesrv = namesrv
        self.brokers = brokers

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    def kill(self, broker_name: str) -> None:
        """SIGKILL one broker (a crash); its data directory stays for :meth:`restart`."""
        self.brokers[broker_name].kill()

    def restart(self, broker_name: str) -> None:
        """Start a stopped or killed broker again on its port and wait until it listens (it
        registers with the name server at start)."""
        b = self.brokers[broker_name]
        b.stop()
        b.start()

    def stop(self) -> None:
        """Stop every broker, then the name server."""
        for b in self.brokers.values():
            b.stop()
        self.namesrv.stop()


def _wait_registered(namesrv_addr: str, names: list[str]) -> None:
    """Wait until the name server lists every broker of ``names`` with a master address."""
    deadline = time.monotonic() + _REGISTERED_TIMEOUT_S
    with contextlib.closing(_Probe(namesrv_addr)) as probe:
        while True:
            known = probe.masters()
            if all(n in known for n in names):
                return
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"brokers {names} did not register with {namesrv_addr}"
                                        f" (known: {sorted(known)})")
            time.sleep(0.05)


class _Probe:
    """GET_BROKER_CLUSTER_INFO over a plain socket (no client threads)."""

    def __init__(self, addr: str) -> None:
        import socket

        from txmq.protocol import parse_address

        host, port = parse_address(addr)
        self._sock = socket.create_connection((host, port), timeout=5)
        self._opaque = 0

    def masters(self) -> set[str]:
        return set(self.master_addrs())

    def master_addrs(self) -> dict[str, str]:
        from txmq.protocol import (
            Command,
            FrameDecoder,
            RequestCode,
            decode_cluster_info,
            encode_command,
        )

        self._opaque += 1
        self._sock.sendall(encode_command(Command(RequestCode.GET_BROKER_CLUSTER_INFO,
                                                  self._opaque)))
        decoder = FrameDecoder()
        while True:
            data = self._sock.recv(65536)
            if not data:
                raise BrokerUnavailable("name server closed the connection")
            for cmd in decoder.feed(data):
                if cmd.is_response and cmd.opaque == self._opaque:
                    if cmd.code != 0 or not cmd.body:
                        return {}
                    info = decode_cluster_info(cmd.body)
                    return {n: bd.broker_addrs[0] for n, bd in info.broker_addr_table.items()
                            if 0 in bd.broker_addrs}

    def close(self) -> None:
        self._sock.close()


def master_addrs(namesrv_addr: str) -> dict[str, str]:
    """Broker name → its master's address (broker id 0), as name server ``namesrv_addr``
    (``host:port``) lists them now (GET_BROKER_CLUSTER_INFO). Raises OSError, BrokerUnavailable."""
    with contextlib.closing(_Probe(namesrv_addr)) as probe:
        return probe.master_addrs()


@contextlib.contextmanager
def run_cluster(brokers: int = 3, data_dir: Path | None = None,
                **config: Any) -> Iterator[ClusterProcess]:
    """Context manager: a started name server and ``brokers`` broker processes registered with it
    (names ``broker-a``, ``broker-b``, …; cluster ``DefaultCluster``), stopped on exit.

    Keyword arguments are BrokerConfig keys given to every broker; ``topics={"orders": 4}``
    creates the topic on every broker, so its route spans them all.

    Raises:
        ValueError: ``brokers`` outside 1..26.
        BrokerUnavailable: a process did not start within 90 s or register within 30 s.
    """
    if not 1 <= brokers <= CLUSTER_BROKERS_MAX:
        raise ValueError(f"brokers must be in 1..{CLUSTER_BROKERS_MAX}")
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txmq-cl-")))
        ns = NamesrvProcess(data_dir / "namesrv")
        stack.callback(ns.stop)
        ns.start()
        procs: dict[str, BrokerProcess] = {}
        for letter in string.ascii_lowercase[:brokers]:
            name = f"broker-{letter}"
            bp = BrokerProcess(data_dir / name, {**config, "broker_name": name,
                                                 "namesrv_addr": ns.addr})
            stack.callback(bp.stop)  # before start: a broker that fails to start is stopped too
            bp.start()
            procs[name] = bp
        _wait_registered(ns.addr, list(procs))
        yield ClusterProcess(ns, procs)
