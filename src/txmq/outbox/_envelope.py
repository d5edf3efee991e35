"""How an outbox event travels as a broker message, and how a consumer reads it back. Pure: no I/O.

The message body is the event's payload, unchanged, so consumers that do not know the outbox (a
Spark job reading the topic) still see the business payload. The event's identity travels in
properties (names in RocketMQ's upper-case style), and the event id is also the message's
``UNIQ_KEY``, so every resend of one event carries the same message id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from txmq.outbox._schema import TxType
from txmq.protocol import PROPERTY_UNIQ_KEY, SYSTEM_PROPERTIES, Message, MessageExt

__all__ = [
    "OUTBOX_PROPERTIES",
    "PROPERTY_OUTBOX_APP_ID",
    "PROPERTY_OUTBOX_BIZ_KEY",
    "PROPERTY_OUTBOX_CREATED_MS",
    "PROPERTY_OUTBOX_EVENT_ID",
    "PROPERTY_OUTBOX_EVENT_TYPE",
    "PROPERTY_OUTBOX_ORIGIN_EVENT_ID",
    "PROPERTY_OUTBOX_TX_TYPE",
    "InboxEvent",
    "OutboxRow",
    "decode_event",
    "default_rollback_topic",
    "to_message",
    "user_properties",
]

PROPERTY_OUTBOX_EVENT_ID = "TXMQ_OUTBOX_EVENT_ID"
PROPERTY_OUTBOX_APP_ID = "TXMQ_OUTBOX_APP_ID"
PROPERTY_OUTBOX_BIZ_KEY = "TXMQ_OUTBOX_BIZ_KEY"
PROPERTY_OUTBOX_EVENT_TYPE = "TXMQ_OUTBOX_EVENT_TYPE"
PROPERTY_OUTBOX_TX_TYPE = "TXMQ_OUTBOX_TX_TYPE"
PROPERTY_OUTBOX_ORIGIN_EVENT_ID = "TXMQ_OUTBOX_ORIGIN_EVENT_ID"
"""On a ROLLBACK event: the event id of the COMMIT event it undoes."""
PROPERTY_OUTBOX_CREATED_MS = "TXMQ_OUTBOX_CREATED_MS"
"""When ``put_message`` wrote the event (ms since the epoch), for end-to-end lag."""

OUTBOX_PROPERTIES = frozenset({
    PROPERTY_OUTBOX_EVENT_ID, PROPERTY_OUTBOX_APP_ID, PROPERTY_OUTBOX_BIZ_KEY, PROPERTY_OUTBOX_EVENT_TYPE,
    PROPERTY_OUTBOX_TX_TYPE, PROPERTY_OUTBOX_ORIGIN_EVENT_ID, PROPERTY_OUTBOX_CREATED_MS,
})
"""Properties the relay sets; user properties of these names are overwritten."""


def default_rollback_topic(topic: str) -> str:
    """Where ROLLBACK events for commit events of ``topic`` go: ``<topic>-rollback``.

    (shieldTXC derives ``SHIELD_TXC_ROLLBACK_<topicSource>`` from one configured source the same way.)
    """
    return f"{topic}-rollback"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A claimed outbox event, as the relay needs it (a projection of the ``outbox`` table).

    ``fencing_token`` is the value this claim set; only an update carrying it may finish the row.
    """

    id: int
    event_id: str
    fencing_token: int
    attempts: int
    app_id: str
    biz_key: str
    event_type: str
    tx_type: str
    topic: str
    tags: str
    keys: str
    properties: dict[str, str]
    payload: bytes
    origin_event_id: str | None
    created_at_ms: int

    @classmethod
    def from_db(cls, r: Any) -> OutboxRow:
        """From a result row with the ``outbox`` table's column names."""
        return cls(id=int(r.id), event_id=r.event_id, fencing_token=int(r.fencing_token),
                   attempts=int(r.attempts), app_id=r.app_id, biz_key=r.biz_key,
                   event_type=r.event_type, tx_type=r.tx_type, topic=r.topic, tags=r.msg_tags,
                   keys=r.msg_keys, properties=json.loads(r.properties or "{}"),
                   payload=bytes(r.payload), origin_event_id=r.origin_event_id,
                   created_at_ms=int(r.created_at_ms))


def to_message(row: OutboxRow) -> Message:
    """The broker message for ``row``: body = payload, tags = the row's tags or its event type,
    keys = the row's keys or its biz key, ``UNIQ_KEY`` = event id, plus the outbox properties."""
    props = {k: v for k, v in row.properties.items() if k not in SYSTEM_PROPERTIES}
    props.update({
        PROPERTY_UNIQ_KEY: row.event_id,
        PROPERTY_OUTBOX_EVENT_ID: row.event_id,
        PROPERTY_OUTBOX_APP_ID: row.app_id,
        PROPERTY_OUTBOX_BIZ_KEY: row.biz_key,
        PROPERTY_OUTBOX_EVENT_TYPE: row.event_type,
        PROPERTY_OUTBOX_TX_TYPE: row.tx_type,
        PROPERTY_OUTBOX_CREATED_MS: str(row.created_at_ms),
    })
    if row.origin_event_id:
        props[PROPERTY_OUTBOX_ORIGIN_EVENT_ID] = row.origin_event_id
    return Message(topic=row.topic, body=row.payload, tags=row.tags or row.event_type,
                   keys=row.keys or row.biz_key, properties=props)


def user_properties(props: dict[str, str]) -> dict[str, str]:
    """``props`` without system and outbox properties (what a rollback event copies)."""
    return {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES and k not in OUTBOX_PROPERTIES}


@dataclass(frozen=True, slots=True)
class InboxEvent:
    """An event as a consumer's handler sees it.

    Attributes:
        event_id: the event's global id (for a message not sent by a relay: its message id).
        app_id, biz_key, event_type, tx_type: as given to ``put_message``.
        payload: the message body.
        topic: the topic it was consumed from (retry topics already mapped back).
        origin_event_id: for a ROLLBACK event, the COMMIT event it undoes; else None.
        reconsume_times: earlier failed deliveries of this message.
        message: the delivered message itself.
    """

    event_id: str
    app_id: str
    biz_key: str
    event_type: str
    tx_type: TxType
    payload: bytes
    topic: str
    origin_event_id: str | None
    reconsume_times: int
    message: MessageExt


def decode_event(msg: MessageExt, default_app_id: str = "") -> InboxEvent:
    """Read the outbox properties of ``msg``.

    A message that was not sent by a relay (a plain or transactional send) is still accepted: its
    event id is its message id, its app id ``default_app_id``, its biz key its first key (or the
    message id), its event type its tag, its tx type COMMIT.
    """
    p = msg.properties
    event_id = p.get(PROPERTY_OUTBOX_EVENT_ID) or msg.msg_id
    keys = msg.keys.split()
    tx = p.get(PROPERTY_OUTBOX_TX_TYPE, TxType.COMMIT)
    return InboxEvent(
        event_id=event_id,
        app_id=p.get(PROPERTY_OUTBOX_APP_ID, default_app_id),
        biz_key=p.get(PROPERTY_OUTBOX_BIZ_KEY) or (keys[0] if keys else event_id),
        event_type=p.get(PROPERTY_OUTBOX_EVENT_TYPE) or msg.tags or "",
        tx_type=TxType(tx) if tx in TxType.__members__ else TxType.COMMIT,
        payload=msg.body, topic=msg.topic,
        origin_event_id=p.get(PROPERTY_OUTBOX_ORIGIN_EVENT_ID),
        reconsume_times=msg.reconsume_times, message=msg,
    )
