"""One chaos run: start the broker (on a tmpfs), the proxy and the workload; run the nemesis; heal;
drain; observe; check. See the package docstring for the whole picture.

A cluster run (``ChaosConfig.brokers`` ≥ 2) starts a name server and that many brokers instead
(``broker-a``, ``broker-b``, … every workload topic on each); the workload finds them through the
name server, the nemesis kills one broker at a time (``broker_kill``) and the workload's processes,
and the final scan, the offset samples and the transaction states are read from every broker. A
queue of the checker is then ``<topic>@<broker>`` and its id.

A replicated run (``ChaosConfig.replicas`` = 1) makes the broker a SYNC_MASTER (``master``) with
a slave (``slave``) following it through a second fault proxy on the HA link (:mod:`._replica`);
its kinds are :data:`REPLICA_KINDS`. While the master is SIGKILLed the slave is scanned; at the end
the run waits for the slave to catch up, scans it again, and hands both commit logs to the checker.
"""

from __future__ import annotations

import contextlib
import sqlite3
import string
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from txmq import limits
from txmq.client import Admin, PullConsumer
from txmq.testing._broker import BrokerProcess
from txmq.testing._cluster import CLUSTER_BROKERS_MAX, run_cluster
from txmq.testing.chaos._check import (
    Observation,
    OffsetSample,
    ReplicaSnapshot,
    Stored,
    Violation,
    check,
    retained_out,
)
from txmq.testing.chaos._history import read_histories
from txmq.testing.chaos._nemesis import (
    CLUSTER_KINDS,
    HA_KINDS,
    KINDS,
    NETWORK_KINDS,
    REPLICA_KINDS,
    Fault,
    fill_disk,
    schedule,
)
from txmq.testing.chaos._procs import BrokerTarget, Worker, mount_tmpfs, unmount
from txmq.testing.chaos._proxy import FaultProxy
from txmq.testing.chaos._replica import RESYNC_TIMEOUT_S, Replica, log_bytes
from txmq.testing.chaos._spec import GROUPS, TOPICS, prepare_databases
from txmq.testing.chaos._worker import NAMESRV_PREFIX

__all__ = ["ChaosConfig", "ChaosResult", "run_chaos"]

_QUEUES = 2
_SERVING_TIMEOUT_S = 90.0
"""A cluster or replicated run waits at most this long, before the warm-up, for the workload to
have stored a message on every broker, the slave included (a loaded 2-core machine took ~30 s to
start the workload's processes; a broker killed before they fetched their routes would get nothing
until the 30 s route refresh, and faults before the first send test nothing)."""
_CUT_BEFORE_KILL_S = 1.0
"""``master_kill_cut``: how long the master takes writes with the HA link cut before its SIGKILL
(at most half the fault's duration)."""
_ROLES = {"plain": "plain", "tx": "tx", "outbox": "outbox", GROUPS[0]: "consumer", GROUPS[1]: "consumer"}


class ChaosConfig(msgspec.Struct, kw_only=True):
    """A run's parameters. ``duration_s`` is the nemesis's span (the faults spread over it);
    ``warmup_s`` of fault-free load come first; the drain after healing takes at most
    ``quiesce_timeout_s``. ``brokers`` ≥ 2 makes it a cluster run (see the module docstring); its
    kinds are :data:`CLUSTER_KINDS` unless ``kinds`` names others than the default. ``replicas``
    1 makes it a replicated run (one broker only), whose default kinds are :data:`REPLICA_KINDS`."""

    seed: int = 1
    brokers: int = 1
    replicas: int = 0
    faults: int = 12
    duration_s: float = 60.0
    warmup_s: float = 5.0
    kinds: tuple[str, ...] = KINDS
    tmpfs_size: str = "64m"
    quiesce_timeout_s: float = limits.CHAOS_QUIESCE_TIMEOUT_MS / 1000


class ChaosResult(msgspec.Struct, kw_only=True):
    """Everything the report shows: the schedule as run, counts, violations, and notes."""

    seed: int
    config: ChaosConfig
    schedule: list[Fault]
    operations: dict[str, int]
    faults_by_kind: dict[str, int]
    violations: list[Violation]
    skipped_kinds: dict[str, str]
    stored: int
    stored_by_broker: dict[str, int]
    """Broker name → messages of the workload's topics it stored (``{}`` in a one-broker run)."""
    retained_out: int
    """Acknowledged messages delivered, then deleted by retention (a full disk forces it)."""
    replica: dict[str, int] = msgspec.field(default_factory=dict)
    """A replicated run's slave: ``snapshots`` (scans), ``stored`` (messages on it at the end),
    ``log_bytes`` / ``master_log_bytes`` (both commit logs at the end); ``{}`` otherwise."""
    offset_samples: int
    redeliveries: int
    tx_states: dict[str, int]
    elapsed_s: float
    quiesced: bool
    notes: list[str] = msgspec.field(default_factory=list)


def _broker_config() -> dict[str, Any]:
    return {"topics": dict.fromkeys(TOPICS.values(), _QUEUES), "transaction_timeout_ms": 1000,
            "transaction_check_interval_ms": 500, "message_delay_level": " ".join(["1s"] * 18),
            "store": {"mapped_file_size_commit_log": 4 * 1024 * 1024, "max_hash_slot_num": 4096,
                      "max_index_num": 40_000}}


class _Run:
    """The running system: broker, proxy, workers, the offset sampler and the active fault."""

    def __init__(self, run: Path, config: ChaosConfig) -> None:
        self.run, self.config = run, config
        (run / "history").mkdir(parents=True, exist_ok=True)
        self.store_dir = run / "broker" / "store"
        self.skipped: dict[str, str] = {}
        self.clock_file = run / "clock_offset_ms"
        self.clock_file.write_text("0")
        self.brokers: dict[str, BrokerTarget] = {}
        """Broker name → the broker as a target: ``{"broker": …}`` in a one-broker run."""
        self._cluster = contextlib.ExitStack()
        self.namesrv_addr = ""
        self.mounted = False
        self.replica = Replica(run, _broker_config()) if config.replicas else None
        self.snapshots: list[ReplicaSnapshot] = []
        if config.brokers == 1:
            why = "" if self.replica else mount_tmpfs(self.store_dir, config.tmpfs_size)
            self.mounted = not why and not self.replica
            if why:
                self.skipped["disk_full"] = f"cannot mount a tmpfs for the broker's store: {why}"
            cfg = self.replica.master_config if self.replica else _broker_config()
            broker = BrokerProcess(run / "broker", cfg, log_path=run / "logs-broker.log",
                                   env={"TXMQ_TEST_CLOCK_OFFSET_FILE": str(self.clock_file)})
            self.brokers["master" if self.replica else "broker"] = BrokerTarget(broker)
        self.proxy: FaultProxy | None = None
        self.workers: dict[str, Worker] = {}
        self.samples: list[OffsetSample] = []
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        prepare_databases(self.run)
        if self.config.brokers == 1:
            broker = self.master().broker
            broker.start()
            self.proxy = FaultProxy(broker.port)
            self.proxy.start()
            endpoints = self.proxy.endpoints
            if self.replica:
                self.replica.start()
        else:
            cluster = self._cluster.enter_context(
                run_cluster(self.config.brokers, self.run / "cluster", **_broker_config()))
            self.brokers = {n: BrokerTarget(b) for n, b in cluster.brokers.items()}
            self.namesrv_addr = cluster.namesrv_addr
            endpoints = NAMESRV_PREFIX + cluster.namesrv_addr
        for name, role in _ROLES.items():
            self.workers[name] = Worker(role, name, self.run, endpoints)
            self.workers[name].start()
        self._sampler = threading.Thread(target=self._sample_offsets, name="chaos-offsets", daemon=True)
        self._sampler.start()

    def master(self) -> BrokerTarget:
        """The broker of a one-broker run (``broker``, or a replicated run's ``master``)."""
        return next(iter(self.brokers.values()))

    def targets(self) -> dict[str, Worker | BrokerTarget]:
        slave = {"slave": self.replica.slave} if self.replica else {}
        return {**self.brokers, **slave, **self.workers}

    def masters(self) -> dict[str, str]:
        """Broker name → address: ``{"": address}`` in a one-broker run (its queues keep their
        topic's name in the checker), the cluster's brokers otherwise."""
        if self.config.brokers == 1:
            return {"": self.master().broker.endpoints}
        return {n: t.broker.endpoints for n, t in self.brokers.items()}

    def restarts(self) -> list[float]:
        """When any broker was started again (ms since the epoch), in order."""
        return sorted(t for b in self.brokers.values() for t in b.restarts)

    def _sample_offsets(self) -> None:
        clients: dict[tuple[str, str], PullConsumer] = {}
        while not self._sampling.wait(limits.CHAOS_OFFSET_SAMPLE_INTERVAL_MS / 1000):
            for name, addr in self.masters().items():
                for g in GROUPS:
                    try:
                        if (name, g) not in clients:
                            clients[(name, g)] = PullConsumer(addr, g, timeout_ms=1000)
                            clients[(name, g)].start()
                        for t in TOPICS.values():
                            for q in range(_QUEUES):
                                off = clients[(name, g)].fetch_consumer_offset(t, q)
                                if off is not None:
                                    self.samples.append(OffsetSample(time.time() * 1000, g,
                                                                     _queue_topic(t, name), q, off))
                    except Exception:  # the broker is down, paused or full: no sample this time
                        with contextlib.suppress(Exception):
                            clients.pop((name, g)).shutdown()
        for c in clients.values():
            with contextlib.suppress(Exception):
                c.shutdown()

    def stop(self) -> None:
        self._sampling.set()
        if self._sampler is not None:
            self._sampler.join(10)
        for w in self.workers.values():
            w.resume()
            w.kill()
        for b in self.brokers.values():
            b.resume()
            b.broker.stop()
        self._cluster.close()
        if self.replica is not None:
            self.replica.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.mounted:
            unmount(self.store_dir)

    # -- faults -----------------------------------------------------------------------------------
    def inject(self, f: Fault) -> None:
        if f.kind in HA_KINDS:
            self._ha_link(f)
        elif f.kind == "master_kill_cut":
            self._ha_link(Fault(at_s=f.at_s, kind="ha_cut", target="ha-link", duration_s=0))
            time.sleep(min(_CUT_BEFORE_KILL_S, f.duration_s / 2))
            t0 = time.time() * 1000
            self.master().kill()
            f.note = self.snapshot(t0)
        elif f.kind == "kill" or f.kind.endswith("_kill"):
            t0 = time.time() * 1000
            self.targets()[f.target].kill()
            if f.kind == "master_kill":
                f.note = self.snapshot(t0)
        elif f.kind == "pause" or f.kind.endswith("_pause"):
            self.targets()[f.target].pause()
        elif f.kind == "drop":
            assert self.proxy is not None
            f.note = f"{self.proxy.drop()} connections closed"
        elif f.kind in NETWORK_KINDS:
            assert self.proxy is not None
            self.proxy.set_mode(f.kind, f.amount_ms)  # type: ignore[arg-type]
        elif f.kind == "disk_full":
            fill_disk(self.store_dir)
        elif f.kind.startswith("clock_"):
            self.clock_file.write_text(str(f.amount_ms))

    def _ha_link(self, f: Fault) -> None:
        assert self.replica is not None
        proxy = self.replica.proxy
        if f.kind == "ha_cut":
            f.note = f"{proxy.drop()} connections closed"
            proxy.set_mode("blackhole")
        else:
            proxy.set_mode(f.kind.removeprefix("ha_"), f.amount_ms)  # type: ignore[arg-type]

    def snapshot(self, t0: float, final: bool = False) -> str:
        """Scan the slave; ``t0`` is when nothing more could reach it (the master's kill) or
        when its catch-up ended. Returns a note for the report."""
        assert self.replica is not None
        try:
            with PullConsumer(self.replica.slave.broker.endpoints, "chaos-checker") as pc:
                stored = _scan({"": pc})
        except Exception as exc:
            return f"slave not scanned: {exc!r}"[:200]
        self.snapshots.append(ReplicaSnapshot(t0, stored, final))
        return f"slave scanned: {len(stored)} messages"

    def heal(self, f: Fault) -> None:
        if f.kind in HA_KINDS:
            assert self.replica is not None
            self.replica.proxy.set_mode("pass")
        elif f.kind == "kill" or f.kind.endswith(("_kill", "_kill_cut")):
            self._restart(self.targets()[f.target])
            if self.replica is not None and f.kind != "kill":
                self.replica.proxy.set_mode("pass")
                if not self.replica.wait_in_sync(self.master().broker.endpoints):
                    f.note = (f.note + "; " if f.note else "") + "the group was not in sync " \
                             f"{RESYNC_TIMEOUT_S:.0f} s after the restart"
        elif f.kind == "pause" or f.kind.endswith("_pause"):
            self.targets()[f.target].resume()
        elif f.kind in NETWORK_KINDS:
            assert self.proxy is not None
            self.proxy.set_mode("pass")
        elif f.kind == "disk_full":
            (self.store_dir / "chaos-ballast").unlink(missing_ok=True)
        elif f.kind.startswith("clock_"):
            self.clock_file.write_text("0")

    def _restart(self, t: Worker | BrokerTarget, attempts: int = 3) -> None:
        for i in range(attempts):
            try:
                t.start()
                return
            except Exception:
                if i == attempts - 1:
                    raise
                time.sleep(1)

    def heal_all(self) -> list[str]:
        """Undo anything still in effect; restart whatever is dead. Returns notes."""
        notes = []
        if self.proxy is not None:
            self.proxy.set_mode("pass")
        if self.replica is not None:
            self.replica.proxy.set_mode("pass")
        self.clock_file.write_text("0")
        (self.store_dir / "chaos-ballast").unlink(missing_ok=True)
        for name, t in self.targets().items():
            t.resume()
            if not t.alive():
                notes.append(f"{name} was dead after the nemesis; restarted")
                self._restart(t)
        return notes


def _nemesis(r: _Run, faults: list[Fault]) -> None:
    t0 = time.monotonic()
    for f in faults:
        if f.kind in r.skipped:
            f.note = "skipped: " + r.skipped[f.kind]
            continue
        time.sleep(max(0.0, t0 + f.at_s - time.monotonic()))
        f.started_ms = time.time() * 1000
        r.inject(f)
        time.sleep(f.duration_s)
        try:
            r.heal(f)
        except Exception as exc:
            f.note = (f.note + "; " if f.note else "") + f"heal failed: {exc!r}"
        f.healed_ms = time.time() * 1000


def _outbox_unsent(run: Path) -> int:
    with contextlib.closing(sqlite3.connect(run / "outbox.db", timeout=30)) as c:
        return int(c.execute("SELECT count(*) FROM txmq_outbox WHERE status != 'PRODUCE_PROCESSED'")
                   .fetchone()[0])


def _effects(run: Path) -> dict[str, dict[str, int]]:
    out = {}
    for g in GROUPS:
        with contextlib.closing(sqlite3.connect(run / f"{g}.db", timeout=30)) as c:
            out[g] = {k: n for k, n in c.execute("SELECT key, count(*) FROM effects GROUP BY key")}
    return out


def _queue_topic(topic: str, broker: str) -> str:
    """The checker's name of ``topic``'s queues on ``broker``: ``topic`` in a one-broker run
    (``broker`` ""), ``<topic>@<broker>`` in a cluster run (queue ids repeat across brokers)."""
    return f"{topic}@{broker}" if broker else topic


def _scan(pcs: dict[str, PullConsumer]) -> list[Stored]:
    """Every message of the workload's topics on every broker (``pcs``: name → its client)."""
    out = []
    for name, pc in pcs.items():
        for t in TOPICS.values():
            for q in range(_QUEUES):
                off, end = pc.min_offset(t, q), pc.max_offset(t, q)
                while off < end:
                    got = pc.pull(t, q, off, 256).messages
                    if not got:
                        break
                    out += [Stored(_queue_topic(t, name), q, m.queue_offset, m.keys, m.msg_id,
                                   m.body) for m in got]
                    off = got[-1].queue_offset + 1
    return out


def _min_offsets(pcs: dict[str, PullConsumer]) -> dict[str, int]:
    return {f"{_queue_topic(t, name)}/{q}": pc.min_offset(t, q)
            for name, pc in pcs.items() for t in TOPICS.values() for q in range(_QUEUES)}


def _backlog(r: _Run, pcs: dict[str, PullConsumer]) -> str:
    """What is still to settle, deliver or relay ("" when everything has drained)."""
    pending = sum(pc.transaction_stats().get("PENDING", 0) for pc in pcs.values())
    unsent = _outbox_unsent(r.run)
    keys = {m.key for m in _scan(pcs)}
    effects = _effects(r.run)
    missing = {g: len(keys - set(effects[g])) for g in GROUPS}
    if pending or unsent or any(missing.values()):
        return f"{pending} transactions pending, {unsent} outbox events unsent, missing per group {missing}"
    return ""


def _quiesce(r: _Run, pcs: dict[str, PullConsumer]) -> str:
    """Stop the producers and wait until everything has drained; returns what had not, or ""."""
    (r.run / "stop").touch()
    deadline = time.monotonic() + r.config.quiesce_timeout_s
    left = "not measured"
    while time.monotonic() < deadline:
        try:
            left = _backlog(r, pcs)
        except Exception as exc:
            left = repr(exc)
        if not left:
            time.sleep(2 * limits.CHAOS_OFFSET_SAMPLE_INTERVAL_MS / 1000)  # one more offset sample
            return ""
        time.sleep(1)
    return left


def _tx_states(masters: dict[str, str], events: list[dict[str, Any]]) -> dict[str, str]:
    """msg id → the state of its transaction on the broker that stored the half (by half offset:
    the broker finds settled transactions only that way)."""
    out = {}
    with contextlib.ExitStack() as stack:
        admins = {n: stack.enter_context(Admin(a)) for n, a in masters.items()}
        only = next(iter(admins.values())) if len(admins) == 1 else None
        for e in events:
            if e["op"] == "tx" and e["phase"] == "ok":
                admin = only or admins[e.get("broker", "")]
                out[e["msg_id"]] = str(admin.query_transaction(f"half:{e['half_offset']}")["state"])
    return out


def _observe(r: _Run, pcs: dict[str, PullConsumer], events: list[dict[str, Any]]) -> Observation:
    tx_broker = _tx_states(r.masters(), events)
    with contextlib.closing(sqlite3.connect(r.run / "tx.db", timeout=30)) as c:
        tx_local = {k: s for k, s in c.execute("SELECT key, state FROM tx")}
    with contextlib.closing(sqlite3.connect(r.run / "outbox.db", timeout=30)) as c:
        outbox_keys = [k for (k,) in c.execute("SELECT biz_key FROM txmq_outbox")]
    return Observation(groups=list(GROUPS), stored=_scan(pcs), tx_local=tx_local,
                       tx_broker=tx_broker, outbox_keys=outbox_keys, effects=_effects(r.run),
                       offsets=list(r.samples), broker_restarts=r.restarts(),
                       min_offsets=_min_offsets(pcs))


def _redeliveries(events: list[dict[str, Any]]) -> int:
    """Deliveries of a key a group had already received (the inbox must absorb them)."""
    seen: set[tuple[str, str]] = set()
    n = 0
    for e in events:
        if e["op"] == "deliver":
            k = (e["group"], e["key"])
            n += k in seen
            seen.add(k)
    return n


def _wait_serving(r: _Run) -> str:
    """Wait until every broker (and a replicated run's slave) stores a ``chaos-plain`` message
    (at most :data:`_SERVING_TIMEOUT_S`); returns "" or a note naming the brokers that had none."""
    deadline = time.monotonic() + _SERVING_TIMEOUT_S
    addrs = dict(r.masters())
    if r.replica is not None:
        addrs["slave"] = r.replica.slave.broker.endpoints
    idle = set(addrs)
    while idle and time.monotonic() < deadline:
        for name in sorted(idle):
            with contextlib.suppress(Exception), PullConsumer(addrs[name]) as pc:
                if sum(pc.max_offset(TOPICS["plain"], q) for q in range(_QUEUES)) > 0:
                    idle.discard(name)
        time.sleep(0.5)
    return f"brokers {sorted(idle)} had no message before the nemesis" if idle else ""


def _broker_names(brokers: int) -> list[str]:
    """The nemesis's broker targets: ``broker``, or the cluster's ``broker-a``, ``broker-b``, …"""
    return ["broker"] if brokers == 1 else [f"broker-{c}" for c in string.ascii_lowercase[:brokers]]


def _kinds(config: ChaosConfig) -> tuple[str, ...]:
    """The fault kinds of the run: ``config.kinds``, but :data:`CLUSTER_KINDS` for a cluster run
    and :data:`REPLICA_KINDS` for a replicated run left at the default kinds."""
    if config.kinds != KINDS:
        return config.kinds
    return CLUSTER_KINDS if config.brokers > 1 else REPLICA_KINDS if config.replicas else KINDS


def _targets(config: ChaosConfig) -> list[str]:
    """The targets ``kill`` and ``pause`` pick from: the brokers and the workload's processes
    (only the latter in a replicated run, whose master and slave have their own kinds)."""
    return [*([] if config.replicas else _broker_names(config.brokers)), *_ROLES]


def _replica_end(r: _Run, obs: Observation) -> dict[str, int]:
    """A replicated run's end, once the workload drained: wait for the slave to catch up, scan
    it (the final snapshot), and fill ``obs``'s replication fields; returns the report's counts."""
    assert r.replica is not None
    obs.replicated = True
    obs.replica_caught_up = r.replica.wait_caught_up(r.master().broker.endpoints)
    note = r.snapshot(time.time() * 1000, final=True)
    if not r.snapshots or not r.snapshots[-1].final:
        raise RuntimeError(f"the final scan of the slave failed: {note}")
    obs.replica_snapshots = list(r.snapshots)
    return {"snapshots": len(r.snapshots), "stored": len(r.snapshots[-1].stored)}


def _operation(e: dict[str, Any]) -> str:
    """An event's row of the report's operations: ``"<op> <phase>"``, and a send stored with a
    weaker status than SEND_OK (a SYNC_MASTER's FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) apart."""
    status = e.get("status", "SEND_OK")
    return f"{e['op']} {e['phase']}" + ("" if status == "SEND_OK" else f" ({status})")


def _check_config(config: ChaosConfig) -> None:
    if not 1 <= config.brokers <= CLUSTER_BROKERS_MAX:
        raise ValueError(f"brokers must be in 1..{CLUSTER_BROKERS_MAX}, not {config.brokers}")
    if config.replicas not in (0, 1) or (config.replicas and config.brokers > 1):
        raise ValueError(f"replicas must be 0 or 1 (with one broker), not {config.replicas}")


def run_chaos(run_dir: Path, config: ChaosConfig) -> ChaosResult:
    """Run the workload under the seeded nemesis in ``run_dir`` and check the histories.

    Raises:
        ValueError: ``config.brokers`` outside 1..26, or ``config.replicas`` not 0 or 1 (1 with
            more than one broker).
        BrokerUnavailable: the broker (a broker of the cluster, the name server, the slave) did
            not start (or start again after a kill).
        RuntimeError: a replicated run could not scan its slave at the end.
    """
    _check_config(config)
    began = time.monotonic()
    faults = schedule(config.seed, config.faults, config.duration_s, _targets(config),
                      _kinds(config))
    replica: dict[str, int] = {}
    r = _Run(run_dir, config)
    try:
        r.start()
        serving = _wait_serving(r) if config.brokers > 1 or config.replicas else ""
        time.sleep(config.warmup_s)
        _nemesis(r, faults)
        notes = [serving] if serving else []
        notes += r.heal_all()
        with contextlib.ExitStack() as stack:
            pcs = {n: stack.enter_context(PullConsumer(a, "chaos-checker"))
                   for n, a in r.masters().items()}
            left = _quiesce(r, pcs)
            r._sampling.set()
            events = read_histories(run_dir / "history")
            obs = _observe(r, pcs, events)
        if r.replica is not None:
            replica = _replica_end(r, obs)
    finally:
        r.stop()
    if r.replica is not None:
        obs.master_log = log_bytes(r.master().broker.data_dir / "store")
        obs.slave_log = log_bytes(r.replica.store_dir)
        replica |= {"log_bytes": len(obs.slave_log), "master_log_bytes": len(obs.master_log)}
    violations = check(events, obs)
    if left:
        notes.append(f"the workload did not drain within {config.quiesce_timeout_s:.0f} s: {left}")
    ops = Counter(_operation(e) for e in events if e["op"] not in ("start", "consumer"))
    return ChaosResult(
        seed=config.seed, config=config, schedule=faults, operations=dict(sorted(ops.items())),
        faults_by_kind=dict(Counter(f.kind for f in faults if f.started_ms)), violations=violations,
        skipped_kinds=r.skipped, stored=len(obs.stored),
        stored_by_broker=dict(sorted(Counter(m.topic.partition("@")[2] for m in obs.stored
                                             if "@" in m.topic).items())),
        retained_out=len(retained_out(events, obs)), replica=replica,
        offset_samples=len(obs.offsets),
        redeliveries=_redeliveries(events),
        tx_states=dict(Counter(obs.tx_broker.values())), elapsed_s=round(time.monotonic() - began, 1),
        quiesced=not left, notes=notes)
