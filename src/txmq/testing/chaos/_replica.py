"""The slave side of a replicated chaos run: the SYNC_MASTER's and the slave's configuration, the
slave as a nemesis target, its catch-up wait and the commit logs the checker compares.

The master's HA listener has a fixed port; the slave follows it through a :class:`FaultProxy`
(``ha_master_address`` is the proxy), so the nemesis can cut, delay or half-open the HA link
(``ha_cut``, ``ha_delay``, ``ha_half_open``) while both processes run, besides SIGKILLing and
SIGSTOPping either one (``master_kill``, ``slave_kill``, ``master_pause``, ``slave_pause``).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from txmq.client import Admin, Message, Producer
from txmq.store import read_commit_log
from txmq.testing._broker import BrokerProcess
from txmq.testing._ports import free_port
from txmq.testing.chaos._procs import BrokerTarget
from txmq.testing.chaos._proxy import FaultProxy

__all__ = [
    "CATCH_UP_TIMEOUT_S",
    "PROBE_TOPIC",
    "RESYNC_TIMEOUT_S",
    "SYNC_FLUSH_TIMEOUT_MS",
    "Replica",
    "log_bytes",
]

CATCH_UP_TIMEOUT_S = 60.0
"""How long the end of a replicated run waits for the slave to reach the master's commit log end
(a cut HA link reconnects within ``HA_RECONNECT_INTERVAL_MS``, 1 s; a slave restarted after a
SIGKILL recovers its log first)."""
RESYNC_TIMEOUT_S = 30.0
"""After healing a ``master_kill`` or ``slave_kill`` the nemesis waits at most this long for the
group to be in sync again (:meth:`Replica.wait_in_sync`) before the next fault, so that fault hits
a replicating group (the slave's
reconnection backs off up to ``HA_RECONNECT_INTERVAL_MS``, 1 s); the report notes a longer wait."""
_CATCH_UP_POLL_S = 0.2
PROBE_TOPIC = "chaos-probe"
"""A topic of the replicated run's brokers outside the workload's: the in-sync probe's sends."""
SYNC_FLUSH_TIMEOUT_MS = 1000
"""The master's ``sync_flush_timeout_ms`` in a replicated run: below the workload's request
timeout (2 s, ``_worker._TIMEOUT_MS``), so a stalled slave makes the master answer
FLUSH_SLAVE_TIMEOUT before the client gives up (with the default 3 s every such send would end
``unknown`` and the not-acknowledged answers would go untested)."""


def log_bytes(store_dir: Path) -> bytes:
    """A store's commit log records (:func:`txmq.store.read_commit_log`: segment files joined in
    offset order, without the zeros written ahead), b"" if none: a slave's is a prefix of its
    master's when the two logs are byte-identical up to the slave's end."""
    return read_commit_log(store_dir)


class Replica:
    """The master's replication settings, the slave (not started) and the HA link's proxy.

    Args:
        run: the run directory; the slave lives in ``run/slave``.
        base: the broker configuration both share (topics, store sizes: a slave's segments must
            have its master's size).
    """

    def __init__(self, run: Path, base: dict[str, Any]) -> None:
        base = {**base, "topics": {**base["topics"], PROBE_TOPIC: 1}}
        self.ha_port = free_port()
        self.master_config = {
            **base,
            "broker_role": "SYNC_MASTER",
            "ha_listen_port": self.ha_port,
            "sync_flush_timeout_ms": SYNC_FLUSH_TIMEOUT_MS,
        }
        self.slave = BrokerTarget(
            BrokerProcess(
                run / "slave",
                {**base, "broker_role": "SLAVE", "broker_id": 1},
                log_path=run / "logs-slave.log",
            )
        )
        self.proxy = FaultProxy(self.ha_port)

    @property
    def store_dir(self) -> Path:
        return self.slave.broker.data_dir / "store"

    def start(self) -> None:
        """Start the HA link's proxy, then the slave following the master through it."""
        self.proxy.start()
        self.slave.broker.config["ha_master_address"] = self.proxy.endpoints
        self.slave.start()

    def stop(self) -> None:
        self.slave.resume()
        self.slave.broker.stop()
        self.proxy.stop()

    def wait_in_sync(self, master_addr: str, timeout_s: float = RESYNC_TIMEOUT_S) -> bool:
        """Wait until the master answers a send to :data:`PROBE_TOPIC` SEND_OK, which it does only
        once the slave has it on disk; False when it had not after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception), Producer("chaos-probe", master_addr, timeout_ms=2000) as p:
                while time.monotonic() < deadline:
                    if p.send(Message(topic=PROBE_TOPIC, body=b"probe")).status.name == "SEND_OK":
                        return True
                    time.sleep(_CATCH_UP_POLL_S)
            time.sleep(_CATCH_UP_POLL_S)
        return False

    def wait_caught_up(self, master_addr: str, timeout_s: float = CATCH_UP_TIMEOUT_S) -> bool:
        """Wait until the slave's commit log reaches the end the master's had when the wait
        began; False when it had not after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        target = -1
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if target < 0:
                    with Admin(master_addr, timeout_ms=2000) as a:
                        target = a.runtime_info().commit_log_max_offset
                with Admin(self.slave.broker.endpoints, timeout_ms=2000) as a:
                    if a.runtime_info().commit_log_max_offset >= target >= 0:
                        return True
            time.sleep(_CATCH_UP_POLL_S)
        return False
