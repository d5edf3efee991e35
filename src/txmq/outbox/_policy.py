"""The relay's and the inbox's decisions, without I/O: configuration, the produce-side state machine,
retry backoff, send batching and the give-up rule. Time comes in as ``now_ms``, randomness as a
``random.Random`` the caller seeds; nothing here touches a database, a socket or a clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from txmq import limits
from txmq.errors import ConfigError
from txmq.outbox._envelope import OutboxRow
from txmq.outbox._schema import EventStatus

__all__ = [
    "PRODUCE_TRANSITIONS",
    "ConsumeVerdict",
    "ProduceInput",
    "RelayConfig",
    "RoundResult",
    "after_handler_failure",
    "backoff_ms",
    "before_handler",
    "claimable",
    "idle_wait_ms",
    "next_status",
    "plan_batches",
]


@dataclass(frozen=True)
class RelayConfig:
    """How a relay polls and retries; every time in ms. Defaults from :mod:`txmq.limits`.

    Attributes:
        period_ms: idle pause between polls (shieldTXC ``tranMessageSendPeriod``).
        initial_delay_ms: wait before the first poll (``tranMessageSendInitialDelay``).
        pool_size: worker threads (``tranMessageSendCorePoolSize``).
        batch_size: events claimed per poll (shieldTXC reads 50).
        lease_ms: how long a claim lasts; then the event may be claimed again.
        backoff_base_ms, backoff_max_ms: retry delay after a failed send, doubling, capped.
        send_batch_bytes_max: payload bytes per broker batch request.
        stats_interval_ms: how often worker 0 refreshes the backlog gauges.
        retention_ms: if set, worker 0 purges processed rows older than this (see ``purge``).
    """

    period_ms: int = limits.OUTBOX_RELAY_PERIOD_MS
    initial_delay_ms: int = limits.OUTBOX_RELAY_INITIAL_DELAY_MS
    pool_size: int = limits.OUTBOX_RELAY_POOL_SIZE
    batch_size: int = limits.OUTBOX_RELAY_BATCH_SIZE
    lease_ms: int = limits.OUTBOX_LEASE_MS
    backoff_base_ms: int = limits.OUTBOX_RETRY_BACKOFF_BASE_MS
    backoff_max_ms: int = limits.OUTBOX_RETRY_BACKOFF_MAX_MS
    send_batch_bytes_max: int = limits.OUTBOX_SEND_BATCH_BYTES_MAX
    stats_interval_ms: int = limits.OUTBOX_STATS_INTERVAL_MS
    retention_ms: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= limits.OUTBOX_RELAY_BATCH_SIZE_MAX:
            raise ConfigError(f"batch_size {self.batch_size} not in 1..{limits.OUTBOX_RELAY_BATCH_SIZE_MAX}")
        if self.pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {self.pool_size}")
        for name in ("period_ms", "lease_ms", "backoff_base_ms", "send_batch_bytes_max", "stats_interval_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.initial_delay_ms < 0:
            raise ConfigError(f"initial_delay_ms must not be negative, got {self.initial_delay_ms}")
        if self.backoff_max_ms < self.backoff_base_ms:
            raise ConfigError("backoff_max_ms must not be below backoff_base_ms")
        if self.retention_ms is not None and self.retention_ms <= 0:
            raise ConfigError(f"retention_ms must be positive, got {self.retention_ms}")


class ProduceInput(Enum):
    """What happens to an outbox event on the produce side."""

    CLAIM = "claim"
    ACK = "ack"
    SEND_FAILED = "send_failed"
    LEASE_EXPIRED_CLAIM = "lease_expired_claim"


PRODUCE_TRANSITIONS: dict[EventStatus, dict[ProduceInput, EventStatus]] = {
    EventStatus.PRODUCE_INIT: {ProduceInput.CLAIM: EventStatus.PRODUCE_PROCESSING},
    EventStatus.PRODUCE_PROCESSING: {
        ProduceInput.ACK: EventStatus.PRODUCE_PROCESSED,
        ProduceInput.SEND_FAILED: EventStatus.PRODUCE_INIT,
        ProduceInput.LEASE_EXPIRED_CLAIM: EventStatus.PRODUCE_PROCESSING,
    },
    EventStatus.PRODUCE_PROCESSED: {},
}
"""The produce-side state machine. Rule: a row becomes PROCESSED only from PROCESSING and only on a
broker acknowledgement (shieldTXC defect 1); every other (state, input) pair is refused."""


def next_status(status: EventStatus, event: ProduceInput) -> EventStatus:
    """The state after ``event``. Raises ValueError for a transition the table does not allow."""
    try:
        return PRODUCE_TRANSITIONS[status][event]
    except KeyError:
        raise ValueError(f"no transition from {status} on {event.value}") from None


def claimable(status: str, next_attempt_at_ms: int, lease_expires_at_ms: int | None, now_ms: int) -> bool:
    """Whether a relay may claim the row at ``now_ms``: a due PRODUCE_INIT row, or a PRODUCE_PROCESSING
    row whose lease has expired. (The SQL in ``_claims`` says the same; tests check they agree.)"""
    if status == EventStatus.PRODUCE_INIT:
        return next_attempt_at_ms <= now_ms
    if status == EventStatus.PRODUCE_PROCESSING:
        return lease_expires_at_ms is not None and lease_expires_at_ms <= now_ms
    return False


def backoff_ms(attempts: int, config: RelayConfig, rng: random.Random) -> int:
    """Delay before the next try after ``attempts`` failed claims (``attempts >= 1``).

    ``base · 2^(attempts−1)`` capped at ``backoff_max_ms``, then scaled by a random factor in
    [0.5, 1] so that relays that failed together do not retry together.
    """
    assert attempts >= 1
    exp = min(attempts - 1, 40)
    delay = min(config.backoff_max_ms, config.backoff_base_ms * (1 << exp))
    return max(1, int(delay * (0.5 + rng.random() / 2)))


def plan_batches(rows: Iterable[OutboxRow], count_max: int, bytes_max: int) -> list[list[OutboxRow]]:
    """Group claimed rows by topic (first appearance order) and cut each group into broker batch
    requests of at most ``count_max`` rows and, except for a single larger row, ``bytes_max`` bytes."""
    by_topic: dict[str, list[OutboxRow]] = {}
    for r in rows:
        by_topic.setdefault(r.topic, []).append(r)
    out: list[list[OutboxRow]] = []
    for group in by_topic.values():
        cur: list[OutboxRow] = []
        size = 0
        for r in group:
            if cur and (len(cur) >= count_max or size + len(r.payload) > bytes_max):
                out.append(cur)
                cur, size = [], 0
            cur.append(r)
            size += len(r.payload)
        if cur:
            out.append(cur)
    return out


def idle_wait_ms(claimed: int, config: RelayConfig) -> int:
    """How long a worker waits before its next poll: not at all after a full batch (there is
    probably more), else the period."""
    return 0 if claimed >= config.batch_size else config.period_ms


@dataclass(frozen=True)
class RoundResult:
    """What one relay round did: events claimed, sent (and marked PROCESSED), failed (back to
    PRODUCE_INIT with backoff), and stale (finished by a claim that had lost its lease: 0 rows)."""

    claimed: int = 0
    sent: int = 0
    failed: int = 0
    stale: int = 0


class ConsumeVerdict(Enum):
    """What the inbox wrapper does with a delivery."""

    RUN_HANDLER = "run_handler"
    EMIT_ROLLBACK = "emit_rollback"
    RECONSUME_LATER = "reconsume_later"


def before_handler(reconsume_times: int, max_reconsume_times: int | None) -> ConsumeVerdict:
    """Before running the handler: a delivery that already had ``max_reconsume_times`` failed
    predecessors is not handled again; the rollback is emitted (``None``: never give up)."""
    if max_reconsume_times is not None and reconsume_times >= max_reconsume_times:
        return ConsumeVerdict.EMIT_ROLLBACK
    return ConsumeVerdict.RUN_HANDLER


def after_handler_failure(reconsume_times: int, max_reconsume_times: int | None) -> ConsumeVerdict:
    """After the handler failed on a delivery with ``reconsume_times`` earlier failures: give up when
    this was the ``max_reconsume_times``-th attempt, else ask for redelivery."""
    if max_reconsume_times is not None and reconsume_times + 1 >= max_reconsume_times:
        return ConsumeVerdict.EMIT_ROLLBACK
    return ConsumeVerdict.RECONSUME_LATER
