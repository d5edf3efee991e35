"""A deterministic simulation of the transaction protocol: one broker, several producers, faults.

Everything is driven by one seeded ``random.Random`` and a fake clock over a
:class:`~txmq.testing.BrokerHarness` (MemoryStore), so any failing seed replays exactly:
``python -m txmq.testing.simulate --seed N``. Producers begin transactions whose local outcome is
planned (commit, rollback, UNKNOWN, a lost end request, a slow local transaction, a crash before or
after the local commit), answer check-backs from their shared local database (possibly late, out
of order, racing their own end request), crash, hang, restart; the broker restarts from its store.

After every step the invariants of DESIGN.md are checked:

- I1  a message visible in its topic belongs to a transaction the local database committed;
- I3  nothing rolled back or discarded is visible;
- I4  a decided outcome never changes, and a message is visible at most once;
- I5  no half message is checked more than ``transaction_check_max`` times; a discarded one is
      parked in ``TRANS_CHECK_MAX_TIME_TOPIC``;
- I6  at the end, once every producer is back, nothing is left pending.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from txmq.broker.transaction import TRANS_CHECK_MAX_TIME_TOPIC, Outcome
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_UNIQ_KEY,
    CheckTransactionStateRequestHeader,
    Command,
    EndTransactionResponseHeader,
    SendMessageResponseHeader,
    decode_message_ext,
    from_ext,
)
from txmq.testing._harness import BrokerHarness

__all__ = ["InvariantViolation", "SimConfig", "Simulation", "run_seed"]

_PLANS = {"commit": 30, "rollback": 15, "unknown": 15, "lost_end": 10, "slow": 15,
          "crash_before": 5, "crash_after": 5}
_LOCAL_ANSWER = {"COMMITTED": "COMMIT", "ABORTED": "ROLLBACK"}


class InvariantViolation(AssertionError):
    """An invariant broke; the message names it, the seed and the step."""


@dataclass
class SimConfig:
    """Shape of one simulated run (times in ms)."""

    steps: int = 150
    producers: int = 3
    transaction_timeout_ms: int = 6_000
    transaction_check_interval_ms: int = 30_000
    transaction_check_max: int = 15


@dataclass
class _Tx:
    msg_id: str
    producer: int
    half: Command
    plan: str
    local: str = "PENDING"  # PENDING, COMMITTED, ABORTED
    slow_steps: int = 0


@dataclass
class _Producer:
    index: int
    conn: int
    alive: bool = True
    hung: bool = False
    inbox: list[Command] = field(default_factory=list)

    @property
    def client_id(self) -> str:
        return f"producer-{self.index}"


class Simulation:
    """One seeded run. Call :meth:`run`; raises :class:`InvariantViolation` on a broken invariant."""

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.cfg = config or SimConfig()
        self.rng = random.Random(seed)
        self._conns = iter(range(1, 1 << 30))
        self.h = self._new_broker(BrokerHarness.__init__.__defaults__[1])  # type: ignore[index]
        self.producers = [_Producer(i, next(self._conns)) for i in range(self.cfg.producers)]
        for p in self.producers:
            self.h.heartbeat(p.conn, p.client_id, ["pg"])
        self.txs: dict[str, _Tx] = {}
        self.decided: dict[int, str] = {}
        self.checks = Counter[int]()
        self.step_no = 0
        self.log: list[str] = []

    def _new_broker(self, now_ms: int, store: object = None) -> BrokerHarness:
        return BrokerHarness(store=store, now_ms=now_ms, topics={"t": 2},  # type: ignore[arg-type]
                             transaction_timeout_ms=self.cfg.transaction_timeout_ms,
                             transaction_check_interval_ms=self.cfg.transaction_check_interval_ms,
                             transaction_check_max=self.cfg.transaction_check_max)

    # -- driving ----------------------------------------------------------------------------------
    def run(self) -> Simulation:
        actions = [(self._begin, 30), (self._advance, 25), (self._tick, 15), (self._answer, 20),
                   (self._crash, 3), (self._restart, 4), (self._hang, 2), (self._broker_restart, 1)]
        fns, weights = zip(*actions, strict=True)
        for step in range(self.cfg.steps):
            self.step_no = step
            self.rng.choices(fns, weights)[0]()
            self._check_invariants()
        self._quiesce()
        return self

    def _live(self) -> list[_Producer]:
        return [p for p in self.producers if p.alive]

    def _begin(self) -> None:
        live = self._live()
        if not live:
            return
        p = self.rng.choice(live)
        msg_id = f"TX{len(self.txs):06d}"
        half = self.h.send(p.conn, "t", b"body", transactional=True, queue_id=self.rng.randrange(2),
                           properties={PROPERTY_UNIQ_KEY: msg_id})
        assert half.code == ResponseCode.SUCCESS, half.remark
        sent = from_ext(half.ext, SendMessageResponseHeader)
        if sent.transaction_id != msg_id:  # the broker answers a half with its UNIQ_KEY
            self._fail(f"half {msg_id} answered with transactionId {sent.transaction_id}")
        plan = self.rng.choices(list(_PLANS), list(_PLANS.values()))[0]
        tx = _Tx(msg_id, p.index, half, plan, slow_steps=self.rng.randint(1, 6))
        self.txs[tx.msg_id] = tx
        self.log.append(f"{self.step_no}: {p.client_id} begins {tx.msg_id} ({plan})")
        if plan == "crash_before":
            self._kill(p)
        elif plan == "crash_after":
            tx.local = "COMMITTED"
            self._kill(p)

    def _advance(self) -> None:
        ready = [t for t in self.txs.values() if t.local == "PENDING"
                 and self.producers[t.producer].alive]
        if not ready:
            return
        tx = self.rng.choice(ready)
        if tx.plan == "slow" and tx.slow_steps > 0:
            tx.slow_steps -= 1
            return
        tx.local = "ABORTED" if tx.plan == "rollback" else "COMMITTED"
        end = {"commit": "COMMIT", "slow": "COMMIT", "rollback": "ROLLBACK", "unknown": "UNKNOWN"}
        if tx.plan in end:
            self._end(self.producers[tx.producer], tx, end[tx.plan], from_check=False)

    def _end(self, p: _Producer, tx: _Tx, outcome: str, from_check: bool) -> None:
        r = self.h.end(p.conn, tx.half, outcome, group="pg", from_check=from_check)
        if r.code != ResponseCode.SUCCESS:
            self._fail(f"end {outcome} of {tx.msg_id} refused: {r.code} {r.remark}")
        recorded = from_ext(r.ext, EndTransactionResponseHeader).outcome
        if outcome != "UNKNOWN" and recorded not in (outcome, Outcome.DISCARD.value):
            self._fail(f"I4: {tx.msg_id} ended {outcome} but broker recorded {recorded} "
                       f"(local {tx.local})")

    def _tick(self) -> None:
        for p in self._live():
            self.h.heartbeat(p.conn, p.client_id, ["pg"])
        for send in self.h.tick(self.rng.randint(0, 2 * self.cfg.transaction_check_interval_ms)):
            hdr = from_ext(send.command.ext, CheckTransactionStateRequestHeader)
            self.checks[hdr.tran_state_table_offset] += 1
            owner = next((p for p in self.producers if p.conn == send.conn), None)
            if owner is None or not owner.alive:
                self._fail(f"check-back of {hdr.msg_id} sent to a dead connection {send.conn}")
            else:
                owner.inbox.append(send.command)
        self.h.broker.persist_offsets()  # the shell persists every few seconds

    def _answer(self) -> None:
        ready = [p for p in self._live() if p.inbox and not p.hung]
        if not ready:
            return
        p = self.rng.choice(ready)
        cmd = p.inbox.pop(self.rng.randrange(len(p.inbox)))  # out of order on purpose
        msg = decode_message_ext(cmd.body)  # the half message as a MessageExt record
        tx = self.txs[msg.msg_id]
        answer = _LOCAL_ANSWER.get(tx.local)
        if answer is not None:
            self._end(p, tx, answer, from_check=True)

    def _kill(self, p: _Producer) -> None:
        self.h.close(p.conn)
        p.alive, p.hung, p.inbox = False, False, []
        for t in self.txs.values():
            if t.producer == p.index and t.local == "PENDING":
                t.local = "ABORTED"  # the process died inside its local transaction
        self.log.append(f"{self.step_no}: {p.client_id} killed")

    def _crash(self) -> None:
        live = self._live()
        if len(live) > 0:
            self._kill(self.rng.choice(live))

    def _restart(self) -> None:
        dead = [p for p in self.producers if not p.alive]
        if dead:
            p = self.rng.choice(dead)
            p.conn, p.alive = next(self._conns), True
            self.h.heartbeat(p.conn, p.client_id, ["pg"])

    def _hang(self) -> None:
        p = self.rng.choice(self.producers)
        p.hung = not p.hung

    def _broker_restart(self) -> None:
        self.log.append(f"{self.step_no}: broker restart")
        self.h = self._new_broker(self.h.now_ms, self.h.store)
        for p in self._live():
            p.conn, p.inbox = next(self._conns), []
            self.h.heartbeat(p.conn, p.client_id, ["pg"])

    def _quiesce(self) -> None:
        """Bring every producer back and let the checker finish; nothing may stay pending (I6)."""
        for p in self.producers:
            p.hung = False
            if not p.alive:
                p.conn, p.alive = next(self._conns), True
                self.h.heartbeat(p.conn, p.client_id, ["pg"])
        for t in self.txs.values():
            if t.local == "PENDING":
                self._end(self.producers[t.producer], t, "COMMIT", from_check=False)
                t.local = "COMMITTED"
        for _ in range(self.cfg.transaction_check_max + 3):
            self._tick()
            for p in self.producers:
                while p.inbox:
                    self._answer_one(p)
            self._check_invariants()
        idx = self.h.broker.tx.index
        if idx.pending:
            self._fail(f"I6: {len(idx.pending)} half messages still pending")
        for tx in self.txs.values():
            outcome = idx.outcome(from_ext(tx.half.ext, SendMessageResponseHeader).queue_offset)
            allowed = {"COMMITTED": (Outcome.COMMIT, Outcome.DISCARD),
                       "ABORTED": (Outcome.ROLLBACK, Outcome.DISCARD)}[tx.local]
            if outcome not in allowed:
                self._fail(f"{tx.msg_id} ended {outcome} but its local transaction is {tx.local}")

    def _answer_one(self, p: _Producer) -> None:
        cmd = p.inbox.pop()
        tx = self.txs[decode_message_ext(cmd.body).msg_id]
        answer = _LOCAL_ANSWER.get(tx.local)
        if answer is not None:
            self._end(p, tx, answer, from_check=True)

    # -- invariants -------------------------------------------------------------------------------
    def _fail(self, what: str) -> None:
        tail = "\n".join(self.log[-15:])
        raise InvariantViolation(f"seed {self.seed}, step {self.step_no}: {what}\nlast events:\n{tail}")

    def _check_invariants(self) -> None:
        idx = self.h.broker.tx.index
        for off, outcome in idx.settled.items():
            before = self.decided.setdefault(off, outcome.value)
            if before != outcome.value:
                self._fail(f"I4: half {off} changed from {before} to {outcome.value}")
        visible = Counter(m.msg_id for m in self.h.all_messages("t"))
        for msg_id, n in visible.items():
            tx = self.txs[msg_id]
            if n > 1:
                self._fail(f"I4: {msg_id} visible {n} times")
            if tx.local != "COMMITTED":
                self._fail(f"I1/I3: {msg_id} visible but its local transaction is {tx.local}")
        for off, n in self.checks.items():
            if n > self.cfg.transaction_check_max:
                self._fail(f"I5: half {off} checked {n} times (max {self.cfg.transaction_check_max})")
        parked = {m.msg_id for m in self.h.all_messages(TRANS_CHECK_MAX_TIME_TOPIC)}
        for off, outcome in idx.settled.items():
            if outcome is Outcome.DISCARD and off not in idx.discarded:
                self._fail(f"I5: discarded half {off} is not parked")
        if parked & set(visible):
            self._fail(f"I3: discarded messages visible: {sorted(parked & set(visible))}")


def run_seed(seed: int, config: SimConfig | None = None) -> Simulation:
    """Run one seed; raises InvariantViolation (with the seed and recent events) on failure."""
    return Simulation(seed, config).run()
