"""One contract suite over three real databases: SQLite (a file), PostgreSQL and MariaDB.

The servers are the machine's (``.ci/services`` starts them): PostgreSQL at 127.0.0.1:5432 and
MariaDB at 127.0.0.1:3306, database ``test``; override with ``TXMQ_TEST_POSTGRES_URL`` /
``TXMQ_TEST_MARIADB_URL``. An unreachable server fails the test, it is never skipped. Every test
gets tables with a fresh random prefix, dropped afterwards, so parallel and earlier runs never
collide.

The transport contract runs on every transport's real server: a txmq broker process, RabbitMQ at
127.0.0.1:5672 (guest/guest, vhost ``txmq-test``) and NATS with JetStream at 127.0.0.1:4222
(``.ci/services`` starts them; override with ``TXMQ_TEST_AMQP_URL`` / ``TXMQ_TEST_NATS_URL``); a server
that is down fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from outbox_helpers import (
    ASYNC_DRIVERS,
    DATABASES,
    SERVER_URLS,
    TRANSPORTS,
    TXMQ_CONSUMER,
    FakeClock,
    fresh_tables,
    open_test_transport,
    server_engine,
)
from prometheus_client import CollectorRegistry

from txmq import outbox
from txmq.outbox import OutboxMetrics, OutboxTables, Transport, open_transport
from txmq.testing import BrokerProcess, ClusterProcess, run_broker, run_cluster


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine(db: str, tmp_path: Path) -> Iterator[sa.Engine]:
    e = (outbox.create_sqlite_engine(tmp_path / "outbox.db") if db == "sqlite"
         else server_engine(db, pool_size=10, max_overflow=10))
    yield e
    e.dispose()


@pytest.fixture
def async_url(db: str, tmp_path: Path) -> str:
    if db == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'outbox.db'}"
    return ASYNC_DRIVERS[db] + SERVER_URLS[db][SERVER_URLS[db].index("://"):]


@pytest.fixture
def tables(engine: sa.Engine) -> Iterator[OutboxTables]:
    t = fresh_tables(engine)
    yield t
    outbox.drop_tables(engine, t)


@pytest.fixture
def metrics() -> OutboxMetrics:
    return OutboxMetrics(CollectorRegistry())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _business_table(engine: sa.Engine, tables: OutboxTables, name: str, *cols: sa.Column[Any]) -> sa.Table:
    t = sa.Table(f"{tables.prefix}{name}", tables.metadata, *cols)
    t.create(engine)
    return t


@pytest.fixture
def orders(engine: sa.Engine, tables: OutboxTables) -> Iterator[sa.Table]:
    """A business table of the upstream service: ``(id INTEGER PK, total INTEGER)``."""
    t = _business_table(engine, tables, "orders", sa.Column("id", sa.Integer, primary_key=True),
                        sa.Column("total", sa.Integer, nullable=False))
    yield t
    t.drop(engine)


@pytest.fixture
def ledger(engine: sa.Engine, tables: OutboxTables) -> Iterator[sa.Table]:
    """A business table of the downstream service: ``(biz_key VARCHAR PK, n INTEGER)``."""
    t = _business_table(engine, tables, "ledger", sa.Column("biz_key", sa.String(64), primary_key=True),
                        sa.Column("n", sa.Integer, nullable=False))
    yield t
    t.drop(engine)


@pytest.fixture(scope="session")
def txmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A real txmq broker process with 100 ms retry delays (for the transport contract)."""
    with run_broker(tmp_path_factory.mktemp("transport-broker"),
                    message_delay_level=" ".join(["100ms"] * 18)) as b:
        yield b


@pytest.fixture(scope="session")
def txmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    """A name server and two txmq broker processes (100 ms retry delays), for the contract on a
    cluster: topics are created on both, so the relay sends to and the inbox consumes from both."""
    with run_cluster(brokers=2, data_dir=tmp_path_factory.mktemp("transport-cluster"),
                     message_delay_level=" ".join(["100ms"] * 18)) as c:
        yield c


@pytest.fixture(params=[*TRANSPORTS, pytest.param("txmq-cluster", marks=pytest.mark.slow)])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    """Each transport on its real server: txmq (a broker process), RabbitMQ, NATS JetStream, and
    txmq on a two-broker cluster through its name server (``txmq://<ns>?namesrv=1``)."""
    kind = str(request.param)
    if kind == "txmq-cluster":
        ns = request.getfixturevalue("txmq_cluster").namesrv_addr
        t = open_transport(f"txmq://{ns}?namesrv=1", consumer_kw=TXMQ_CONSUMER)
        yield t
        t.close()
        return
    endpoints = request.getfixturevalue("txmq_broker").endpoints if kind == "txmq" else ""
    t = open_test_transport(kind, endpoints)
    yield t
    t.close()
