"""``put_message``: write an outbox event in the caller's own local transaction (invariant I8).

The event row is one ``INSERT`` on the caller's connection; nothing commits here. If the business
transaction rolls back, the event is gone with it; if it commits, a relay will send the event.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, overload

import sqlalchemy as sa
from sqlalchemy.orm import Session

if TYPE_CHECKING:  # importing sqlalchemy.ext.asyncio costs about a second: only callers that use it do
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from txmq import limits
from txmq.errors import OutboxError
from txmq.outbox._schema import DEFAULT_TABLES, EventStatus, OutboxTables, TxType
from txmq.outbox._tracing import put_span
from txmq.protocol import Message
from txmq.tracing import Tracing

__all__ = ["insert_event", "new_event_id", "put_message"]


def new_event_id() -> str:
    """A fresh global event id: 32 lowercase hex digits (uuid4)."""
    return uuid.uuid4().hex


def _check(name: str, value: str, max_chars: int, *, empty_ok: bool = False) -> None:
    if not isinstance(value, str):
        raise OutboxError(f"{name} must be a str, got {type(value).__name__}")
    if not value and not empty_ok:
        raise OutboxError(f"{name} must not be empty")
    if len(value) > max_chars:
        raise OutboxError(f"{name} is {len(value)} characters, at most {max_chars} allowed")


def insert_event(conn: sa.Connection, tables: OutboxTables, message: Message, *, event_type: str,
                 biz_key: str, app_id: str, tx_type: TxType, now_ms: int,
                 origin_event_id: str | None = None, tracing: Tracing | None = None,
                 fallback_context: dict[str, str] | None = None) -> str:
    """INSERT one PRODUCE_INIT event on ``conn`` (no commit); returns its event id.

    With ``tracing`` (propagating), the event's properties (a copy) get the current trace context
    (``traceparent``, ``tracestate``: its creation context, carried to every consumer) unless
    they carry one already, or, when there is none, ``fallback_context``; the write is a
    ``put_message <topic>`` span when spans are made.

    Raises:
        OutboxError: an empty or too long field, an empty topic, a payload over 4 MiB.
    """
    _check("app_id", app_id, limits.OUTBOX_APP_ID_MAX_CHARS, empty_ok=True)
    _check("biz_key", biz_key, limits.OUTBOX_BIZ_KEY_MAX_CHARS)
    _check("event_type", event_type, limits.OUTBOX_EVENT_TYPE_MAX_CHARS)
    _check("topic", message.topic, 255)
    if len(message.body) > limits.MESSAGE_SIZE_MAX_BYTES:
        raise OutboxError(f"payload of {len(message.body)} bytes exceeds {limits.MESSAGE_SIZE_MAX_BYTES}")
    event_id = new_event_id()
    tx = TxType(tx_type).value
    if tracing is None or not tracing.propagates:
        _insert(conn, tables, message, message.properties, event_id, event_type, biz_key, app_id, tx,
                now_ms, origin_event_id)
        return event_id
    with put_span(tracing, tables.outbox.name, message, event_id, event_type, biz_key, tx,
                  origin_event_id):
        props = dict(message.properties)  # the caller's dict may be shared
        if not tracing.inject(props) and fallback_context:
            props.update(fallback_context)
        _insert(conn, tables, message, props, event_id, event_type, biz_key, app_id, tx, now_ms,
                origin_event_id)
    return event_id


def _insert(conn: sa.Connection, tables: OutboxTables, message: Message, props: dict[str, str],
            event_id: str, event_type: str, biz_key: str, app_id: str, tx_type: str, now_ms: int,
            origin_event_id: str | None) -> None:
    conn.execute(tables.outbox.insert(), {  # values as parameters: the statement is compiled once
        "event_id": event_id, "app_id": app_id, "biz_key": biz_key, "event_type": event_type,
        "tx_type": tx_type, "status": EventStatus.PRODUCE_INIT.value, "topic": message.topic,
        "msg_tags": message.tags, "msg_keys": message.keys, "properties": json.dumps(props),
        "payload": bytes(message.body), "origin_event_id": origin_event_id, "attempts": 0,
        "next_attempt_at_ms": now_ms, "fencing_token": 0, "created_at_ms": now_ms, "updated_at_ms": now_ms,
    })


def _sync_connection(conn: sa.Connection | Session) -> sa.Connection:
    c = conn.connection() if isinstance(conn, Session) else conn
    if c.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        raise OutboxError("put_message needs the caller's transaction; this connection autocommits")
    return c


@overload
def put_message(conn: AsyncConnection | AsyncSession, message: Message, event_type: str, biz_key: str,
                app_id: str, tx_type: TxType = ..., *, tables: OutboxTables = ...,
                now_ms: int | None = ..., tracing: Tracing | bool = ...) -> Coroutine[Any, Any, str]: ...


@overload
def put_message(conn: sa.Connection | Session, message: Message, event_type: str, biz_key: str,
                app_id: str, tx_type: TxType = ..., *, tables: OutboxTables = ...,
                now_ms: int | None = ..., tracing: Tracing | bool = ...) -> str: ...


def put_message(conn: sa.Connection | Session | AsyncConnection | AsyncSession, message: Message,
                event_type: str, biz_key: str, app_id: str, tx_type: TxType = TxType.COMMIT, *,
                tables: OutboxTables = DEFAULT_TABLES, now_ms: int | None = None,
                tracing: Tracing | bool = True) -> str | Coroutine[Any, Any, str]:
    """Write ``message`` as an outbox event in the caller's open local transaction.

    Args:
        conn: the business transaction's ``Connection`` or ORM ``Session`` (returns the event id),
            or its ``AsyncConnection`` / ``AsyncSession`` (returns a coroutine: ``await`` it).
        message: topic, body (the payload, at most 4 MiB), optional tags, keys and properties.
        event_type: what happened, e.g. ``"ORDER_CREATED"`` (at most 64 characters).
        biz_key: the business key, e.g. the order id (at most 255 characters, not empty).
        app_id: the writing application (at most 128 characters); part of the consumer's
            idempotency key ``(app_id, biz_key, event_id)``.
        tx_type: COMMIT (default) or ROLLBACK.
        tables: which outbox (default ``txmq_outbox``).
        now_ms: the creation time, ms since the epoch (default: the wall clock).
        tracing: True (the global tracer provider), False, or a :class:`~txmq.tracing.Tracing`:
            the event carries the current trace context (its creation context: the relay's send
            and the consumers join the caller's trace), and the write is a ``put_message <topic>``
            span (docs/tracing.md, "Outbox and inbox").

    Returns:
        The event id (32 hex digits), which is also the sent message's id.

    Raises:
        OutboxError: bad arguments, or a connection in AUTOCOMMIT mode (the event would not be
            atomic with the business rows). Database errors are SQLAlchemy's, from the caller's
            transaction.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    kw: dict[str, Any] = {"event_type": event_type, "biz_key": biz_key, "app_id": app_id,
                          "tx_type": tx_type, "now_ms": now, "tracing": Tracing.of(tracing)}

    if isinstance(conn, sa.Connection | Session):
        return insert_event(_sync_connection(conn), tables, message, **kw)

    def put(sync: sa.Connection | Session) -> str:  # runs in the async facade's greenlet
        return insert_event(_sync_connection(sync), tables, message, **kw)

    return conn.run_sync(put)  # AsyncSession / AsyncConnection: a coroutine
