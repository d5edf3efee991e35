"""txmq's shipped Alembic migrations (``txmq.outbox.migrations``) on SQLite, PostgreSQL and MariaDB.

Every test gets a database of its own (a file, or ``CREATE DATABASE`` on the servers of
``outbox_helpers.SERVER_URLS``), dropped afterwards. The migrations are run with ``alembic.command``
(Alembic docs, "Programmatic API") and compared with :func:`txmq.outbox.make_tables` two ways:
inspection of the created tables next to ``init_db``'s, and autogenerate's ``compare_metadata``.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from outbox_helpers import DATABASES, SERVER_URLS, FakeClock, RecordingSender, make_relay, put, server_engine
from prometheus_client import CollectorRegistry

from txmq import outbox
from txmq.outbox import OutboxMetrics, migrations


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty database, dropped after the test."""
    db = str(request.param)
    if db == "sqlite":
        yield f"sqlite:///{tmp_path / 'mig.db'}"
        return
    name = f"txmq_mig_{uuid.uuid4().hex[:12]}"
    admin = server_engine(db, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield sa.make_url(SERVER_URLS[db]).set(database=name).render_as_string(hide_password=False)
    finally:
        drop = f"DROP DATABASE {name}" + (" WITH (FORCE)" if db == "postgresql" else "")
        with admin.connect() as conn:
            conn.execute(sa.text(drop))
        admin.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    e = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    yield e
    e.dispose()


def _table_names(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def _shape(engine: sa.Engine, table: str, prefix: str) -> dict[str, Any]:
    """Columns (name, type, nullability, comment), indexes and unique constraints, prefix removed."""
    insp = sa.inspect(engine)
    cols = [(c["name"], repr(c["type"]), c["nullable"], c.get("comment"), c.get("autoincrement"))
            for c in insp.get_columns(table)]
    ixs = sorted((i["name"].removeprefix(prefix), tuple(i["column_names"]), bool(i["unique"]))
                 for i in insp.get_indexes(table))
    uqs = sorted((u["name"].removeprefix(prefix), tuple(u["column_names"]))
                 for u in insp.get_unique_constraints(table))
    pk = insp.get_pk_constraint(table)["constrained_columns"]
    return {"columns": cols, "indexes": ixs, "unique": uqs, "pk": pk}


def _diffs(engine: sa.Engine, md: sa.MetaData) -> list[Any]:
    """What autogenerate would change to make the database match ``md`` (types and comments too)."""
    with engine.connect() as conn:
        mc = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(mc, md))


def test_upgrade_creates_what_init_db_creates(engine: sa.Engine, db_url: str) -> None:
    command.upgrade(migrations.alembic_config(db_url), "head")
    reference = outbox.make_tables("ref_")
    outbox.init_db(engine, reference)
    assert {"txmq_outbox", "txmq_inbox", "alembic_version"} <= _table_names(engine)
    for name in ("outbox", "inbox"):
        assert _shape(engine, f"txmq_{name}", "txmq_") == _shape(engine, f"ref_{name}", "ref_")


def test_migrated_schema_has_no_autogenerate_diff(engine: sa.Engine, db_url: str) -> None:
    command.upgrade(migrations.alembic_config(db_url), "head")
    assert _diffs(engine, outbox.make_tables().metadata) == []


def test_compare_detects_a_schema_difference(engine: sa.Engine, db_url: str) -> None:
    """The comparison of the test above can fail: an index the migration lacks is reported."""
    command.upgrade(migrations.alembic_config(db_url), "head")
    t = outbox.make_tables()
    sa.Index("txmq_outbox_extra_ix", t.outbox.c.topic)
    assert [d[0] for d in _diffs(engine, t.metadata)] == ["add_index"]


def test_downgrade_base_drops_both_tables(engine: sa.Engine, db_url: str) -> None:
    cfg = migrations.alembic_config(db_url)
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "base")
    assert _table_names(engine) == {"alembic_version"}
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_heads() == ()
    command.upgrade(cfg, "head")  # and again: the downgrade left nothing behind that would collide
    assert {"txmq_outbox", "txmq_inbox"} <= _table_names(engine)


def test_prefix_from_attributes_runs_the_outbox_flow(engine: sa.Engine, db_url: str) -> None:
    cfg = migrations.alembic_config(db_url, prefix="svc_")
    command.upgrade(cfg, "head")
    assert _table_names(engine) == {"svc_outbox", "svc_inbox", "alembic_version"}
    tables = outbox.make_tables("svc_")
    assert _diffs(engine, tables.metadata) == []
    clock, sender = FakeClock(), RecordingSender()
    put(engine, tables, 3, now_ms=clock.ms)
    result = make_relay(engine, tables, sender, OutboxMetrics(CollectorRegistry()), clock).run_once()
    assert result.sent == 3 and len(sender.sent) == 3
    command.downgrade(cfg, "base")
    assert _table_names(engine) == {"alembic_version"}


def test_prefix_from_x_argument(engine: sa.Engine, db_url: str) -> None:
    cfg = migrations.alembic_config(db_url)
    del cfg.attributes[migrations.PREFIX_ATTRIBUTE]
    cfg.cmd_opts = _XOpts(["txmq_prefix=x_"])  # what ``alembic -x txmq_prefix=x_`` sets
    command.upgrade(cfg, "head")
    assert _table_names(engine) == {"x_outbox", "x_inbox", "alembic_version"}
    command.downgrade(cfg, "base")
    assert _table_names(engine) == {"alembic_version"}


class _XOpts:
    """The part of Alembic's parsed command line that ``get_x_argument`` reads."""

    def __init__(self, x: list[str]) -> None:
        self.x = x


def test_stamp_a_database_init_db_created(engine: sa.Engine, db_url: str) -> None:
    outbox.init_db(engine)
    cfg = migrations.alembic_config(db_url)
    command.stamp(cfg, migrations.HEAD_REVISION)
    command.upgrade(cfg, "head")  # nothing to do: creating the tables again would fail
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_heads() == (migrations.HEAD_REVISION,)
    command.downgrade(cfg, "base")
    assert _table_names(engine) == {"alembic_version"}


SERVICE_ENV = '''
from alembic import context
import sqlalchemy as sa
from txmq.outbox import DEFAULT_TABLES

service_md = sa.MetaData()
sa.Table("orders", service_md, sa.Column("id", sa.Integer, primary_key=True))
target_metadata = [service_md, DEFAULT_TABLES.metadata]  # as docs/outbox.md says

url = context.config.get_main_option("sqlalchemy.url")
engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
with engine.connect() as conn:
    context.configure(connection=conn, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
'''

SERVICE_INI = """[alembic]
script_location = %(here)s
path_separator = space
version_locations = %(here)s/versions txmq.outbox:migrations/versions
"""

SERVICE_REVISION = '''
import sqlalchemy as sa
from alembic import op

revision = "svc_0001"
down_revision = None
branch_labels = ("service",)
depends_on = "txmq_outbox"


def upgrade():
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("orders")
'''


def _heads(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(MigrationContext.configure(conn).get_current_heads())


def _assert_only_orders_differs(engine: sa.Engine) -> None:
    """txmq's tables match ``make_tables()``; the service's own ``orders`` is the one extra table."""
    diffs = _diffs(engine, outbox.make_tables().metadata)
    assert len(diffs) == 1 and diffs[0][0] == "remove_table" and diffs[0][1].name == "orders", diffs


def _service_config(tmp_path: Path, db_url: str, revision: str = SERVICE_REVISION) -> Config:
    """A service's own Alembic environment that includes txmq's version location (docs/outbox.md)."""
    (tmp_path / "svc" / "versions").mkdir(parents=True)
    (tmp_path / "svc" / "env.py").write_text(SERVICE_ENV)
    (tmp_path / "svc" / "versions" / "svc_0001_orders.py").write_text(revision)
    ini = tmp_path / "svc" / "alembic.ini"
    ini.write_text(SERVICE_INI + f"sqlalchemy.url = {db_url.replace('%', '%%')}\n")
    return Config(str(ini))


def test_service_history_includes_txmq_revisions(engine: sa.Engine, db_url: str, tmp_path: Path) -> None:
    cfg = _service_config(tmp_path, db_url)
    command.upgrade(cfg, "service@head")  # depends_on pulls txmq_outbox@head in first
    assert _table_names(engine) == {"orders", "txmq_outbox", "txmq_inbox", "alembic_version"}
    _assert_only_orders_differs(engine)
    command.check(cfg)  # the env's target_metadata (docs/outbox.md): autogenerate finds nothing to do
    assert _heads(engine) == {"svc_0001"}  # svc_0001 depends on txmq_0001, so it alone is the head
    command.downgrade(cfg, "txmq_outbox@base")  # the service revision depends on it: both go
    assert _table_names(engine) == {"alembic_version"}


def test_stamp_in_a_service_history(engine: sa.Engine, db_url: str, tmp_path: Path) -> None:
    """A service history older than txmq's revisions, tables from ``init_db``: stamp, then upgrade."""
    cfg = _service_config(tmp_path, db_url, SERVICE_REVISION.replace('depends_on = "txmq_outbox"', ""))
    command.upgrade(cfg, "service@head")
    outbox.init_db(engine)
    command.stamp(cfg, migrations.HEAD_REVISION)
    command.upgrade(cfg, "heads")  # nothing left to run: creating txmq_outbox again would fail
    assert _heads(engine) == {"svc_0001", migrations.HEAD_REVISION}
    _assert_only_orders_differs(engine)
    command.downgrade(cfg, "txmq_outbox@base")
    assert _table_names(engine) == {"orders", "alembic_version"}


def test_version_location_path_is_shipped() -> None:
    files = {p.name for p in migrations.alembic_version_location().iterdir()}
    assert "txmq_0001_create_outbox_inbox.py" in files


def test_offline_mode_writes_the_ddl(tmp_path: Path) -> None:
    """``alembic upgrade head --sql`` (offline): the env prints the DDL and touches no database."""
    cfg = migrations.alembic_config(f"sqlite:///{tmp_path / 'never.db'}", prefix="off_")
    cfg.output_buffer = buf = io.StringIO()
    command.upgrade(cfg, "head", sql=True)
    ddl = buf.getvalue()
    assert "CREATE TABLE off_outbox" in ddl and "CREATE INDEX off_inbox_consumed_ix" in ddl
    assert not (tmp_path / "never.db").exists()
