"""Helpers of the outbox tests (imported by name: pytest puts this directory on ``sys.path``)."""

from __future__ import annotations

import os
import random
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from txmq import outbox
from txmq.client import Message, MessageExt
from txmq.outbox import (
    OutboxMetrics,
    OutboxTables,
    Relay,
    RelayConfig,
    Sender,
    Transport,
    default_rollback_topic,
    open_transport,
)
from txmq.outbox._claims import claim
from txmq.outbox._envelope import to_message

DATABASES = ("sqlite", "postgresql", "mariadb")

SERVER_URLS = {
    "postgresql": os.environ.get("TXMQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("TXMQ_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg_async", "mariadb": "mysql+asyncmy"}


class FakeClock:
    """Wall clock in seconds that moves only when told to."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    @property
    def ms(self) -> int:
        return int(self.t * 1000)


def server_engine(db: str, **kw: object) -> sa.Engine:
    """An engine of the PostgreSQL or MariaDB test server; fails (never skips) if it is down."""
    engine = sa.create_engine(SERVER_URLS[db], pool_pre_ping=True, **kw)  # type: ignore[arg-type]
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"{db} at {SERVER_URLS[db]} is not reachable ({exc.orig}); run .ci/services")
    return engine


def fresh_tables(engine: sa.Engine, tag: str = "") -> OutboxTables:
    """Outbox and inbox tables with a new random prefix, created."""
    t = outbox.make_tables(f"t{uuid.uuid4().hex[:10]}{tag}_")
    outbox.init_db(engine, t)
    return t


def sample(m: OutboxMetrics, name: str, table: str) -> float:
    v = m.registry.get_sample_value(name, {"table": table})
    return 0.0 if v is None else v


def put(engine: sa.Engine, tables: OutboxTables, n: int, *, topic: str = "t", now_ms: int | None = None,
        app_id: str = "app") -> list[str]:
    """``n`` committed COMMIT events with biz keys ``k0``…; returns their event ids."""
    with engine.begin() as conn:
        return [outbox.put_message(conn, Message(topic=topic, body=f"payload-{i}".encode()), "CREATED",
                                   f"k{i}", app_id, tables=tables, now_ms=now_ms) for i in range(n)]


def delivery(msg: Message, reconsume_times: int = 0) -> MessageExt:
    """What a consumer would receive for ``msg`` (a sent relay message)."""
    return MessageExt(topic=msg.topic, body=msg.body, tags=msg.tags, keys=msg.keys,
                      properties=dict(msg.properties), reconsume_times=reconsume_times)


class RecordingSender:
    """A Sender that stores what it is given; ``fail`` makes the sends raise."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.fail: Exception | None = None

    def send_batch(self, msgs: list[Message]) -> object:
        if self.fail is not None:
            raise self.fail
        self.sent.extend(msgs)
        return None


def events(engine: sa.Engine, tables: OutboxTables) -> list[Any]:
    """All outbox rows, in id order."""
    with engine.connect() as conn:
        return list(conn.execute(sa.select(tables.outbox).order_by(tables.outbox.c.id)))


def inbox_rows(engine: sa.Engine, tables: OutboxTables) -> list[Any]:
    """All inbox rows, in id order."""
    with engine.connect() as conn:
        return list(conn.execute(sa.select(tables.inbox).order_by(tables.inbox.c.id)))


def make_relay(engine: sa.Engine, tables: OutboxTables, sender: Sender, metrics: OutboxMetrics,
               clock: FakeClock, **cfg: int) -> Relay:
    """A relay on the fake clock with seeded jitter; ``cfg`` are RelayConfig fields."""
    return Relay(engine, sender, tables=tables, config=RelayConfig(**cfg), metrics=metrics, clock=clock,
                 rng=random.Random(7))


def sent_messages(engine: sa.Engine, tables: OutboxTables, n: int, clock: FakeClock) -> list[Message]:
    """``n`` events put, claimed and turned into the messages a relay would send."""
    put(engine, tables, n, now_ms=clock.ms)
    with engine.begin() as conn:
        return [to_message(r) for r in claim(conn, tables, "x/0", clock.ms, n, 1000)]


# -- transports (RabbitMQ, NATS JetStream, txmq) ---------------------------------------------------
TRANSPORTS = ("txmq", "rabbitmq", "nats")

TRANSPORT_URLS = {
    # the tests' own vhost, which .ci/services empties before each run and gives an expiry policy:
    # every test declares fresh quorum queues, and RabbitMQ stops answering handshakes once a node
    # holds more quorum queues than it has file handles (1,024 here; 1,500 of them wedged it)
    "rabbitmq": os.environ.get("TXMQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/txmq-test"),
    "nats": os.environ.get("TXMQ_TEST_NATS_URL", "nats://127.0.0.1:4222"),
}
DOWN_URLS = {"txmq": "txmq://127.0.0.1:1", "rabbitmq": "amqp://guest:guest@127.0.0.1:1/",
             "nats": "nats://127.0.0.1:1"}
"""Port 1: nothing listens there (connection refused at once)."""

TXMQ_CONSUMER = {"consume_from_where": "CONSUME_FROM_FIRST_OFFSET", "suspend_ms": 500}
RETRY_DELAY_MS = 50


def open_test_transport(kind: str, txmq_endpoints: str) -> Transport:
    """A connected transport of ``kind``; fails (never skips) when its server is down."""
    if kind == "txmq":
        return open_transport(f"txmq://{txmq_endpoints}", consumer_kw=TXMQ_CONSUMER)
    t = open_transport(TRANSPORT_URLS[kind], retry_delay_ms=RETRY_DELAY_MS)
    try:
        t.connect()
    except Exception as exc:
        t.close()
        pytest.fail(f"{kind} at {TRANSPORT_URLS[kind]} is not reachable ({exc}); run .ci/services")
    return t


def names(tag: str = "") -> tuple[str, str]:
    """A fresh topic and its rollback topic."""
    topic = f"orders-{uuid.uuid4().hex[:8]}{tag}"
    return topic, default_rollback_topic(topic)
