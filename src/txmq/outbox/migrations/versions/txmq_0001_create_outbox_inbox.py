"""Create the outbox and inbox tables: what ``make_tables(prefix)`` defined when this was written.

Revision ID: txmq_0001
Revises:
Create Date: 2026-11-23

Frozen copy of ``txmq/outbox/_schema.py`` (``_outbox_table``, ``_inbox_table``) at commit d5595b2:
the lengths of ``txmq.limits`` are written out, so later changes to the module need a new revision
rather than silently changing this one. The prefix comes from :func:`migration_prefix`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from txmq.outbox.migrations import BRANCH_LABEL, migration_prefix

revision: str = "txmq_0001"
down_revision: str | None = None
branch_labels: tuple[str, ...] | None = (BRANCH_LABEL,)
depends_on: str | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: INTEGER PRIMARY KEY = rowid
_PAYLOAD = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")  # BLOB is 64 KiB
_TEXT = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
_EVENT_ID = 64  # _EVENT_ID_CHARS
_TOPIC = 255  # _TOPIC_CHARS
_APP_ID = 128  # limits.OUTBOX_APP_ID_MAX_CHARS
_BIZ_KEY = 255  # limits.OUTBOX_BIZ_KEY_MAX_CHARS
_EVENT_TYPE = 64  # limits.OUTBOX_EVENT_TYPE_MAX_CHARS


def _create_outbox(p: str) -> None:
    c = sa.Column
    op.create_table(
        f"{p}outbox",
        c("id", _ID, primary_key=True, autoincrement=True),
        c("event_id", sa.String(_EVENT_ID), nullable=False,
          comment="global id of the event (uuid4 hex); the sent message's UNIQ_KEY"),
        c("app_id", sa.String(_APP_ID), nullable=False),
        c("biz_key", sa.String(_BIZ_KEY), nullable=False),
        c("event_type", sa.String(_EVENT_TYPE), nullable=False),
        c("tx_type", sa.String(8), nullable=False),
        c("status", sa.String(32), nullable=False),
        c("topic", sa.String(_TOPIC), nullable=False),
        c("msg_tags", sa.String(255), nullable=False),
        c("msg_keys", sa.String(1024), nullable=False),
        c("properties", _TEXT, nullable=False, comment="user message properties as a JSON object"),
        c("payload", _PAYLOAD, nullable=False),
        c("origin_event_id", sa.String(_EVENT_ID), nullable=True,
          comment="ROLLBACK events: the event_id of the COMMIT event they undo"),
        c("attempts", sa.Integer, nullable=False, comment="claims so far (counted at claim)"),
        c("next_attempt_at_ms", sa.BigInteger, nullable=False),
        c("lease_owner", sa.String(128), nullable=True),
        c("lease_expires_at_ms", sa.BigInteger, nullable=True),
        c("fencing_token", sa.BigInteger, nullable=False,
          comment="incremented by every claim; only the latest claimant may finish the row"),
        c("last_error", sa.String(1024), nullable=True),
        c("created_at_ms", sa.BigInteger, nullable=False),
        c("updated_at_ms", sa.BigInteger, nullable=False),
        c("sent_at_ms", sa.BigInteger, nullable=True),
        sa.UniqueConstraint("event_id", name=f"{p}outbox_event_uq"),
    )
    op.create_index(f"{p}outbox_due_ix", f"{p}outbox", ["status", "next_attempt_at_ms"])
    op.create_index(f"{p}outbox_lease_ix", f"{p}outbox", ["status", "lease_expires_at_ms"])


def _create_inbox(p: str) -> None:
    c = sa.Column
    op.create_table(
        f"{p}inbox",
        c("id", _ID, primary_key=True, autoincrement=True),
        c("app_id", sa.String(_APP_ID), nullable=False),
        c("biz_key", sa.String(_BIZ_KEY), nullable=False),
        c("event_id", sa.String(_EVENT_ID), nullable=False),
        c("event_type", sa.String(_EVENT_TYPE), nullable=False),
        c("tx_type", sa.String(8), nullable=False),
        c("status", sa.String(32), nullable=False),
        c("topic", sa.String(_TOPIC), nullable=False),
        c("msg_id", sa.String(_EVENT_ID), nullable=False),
        c("reconsume_times", sa.Integer, nullable=False),
        c("consumed_at_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("app_id", "biz_key", "event_id", name=f"{p}inbox_event_uq"),
    )
    op.create_index(f"{p}inbox_consumed_ix", f"{p}inbox", ["consumed_at_ms"])


def upgrade() -> None:
    """Create ``<prefix>outbox`` and ``<prefix>inbox`` with their indexes and unique constraints."""
    p = migration_prefix()
    _create_outbox(p)
    _create_inbox(p)


def downgrade() -> None:
    """Drop both tables (their indexes go with them)."""
    p = migration_prefix()
    op.drop_table(f"{p}inbox")
    op.drop_table(f"{p}outbox")
