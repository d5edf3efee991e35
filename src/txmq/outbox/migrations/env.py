"""Standalone Alembic environment of txmq's outbox and inbox migrations (``alembic_config``).

Follows Alembic's generic ``env.py`` template (online and offline modes), with the target metadata
of :func:`~txmq.outbox.make_tables` for the migration's prefix. A connection passed in
``Config.attributes["connection"]`` is used as is (Alembic cookbook, "Sharing a Connection").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from txmq.outbox._schema import make_tables
from txmq.outbox.migrations import migration_prefix


def _configure_and_run(**kw: object) -> None:
    context.configure(target_metadata=make_tables(migration_prefix()).metadata, **kw)  # type: ignore[arg-type]
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    conn = context.config.attributes.get("connection")
    if conn is not None:
        _configure_and_run(connection=conn)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    engine = sa.create_engine(str(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure_and_run(connection=conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    _configure_and_run(url=context.config.get_main_option("sqlalchemy.url"), literal_binds=True)
else:
    _run_online()
