"""The local message table's two tables, as SQLAlchemy Core ``Table`` objects in our own ``MetaData``.

``<prefix>outbox`` holds outbox events: written by :func:`~txmq.outbox.put_message` in the caller's
local transaction (status ``PRODUCE_INIT``), claimed and sent by a relay. ``<prefix>inbox`` holds one
row per event a consumer has handled, unique on ``(app_id, biz_key, event_id)``, with a surrogate
primary key of its own: the upstream row id is never reused as a downstream key (shieldTXC defect 6,
peers.md §3).

Times are integers, milliseconds since the epoch (``*_ms``), so that comparisons behave the same on
SQLite, PostgreSQL and MariaDB and the relay's decisions can take ``now`` as a plain number.

Event status (DESIGN.md vocabulary)::

    outbox:  PRODUCE_INIT --claim--> PRODUCE_PROCESSING --broker ack--> PRODUCE_PROCESSED
                  ^                       |      ^
                  +------send failed------+      +--lease expired: claimed again (new fencing token)
    inbox:   CONSUME_PROCESSED             the handler's transaction committed with the inbox row
             CONSUME_MAX_RECONSUMETIMES    given up; a ROLLBACK event was written in the same transaction

``CONSUME_INIT`` and ``CONSUME_PROCESSING`` exist only inside the consumer's open transaction: the
inbox row and the handler's side effect commit together or not at all, so no other transaction ever
sees them (shieldTXC wrote them in separate transactions, defects 4, 5 and 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from txmq import limits

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_TABLES",
    "EventStatus",
    "OutboxTables",
    "TxType",
    "drop_tables",
    "init_db",
    "make_tables",
]

DEFAULT_PREFIX = "txmq_"
"""Table name prefix of :data:`DEFAULT_TABLES` (``txmq_outbox``, ``txmq_inbox``)."""


class TxType(StrEnum):
    """Whether an event carries the forward action or undoes it (shieldTXC ``TXType``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"


class EventStatus(StrEnum):
    """Status of an outbox or inbox row (shieldTXC ``EventStatus``)."""

    PRODUCE_INIT = "PRODUCE_INIT"
    PRODUCE_PROCESSING = "PRODUCE_PROCESSING"
    PRODUCE_PROCESSED = "PRODUCE_PROCESSED"
    CONSUME_INIT = "CONSUME_INIT"
    CONSUME_PROCESSING = "CONSUME_PROCESSING"
    CONSUME_PROCESSED = "CONSUME_PROCESSED"
    CONSUME_MAX_RECONSUMETIMES = "CONSUME_MAX_RECONSUMETIMES"


_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: INTEGER PRIMARY KEY = rowid
_PAYLOAD = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")  # BLOB is 64 KiB
_TEXT = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
_EVENT_ID_CHARS = 64
_TOPIC_CHARS = 255


@dataclass(frozen=True)
class OutboxTables:
    """The outbox and inbox tables of one prefix, in one ``MetaData``.

    Attributes:
        metadata: holds both tables (pass it to Alembic's ``target_metadata`` to migrate them).
        outbox: the event table, ``<prefix>outbox``.
        inbox: the consumed-event table, ``<prefix>inbox``.
        prefix: the table name prefix.
    """

    metadata: sa.MetaData
    outbox: sa.Table
    inbox: sa.Table
    prefix: str


def _outbox_table(md: sa.MetaData, prefix: str, schema: str | None) -> sa.Table:
    c = sa.Column
    return sa.Table(
        f"{prefix}outbox", md,
        c("id", _ID, primary_key=True, autoincrement=True),
        c("event_id", sa.String(_EVENT_ID_CHARS), nullable=False,
          comment="global id of the event (uuid4 hex); the sent message's UNIQ_KEY"),
        c("app_id", sa.String(limits.OUTBOX_APP_ID_MAX_CHARS), nullable=False),
        c("biz_key", sa.String(limits.OUTBOX_BIZ_KEY_MAX_CHARS), nullable=False),
        c("event_type", sa.String(limits.OUTBOX_EVENT_TYPE_MAX_CHARS), nullable=False),
        c("tx_type", sa.String(8), nullable=False),
        c("status", sa.String(32), nullable=False),
        c("topic", sa.String(_TOPIC_CHARS), nullable=False),
        c("msg_tags", sa.String(255), nullable=False, default=""),
        c("msg_keys", sa.String(1024), nullable=False, default=""),
        c("properties", _TEXT, nullable=False, comment="user message properties as a JSON object"),
        c("payload", _PAYLOAD, nullable=False),
        c("origin_event_id", sa.String(_EVENT_ID_CHARS), nullable=True,
          comment="ROLLBACK events: the event_id of the COMMIT event they undo"),
        c("attempts", sa.Integer, nullable=False, default=0, comment="claims so far (counted at claim)"),
        c("next_attempt_at_ms", sa.BigInteger, nullable=False),
        c("lease_owner", sa.String(128), nullable=True),
        c("lease_expires_at_ms", sa.BigInteger, nullable=True),
        c("fencing_token", sa.BigInteger, nullable=False, default=0,
          comment="incremented by every claim; only the latest claimant may finish the row"),
        c("last_error", sa.String(1024), nullable=True),
        c("created_at_ms", sa.BigInteger, nullable=False),
        c("updated_at_ms", sa.BigInteger, nullable=False),
        c("sent_at_ms", sa.BigInteger, nullable=True),
        sa.UniqueConstraint("event_id", name=f"{prefix}outbox_event_uq"),
        sa.Index(f"{prefix}outbox_due_ix", "status", "next_attempt_at_ms"),
        sa.Index(f"{prefix}outbox_lease_ix", "status", "lease_expires_at_ms"),
        schema=schema,
    )


def _inbox_table(md: sa.MetaData, prefix: str, schema: str | None) -> sa.Table:
    c = sa.Column
    return sa.Table(
        f"{prefix}inbox", md,
        c("id", _ID, primary_key=True, autoincrement=True),
        c("app_id", sa.String(limits.OUTBOX_APP_ID_MAX_CHARS), nullable=False),
        c("biz_key", sa.String(limits.OUTBOX_BIZ_KEY_MAX_CHARS), nullable=False),
        c("event_id", sa.String(_EVENT_ID_CHARS), nullable=False),
        c("event_type", sa.String(limits.OUTBOX_EVENT_TYPE_MAX_CHARS), nullable=False),
        c("tx_type", sa.String(8), nullable=False),
        c("status", sa.String(32), nullable=False),
        c("topic", sa.String(_TOPIC_CHARS), nullable=False),
        c("msg_id", sa.String(_EVENT_ID_CHARS), nullable=False),
        c("reconsume_times", sa.Integer, nullable=False),
        c("consumed_at_ms", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("app_id", "biz_key", "event_id", name=f"{prefix}inbox_event_uq"),
        sa.Index(f"{prefix}inbox_consumed_ix", "consumed_at_ms"),
        schema=schema,
    )


def make_tables(prefix: str = DEFAULT_PREFIX, *, metadata: sa.MetaData | None = None,
                schema: str | None = None) -> OutboxTables:
    """Define ``<prefix>outbox`` and ``<prefix>inbox`` in ``metadata`` (a new one by default).

    Several prefixes can live in one database (one per service, or per test run). ``schema`` places
    them in a PostgreSQL schema or another MariaDB database.
    """
    md = metadata if metadata is not None else sa.MetaData()
    return OutboxTables(md, _outbox_table(md, prefix, schema), _inbox_table(md, prefix, schema), prefix)


DEFAULT_TABLES = make_tables()
"""``txmq_outbox`` and ``txmq_inbox``: what every function uses unless given ``tables=``."""


def init_db(bind: sa.Engine | sa.Connection, tables: OutboxTables = DEFAULT_TABLES) -> None:
    """Create the outbox and inbox tables and their indexes if they do not exist (``create_all``)."""
    tables.metadata.create_all(bind, tables=[tables.outbox, tables.inbox])


def drop_tables(bind: sa.Engine | sa.Connection, tables: OutboxTables = DEFAULT_TABLES) -> None:
    """Drop both tables if they exist (tests, and ``txmq outbox`` users starting over)."""
    tables.metadata.drop_all(bind, tables=[tables.outbox, tables.inbox])
