"""The demo's downstream ledger service: a push consumer of group ``ledger`` (clustering) behind the
local message table's inbox (:class:`txmq.outbox.CommitListener`).

Run as ``python -m txmq.demo.ledger --endpoints E|--namesrv-addr N --db ledger.db [--outbox-url URL]
[--rollback-topic T]``. For each delivered order the inbox row and the ``received`` row commit in one SQLite
transaction, so a redelivery is recognised by
the inbox's unique key and acknowledged without booking twice (counted in ``duplicates``). The
ledger permanently rejects the orders :func:`txmq.demo._faults.ledger_rejects` names:
after 10 failed deliveries the inbox writes a ROLLBACK event into the ledger's own outbox, and this
process's relay ships it to ``orders-rollback``, where the order service compensates. With
``--outbox-url`` (``amqp://…`` or ``nats://…``, see :func:`txmq.outbox.open_transport`) the relay
ships the ROLLBACK events over that broker instead, to ``--rollback-topic``; the orders themselves
still come from txmq. Stops cleanly on SIGTERM.
"""

from __future__ import annotations

from txmq.extras import require_extra as _require_extra

_require_extra("demo", "txmq.demo.ledger", "sqlalchemy", "alembic")

import argparse
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from txmq import outbox
from txmq.client import Producer
from txmq.demo._faults import ledger_rejects
from txmq.demo.traces import start_tracing
from txmq.outbox import EventStatus, InboxEvent

__all__ = ["APP_ID", "LEDGER_GROUP", "LedgerRejected", "init_db", "ledger_counts", "ledger_rejected", "main"]

LEDGER_GROUP = "ledger"
APP_ID = "order-service"
"""The app id of the orders the ledger consumes (the order service sends plain transactional
messages, so the inbox keys them by this app id, the order key and the message id)."""

_METADATA = sa.MetaData()
_RECEIVED = sa.Table("received", _METADATA,
                     sa.Column("orderkey", sa.Integer, primary_key=True),
                     sa.Column("msg_id", sa.Text, nullable=False),
                     sa.Column("queue_id", sa.Integer, nullable=False),
                     sa.Column("queue_offset", sa.Integer, nullable=False))
_DUPLICATES = sa.Table("duplicates", _METADATA,
                       sa.Column("orderkey", sa.Integer, nullable=False),
                       sa.Column("msg_id", sa.Text, nullable=False))


_BOOK = sqlite_insert(_RECEIVED).on_conflict_do_nothing()


class LedgerRejected(Exception):
    """The ledger refuses this order (the demo's deterministic ``LEDGER_REJECT`` fault)."""


def _engine(path: Path) -> sa.Engine:
    return outbox.create_sqlite_engine(path)


def init_db(path: Path) -> None:
    """Create ``received``, ``duplicates`` and the outbox/inbox tables if missing."""
    engine = _engine(path)
    try:
        _METADATA.create_all(engine)
        outbox.init_db(engine)
    finally:
        engine.dispose()


def ledger_counts(path: Path) -> tuple[set[int], int]:
    """``(distinct order keys received, duplicate deliveries)``."""
    engine = _engine(path)
    try:
        with engine.connect() as conn:
            keys = set(conn.execute(sa.select(_RECEIVED.c.orderkey)).scalars())
            dups = conn.execute(sa.select(sa.func.count()).select_from(_DUPLICATES)).scalar_one()
        return keys, int(dups)
    finally:
        engine.dispose()


def ledger_rejected(path: Path) -> dict[str, set[int]]:
    """Order keys the ledger gave up on: ``{"given_up": inbox rows CONSUME_MAX_RECONSUMETIMES,
    "rollback_sent": ROLLBACK events the relay has sent}``."""
    engine = _engine(path)
    t = outbox.DEFAULT_TABLES
    try:
        with engine.connect() as conn:
            given_up = conn.execute(sa.select(t.inbox.c.biz_key).where(
                t.inbox.c.status == EventStatus.CONSUME_MAX_RECONSUMETIMES.value)).scalars()
            sent = conn.execute(sa.select(t.outbox.c.biz_key).where(
                t.outbox.c.tx_type == "ROLLBACK",
                t.outbox.c.status == EventStatus.PRODUCE_PROCESSED.value)).scalars()
            return {"given_up": {int(k) for k in given_up}, "rollback_sent": {int(k) for k in sent}}
    finally:
        engine.dispose()


def book(conn: sa.Connection, ev: InboxEvent) -> None:
    """The ledger's side effect, inside the inbox transaction. Raises LedgerRejected."""
    key = int(ev.biz_key)
    if ledger_rejects(key):
        raise LedgerRejected(f"order {key} is rejected by the ledger")
    m = ev.message
    row = {"orderkey": key, "msg_id": m.msg_id, "queue_id": m.queue_id, "queue_offset": m.queue_offset}
    if conn.execute(_BOOK, row).rowcount == 0:  # booked before under another message id: count it
        conn.execute(_DUPLICATES.insert(), {"orderkey": key, "msg_id": m.msg_id})


def _duplicate_recorder(engine: sa.Engine):  # type: ignore[no-untyped-def]
    def record(ev: InboxEvent) -> None:
        with engine.begin() as conn:
            conn.execute(_DUPLICATES.insert().values(orderkey=int(ev.biz_key), msg_id=ev.event_id))
    return record


def _relay_sender(endpoints: str, outbox_url: str | None,
                  namesrv_addr: str = "") -> tuple[outbox.Sender, Callable[[], None]]:
    """What the ledger's relay sends through, and how to close it: txmq's Producer (to the broker
    ``endpoints`` or the cluster of ``namesrv_addr``), or the transport of ``outbox_url``. Raises
    ConfigError (bad URL)."""
    if outbox_url:
        transport = outbox.open_transport(outbox_url)
        return transport, transport.close
    producer = Producer("ledger-outbox", endpoints, namesrv_addr=namesrv_addr)
    producer.start()
    return producer, producer.shutdown


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--endpoints", default="", help="the broker (host:port)")
    p.add_argument("--namesrv-addr", default="", help="name servers of a cluster, instead")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--outbox-url", help="send ROLLBACK events over this transport (amqp://, nats://)")
    p.add_argument("--rollback-topic", help="where ROLLBACK events go (default <topic>-rollback)")
    p.add_argument("--trace-file", type=Path, help="append spans here (OTLP JSON lines)")
    a = p.parse_args(argv)
    if not a.endpoints and not a.namesrv_addr:
        p.error("--endpoints or --namesrv-addr is required")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s: %(message)s")
    init_db(a.db)
    provider = start_tracing(a.trace_file, LEDGER_GROUP) if a.trace_file else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = _engine(a.db)
    sender, close_sender = _relay_sender(a.endpoints, a.outbox_url, a.namesrv_addr)
    relay = outbox.Relay(engine, sender, config=outbox.RelayConfig(period_ms=500))
    fixed_topic: str | None = a.rollback_topic
    rollback_topic = ((lambda _t: fixed_topic) if fixed_topic else outbox.default_rollback_topic)
    # run with ``python -m``, this module is ``__main__``: the handler from the module itself,
    # so that its refusal's error.type on the spans is txmq.demo.ledger.LedgerRejected
    from txmq.demo.ledger import book as handler

    listener = outbox.CommitListener(engine, handler, app_id=APP_ID, on_rollback=relay.wake,
                                     on_duplicate=_duplicate_recorder(engine),
                                     rollback_topic=rollback_topic)
    consumer = listener.consumer(LEDGER_GROUP, a.endpoints, "orders",
                                 consume_from_where="CONSUME_FROM_FIRST_OFFSET", consume_threads=2,
                                 namesrv_addr=a.namesrv_addr)
    relay.start()
    consumer.start()
    try:
        stop.wait()
    finally:
        consumer.shutdown()
        relay.stop()
        close_sender()
        if provider is not None:
            provider.shutdown()


if __name__ == "__main__":
    main()
