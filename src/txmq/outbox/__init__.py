"""The local message table (transactional outbox and inbox) on SQLAlchemy Core: the shieldTXC model.

Upstream, :func:`put_message` writes an event row in the caller's own local transaction; a
:class:`Relay` claims events (lease + fencing token), sends them and marks them sent only after the
broker acknowledged them. Downstream, a :class:`CommitListener` records an inbox row in the same
transaction as the handler's side effect, so a redelivered event is acknowledged without repeating
it; when an event keeps failing it writes a ROLLBACK event, which the downstream's relay ships to the
rollback topic, where the upstream's :class:`RollbackListener` runs the compensation. Works on
SQLite, PostgreSQL and MariaDB/MySQL (any SQLAlchemy engine).

Example (upstream)::

    from txmq.client import Message, Producer
    from txmq import outbox

    engine = outbox.create_sqlite_engine("orders.db")
    outbox.init_db(engine)
    with engine.begin() as conn:                      # the business transaction
        conn.execute(orders.insert().values(id=42, total=100))
        outbox.put_message(conn, Message(topic="orders", body=b'{"id": 42}'),
                           event_type="ORDER_CREATED", biz_key="42", app_id="order-service")
    with Producer("order-service", "127.0.0.1:10911") as producer, outbox.Relay(engine, producer):
        ...                                           # the relay sends in background threads

See docs/outbox.md for the downstream and rollback sides.
"""

from txmq.extras import require_extra as _require_extra

_require_extra("outbox", "txmq.outbox", "sqlalchemy", "alembic")

from txmq.outbox._aio import AsyncCommitListener, AsyncHandler, AsyncRelay, AsyncRollbackListener, AsyncSender
from txmq.outbox._aio_transport import (
    AsyncSubscription,
    AsyncTransport,
    AsyncTxmqTransport,
    open_async_transport,
)
from txmq.outbox._envelope import (
    PROPERTY_OUTBOX_APP_ID,
    PROPERTY_OUTBOX_BIZ_KEY,
    PROPERTY_OUTBOX_CREATED_MS,
    PROPERTY_OUTBOX_EVENT_ID,
    PROPERTY_OUTBOX_EVENT_TYPE,
    PROPERTY_OUTBOX_ORIGIN_EVENT_ID,
    PROPERTY_OUTBOX_TX_TYPE,
    InboxEvent,
    decode_event,
    default_rollback_topic,
)
from txmq.outbox._inbox import CommitListener, Handler, RejectEvent, RollbackListener
from txmq.outbox._metrics import OutboxMetrics, default_metrics
from txmq.outbox._open import TxmqTransport, open_transport
from txmq.outbox._ops import (
    Backlog,
    OutboxStatus,
    PurgeResult,
    backlog,
    create_sqlite_engine,
    outbox_status,
    purge,
)
from txmq.outbox._policy import RelayConfig, RoundResult
from txmq.outbox._put import put_message
from txmq.outbox._relay import Relay, Sender
from txmq.outbox._schema import (
    DEFAULT_PREFIX,
    DEFAULT_TABLES,
    EventStatus,
    OutboxTables,
    TxType,
    drop_tables,
    init_db,
    make_tables,
)
from txmq.outbox._transport import (
    PROPERTY_DLQ_REASON,
    Listener,
    NotAnEnvelope,
    Subscription,
    Transport,
    parse_transport_url,
)

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_TABLES",
    "PROPERTY_DLQ_REASON",
    "PROPERTY_OUTBOX_APP_ID",
    "PROPERTY_OUTBOX_BIZ_KEY",
    "PROPERTY_OUTBOX_CREATED_MS",
    "PROPERTY_OUTBOX_EVENT_ID",
    "PROPERTY_OUTBOX_EVENT_TYPE",
    "PROPERTY_OUTBOX_ORIGIN_EVENT_ID",
    "PROPERTY_OUTBOX_TX_TYPE",
    "AsyncCommitListener",
    "AsyncHandler",
    "AsyncRelay",
    "AsyncRollbackListener",
    "AsyncSender",
    "AsyncSubscription",
    "AsyncTransport",
    "AsyncTxmqTransport",
    "Backlog",
    "CommitListener",
    "EventStatus",
    "Handler",
    "InboxEvent",
    "Listener",
    "NotAnEnvelope",
    "OutboxMetrics",
    "OutboxStatus",
    "OutboxTables",
    "PurgeResult",
    "RejectEvent",
    "Relay",
    "RelayConfig",
    "RollbackListener",
    "RoundResult",
    "Sender",
    "Subscription",
    "Transport",
    "TxType",
    "TxmqTransport",
    "backlog",
    "create_sqlite_engine",
    "decode_event",
    "default_metrics",
    "default_rollback_topic",
    "drop_tables",
    "init_db",
    "make_tables",
    "open_async_transport",
    "open_transport",
    "outbox_status",
    "parse_transport_url",
    "purge",
    "put_message",
]
