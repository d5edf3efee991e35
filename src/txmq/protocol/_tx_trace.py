"""A transaction's life as the broker recorded it, and the W3C trace context it belongs to.

The broker records, per half message, when and from whom it was stored, each check-back it sent
(to which producer, the how-manieth) and how it was answered (the answer, by whom, after how long),
and the end (outcome, decided by the producer, a check-back or an operator, by whom);
``GET_TRANSACTION_TRACE`` (txmq, :class:`TransactionTraceRequestHeader`) reads it back as a JSON
list of :class:`TransactionLife` (docs/tracing.md, "The broker's leg").

A producer that traces puts the W3C Trace Context headers in the message's properties under their
own names, ``traceparent`` and ``tracestate`` (W3C Trace Context, Level 1, §3.2 and §3.3); the
broker keeps them with the life, so the console can show and filter by the trace id, and the
broker's OTLP spans join that trace.
"""

from __future__ import annotations

import msgspec

from txmq.protocol._headers import JLong

__all__ = [
    "PROPERTY_TRACEPARENT",
    "PROPERTY_TRACESTATE",
    "TransactionLife",
    "TransactionStep",
    "TransactionTraceRequestHeader",
    "trace_id_of",
]

PROPERTY_TRACEPARENT = "traceparent"
"""The W3C ``traceparent`` header as a message property: ``00-<trace id>-<parent id>-<flags>``."""
PROPERTY_TRACESTATE = "tracestate"
"""The W3C ``tracestate`` header as a message property (vendor key=value list)."""

_HEX = frozenset("0123456789abcdef")
_TRACEPARENT_LEN = 55
"""``2 + 1 + 32 + 1 + 16 + 1 + 2`` characters (W3C Trace Context §3.2.2, version 00)."""


def trace_id_of(traceparent: str) -> str:
    """The trace id (32 lowercase hex digits) of a W3C ``traceparent`` value, or "" when it is not
    one: version (not ``ff``), trace id (not all zeros), parent id (not all zeros) and flags in
    lowercase hex, separated by ``-`` (W3C Trace Context §3.2.2; a later version may append
    ``-`` and more fields, version 00 may not)."""
    tp = traceparent[:_TRACEPARENT_LEN + 1]
    if len(tp) < _TRACEPARENT_LEN or tp[2] != "-" or tp[35] != "-" or tp[52] != "-":
        return ""
    version, trace_id, parent_id, flags = tp[:2], tp[3:35], tp[36:52], tp[53:55]
    if not _HEX.issuperset(version + trace_id + parent_id + flags) or version == "ff":
        return ""
    if len(tp) > _TRACEPARENT_LEN and (version == "00" or tp[55] != "-"):
        return ""
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return ""
    return trace_id


class TransactionTraceRequestHeader(msgspec.Struct, kw_only=True, rename="camel"):
    """GET_TRANSACTION_TRACE (txmq): the recorded lives of the transaction ``id`` names (a message
    id, ``UNIQ_KEY``, or ``half:<half queue offset>``), or of every transaction whose
    ``traceparent`` carries ``trace_id`` (32 hex digits); newest first, at most ``limit`` (the
    broker caps it at ``limits.TRANSACTION_TRACE_QUERY_MAX``). Exactly one of ``id`` and
    ``trace_id`` is given."""

    id: str = ""
    trace_id: str = ""
    limit: JLong = 16


class TransactionStep(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True, gc=False):
    """One step of a transaction's life after its half was stored.

    ``kind``:

    - ``check-back``: CHECK_TRANSACTION_STATE sent at ``time_ms``, the ``check_count``-th, to the
      producer ``client_id`` at ``address`` (its connection's remote ``ip:port``);
    - ``answer``: an end request that did not settle by itself, or answered a check-back:
      ``answer`` COMMIT, ROLLBACK or UNKNOWN, sent by ``client_id`` at ``address``; for a
      check-back's answer ``check_count`` and ``sent_ms`` name the check-back (the answer took
      ``time_ms - sent_ms``); ``check_count`` 0: the producer's own end request (UNKNOWN);
    - ``end``: the transaction was settled: ``outcome`` COMMIT, ROLLBACK or DISCARD, ``decided_by``
      ``producer``, ``check-back`` or ``operator`` (as the op record's ``TXMQ_DECIDED_BY``; a
      discard after ``transactionCheckMax`` check-backs is ``check-back`` with its ``reason``), by
      ``client_id`` at ``address`` (the connection whose request settled it) or ``operator``.
    """

    kind: str
    time_ms: int
    check_count: int = 0
    client_id: str = ""
    address: str = ""
    answer: str = ""
    sent_ms: int = 0
    outcome: str = ""
    decided_by: str = ""
    operator: str = ""
    reason: str = ""


class TransactionLife(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True, gc=False):
    """A transaction's life as the broker recorded it: its half message (queue offset in
    ``RMQ_SYS_TRANS_HALF_TOPIC``, commit log offset, message id, real topic, producer group, the
    sending client's id and address, born and stored times in ms, and the W3C trace context it
    came with) and its :class:`TransactionStep` s in order. ``stored_ms`` 0: the half was stored
    before the broker's last start (the life began at its first check-back since)."""

    half_offset: int
    commit_log_offset: int
    msg_id: str = ""
    topic: str = ""
    producer_group: str = ""
    client_id: str = ""
    address: str = ""
    born_ms: int = 0
    stored_ms: int = 0
    traceparent: str = ""
    tracestate: str = ""
    steps: list[TransactionStep] = msgspec.field(default_factory=list)
