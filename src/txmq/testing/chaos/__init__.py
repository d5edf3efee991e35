"""Jepsen-style chaos testing over real processes: a workload, a nemesis, histories and a checker.

A run (:func:`run_chaos`, ``txmq chaos``, ``tests/testing/test_chaos.py``) starts:

- a broker (``txmq broker``) whose store lives on a small tmpfs, behind a :class:`FaultProxy` that
  every client connects through;
- the workload, one process each: a plain producer, a transactional producer with a local SQLite
  record of each local transaction, an outbox writer + relay, and one consumer in each of two
  consumer groups whose side effects go through the outbox's inbox (:mod:`._worker`). Each appends
  its history (every operation's invoke and completion: ok / fail / unknown) to a JSON-lines file;
- the nemesis: a schedule drawn from ``random.Random(seed)`` of SIGKILL (+ restart) and SIGSTOP /
  SIGCONT of every process, drop / blackhole / delay / half-open connections in the proxy, a full
  disk under the broker's store, and broker clock jumps forward and back (:mod:`._nemesis`).

A cluster run (``ChaosConfig(brokers=2)``, ``txmq chaos --brokers 2``) starts a name server and
that many brokers instead of the broker and the proxy; the workload finds them through the name
server and the nemesis SIGKILLs one broker at a time (``broker_kill``) while the others keep
serving, besides killing and pausing the workload's processes (:data:`CLUSTER_KINDS`).

A replicated run (``ChaosConfig(replicas=1)``, ``txmq chaos --replicas 1``) makes the broker a
SYNC_MASTER with a slave that follows it through a second fault proxy on the HA link; the nemesis
SIGKILLs and SIGSTOPs the master and the slave and cuts, delays and half-opens the HA link
(:data:`REPLICA_KINDS`), and the checker adds the replication properties: what the master
acknowledged SUCCESS is on the slave byte for byte (scanned while the master is down, and at the
end), no rolled-back transaction is, and the slave's commit log is a prefix of the master's.

A failover run (``txmq chaos --cluster``, :func:`run_failover_chaos`, issue 26) puts 3
controllers, broker groups of 2 controller-mode brokers, a name server and the client processes
each in its own network namespace (:class:`txmq.testing.Hosts`), and its nemesis kills, pauses,
partitions and clock-jumps by role (the master, the controller leader…; :mod:`._failover`); besides
:func:`check` it checks one master per group per epoch and no write taken by a deposed master, and
reports downtime per fault window and failover times (:mod:`._failover_check`).

After the last fault every fault is healed, the producers stop, and the run waits until every
transaction is settled, the outbox is sent and both groups have everything; then :func:`check` reads
the histories, a scan of the broker, the transaction states, the databases and the offset samples,
and lists violations (see :mod:`._check`). The report (:func:`render_markdown`, JSON) gives the
schedule, the counts, each violation with its history excerpt, and the seed that replays it.

The workload's outbox needs the ``outbox`` extra (SQLAlchemy) besides ``broker``.
"""

from txmq.extras import require_extra as _require_extra

_require_extra("outbox", "txmq.testing.chaos", "sqlalchemy", "alembic")

from txmq.testing.chaos._bed import FailoverBed, controller_unavailable
from txmq.testing.chaos._check import (
    Observation,
    OffsetSample,
    ReplicaSnapshot,
    Stored,
    Violation,
    check,
)
from txmq.testing.chaos._failover import (
    FAILOVER_KINDS,
    ClusterSpec,
    NoTarget,
    Plan,
    Step,
    Topology,
    View,
    failover_schedule,
    plan,
    topology,
)
from txmq.testing.chaos._failover_check import (
    FailoverTime,
    MasterKill,
    WindowDowntime,
    downtime_per_fault,
    failover_summary,
    failover_times,
    failover_violations,
)
from txmq.testing.chaos._failover_run import (
    FailoverConfig,
    FailoverResult,
    run_failover_chaos,
)
from txmq.testing.chaos._failover_run import (
    refusal as failover_refusal,
)
from txmq.testing.chaos._history import HistoryWriter, read_histories
from txmq.testing.chaos._nemesis import CLUSTER_KINDS, KINDS, REPLICA_KINDS, Fault, schedule
from txmq.testing.chaos._procs import BrokerTarget
from txmq.testing.chaos._proxy import FaultProxy
from txmq.testing.chaos._report import render_failover_markdown, render_markdown, write_reports
from txmq.testing.chaos._run import ChaosConfig, ChaosResult, run_chaos

__all__ = [
    "CLUSTER_KINDS",
    "FAILOVER_KINDS",
    "KINDS",
    "REPLICA_KINDS",
    "BrokerTarget",
    "ChaosConfig",
    "ChaosResult",
    "ClusterSpec",
    "FailoverBed",
    "FailoverConfig",
    "FailoverResult",
    "FailoverTime",
    "Fault",
    "FaultProxy",
    "HistoryWriter",
    "MasterKill",
    "NoTarget",
    "Observation",
    "OffsetSample",
    "Plan",
    "ReplicaSnapshot",
    "Step",
    "Stored",
    "Topology",
    "View",
    "Violation",
    "WindowDowntime",
    "check",
    "controller_unavailable",
    "downtime_per_fault",
    "failover_refusal",
    "failover_schedule",
    "failover_summary",
    "failover_times",
    "failover_violations",
    "plan",
    "read_histories",
    "render_failover_markdown",
    "render_markdown",
    "run_chaos",
    "run_failover_chaos",
    "schedule",
    "topology",
    "write_reports",
]
