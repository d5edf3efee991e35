"""The demo's brokers: one broker it starts (the default), a cluster it starts (a name server and N
brokers, ``--brokers N``), or brokers it is given (``--broker`` / ``--namesrv-addr``). With
``--replicas 1`` the one broker it starts is a SYNC_MASTER with a slave (docs/replication.md), and
the report says whether the slave's commit log ended byte-identical to the master's.

Every client of the demo (order service, ledger, compensator, Spark) is told either a broker
address or the name servers; the demo itself reads each broker's transaction counts and how many
orders each stored from every master.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txmq.client import Admin, AsyncPullConsumer, PullConsumer
from txmq.errors import BrokerUnavailable, ConfigError
from txmq.store import read_commit_log

__all__ = ["DEMO_BROKERS_MAX", "DEMO_REPLICA_WAIT_S", "Brokers", "start_brokers"]

DEMO_BROKERS_MAX = 26
"""``--brokers`` at most: the cluster harness names its brokers ``broker-a`` … ``broker-z``
(:data:`txmq.testing._cluster.CLUSTER_BROKERS_MAX`)."""

DEMO_REPLICA_WAIT_S = 60.0
"""Longest the demo waits for its slave to be in sync (at start) and caught up (at the end)."""


@dataclass
class Brokers:
    """Where the demo's clients connect, and the masters behind it.

    Attributes:
        endpoints: a broker address ``host:port`` ("" when ``namesrv_addr`` is set).
        namesrv_addr: name servers ``host:port[;host:port]`` ("" with one broker).
        masters: broker name → master address (``{"broker": endpoints}`` with one broker).
        stop: stops what the demo started (nothing for brokers it was given).
        replica: with ``--replicas 1``, checks the slave at the end (:meth:`replica_report`).
    """

    endpoints: str
    namesrv_addr: str
    masters: dict[str, str]
    stop: Callable[[], None] = field(default=lambda: None)
    replica: Callable[[], dict[str, Any]] | None = None

    def replica_report(self) -> dict[str, Any]:
        """``{"replicas": 0}``, or with a slave: its lag when the run ended (bytes) and whether
        its commit log is byte-identical to the master's once caught up. Call before
        :attr:`stop`."""
        return {"replicas": 0} if self.replica is None else self.replica()

    def args(self) -> list[str]:
        """Command-line arguments of the demo's services: ``--endpoints`` or ``--namesrv-addr``."""
        return (["--namesrv-addr", self.namesrv_addr] if self.namesrv_addr
                else ["--endpoints", self.endpoints])

    def spark_options(self) -> dict[str, str]:
        """Options of the txmq Spark source: ``namesrvAddr`` or ``endpoints``."""
        return ({"namesrvAddr": self.namesrv_addr} if self.namesrv_addr
                else {"endpoints": self.endpoints})

    def describe(self) -> str:
        """One line for the console: the name server and each broker, or the broker."""
        if not self.namesrv_addr:
            return f"broker at {self.endpoints}"
        each = ", ".join(f"{n} at {a}" for n, a in sorted(self.masters.items()))
        return f"name server at {self.namesrv_addr}; brokers {each}"

    def transaction_stats(self) -> dict[str, int]:
        """The transaction counts (PENDING, COMMIT, ROLLBACK, DISCARD, checks_sent, …) summed over
        every master. Raises BrokerUnavailable, RequestTimeout."""
        total: Counter[str] = Counter()
        for addr in self.masters.values():
            with PullConsumer(addr) as pc:
                total.update(pc.transaction_stats())
        return dict(total)

    def stored(self, topic: str) -> dict[str, int]:
        """Broker name → messages of ``topic`` it stores (the sum of its queues' max offsets).
        Raises BrokerUnavailable, RequestTimeout, RemoteError."""
        out: dict[str, int] = {}
        for name, addr in sorted(self.masters.items()):
            with PullConsumer(addr) as pc:
                out[name] = sum(pc.max_offset(topic, q) for q in pc.queue_ids(topic))
        return out


async def _cluster_masters(namesrv_addr: str) -> dict[str, str]:
    """Broker name → master address of every group the name servers know."""
    client = AsyncPullConsumer("", namesrv_addr=namesrv_addr)
    await client.start()
    try:
        return await client.cluster_masters()
    finally:
        await client.shutdown()


def _given(broker: str | None, namesrv_addr: str | None, topics: dict[str, int]) -> Brokers:
    """The brokers the demo was pointed at, with ``topics`` created on every master."""
    with PullConsumer(broker or "", namesrv_addr=namesrv_addr or "") as pc:
        for topic, queues in topics.items():
            pc.create_topic(topic, queues)
        if namesrv_addr:
            return Brokers("", namesrv_addr, asyncio.run(_cluster_masters(namesrv_addr)))
        return Brokers(pc.broker_address(), "", {"broker": pc.broker_address()})


def _master_and_slave(run_dir: Path, topics: dict[str, int], **config: Any) -> Brokers:
    """A SYNC_MASTER under ``run_dir/broker`` and its slave under ``run_dir/slave``, in sync."""
    from txmq.testing import BrokerProcess, free_port

    ha = free_port()
    master = BrokerProcess(run_dir / "broker", {"topics": topics, **config, "ha_listen_port": ha,
                                                "broker_role": "SYNC_MASTER"})
    slave = BrokerProcess(run_dir / "slave", {"topics": topics, **config, "broker_role": "SLAVE",
                                              "broker_id": 1, "ha_master_address": f"127.0.0.1:{ha}"})
    master.start()
    slave.start()

    def stop() -> None:
        slave.stop()
        master.stop()

    def lag() -> tuple[int, int]:  # (the master's end, bytes the slave has not acknowledged)
        with Admin(master.endpoints) as a:
            info = a.ha_status()
        diffs = [c.diff for c in info.ha_connection_info]
        return info.master_commit_log_max_offset, min(diffs) if diffs else -1

    def report() -> dict[str, Any]:
        end, behind = lag()
        deadline = time.monotonic() + DEMO_REPLICA_WAIT_S
        while lag()[1] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        end, caught = lag()
        same = caught == 0 and _log(master.data_dir, end) == _log(slave.data_dir, end)
        return {"replicas": 1, "slave_lag_bytes_at_end": behind, "slave_log_bytes": end,
                "slave_log_identical": same}

    deadline = time.monotonic() + DEMO_REPLICA_WAIT_S
    while lag()[1] < 0:
        if time.monotonic() > deadline:
            stop()
            raise BrokerUnavailable("the demo's slave did not connect to its master")
        time.sleep(0.2)
    return Brokers(master.endpoints, "", {"broker": master.endpoints}, stop, report)


def _log(data_dir: Path, end: int) -> bytes:
    """The first ``end`` bytes of the commit log under ``data_dir`` (its records in order)."""
    return read_commit_log(data_dir / "store")[:end]


def start_brokers(n: int, run_dir: Path, topics: dict[str, int], broker: str | None = None,
                  namesrv_addr: str | None = None, replicas: int = 0, **config: Any) -> Brokers:
    """The demo's brokers: those given (``broker`` or ``namesrv_addr``, ``topics`` created there),
    one broker started with its data in ``run_dir/broker`` (``n`` = 1), or a name server and ``n``
    brokers started with their data under ``run_dir/cluster`` (``n`` ≥ 2), each with ``topics``
    (name → queue count) and the BrokerConfig keys ``config``. ``replicas`` 1: the one broker
    started is a SYNC_MASTER with a slave (returned once the slave is connected).

    Raises:
        ConfigError: ``n`` outside 1..:data:`DEMO_BROKERS_MAX`, or ``n`` ≥ 2 with brokers given,
            or ``replicas`` other than 0 and 1, or 1 with more brokers or brokers given.
        BrokerUnavailable: a process did not start, or a given broker cannot be reached.
    """
    if not 1 <= n <= DEMO_BROKERS_MAX:
        raise ConfigError(f"--brokers {n}: use 1..{DEMO_BROKERS_MAX}")
    if replicas not in (0, 1):
        raise ConfigError(f"--replicas {replicas}: use 0 or 1")
    if replicas and (n > 1 or broker or namesrv_addr):
        raise ConfigError("--replicas 1 gives the one broker the demo starts a slave: drop "
                          "--brokers, --broker and --namesrv-addr")
    if replicas:
        return _master_and_slave(run_dir, topics, **config)
    if broker or namesrv_addr:
        if n > 1:
            raise ConfigError("--brokers starts a cluster: drop --broker / --namesrv-addr")
        return _given(broker, namesrv_addr, topics)
    from txmq.testing import BrokerProcess, run_cluster

    if n == 1:
        bp = BrokerProcess(run_dir / "broker", {"topics": topics, **config})
        bp.start()
        return Brokers(bp.endpoints, "", {"broker": bp.endpoints}, bp.stop)
    stack = contextlib.ExitStack()
    cluster = stack.enter_context(run_cluster(n, run_dir / "cluster", topics=topics, **config))
    masters = {name: b.endpoints for name, b in cluster.brokers.items()}
    return Brokers("", cluster.namesrv_addr, masters, stack.close)
