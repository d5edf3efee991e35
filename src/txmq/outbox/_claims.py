"""The relay's SQL: claim events with a lease and a fencing token, then finish them.

Two ways to claim, chosen by dialect:

* PostgreSQL, MariaDB and MySQL: ``SELECT … FOR UPDATE SKIP LOCKED`` then ``UPDATE`` in one
  transaction. Concurrent relays skip each other's locked rows instead of waiting or double-claiming.
* SQLite (and any other database): candidates are read without locks, then each is claimed by a
  conditional ``UPDATE … WHERE id = ? AND fencing_token = ? AND <still claimable>``: a compare-and-set,
  so of two relays that read the same candidate exactly one updates it (rowcount 1), and a row that
  was finished meanwhile is never claimed again.

Every claim sets ``status = PRODUCE_PROCESSING``, the lease (owner, expiry), ``fencing_token + 1`` and
``attempts + 1`` (attempts are counted when claimed, so a relay that dies mid-send still counts;
langwatch #7037). Finishing a row (sent or failed) requires the token of the claim: after a lease
expired and another relay re-claimed the row, the first relay's update matches 0 rows and is counted
as stale instead of overwriting the newer claim.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from txmq.outbox._envelope import OutboxRow
from txmq.outbox._schema import EventStatus, OutboxTables

__all__ = ["claim", "claim_conditional", "claim_skip_locked", "claimable_clause", "mark_failed", "mark_sent",
           "supports_skip_locked"]

_SKIP_LOCKED_DIALECTS = frozenset({"postgresql", "mysql", "mariadb"})
_ERROR_CHARS = 1024


def supports_skip_locked(dialect: sa.Dialect) -> bool:
    """Whether claims use ``FOR UPDATE SKIP LOCKED`` (PostgreSQL ≥ 9.5, MariaDB ≥ 10.6, MySQL ≥ 8)."""
    return dialect.name in _SKIP_LOCKED_DIALECTS


def _due(t: sa.Table, now_ms: int) -> sa.ColumnElement[bool]:
    return sa.and_(t.c.status == EventStatus.PRODUCE_INIT.value, t.c.next_attempt_at_ms <= now_ms)


def _expired(t: sa.Table, now_ms: int) -> sa.ColumnElement[bool]:
    return sa.and_(t.c.status == EventStatus.PRODUCE_PROCESSING.value, t.c.lease_expires_at_ms <= now_ms)


def claimable_clause(t: sa.Table, now_ms: int) -> sa.ColumnElement[bool]:
    """SQL of :func:`txmq.outbox._policy.claimable`."""
    return sa.or_(_due(t, now_ms), _expired(t, now_ms))


def _candidates(conn: sa.Connection, t: sa.Table, now_ms: int, limit: int, *,
                lock: bool) -> list[Any]:
    """Expired leases first (the oldest stuck events), then due PRODUCE_INIT events in due order.
    Two index range scans rather than one OR, so a long processed history is never scanned."""
    out: list[Any] = []
    for cond, order in ((_expired(t, now_ms), t.c.lease_expires_at_ms),
                        (_due(t, now_ms), t.c.next_attempt_at_ms)):
        if len(out) >= limit:
            break
        q = sa.select(t.c.id, t.c.fencing_token).where(cond).order_by(order, t.c.id).limit(limit - len(out))
        if lock:
            q = q.with_for_update(skip_locked=True)
        out.extend(conn.execute(q).all())
    return out


def _claim_values(t: sa.Table, owner: str, now_ms: int, lease_ms: int) -> dict[str, object]:
    return {"status": EventStatus.PRODUCE_PROCESSING.value, "lease_owner": owner,
            "lease_expires_at_ms": now_ms + lease_ms, "fencing_token": t.c.fencing_token + 1,
            "attempts": t.c.attempts + 1, "updated_at_ms": now_ms}


def _load(conn: sa.Connection, t: sa.Table, ids: list[int]) -> list[OutboxRow]:
    if not ids:
        return []
    rows = conn.execute(sa.select(t).where(t.c.id.in_(ids)).order_by(t.c.id)).all()
    return [OutboxRow.from_db(r) for r in rows]


def claim(conn: sa.Connection, tables: OutboxTables, owner: str, now_ms: int, limit: int,
          lease_ms: int) -> list[OutboxRow]:
    """Claim up to ``limit`` claimable events for ``owner`` until ``now_ms + lease_ms``.

    Runs in the caller's transaction on ``conn``; the claim holds once it commits. Uses
    :func:`claim_skip_locked` where the dialect supports it, else :func:`claim_conditional`.
    Returns the claimed rows with their new fencing tokens, in id order.
    """
    how = claim_skip_locked if supports_skip_locked(conn.dialect) else claim_conditional
    return how(conn, tables, owner, now_ms, limit, lease_ms)


def claim_skip_locked(conn: sa.Connection, tables: OutboxTables, owner: str, now_ms: int, limit: int,
                      lease_ms: int) -> list[OutboxRow]:
    """:func:`claim` by ``SELECT … FOR UPDATE SKIP LOCKED`` + ``UPDATE`` (PostgreSQL, MariaDB, MySQL)."""
    t = tables.outbox
    ids = [c.id for c in _candidates(conn, t, now_ms, limit, lock=True)]
    if ids:
        conn.execute(sa.update(t).where(t.c.id.in_(ids)).values(**_claim_values(t, owner, now_ms, lease_ms)))
    return _load(conn, t, ids)


_CAS: weakref.WeakKeyDictionary[sa.Table, sa.Update] = weakref.WeakKeyDictionary()


def _cas_statement(t: sa.Table) -> sa.Update:
    """The compare-and-set claim of one candidate, built once per table with bound parameters (so it
    is compiled once; building it per row cost more than the database work)."""
    stmt = _CAS.get(t)
    if stmt is None:
        now = sa.bindparam("now_ms", type_=sa.BigInteger)
        due = sa.and_(t.c.status == EventStatus.PRODUCE_INIT.value, t.c.next_attempt_at_ms <= now)
        expired = sa.and_(t.c.status == EventStatus.PRODUCE_PROCESSING.value, t.c.lease_expires_at_ms <= now)
        stmt = _CAS[t] = sa.update(t).where(
            t.c.id == sa.bindparam("cand_id"), t.c.fencing_token == sa.bindparam("cand_token"),
            sa.or_(due, expired),
        ).values(status=EventStatus.PRODUCE_PROCESSING.value, lease_owner=sa.bindparam("owner"),
                 lease_expires_at_ms=sa.bindparam("lease_until"), fencing_token=t.c.fencing_token + 1,
                 attempts=t.c.attempts + 1, updated_at_ms=now)
    return stmt


def claim_conditional(conn: sa.Connection, tables: OutboxTables, owner: str, now_ms: int, limit: int,
                      lease_ms: int) -> list[OutboxRow]:
    """:func:`claim` by a compare-and-set ``UPDATE`` per candidate (any database)."""
    t = tables.outbox
    stmt = _cas_statement(t)
    got: list[int] = []
    for c in _candidates(conn, t, now_ms, limit, lock=False):
        res = conn.execute(stmt, {"cand_id": c.id, "cand_token": c.fencing_token, "now_ms": now_ms,
                                  "owner": owner, "lease_until": now_ms + lease_ms})
        if res.rowcount == 1:
            got.append(c.id)
    return _load(conn, t, got)


def mark_sent(conn: sa.Connection, tables: OutboxTables, rows: Sequence[OutboxRow], now_ms: int) -> int:
    """PRODUCE_PROCESSING → PRODUCE_PROCESSED for rows whose claim (id, fencing token) still holds.

    Call only after the broker acknowledged the send. Returns how many rows were marked; the rest
    were re-claimed by another relay after their lease expired (stale).
    """
    if not rows:
        return 0
    t = tables.outbox
    stmt = sa.update(t).where(
        t.c.id.in_([r.id for r in rows]),
        t.c.status == EventStatus.PRODUCE_PROCESSING.value,
        sa.tuple_(t.c.id, t.c.fencing_token).in_([(r.id, r.fencing_token) for r in rows]),
    ).values(status=EventStatus.PRODUCE_PROCESSED.value, sent_at_ms=now_ms, updated_at_ms=now_ms,
             lease_owner=None, lease_expires_at_ms=None, last_error=None)
    return int(conn.execute(stmt).rowcount)


def mark_failed(conn: sa.Connection, tables: OutboxTables, failures: Sequence[tuple[OutboxRow, int]],
                error: str, now_ms: int) -> int:
    """PRODUCE_PROCESSING → PRODUCE_INIT, due again at the given time, for each ``(row, due_ms)``
    whose claim still holds; records ``error``. Returns how many rows were updated."""
    t = tables.outbox
    done = 0
    for row, due_ms in failures:
        res = conn.execute(sa.update(t).where(
            t.c.id == row.id, t.c.fencing_token == row.fencing_token,
            t.c.status == EventStatus.PRODUCE_PROCESSING.value,
        ).values(status=EventStatus.PRODUCE_INIT.value, next_attempt_at_ms=due_ms, lease_owner=None,
                 lease_expires_at_ms=None, last_error=error[:_ERROR_CHARS], updated_at_ms=now_ms))
        done += int(res.rowcount)
    return done
