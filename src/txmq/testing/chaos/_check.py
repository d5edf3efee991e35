"""The check at the end of a chaos run: histories + what the broker and the databases hold.

Pure functions over data (no I/O), so the checker is tested on synthetic histories. Violations:

- ``lost``: an acknowledged plain send (``send`` ok), a locally committed transaction, or a committed
  outbox event is missing from the broker, or never had its side effect in one of the groups (I2, I8);
- ``rolled_back_visible``: a transaction whose local record says rolled back, or that the broker
  discarded, is stored in its topic or had a side effect (I1, I3);
- ``duplicate_side_effect``: a group's side effect for one key happened more than once (I8);
- ``two_terminal_states``: the broker's state of a transaction contradicts the local record, or two
  end replies for it gave different outcomes (I4);
- ``offset_skip``: a sampled committed offset of a group passes a message the group never received
  (I7); ``offset_regression``: a sampled committed offset moved backwards with no broker restart in
  between (a restart may lose offsets committed since the last persist; that only redelivers).

A replicated run (a SYNC_MASTER and its slave, :attr:`Observation.replicated`) adds:

- ``replica_lost``: a message the SYNC_MASTER acknowledged SUCCESS (a plain send whose status is
  ``SEND_OK``, a transaction whose commit was answered ``COMMIT``) before a snapshot of the slave
  was taken (while the master was SIGKILLed, and at the end) is missing from it, or stands there
  at another queue offset or with other bytes than the master's; at the end, after the slave caught
  up, anything the master stores and the slave does not;
- ``replica_rolled_back_visible``: a rolled-back or discarded transaction's message on the slave;
- ``replica_diverged``: the slave's commit log is not a byte prefix of the master's;
- ``replica_behind``: the slave had not caught up with the master when the run ended.

A send answered FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE is stored on the master (RocketMQ's
``sendOK``; the master-side checks above hold it to that) but was not acknowledged by the slave:
the slave may or may not hold it at a snapshot.

A send or transaction that completed ``unknown`` (or ``fail``) may or may not be present: never a
violation either way.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import msgspec

__all__ = ["NOT_REPLICATED_STATUSES", "Observation", "OffsetSample", "ReplicaSnapshot", "Stored",
           "Violation", "check", "retained_out"]

_EXCERPT_MAX = 12
NOT_REPLICATED_STATUSES = frozenset({"FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})
"""Send statuses (``SendStatus`` names) of a message stored on the master that no slave
acknowledged: not acknowledged as far as the slave is concerned."""


class Stored(msgspec.Struct, frozen=True):
    """A message found in the broker by the final scan."""

    topic: str
    queue_id: int
    offset: int
    key: str
    msg_id: str = ""
    body: bytes = b""


class ReplicaSnapshot(msgspec.Struct, frozen=True):
    """Every message of the workload's topics on the slave, scanned after ``t`` (ms since the
    epoch): while the master was SIGKILLed (nothing could reach the slave after ``t``), or at the
    end of the run (``final``: the slave had caught up, so it holds everything the master does)."""

    t: float
    stored: list[Stored]
    final: bool = False


class OffsetSample(msgspec.Struct, frozen=True):
    """A group's committed offset of one queue, sampled at ``t`` (ms since the epoch)."""

    t: float
    group: str
    topic: str
    queue_id: int
    offset: int


class Observation(msgspec.Struct, kw_only=True):
    """What the end of the run found, besides the histories.

    Attributes:
        groups: the consumer groups that must each receive every acknowledged message.
        stored: every message in the workload's topics (final scan of every queue).
        tx_local: the transactional producer's local records, key → ``committed`` | ``rolled_back``.
        tx_broker: the broker's state (QUERY_TRANSACTION) by message id: PENDING, COMMIT, ROLLBACK,
            DISCARD.
        outbox_keys: keys of the events committed into the outbox table.
        effects: group → key → how many times the side effect happened.
        offsets: samples of QUERY_CONSUMER_OFFSET taken during the run.
        broker_restarts: times (ms since the epoch) the broker was started again.
        min_offsets: ``"<topic>/<queue id>"`` → the first queue offset the broker still stores
            at the end (above 0 once retention deleted segments: a full disk forces it).
        replicated: a replicated run: the replication checks apply.
        replica_snapshots: scans of the slave (see :class:`ReplicaSnapshot`).
        replica_caught_up: the slave's commit log reached the master's before the final scan.
        master_log, slave_log: both commit logs at the end (the segments joined in offset order).
    """

    groups: list[str]
    stored: list[Stored] = msgspec.field(default_factory=list)
    tx_local: dict[str, str] = msgspec.field(default_factory=dict)
    tx_broker: dict[str, str] = msgspec.field(default_factory=dict)
    outbox_keys: list[str] = msgspec.field(default_factory=list)
    effects: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    offsets: list[OffsetSample] = msgspec.field(default_factory=list)
    broker_restarts: list[float] = msgspec.field(default_factory=list)
    min_offsets: dict[str, int] = msgspec.field(default_factory=dict)
    replicated: bool = False
    replica_snapshots: list[ReplicaSnapshot] = msgspec.field(default_factory=list)
    replica_caught_up: bool = True
    master_log: bytes = b""
    slave_log: bytes = b""


class Violation(msgspec.Struct, frozen=True):
    """One broken guarantee, with the history events about it."""

    kind: str
    key: str
    detail: str
    excerpt: list[dict[str, Any]] = msgspec.field(default_factory=list)


class _Excerpts:
    """The history events of a key or message id (at most ``_EXCERPT_MAX`` each), indexed once:
    a run with many violations must not scan every event once per violation."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for i, e in enumerate(events):
            for field in ("key", "msg_id"):
                v = e.get(field)
                if v and len(hits := self._by[(field, v)]) < _EXCERPT_MAX:
                    hits.append({**e, "_i": i})

    def __call__(self, key: str, msg_id: str = "") -> list[dict[str, Any]]:
        hits = {e["_i"]: e for e in self._by.get(("key", key), [])}
        hits.update((e["_i"], e) for e in self._by.get(("msg_id", msg_id), []) if msg_id)
        return [{k: v for k, v in e.items() if k != "_i"} for _, e in sorted(hits.items())][:_EXCERPT_MAX]


def retained_out(events: list[dict[str, Any]], obs: Observation) -> set[str]:
    """Keys delivered from a queue offset the broker no longer stores: retention deleted their
    segment (a full disk forces it, as RocketMQ's ``cleanForciblyRatio`` does). Their absence from
    the final scan is not a loss; whether every group received them is still checked."""
    out = set()
    for e in events:
        if e["op"] != "deliver" or e.get("reconsume") or not isinstance(e.get("offset"), int):
            continue
        if e["offset"] < obs.min_offsets.get(f"{e.get('topic')}/{e.get('queue')}", 0):
            out.add(e["key"])
    return out


def _acknowledged(events: list[dict[str, Any]], obs: Observation) -> dict[str, str]:
    """key → why it must be present."""
    acked = {e["key"]: "send ok" for e in events if e["op"] == "send" and e["phase"] == "ok"}
    acked.update((k, "local transaction committed") for k, s in obs.tx_local.items() if s == "committed")
    acked.update((k, "outbox event committed") for k in obs.outbox_keys)
    return acked


def check(events: list[dict[str, Any]], obs: Observation) -> list[Violation]:
    """Every violation found in the histories ``events`` and the observation ``obs``."""
    out: list[Violation] = []
    ex = _Excerpts(events)
    stored_keys = {m.key for m in obs.stored}
    present = stored_keys | retained_out(events, obs)
    for key, why in sorted(_acknowledged(events, obs).items()):
        missing = [] if key in present else ["the broker"]
        missing += [g for g in obs.groups if not obs.effects.get(g, {}).get(key)]
        if missing:
            out.append(Violation("lost", key, f"{why}, but missing from {', '.join(missing)}",
                                 ex(key)))
    out += _rolled_back_visible(events, obs, stored_keys, ex)
    for g, counts in sorted(obs.effects.items()):
        for key, n in sorted(counts.items()):
            if n > 1:
                out.append(Violation("duplicate_side_effect", key, f"group {g}: side effect {n} times",
                                     ex(key)))
    out += _terminal_states(events, obs, ex)
    out += _offsets(events, obs, ex)
    if obs.replicated:
        out += _replication(events, obs, ex)
    return out


def _tx_ids(events: list[dict[str, Any]]) -> dict[str, str]:
    """msg id → key of every half message the producer saw stored or ran a local transaction for."""
    return {e["msg_id"]: e["key"] for e in events
            if e["op"] in ("tx", "local", "check") and e.get("msg_id") and e.get("key")}


def _rolled_back_visible(events: list[dict[str, Any]], obs: Observation,
                         stored_keys: set[str], ex: _Excerpts) -> list[Violation]:
    ids = _tx_ids(events)
    dead = {k: "local transaction rolled back" for k, s in obs.tx_local.items() if s == "rolled_back"}
    dead.update((ids[m], f"broker state {s}") for m, s in obs.tx_broker.items()
                if s in ("ROLLBACK", "DISCARD") and m in ids and ids[m] not in dead)
    out = []
    for key, why in sorted(dead.items()):
        seen = (["the broker"] if key in stored_keys else []) + \
               [g for g in obs.groups if obs.effects.get(g, {}).get(key)]
        if seen:
            out.append(Violation("rolled_back_visible", key, f"{why}, but visible in {', '.join(seen)}",
                                 ex(key)))
    return out


def _terminal_states(events: list[dict[str, Any]], obs: Observation,
                     ex: _Excerpts) -> list[Violation]:
    out = []
    ids = _tx_ids(events)
    for msg_id, state in sorted(obs.tx_broker.items()):
        key = ids.get(msg_id, "")
        local = obs.tx_local.get(key)
        if (local == "committed" and state in ("ROLLBACK", "DISCARD")) or \
                (local != "committed" and state == "COMMIT"):
            out.append(Violation("two_terminal_states", key,
                                 f"broker says {state}, local record says {local or 'nothing'}",
                                 ex(key, msg_id)))
    ends: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if e["op"] == "tx" and e["phase"] == "ok" and e.get("outcome") in ("COMMIT", "ROLLBACK"):
            ends[e["msg_id"]].add(e["outcome"])
    for msg_id, outcomes in sorted(ends.items()):
        if len(outcomes) > 1:
            out.append(Violation("two_terminal_states", ids.get(msg_id, ""),
                                 f"end replies gave {sorted(outcomes)}", ex("", msg_id)))
    return out


def _offsets(events: list[dict[str, Any]], obs: Observation, ex: _Excerpts) -> list[Violation]:
    delivered: dict[str, set[str]] = defaultdict(set)
    for e in events:
        if e["op"] == "deliver":
            delivered[e["group"]].add(e["key"])
    for g, counts in obs.effects.items():
        delivered[g].update(k for k, n in counts.items() if n)
    by_queue: dict[tuple[str, int], list[Stored]] = defaultdict(list)
    for m in obs.stored:
        by_queue[(m.topic, m.queue_id)].append(m)
    series: dict[tuple[str, str, int], list[OffsetSample]] = defaultdict(list)
    for s in sorted(obs.offsets, key=lambda s: s.t):
        series[(s.group, s.topic, s.queue_id)].append(s)
    out = []
    for (g, topic, q), samples in sorted(series.items()):
        for a, b in itertools.pairwise(samples):
            if b.offset < a.offset and not any(a.t < r <= b.t for r in obs.broker_restarts):
                out.append(Violation("offset_regression", f"{g}/{topic}/{q}",
                                     f"committed offset {a.offset} at {a.t:.0f} went back to {b.offset} "
                                     f"at {b.t:.0f} without a broker restart"))
        top = max(s.offset for s in samples)
        skipped = [m for m in by_queue[(topic, q)] if m.offset < top and m.key not in delivered[g]]
        for m in skipped[:_EXCERPT_MAX]:
            out.append(Violation("offset_skip", m.key,
                                 f"group {g} committed offset {top} of {topic}/{q} past offset "
                                 f"{m.offset}, never delivered to it", ex(m.key)))
    return out


def _replica_acks(events: list[dict[str, Any]]) -> list[tuple[float, str, dict[str, Any]]]:
    """(completion time, key, event) of every write the SYNC_MASTER acknowledged SUCCESS: a send
    ok with a status outside :data:`NOT_REPLICATED_STATUSES`, a transaction ok whose end answered
    ``COMMIT`` (a commit answered FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE comes back as
    ``UNKNOWN_END``; a half stored with either is rolled back by the producer)."""
    out = []
    for e in events:
        if e["phase"] != "ok":
            continue
        if (e["op"] == "send" and e.get("status", "SEND_OK") not in NOT_REPLICATED_STATUSES) or \
                (e["op"] == "tx" and e.get("outcome") == "COMMIT"):
            out.append((e["t"], e["key"], e))
    return out


def _replication(events: list[dict[str, Any]], obs: Observation, ex: _Excerpts) -> list[Violation]:
    out: list[Violation] = []
    on_master = {m.key: m for m in obs.stored}
    acks = _replica_acks(events)
    dead = {k for k, s in obs.tx_local.items() if s == "rolled_back"}
    ids = _tx_ids(events)
    dead.update(ids[m] for m, s in obs.tx_broker.items() if s in ("ROLLBACK", "DISCARD") and m in ids)
    reported: set[tuple[str, str]] = set()

    def report(kind: str, key: str, detail: str) -> None:
        if (kind, key) not in reported:
            reported.add((kind, key))
            out.append(Violation(kind, key, detail, ex(key)))

    for snap in obs.replica_snapshots:
        on_slave = {m.key: m for m in snap.stored}
        when = "at the end" if snap.final else f"while the master was down ({snap.t:.0f})"
        for t, key, e in acks:
            if t >= snap.t:
                continue
            why = _replica_mismatch(on_slave.get(key), on_master.get(key), e)
            if why:
                report("replica_lost", key, f"acknowledged SUCCESS at {t:.0f}, but {why} on the "
                                            f"slave {when}")
        for key in sorted(dead & set(on_slave)):
            report("replica_rolled_back_visible", key, f"rolled back, but on the slave {when}")
        if snap.final and obs.replica_caught_up:
            for key, m in sorted(on_master.items()):
                why = _replica_mismatch(on_slave.get(key), m, {})
                if why:
                    report("replica_lost", key, f"stored on the master, but {why} on the caught-up "
                                                "slave at the end")
    if not obs.master_log.startswith(obs.slave_log):
        at = next(i for i, (a, b) in enumerate(zip(obs.master_log, obs.slave_log, strict=False))
                  if a != b) if len(obs.slave_log) <= len(obs.master_log) else len(obs.master_log)
        out.append(Violation("replica_diverged", "commit log",
                             f"the slave's log ({len(obs.slave_log)} bytes) is not a prefix of the "
                             f"master's ({len(obs.master_log)} bytes): first difference at {at}"))
    if not obs.replica_caught_up:
        out.append(Violation("replica_behind", "commit log",
                             "the slave had not caught up with the master at the end of the run"))
    return out


def _replica_mismatch(copy: Stored | None, original: Stored | None, ack: dict[str, Any]) -> str:
    """How the slave's ``copy`` of a message differs from the master's ``original`` and from the
    position its acknowledgement ``ack`` named; "" when it does not."""
    if copy is None:
        return "missing"
    if isinstance(ack.get("queue"), int) and isinstance(ack.get("offset"), int) and \
            (copy.queue_id, copy.offset) != (ack["queue"], ack["offset"]):
        return f"at queue {copy.queue_id} offset {copy.offset}, not {ack['queue']}/{ack['offset']}"
    if original is not None and (copy.topic, copy.queue_id, copy.offset, copy.body) != \
            (original.topic, original.queue_id, original.offset, original.body):
        return "not byte for byte the master's message"
    return ""
