"""One chaos run: start the broker (on a tmpfs), the proxy and the workload; run the nemesis; heal;
drain; observe; check. See the package docstring for the whole picture."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from txmq import limits
from txmq.client import Admin, PullConsumer
from txmq.testing._broker import BrokerProcess
from txmq.testing.chaos._check import (
    Observation,
    OffsetSample,
    Stored,
    Violation,
    check,
    retained_out,
)
from txmq.testing.chaos._history import read_histories
from txmq.testing.chaos._nemesis import KINDS, NETWORK_KINDS, Fault, fill_disk, schedule
from txmq.testing.chaos._procs import BrokerTarget, Worker, mount_tmpfs, unmount
from txmq.testing.chaos._proxy import FaultProxy
from txmq.testing.chaos._spec import GROUPS, TOPICS, prepare_databases

__all__ = ["ChaosConfig", "ChaosResult", "run_chaos"]

_QUEUES = 2
_ROLES = {"plain": "plain", "tx": "tx", "outbox": "outbox", GROUPS[0]: "consumer", GROUPS[1]: "consumer"}


class ChaosConfig(msgspec.Struct, kw_only=True):
    """A run's parameters. ``duration_s`` is the nemesis's span (the faults spread over it);
    ``warmup_s`` of fault-free load come first; the drain after healing takes at most
    ``quiesce_timeout_s``."""

    seed: int = 1
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
    retained_out: int
    """Acknowledged messages delivered, then deleted by retention (a full disk forces it)."""
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
        why = mount_tmpfs(self.store_dir, config.tmpfs_size)
        self.mounted = not why
        if why:
            self.skipped["disk_full"] = f"cannot mount a tmpfs for the broker's store: {why}"
        self.clock_file = run / "clock_offset_ms"
        self.clock_file.write_text("0")
        self.broker = BrokerProcess(run / "broker", _broker_config(), log_path=run / "logs-broker.log",
                                    env={"TXMQ_TEST_CLOCK_OFFSET_FILE": str(self.clock_file)})
        self.target = BrokerTarget(self.broker)
        self.proxy: FaultProxy | None = None
        self.workers: dict[str, Worker] = {}
        self.samples: list[OffsetSample] = []
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        prepare_databases(self.run)
        self.broker.start()
        self.proxy = FaultProxy(self.broker.port)
        self.proxy.start()
        for name, role in _ROLES.items():
            self.workers[name] = Worker(role, name, self.run, self.proxy.endpoints)
            self.workers[name].start()
        self._sampler = threading.Thread(target=self._sample_offsets, name="chaos-offsets", daemon=True)
        self._sampler.start()

    def targets(self) -> dict[str, Worker | BrokerTarget]:
        return {"broker": self.target, **self.workers}

    def _sample_offsets(self) -> None:
        clients: dict[str, PullConsumer] = {}
        while not self._sampling.wait(limits.CHAOS_OFFSET_SAMPLE_INTERVAL_MS / 1000):
            for g in GROUPS:
                try:
                    if g not in clients:
                        clients[g] = PullConsumer(self.broker.endpoints, g, timeout_ms=1000)
                        clients[g].start()
                    for t in TOPICS.values():
                        for q in range(_QUEUES):
                            off = clients[g].fetch_consumer_offset(t, q)
                            if off is not None:
                                self.samples.append(OffsetSample(time.time() * 1000, g, t, q, off))
                except Exception:  # the broker is down, paused or full: no sample this time
                    with contextlib.suppress(Exception):
                        clients.pop(g).shutdown()
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
        self.target.resume()
        self.broker.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.mounted:
            unmount(self.store_dir)

    # -- faults -----------------------------------------------------------------------------------
    def inject(self, f: Fault) -> None:
        assert self.proxy is not None
        if f.kind == "kill":
            self.targets()[f.target].kill()
        elif f.kind == "pause":
            self.targets()[f.target].pause()
        elif f.kind == "drop":
            f.note = f"{self.proxy.drop()} connections closed"
        elif f.kind in NETWORK_KINDS:
            self.proxy.set_mode(f.kind, f.amount_ms)  # type: ignore[arg-type]
        elif f.kind == "disk_full":
            fill_disk(self.store_dir)
        elif f.kind.startswith("clock_"):
            self.clock_file.write_text(str(f.amount_ms))

    def heal(self, f: Fault) -> None:
        assert self.proxy is not None
        if f.kind == "kill":
            self._restart(self.targets()[f.target])
        elif f.kind == "pause":
            self.targets()[f.target].resume()
        elif f.kind in NETWORK_KINDS:
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
        assert self.proxy is not None
        notes = []
        self.proxy.set_mode("pass")
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


def _scan(pc: PullConsumer) -> list[Stored]:
    out = []
    for t in TOPICS.values():
        for q in range(_QUEUES):
            off, end = pc.min_offset(t, q), pc.max_offset(t, q)
            while off < end:
                got = pc.pull(t, q, off, 256).messages
                if not got:
                    break
                out += [Stored(t, q, m.queue_offset, m.keys, m.msg_id) for m in got]
                off = got[-1].queue_offset + 1
    return out


def _min_offsets(pc: PullConsumer) -> dict[str, int]:
    return {f"{t}/{q}": pc.min_offset(t, q) for t in TOPICS.values() for q in range(_QUEUES)}


def _backlog(r: _Run, pc: PullConsumer) -> str:
    """What is still to settle, deliver or relay ("" when everything has drained)."""
    pending = pc.transaction_stats().get("PENDING", 0)
    unsent = _outbox_unsent(r.run)
    keys = {m.key for m in _scan(pc)}
    effects = _effects(r.run)
    missing = {g: len(keys - set(effects[g])) for g in GROUPS}
    if pending or unsent or any(missing.values()):
        return f"{pending} transactions pending, {unsent} outbox events unsent, missing per group {missing}"
    return ""


def _quiesce(r: _Run, pc: PullConsumer) -> str:
    """Stop the producers and wait until everything has drained; returns what had not, or ""."""
    (r.run / "stop").touch()
    deadline = time.monotonic() + r.config.quiesce_timeout_s
    left = "not measured"
    while time.monotonic() < deadline:
        try:
            left = _backlog(r, pc)
        except Exception as exc:
            left = repr(exc)
        if not left:
            time.sleep(2 * limits.CHAOS_OFFSET_SAMPLE_INTERVAL_MS / 1000)  # one more offset sample
            return ""
        time.sleep(1)
    return left


def _observe(r: _Run, pc: PullConsumer, events: list[dict[str, Any]]) -> Observation:
    tx_broker = {}  # by half offset: the broker finds settled transactions only that way
    with Admin(r.broker.endpoints) as admin:
        for e in events:
            if e["op"] == "tx" and e["phase"] == "ok":
                state = admin.query_transaction(f"half:{e['half_offset']}")["state"]
                tx_broker[e["msg_id"]] = str(state)
    with contextlib.closing(sqlite3.connect(r.run / "tx.db", timeout=30)) as c:
        tx_local = {k: s for k, s in c.execute("SELECT key, state FROM tx")}
    with contextlib.closing(sqlite3.connect(r.run / "outbox.db", timeout=30)) as c:
        outbox_keys = [k for (k,) in c.execute("SELECT biz_key FROM txmq_outbox")]
    return Observation(groups=list(GROUPS), stored=_scan(pc), tx_local=tx_local, tx_broker=tx_broker,
                       outbox_keys=outbox_keys, effects=_effects(r.run), offsets=list(r.samples),
                       broker_restarts=list(r.target.restarts), min_offsets=_min_offsets(pc))


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


def run_chaos(run_dir: Path, config: ChaosConfig) -> ChaosResult:
    """Run the workload under the seeded nemesis in ``run_dir`` and check the histories.

    Raises:
        BrokerUnavailable: the broker did not start (or start again after a kill).
    """
    began = time.monotonic()
    faults = schedule(config.seed, config.faults, config.duration_s,
                      ["broker", *_ROLES], config.kinds)
    r = _Run(run_dir, config)
    try:
        r.start()
        time.sleep(config.warmup_s)
        _nemesis(r, faults)
        notes = r.heal_all()
        with PullConsumer(r.broker.endpoints, "chaos-checker") as pc:
            left = _quiesce(r, pc)
            r._sampling.set()
            events = read_histories(run_dir / "history")
            obs = _observe(r, pc, events)
    finally:
        r.stop()
    violations = check(events, obs)
    if left:
        notes.append(f"the workload did not drain within {config.quiesce_timeout_s:.0f} s: {left}")
    ops = Counter(f"{e['op']} {e['phase']}" for e in events if e["op"] not in ("start", "consumer"))
    return ChaosResult(
        seed=config.seed, config=config, schedule=faults, operations=dict(sorted(ops.items())),
        faults_by_kind=dict(Counter(f.kind for f in faults if f.started_ms)), violations=violations,
        skipped_kinds=r.skipped, stored=len(obs.stored),
        retained_out=len(retained_out(events, obs)), offset_samples=len(obs.offsets),
        redeliveries=_redeliveries(events),
        tx_states=dict(Counter(obs.tx_broker.values())), elapsed_s=round(time.monotonic() - began, 1),
        quiesced=not left, notes=notes)
