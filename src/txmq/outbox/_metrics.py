"""Prometheus metrics of relays and inbox listeners (prometheus-client).

One :class:`OutboxMetrics` can serve any number of relays and listeners in a process: every series
is labelled with the outbox table it belongs to. :func:`default_metrics` registers one set in
prometheus-client's default registry (what ``start_http_server`` exposes); tests pass their own
``CollectorRegistry``.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["OutboxMetrics", "default_metrics"]

_LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class OutboxMetrics:
    """The metric families. Label ``table`` is the outbox (or inbox) table name.

    Attributes:
        backlog: ``txmq_outbox_backlog_events{table,status}``: unsent events by status.
        oldest_age: ``txmq_outbox_oldest_unsent_age_seconds{table}``: age of the oldest unsent event.
        relay_lag: ``txmq_outbox_relay_lag_seconds{table}``: event creation to broker acknowledgement.
        claimed, sent, send_failures: ``txmq_outbox_events_{claimed,sent}_total``,
            ``txmq_outbox_send_failures_total``.
        stale_finishes: ``txmq_outbox_stale_finishes_total``: a finishing update matched 0 rows because
            the claim had lost its lease (the event may be sent twice; the inbox absorbs it).
        relay_errors: ``txmq_outbox_relay_errors_total``: relay rounds that failed on the database.
        consumed, duplicates_skipped, handler_failures, rollbacks_emitted:
            ``txmq_inbox_events_consumed_total``, ``txmq_inbox_duplicates_skipped_total``,
            ``txmq_inbox_handler_failures_total``, ``txmq_inbox_rollbacks_emitted_total``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        t = ["table"]
        self.registry = r
        self.backlog = Gauge("txmq_outbox_backlog_events", "Unsent outbox events by status",
                             ["table", "status"], registry=r)
        self.oldest_age = Gauge("txmq_outbox_oldest_unsent_age_seconds",
                                "Age of the oldest unsent outbox event", t, registry=r)
        self.relay_lag = Histogram("txmq_outbox_relay_lag_seconds",
                                   "Outbox event creation to broker acknowledgement", t,
                                   buckets=_LAG_BUCKETS_S, registry=r)
        self.claimed = Counter("txmq_outbox_events_claimed", "Outbox events claimed", t, registry=r)
        self.sent = Counter("txmq_outbox_events_sent", "Outbox events acknowledged and marked", t,
                            registry=r)
        self.send_failures = Counter("txmq_outbox_send_failures", "Outbox events whose send failed", t,
                                     registry=r)
        self.stale_finishes = Counter("txmq_outbox_stale_finishes",
                                      "Finishing updates that matched no row (lease lost)", t, registry=r)
        self.relay_errors = Counter("txmq_outbox_relay_errors", "Relay rounds failed on the database", t,
                                    registry=r)
        self.consumed = Counter("txmq_inbox_events_consumed", "Events handled and committed", t,
                                registry=r)
        self.duplicates_skipped = Counter("txmq_inbox_duplicates_skipped",
                                          "Redelivered events acknowledged without running the handler",
                                          t, registry=r)
        self.handler_failures = Counter("txmq_inbox_handler_failures", "Handler calls that failed", t,
                                        registry=r)
        self.rollbacks_emitted = Counter("txmq_inbox_rollbacks_emitted",
                                         "ROLLBACK events written after the last allowed attempt", t,
                                         registry=r)


_default: OutboxMetrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> OutboxMetrics:
    """The process-wide metrics, registered in ``prometheus_client.REGISTRY`` on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = OutboxMetrics(REGISTRY)
        return _default
