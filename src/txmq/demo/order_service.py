"""The demo's upstream order service: one producer process of producer group ``order-service``.

Run as ``python -m txmq.demo.order_service --endpoints E|--namesrv-addr N --db orders.db --work slot.bin
--progress slot.progress``. It sends each order of its work file with
``send_message_in_transaction``; the local transaction inserts the order into the shared SQLite
order database. A progress file (append-only lines ``A <key>`` before the half message, ``D <key>
<state>`` after the end) lets a replacement process skip what a killed one attempted.

With ``--compensate`` instead, it runs the order service's compensation: a
:class:`txmq.outbox.RollbackListener` on ``orders-rollback`` (group ``order-service-compensation``)
that cancels the order a ROLLBACK event names (``orders.cancelled = 1``), in one transaction with
the inbox row in the order database, so a redelivered rollback cancels once. ``--outbox-url`` (and
``--rollback-topic``) consume the ROLLBACK events over RabbitMQ or NATS JetStream instead.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from txmq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.demo import orderdb
from txmq.demo._faults import Fault, fault_of, returns_unknown
from txmq.demo.tpch import decode_order
from txmq.demo.traces import ORDER_KEY, start_tracing

if TYPE_CHECKING:  # the producers never need SQLAlchemy: they do not import it (about 2 s each)
    import sqlalchemy as sa
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from txmq.outbox import InboxEvent

__all__ = ["CHECK_GRACE_MS", "COMPENSATION_GROUP", "ROLLBACK_TOPIC", "OrderListener", "cancel_order",
           "main", "run_compensator"]

log = logging.getLogger("txmq.demo.order_service")

CHECK_GRACE_MS = 4_000
"""A check-back for an order not in the database answers UNKNOWN until the half message is this old,
so a local transaction still running in another process is never rolled back under it."""

PRODUCER_GROUP = "order-service"
TOPIC = "orders"
ROLLBACK_TOPIC = "orders-rollback"
"""Where the ledger's ROLLBACK events arrive (``txmq.outbox.default_rollback_topic(TOPIC)``)."""
COMPENSATION_GROUP = "order-service-compensation"


_TX_LOG_DDL = """CREATE TABLE IF NOT EXISTS tx_log (
    transaction_id TEXT PRIMARY KEY, orderkey INTEGER NOT NULL)"""


def init_tx_log(db: Path) -> None:
    """Create the transaction log: which transaction id inserted which order."""
    conn = orderdb.connect(db)
    try:
        with conn:
            conn.execute(_TX_LOG_DDL)
    finally:
        conn.close()


class OrderListener:
    """Local transaction = insert the order and a ``tx_log`` row for this transaction id, in one
    database transaction; check-back = look the transaction id up in ``tx_log``.

    Answering by transaction id (not by order key) is what makes a re-sent order safe: a second
    half message for an order that is already in the database finds no ``tx_log`` row of its own
    and is rolled back, so an order is never published twice.
    """

    def __init__(self, db: Path) -> None:
        self.db = db
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = orderdb.connect(self.db)
        return conn

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        order = decode_order(msg.body)
        fault = fault_of(order.o_orderkey)
        if fault is Fault.ROLLBACK:
            return LocalTransactionState.ROLLBACK_MESSAGE  # the local transaction failed
        if fault is Fault.CRASH_BEFORE_COMMIT:
            os.kill(os.getpid(), signal.SIGKILL)
        conn = self._conn()
        try:
            with conn:
                orderdb.insert_order(conn, order)
                conn.execute("INSERT INTO tx_log VALUES (?, ?)", (msg.msg_id, order.o_orderkey))
        except sqlite3.IntegrityError:  # already inserted by an earlier transaction of this order
            return LocalTransactionState.ROLLBACK_MESSAGE
        if fault is Fault.CRASH_AFTER_COMMIT:
            os.kill(os.getpid(), signal.SIGKILL)
        if returns_unknown(order.o_orderkey):
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        conn = orderdb.connect(self.db)
        try:
            row = conn.execute("SELECT 1 FROM tx_log WHERE transaction_id = ?", (msg.msg_id,)).fetchone()
        finally:
            conn.close()
        if row is not None:
            return LocalTransactionState.COMMIT_MESSAGE
        if time.time() * 1000 - msg.born_timestamp_ms < CHECK_GRACE_MS:
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.ROLLBACK_MESSAGE


def _progress(progress: Path) -> tuple[set[int], set[int]]:
    """``(attempted, done)`` order keys of earlier processes of this slot."""
    attempted, done = set(), set()
    if progress.exists():
        for line in progress.read_text().splitlines():
            if line.startswith("A "):
                attempted.add(int(line.split()[1]))
            elif line.startswith("D "):
                done.add(int(line.split()[1]))
    return attempted, done


def _todo(work: list[tuple[int, bytes]], progress: Path) -> list[tuple[int, bytes]]:
    """Orders a (replacement) process still has to send: not done, and not a crash order already
    attempted (its half message is stored; check-back settles it). An order that was in flight in
    another thread when the process died is sent again: ``tx_log`` keeps that safe."""
    attempted, done = _progress(progress)
    crash = (Fault.CRASH_AFTER_COMMIT, Fault.CRASH_BEFORE_COMMIT)
    return [(k, b) for k, b in work
            if k not in done and not (k in attempted and fault_of(k) in crash)]


def _worker(producer: TransactionProducer, work: list[tuple[int, bytes]], fd: int,
            tracer: Tracer | None) -> None:
    for key, body in work:
        os.write(fd, f"A {key}\n".encode())
        with (tracer.start_as_current_span(f"place order {key}", attributes={
                ORDER_KEY: key, "txmq.demo.fault": fault_of(key).value})
              if tracer is not None else contextlib.nullcontext()):
            r = producer.send_message_in_transaction(Message(topic=TOPIC, body=body, keys=str(key)))
        os.write(fd, f"D {key} {r.local_transaction_state.name} {r.outcome}\n".encode())


def _tracer(provider: TracerProvider | None) -> Tracer | None:
    return None if provider is None else provider.get_tracer("txmq.demo")


def run(
    endpoints: str, db: Path, work_file: Path, progress: Path, threads: int, linger: bool = False,
    namesrv_addr: str = "", trace_file: Path | None = None,
) -> None:
    """Send every order of ``work_file`` not yet attempted, with ``threads`` concurrent senders, to
    the broker ``endpoints`` or the cluster the name servers ``namesrv_addr`` route to; each in a
    ``place order <key>`` span exported to ``trace_file`` (when given)."""
    work = msgspec.msgpack.decode(work_file.read_bytes(), type=list[tuple[int, bytes]])
    todo = _todo(work, progress)
    provider = start_tracing(trace_file, PRODUCER_GROUP) if trace_file else None
    fd = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    producer = TransactionProducer(PRODUCER_GROUP, endpoints, OrderListener(db), check_threads=4,
                                   namesrv_addr=namesrv_addr)
    producer.start()
    try:
        parts = [todo[i::threads] for i in range(threads)]
        ts = [threading.Thread(target=_worker, args=(producer, p, fd, _tracer(provider)))
              for p in parts]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        os.write(fd, b"END\n")
        if linger:  # keep answering check-backs until told to stop (SIGTERM)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            stop.wait()
    finally:
        producer.shutdown()
        os.close(fd)
        if provider is not None:
            provider.shutdown()  # exports what is left


def cancel_order(conn: sa.Connection, ev: InboxEvent) -> None:
    """Compensation of a rejected order: mark it cancelled (in the inbox transaction).

    Raises:
        LookupError: no such order (never committed): retried, then the DLQ shows it to a person.
    """
    import sqlalchemy as sa

    res = conn.execute(sa.text("UPDATE orders SET cancelled = 1 WHERE o_orderkey = :k"),
                       {"k": int(ev.biz_key)})
    if res.rowcount != 1:
        raise LookupError(f"order {ev.biz_key} to cancel is not in the order database")


def run_compensator(endpoints: str, db: Path, outbox_url: str | None = None,
                    rollback_topic: str = ROLLBACK_TOPIC, namesrv_addr: str = "",
                    trace_file: Path | None = None) -> None:
    """Consume ``rollback_topic`` and cancel each named order once, until SIGTERM: on txmq at
    ``endpoints`` (or the cluster of the name servers ``namesrv_addr``), or over the transport of
    ``outbox_url`` (``amqp://…``, ``nats://…``); spans to ``trace_file`` (when given).

    Raises:
        ConfigError: a bad ``outbox_url`` or a topic name that transport cannot carry.
    """
    from txmq.outbox import RollbackListener, create_sqlite_engine, open_transport
    from txmq.outbox import init_db as init_outbox

    provider = start_tracing(trace_file, COMPENSATION_GROUP) if trace_file else None
    engine = create_sqlite_engine(db)
    init_outbox(engine)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    listener = RollbackListener(engine, cancel_order, app_id=PRODUCER_GROUP)
    transport = open_transport(outbox_url) if outbox_url else None
    consumer = (listener.subscribe(transport, COMPENSATION_GROUP, rollback_topic) if transport
                else listener.consumer(COMPENSATION_GROUP, endpoints, rollback_topic,
                                       consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                       namesrv_addr=namesrv_addr))
    consumer.start()
    try:
        stop.wait()
    finally:
        consumer.shutdown()
        if transport is not None:
            transport.close()
        engine.dispose()
        if provider is not None:
            provider.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoints", default="", help="the broker (host:port)")
    p.add_argument("--namesrv-addr", default="", help="name servers of a cluster, instead")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--work", type=Path)
    p.add_argument("--progress", type=Path)
    p.add_argument("--compensate", action="store_true",
                   help="run the compensation consumer of orders-rollback instead of sending")
    p.add_argument("--outbox-url", help="with --compensate: consume over this transport (amqp://, nats://)")
    p.add_argument("--rollback-topic", default=ROLLBACK_TOPIC, help="with --compensate: the topic")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trace-file", type=Path, help="append spans here (OTLP JSON lines)")
    p.add_argument(
        "--linger",
        action="store_true",
        help="after sending everything, keep answering check-backs until SIGTERM",
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s: %(message)s")
    if not a.endpoints and not a.namesrv_addr:
        p.error("--endpoints or --namesrv-addr is required")
    if a.compensate:
        run_compensator(a.endpoints, a.db, a.outbox_url, a.rollback_topic, a.namesrv_addr,
                        a.trace_file)
        return
    if a.work is None or a.progress is None:
        p.error("--work and --progress are required unless --compensate")
    run(a.endpoints, a.db, a.work, a.progress, a.threads, a.linger, a.namesrv_addr, a.trace_file)


if __name__ == "__main__":
    main()
