"""Alembic migrations of the outbox and inbox tables, shipped in the package.

``versions/`` is an Alembic version location whose revisions carry the branch label
:data:`BRANCH_LABEL` (``txmq_outbox``). A service includes it in its own Alembic history by adding
:data:`VERSION_LOCATION` (``txmq.outbox:migrations/versions``) to ``version_locations`` in its
``alembic.ini`` and upgrading ``heads`` (or making one of its revisions ``depends_on`` the label);
see docs/outbox.md, "Alembic migrations". This directory is also a complete Alembic script location
(``env.py``) for databases that hold nothing but txmq's tables: :func:`alembic_config`.

The table prefix, ``txmq_`` by default as in :func:`~txmq.outbox.make_tables`, comes from the
Alembic ``Config.attributes["txmq_prefix"]`` or the command line ``-x txmq_prefix=...``
(Alembic docs, "Sharing a Connection across one or more programmatic migration commands" and
``EnvironmentContext.get_x_argument``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import context
from alembic.config import Config

from txmq.outbox._schema import DEFAULT_PREFIX

__all__ = [
    "BRANCH_LABEL",
    "HEAD_REVISION",
    "PREFIX_ATTRIBUTE",
    "SCRIPT_LOCATION",
    "VERSION_LOCATION",
    "alembic_config",
    "alembic_version_location",
    "migration_prefix",
]

BRANCH_LABEL = "txmq_outbox"
"""Branch label of txmq's revisions: ``alembic upgrade txmq_outbox@head``, ``depends_on="txmq_outbox"``."""

HEAD_REVISION = "txmq_0001"
"""The newest txmq revision; ``alembic stamp txmq_0001`` marks tables that ``init_db`` created."""

PREFIX_ATTRIBUTE = "txmq_prefix"
"""Key of the table prefix in ``Config.attributes`` and in ``-x`` arguments."""

SCRIPT_LOCATION = "txmq.outbox:migrations"
"""Alembic script location (package resource form) of the standalone environment."""

VERSION_LOCATION = "txmq.outbox:migrations/versions"
"""Alembic version location (package resource form) for a service's ``version_locations``."""


def alembic_version_location() -> Path:
    """The directory of txmq's revision files, as a filesystem path (for ``version_locations``)."""
    return Path(str(resources.files("txmq.outbox.migrations") / "versions"))


def migration_prefix() -> str:
    """The table prefix of the running migration: ``Config.attributes``, then ``-x``, then ``txmq_``.

    Call it only while Alembic runs a migration (it reads :data:`alembic.context`).
    """
    attr = context.config.attributes.get(PREFIX_ATTRIBUTE)
    if attr is not None:
        return str(attr)
    return str(context.get_x_argument(as_dictionary=True).get(PREFIX_ATTRIBUTE, DEFAULT_PREFIX))


def alembic_config(url: str, prefix: str = DEFAULT_PREFIX) -> Config:
    """A programmatic ``Config`` of the standalone environment for ``url`` and ``prefix``.

    Use it with ``alembic.command``: ``command.upgrade(alembic_config(url), "head")``. The standalone
    environment keeps its version in ``alembic_version``; services with their own Alembic history
    should include :data:`VERSION_LOCATION` instead.
    """
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes[PREFIX_ATTRIBUTE] = prefix
    return cfg
