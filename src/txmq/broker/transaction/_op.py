"""Op records: what the broker writes to ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` when it settles half
messages, and the properties the console's trace and audit log read from them.

Each op record lists settled half queue offsets (``"<offset>,"`` tokens) for one outcome and one
decider. Besides RocketMQ's tag ``d`` it carries ``TXMQ_OUTCOME`` and ``TXMQ_DECIDED_BY``
(``producer``, ``check-back`` or ``operator``). An operator's decision (one transaction) also
carries ``TXMQ_OPERATOR``, ``TXMQ_REASON``, the transaction's message id ``TXMQ_TX_ID`` and real
topic ``TXMQ_TX_TOPIC``, and KEYS ``TXMQ_OPERATOR_DECISION <msg id>``: the broker's key index
then finds the audit log (newest first) and one transaction's decision without reading the op
topic.
"""

from __future__ import annotations

from txmq import limits
from txmq.broker.transaction._index import HalfEntry, Outcome
from txmq.protocol import (
    OP_TOPIC,
    OPERATOR_DECISION_KEY,
    PROPERTY_TXMQ_DECIDED_BY,
    PROPERTY_TXMQ_OPERATOR,
    PROPERTY_TXMQ_OUTCOME,
    PROPERTY_TXMQ_REASON,
    PROPERTY_TXMQ_TX_ID,
    PROPERTY_TXMQ_TX_TOPIC,
)
from txmq.store import Record

__all__ = ["REMOVE_TAG", "decided_by", "op_records"]

REMOVE_TAG = "d"
"""RocketMQ ``TransactionalMessageUtil.REMOVE_TAG``: the tag of op records."""


def decided_by(entry: HalfEntry, outcome: Outcome, operator: str, checked: frozenset[int]) -> str:
    """``TXMQ_DECIDED_BY`` of a settlement: ``operator`` when an operator decided, ``check-back``
    for a check-back's answer (``entry.half_offset`` in ``checked``) or a discard, else
    ``producer``."""
    if operator:
        return "operator"
    if entry.half_offset in checked or outcome is Outcome.DISCARD:
        return "check-back"
    return "producer"


def op_records(items: list[tuple[HalfEntry, Outcome]], now_ms: int, operator: str = "",
               reason: str = "", checked: frozenset[int] = frozenset()) -> list[Record]:
    """Op records settling ``items``: one per (outcome, decider), bodies of at most
    ``limits.TRANSACTION_OP_MSG_MAX_SIZE`` characters of offsets (RocketMQ 5.1 batches op
    messages the same way); ``checked``: half offsets decided by a check-back answer."""
    groups: dict[tuple[Outcome, str], list[HalfEntry]] = {}
    for entry, outcome in items:
        groups.setdefault((outcome, decided_by(entry, outcome, operator, checked)), []).append(entry)
    out: list[Record] = []
    for (outcome, by), entries in groups.items():
        props = {PROPERTY_TXMQ_OUTCOME: outcome.value, PROPERTY_TXMQ_DECIDED_BY: by}
        keys = ""
        if operator:
            props |= {PROPERTY_TXMQ_OPERATOR: operator, PROPERTY_TXMQ_REASON: reason}
            if len(entries) == 1:
                props |= {PROPERTY_TXMQ_TX_ID: entries[0].msg_id,
                          PROPERTY_TXMQ_TX_TOPIC: entries[0].real_topic}
            keys = " ".join([OPERATOR_DECISION_KEY, *(e.msg_id for e in entries if e.msg_id)])
        body: list[str] = []
        size = 0
        for i, entry in enumerate(entries):
            tok = f"{entry.half_offset},"
            body.append(tok)
            size += len(tok)
            if size >= limits.TRANSACTION_OP_MSG_MAX_SIZE or i == len(entries) - 1:
                out.append(Record(topic=OP_TOPIC, queue_id=0, body="".join(body).encode(),
                                  tags=REMOVE_TAG, keys=keys, properties=dict(props),
                                  born_timestamp_ms=now_ms, store_timestamp_ms=now_ms))
                body, size = [], 0
    return out
