"""Pydantic models of the console's JSON API: request bodies and answers (the OpenAPI schema).

Times are ms since the epoch (``*_ms``), ages and durations ms, sizes bytes, rates per second.
The :class:`~txmq.console.Backend` returns these models; pages render them and the API serialises
them as they are.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "AuditEntry",
    "AuditPage",
    "BrokerInfo",
    "ConsumerMember",
    "DlqMessage",
    "DlqPage",
    "DlqSummary",
    "EndTransactionBody",
    "EndTransactionResult",
    "GroupDetail",
    "GroupQueue",
    "GroupSummary",
    "History",
    "LagHistory",
    "MessageDetail",
    "MessageList",
    "MessageSummary",
    "MessageTrace",
    "OutboxInbox",
    "OutboxLease",
    "OutboxStatus",
    "OutboxSummary",
    "Overview",
    "ParkedPage",
    "ParkedTransaction",
    "PendingPage",
    "PendingTransaction",
    "ReplicaMember",
    "ResendBody",
    "ResendPage",
    "ResendResultModel",
    "ResetOffsetBody",
    "ResetOffsetResult",
    "ResetQueue",
    "ResumeResult",
    "Subscription",
    "TopicCreateBody",
    "TopicDeleted",
    "TopicDetail",
    "TopicQueue",
    "TopicQueues",
    "TopicSummary",
    "TopicUpdateBody",
    "TraceEvent",
]


class History(BaseModel):
    """Samples of the History sampler, oldest first, as parallel lists."""

    t_ms: list[int] = Field(default_factory=list)
    in_per_s: list[float] = Field(default_factory=list)
    out_per_s: list[float] = Field(default_factory=list)
    half_backlog: list[int] = Field(default_factory=list)


class BrokerInfo(BaseModel):
    """One broker: its name, address, version, store size (bytes), disk used ratio (0..1)."""

    name: str
    addr: str
    version: str
    store_bytes: int
    disk_ratio: float
    commitlog_max_offset: int
    uptime_ms: int


class Overview(BaseModel):
    """GET /api/overview: brokers, current rates (messages/s, the History's newest point; 0
    before two samples), backlogs and their history. ``half_backlog``: pending transactions;
    ``discarded``: transactions discarded after transactionCheckMax and not resumed (listed by
    GET /api/transactions/parked); ``parked``: messages the brokers' schedulers parked
    (``TXMQ_SYS_PARKED_TOPIC``)."""

    brokers: list[BrokerInfo]
    in_per_s: float
    out_per_s: float
    half_backlog: int
    discarded: int
    parked: int
    history: History
    replication: list[ReplicaMember] = Field(default_factory=list)
    """Each broker group's members as its brokers see them (GET_BROKER_HA_STATUS)."""


class ReplicaMember(BaseModel):
    """A member of a broker group, as broker ``seen_by`` reports it: its role and id, address,
    commit log offset (its end, or what a slave acknowledged), and how far it lags its master
    in bytes and seconds (None: unknown, a slave's master); ``in_sync``: a slave within
    ``ha_max_gap_not_in_sync``, or a slave's link to its master is up."""

    group: str
    seen_by: str
    member: str
    role: str
    broker_id: int
    address: str
    offset: int | None
    lag_bytes: int | None
    lag_s: float | None
    in_sync: bool


class TopicSummary(BaseModel):
    """One topic, its offsets summed over its queues; ``messages`` = max - min."""

    topic: str
    queues: int
    perm: int
    min_offset: int
    max_offset: int
    messages: int


class TopicQueue(BaseModel):
    """One queue of a topic: its offsets and the newest message's store time."""

    queue_id: int
    min_offset: int
    max_offset: int
    last_update_ms: int
    broker: str = ""


class TopicDetail(BaseModel):
    """GET /api/topics/{topic}: its queues and its route (brokers and queue datas)."""

    topic: str
    queues: list[TopicQueue]
    route: dict[str, Any]


class TopicCreateBody(BaseModel):
    """POST /api/topics."""

    topic: str
    queues: int = 4


class TopicUpdateBody(BaseModel):
    """PUT /api/topics/{topic}: the new queue count (queues are only added)."""

    queues: int


class TopicQueues(BaseModel):
    """A topic and its queue count after a create or update."""

    topic: str
    queues: int


class TopicDeleted(BaseModel):
    """DELETE /api/topics/{topic}."""

    topic: str
    deleted: bool
    detail: str = ""


class GroupSummary(BaseModel):
    """One consumer group: model (CLUSTERING/BROADCASTING/""), online members, topics, lag
    (messages not yet consumed) and in-flight messages (pulled, not yet acknowledged)."""

    group: str
    model: str
    members: int
    subscriptions: list[str]
    lag: int
    inflight: int


class ConsumerMember(BaseModel):
    """One online consumer of a group."""

    client_id: str
    addr: str
    language: str
    version: str


class Subscription(BaseModel):
    """A topic a group subscribes to and its tag expression."""

    topic: str
    expression: str


class GroupQueue(BaseModel):
    """Per queue of a group: broker (max) offset, consumer offset, lag."""

    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int
    broker: str = ""


class LagHistory(BaseModel):
    """A group's lag samples, oldest first."""

    t_ms: list[int] = Field(default_factory=list)
    lag: list[int] = Field(default_factory=list)


class GroupDetail(BaseModel):
    """GET /api/groups/{group}."""

    group: str
    model: str
    members: list[ConsumerMember]
    subscriptions: list[Subscription]
    queues: list[GroupQueue]
    lag: int
    lag_history: LagHistory


class ResetOffsetBody(BaseModel):
    """POST /api/groups/{group}/reset-offset: move to the first message stored at or after
    ``timestamp_ms``."""

    topic: str
    timestamp_ms: int


class ResetQueue(BaseModel):
    """A queue's new consumer offset."""

    queue_id: int
    offset: int


class ResetOffsetResult(BaseModel):
    """The answer of a reset."""

    group: str
    topic: str
    queues: list[ResetQueue]


class PendingTransaction(BaseModel):
    """One unsettled half message; ``id`` is its message id (UNIQ_KEY)."""

    id: str
    half_offset: int
    topic: str
    producer_group: str
    keys: str
    age_ms: int
    check_count: int
    born_host: str


class PendingPage(BaseModel):
    """GET /api/transactions: pending in all and a page of them, oldest first."""

    pending_total: int
    items: list[PendingTransaction]


class ParkedTransaction(BaseModel):
    """A half message discarded after transactionCheckMax check-backs (or another parked one)."""

    id: str
    topic: str
    producer_group: str
    keys: str
    check_count: int
    parked_at_ms: int
    reason: str


class ParkedPage(BaseModel):
    """GET /api/transactions/parked."""

    total: int
    items: list[ParkedTransaction]


class ResumeResult(BaseModel):
    """POST /api/transactions/{id}/resume: its new half offset."""

    id: str
    half_offset: int


class EndTransactionBody(BaseModel):
    """POST /api/transactions/{id}/commit|rollback; ``operator`` must not be empty."""

    operator: str = ""
    reason: str = ""


class EndTransactionResult(BaseModel):
    """The operator's decision as recorded."""

    id: str
    outcome: Literal["COMMIT", "ROLLBACK"]
    operator: str
    reason: str


class AuditEntry(BaseModel):
    """One operator decision (an op message carrying the operator)."""

    time_ms: int
    id: str
    topic: str
    outcome: str
    operator: str
    reason: str


class AuditPage(BaseModel):
    """GET /api/transactions/audit: newest first."""

    items: list[AuditEntry]


class DlqSummary(BaseModel):
    """One group's dead-letter queue ``%DLQ%<group>`` and its message count."""

    group: str
    topic: str
    messages: int


class DlqMessage(BaseModel):
    """A message summary (DLQ page rows and search results); ``body_preview``: the first
    characters of the body as text."""

    msg_id: str
    topic: str
    keys: str
    tags: str
    reconsume_times: int
    born_ms: int
    stored_ms: int
    body_preview: str
    origin_topic: str


MessageSummary = DlqMessage


class DlqPage(BaseModel):
    """GET /api/dlq/{group}: a page of its messages (oldest first)."""

    group: str
    total: int
    items: list[DlqMessage]


class MessageDetail(BaseModel):
    """A whole message: ``body`` is text when ``body_encoding`` is ``utf-8``, else base64."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    keys: str
    tags: str
    reconsume_times: int
    born_ms: int
    stored_ms: int
    born_host: str
    store_host: str
    properties: dict[str, str]
    body: str
    body_encoding: Literal["utf-8", "base64"]
    body_bytes: int


class ResendBody(BaseModel):
    """POST /api/dlq/{group}/resend: ids to resend; empty resends every message."""

    msg_ids: list[str] = Field(default_factory=list)


class ResendResultModel(BaseModel):
    """One message of a resend: ``ok``, the error when not, and the resent copy's id."""

    msg_id: str
    ok: bool
    error: str
    new_msg_id: str


class ResendPage(BaseModel):
    """The answer of a resend, one result per id asked."""

    results: list[ResendResultModel]


class MessageList(BaseModel):
    """GET /api/messages."""

    items: list[MessageSummary]


class TraceEvent(BaseModel):
    """One step of a message's life.

    ``kind``: half, answer, check-back, commit, rollback, stored, delivered, retry or dlq;
    ``by``: producer, check-back or operator for commit/rollback (producer for an answer), else
    ""; ``group``: the consumer group of delivered/retry/dlq; ``client``: the producer's client id
    and address a check-back went to, that answered UNKNOWN, or whose request decided (from the
    broker's record of the transaction's life, while it has it: docs/tracing.md). ``time_ms`` is
    0 when the broker does not record it (``delivered``: the group's consumer offset is past the
    message, or ``detail`` starts with "not yet").
    """

    kind: Literal["half", "answer", "check-back", "commit", "rollback", "stored", "delivered",
                  "retry", "dlq"]
    time_ms: int
    group: str = ""
    by: str = ""
    operator: str = ""
    reason: str = ""
    detail: str = ""
    client: str = ""


class MessageTrace(BaseModel):
    """GET /api/messages/{msg_id}: the message (the stored copy in its real topic, else its half
    or first copy) and its trace: half, answers and check-backs, decision, stored, then per
    consumer group delivery, retries and dead letter; and its W3C trace id."""

    message: MessageDetail
    trace: list[TraceEvent]
    trace_id: str = ""
    """The W3C trace id of the message's ``traceparent`` property ("" when it has none)."""


class OutboxStatus(BaseModel):
    """Rows of the outbox table in one status and the oldest one's age."""

    status: str
    rows: int
    oldest_age_ms: int


class OutboxLease(BaseModel):
    """A relay's lease on rows."""

    relay: str
    until_ms: int
    rows: int


class OutboxInbox(BaseModel):
    """The inbox (dedup) table: rows and duplicates refused."""

    rows: int
    duplicates: int


class OutboxSummary(BaseModel):
    """GET /api/outbox."""

    statuses: list[OutboxStatus]
    leases: list[OutboxLease]
    inbox: OutboxInbox
