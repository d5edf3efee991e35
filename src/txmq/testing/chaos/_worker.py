"""The chaos workload's processes: ``python -m txmq.testing.chaos._worker ROLE RUN_DIR ENDPOINTS NAME``.

ENDPOINTS is a broker address ``host:port``, or ``namesrv:<addresses>`` for a cluster: the clients
then find its brokers through those name servers.

Roles (each appends its history to ``RUN_DIR/history/NAME.jsonl``; see :mod:`._history`):

- ``plain``: a Producer sends ``chaos-plain`` messages, one key each (``keys`` = the operation id);
- ``tx``: a TransactionProducer sends ``chaos-tx`` half messages; its local transaction writes the
  key's row in ``RUN_DIR/tx.db`` (``committed`` or ``rolled_back``). A check-back finds that row; when
  there is none and the half message is older than ``_TX_FENCE_MS`` it *inserts* ``rolled_back``, so the
  local database decides once (the primary key fences a local transaction that resumes later);
- ``outbox``: ``put_message`` into ``RUN_DIR/outbox.db`` (``chaos-outbox``) and a Relay publishing it;
- ``consumer``: a PushConsumer of group NAME over the three topics; the outbox's CommitListener
  records every message in its inbox and the side effect (a row of ``effects``) in one database
  transaction, so a redelivery never repeats the side effect.

Producers stop producing (and keep serving check-backs and relaying) once ``RUN_DIR/stop`` exists.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from txmq import outbox
from txmq.client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
    TransactionProducer,
)
from txmq.errors import RemoteError, TxmqError
from txmq.protocol import decode_offset_msg_id
from txmq.testing.chaos._history import HistoryWriter
from txmq.testing.chaos._spec import EFFECTS, TOPICS, TX_GROUP

__all__ = ["main"]

_TX_FENCE_MS = 3000
_TIMEOUT_MS = 2000
_PAUSE_S = 0.03


_PARENT = os.getppid()
NAMESRV_PREFIX = "namesrv:"
"""ENDPOINTS starting with this name the name servers of a cluster instead of a broker."""


def _where(endpoints: str) -> tuple[str, dict[str, Any]]:
    """``(endpoints, client keyword arguments)`` of the ENDPOINTS argument."""
    if endpoints.startswith(NAMESRV_PREFIX):
        return "", {"namesrv_addr": endpoints.removeprefix(NAMESRV_PREFIX)}
    return endpoints, {}


def _orphaned() -> bool:
    """The chaos run that started us is gone: exit rather than linger."""
    return os.getppid() != _PARENT


def _stopping(run: Path) -> bool:
    if _orphaned():
        os._exit(0)  # client and relay threads would keep the interpreter alive
    return (run / "stop").exists()


def _completion(exc: BaseException) -> str:
    """A refusal by the broker did not happen; anything else (timeout, lost connection) may have."""
    return "fail" if isinstance(exc, RemoteError) else "unknown"


def _start(make: Any) -> Any:
    while True:
        try:
            return make()
        except Exception:  # the broker (or the proxy) may be down while we start
            time.sleep(0.2)


def run_plain(run: Path, endpoints: str, h: HistoryWriter) -> None:
    addr, kw = _where(endpoints)
    p = _start(lambda: Producer("chaos-plain-producers", addr, timeout_ms=_TIMEOUT_MS, **kw))
    i = 0
    while not _stopping(run):
        i += 1
        key = f"{h.proc}.{h.inc}.{i}"
        h.write("send", "invoke", key=key)
        try:
            r = p.send(Message(topic=TOPICS["plain"], body=key.encode(), keys=key))
        except Exception as exc:
            h.write("send", _completion(exc), key=key, error=repr(exc)[:200])
            time.sleep(0.2)
            continue
        h.write("send", "ok", key=key, msg_id=r.msg_id, queue=r.queue_id, offset=r.queue_offset,
                broker=r.broker_name, status=r.status.name, **_acked_by(r))
        time.sleep(_PAUSE_S)
    _idle()


def _acked_by(r: SendResult) -> dict[str, Any]:
    """Who acknowledged send result ``r``, for the failover checks: ``addr``, the store host of its
    offset message id (the broker's own address), and ``epoch``, the master epoch the answer
    carried (``masterEpoch``, issue 26; absent outside controller mode)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(TxmqError):
        out["addr"] = decode_offset_msg_id(r.offset_msg_id)[0]
    if r.master_epoch is not None:
        out["epoch"] = r.master_epoch
    return out


class _LocalTransactions:
    """The tx role's listener over its local SQLite database."""

    def __init__(self, db: Path, h: HistoryWriter) -> None:
        self.db, self.h = db, h

    def _conn(self) -> sqlite3.Connection:
        c = sqlite3.connect(self.db, timeout=30, isolation_level="IMMEDIATE")
        c.execute("PRAGMA synchronous=FULL")
        return c

    def _decide(self, key: str, state: str) -> str:
        """Insert the key's row unless there is one; return the row's state."""
        c = self._conn()
        try:
            with c:
                c.execute("INSERT OR IGNORE INTO tx VALUES (?, ?, ?)", (key, state, time.time()))
            return str(c.execute("SELECT state FROM tx WHERE key=?", (key,)).fetchone()[0])
        finally:
            c.close()

    def execute_local_transaction(self, msg: Message, arg: str) -> LocalTransactionState:
        state = self._decide(msg.keys, "rolled_back" if arg == "rollback" else "committed")
        self.h.write("local", "ok", key=msg.keys, msg_id=msg.msg_id, state=state, intent=arg)
        if state == "rolled_back":
            return LocalTransactionState.ROLLBACK_MESSAGE
        return LocalTransactionState.UNKNOWN if arg == "unknown" else LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        c = self._conn()
        try:
            row = c.execute("SELECT state FROM tx WHERE key=?", (msg.keys,)).fetchone()
        finally:
            c.close()
        if row is None and time.time() * 1000 - msg.born_timestamp_ms < _TX_FENCE_MS:
            answer = LocalTransactionState.UNKNOWN
        else:
            state = row[0] if row else self._decide(msg.keys, "rolled_back")
            answer = (LocalTransactionState.COMMIT_MESSAGE if state == "committed"
                      else LocalTransactionState.ROLLBACK_MESSAGE)
        self.h.write("check", "ok", key=msg.keys, msg_id=msg.msg_id, answer=answer.name)
        return answer


def run_tx(run: Path, endpoints: str, h: HistoryWriter) -> None:
    db = run / "tx.db"
    listener = _LocalTransactions(db, h)
    addr, kw = _where(endpoints)
    tp = _start(lambda: TransactionProducer(TX_GROUP, addr, listener, timeout_ms=_TIMEOUT_MS, **kw))
    rng = random.Random(h.inc)
    i = 0
    while not _stopping(run):
        i += 1
        key = f"{h.proc}.{h.inc}.{i}"
        intent = rng.choices(["commit", "rollback", "unknown"], [7, 2, 1])[0]
        h.write("tx", "invoke", key=key, intent=intent)
        try:
            r = tp.send_message_in_transaction(Message(topic=TOPICS["tx"], body=key.encode(), keys=key),
                                               intent)
        except Exception as exc:
            h.write("tx", _completion(exc), key=key, error=repr(exc)[:200])
            time.sleep(0.2)
            continue
        h.write("tx", "ok", key=key, msg_id=r.msg_id, half_offset=r.half_offset, outcome=r.outcome,
                broker=r.broker_name)
        time.sleep(_PAUSE_S)
    _idle()


def run_outbox(run: Path, endpoints: str, h: HistoryWriter) -> None:
    engine = outbox.create_sqlite_engine(str(run / "outbox.db"))
    addr, kw = _where(endpoints)
    producer = _start(lambda: Producer("chaos-relay", addr, timeout_ms=_TIMEOUT_MS, **kw))
    relay = outbox.Relay(engine, producer, config=outbox.RelayConfig(period_ms=100, lease_ms=5000,
                                                                     backoff_max_ms=1000))
    relay.start()
    i = 0
    while not _stopping(run):
        i += 1
        key = f"{h.proc}.{h.inc}.{i}"
        h.write("put", "invoke", key=key)
        try:
            with engine.begin() as conn:
                outbox.put_message(conn, Message(topic=TOPICS["outbox"], body=key.encode(), keys=key),
                                   "CHAOS", key, "chaos")
        except Exception as exc:
            h.write("put", "fail", key=key, error=repr(exc)[:200])
            continue
        h.write("put", "ok", key=key)
        time.sleep(_PAUSE_S)
    _idle()


def run_consumer(run: Path, endpoints: str, h: HistoryWriter) -> None:
    group = h.proc
    engine = outbox.create_sqlite_engine(str(run / f"{group}.db"))
    def side_effect(conn: sa.Connection, ev: outbox.InboxEvent) -> None:
        conn.execute(EFFECTS.insert().values(key=ev.message.keys, topic=ev.topic, event_id=ev.event_id))

    inbox = outbox.CommitListener(engine, side_effect)

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            h.write("deliver", "ok", group=group, key=m.keys, msg_id=m.msg_id, topic=m.topic,
                    queue=m.queue_id, offset=m.queue_offset, reconsume=m.reconsume_times)
        return inbox(msgs)

    addr, kw = _where(endpoints)

    def make() -> PushConsumer:
        c = PushConsumer(group, addr, listener, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                         suspend_ms=1000, timeout_ms=_TIMEOUT_MS, **kw)
        for t in TOPICS.values():
            c.subscribe(t)
        c.start()
        return c

    _start(make)
    h.write("consumer", "info", group=group)
    _idle()


def _idle() -> None:
    while not _orphaned():
        time.sleep(1)
    os._exit(0)


def main(argv: list[str]) -> None:
    role, run, endpoints, name = argv[0], Path(argv[1]), argv[2], argv[3]
    h = HistoryWriter(run / "history" / f"{name}.jsonl", name)
    h.write("start", "info", role=role)
    {"plain": run_plain, "tx": run_tx, "outbox": run_outbox, "consumer": run_consumer}[role](
        run, endpoints, h)


if __name__ == "__main__":
    main(sys.argv[1:])
