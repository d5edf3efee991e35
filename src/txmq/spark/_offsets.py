"""Offsets of the ``txmq`` Spark source: JSON forms, start/end specs and micro-batch arithmetic.

Pure functions on ``{(topic, broker_name, queue_id): offset}`` maps, used on the driver (see
:mod:`txmq.spark._source` for the options and guarantees they implement).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows

from txmq.errors import ConfigError, DataLossError

__all__ = [
    "EARLIEST",
    "LATEST",
    "DataLossError",
    "OffsetSpec",
    "QueueKey",
    "advance_offsets",
    "apply_read_limit",
    "check_start",
    "fair_shares",
    "key_name",
    "normalize_brokers",
    "offsets_from_json",
    "offsets_to_json",
    "parse_offset_spec",
    "parse_queue_key",
    "range_start",
    "with_timestamps",
]

_log = logging.getLogger("txmq.spark._source")

QueueKey = tuple[str, str, int]
"""(topic, broker_name, queue_id): one message queue of one broker group. ``broker_name`` is ""
for a queue named without a broker (offsets of the one-broker format; :func:`normalize_brokers`
gives them the topic's only broker group), and for a client that does not name broker groups."""

_K = TypeVar("_K")
_V = TypeVar("_V")

EARLIEST = -2
"""Offset sentinel in ``startingOffsets``/``endingOffsets`` JSON: the queue's ``min_offset``."""
LATEST = -1
"""Offset sentinel in ``startingOffsets``/``endingOffsets`` JSON: the queue's ``max_offset``."""


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end in every queue.

    Attributes:
        default: :data:`EARLIEST`, :data:`LATEST` or an offset, for queues not in ``explicit``.
        explicit: per-queue offsets (or sentinels) from a JSON map.
        default_ms: a timestamp (ms since the epoch) for every queue (``startingTimestamp`` /
            ``endingTimestamp``); when set it overrides everything else.
        explicit_ms: per-queue timestamps (``startingOffsetsByTimestamp``); they override
            ``default``/``explicit`` for their queues.

    A queue resolved by a timestamp ``t`` gets the first offset whose store timestamp is ``>= t``
    (the broker's SEARCH_OFFSET_BY_TIMESTAMP), or the queue's ``max_offset`` when every message
    is older, as Kafka's ``startingTimestamp`` (but no error for such a queue: it reads nothing).
    """

    default: int
    explicit: Mapping[QueueKey, int] = field(default_factory=dict)
    default_ms: int | None = None
    explicit_ms: Mapping[QueueKey, int] = field(default_factory=dict)

    def by_time(self, keys: Iterable[QueueKey]) -> dict[QueueKey, int]:
        """``{queue: timestamp_ms}`` of the queues among ``keys`` that are resolved by time.
        Raises ConfigError as :func:`normalize_brokers`."""
        wanted = set(keys)
        if self.default_ms is not None:
            return dict.fromkeys(sorted(wanted), self.default_ms)
        explicit_ms = normalize_brokers(self.explicit_ms, wanted)
        return {k: t for k, t in sorted(explicit_ms.items()) if k in wanted}

    def uses_latest(self) -> bool:
        """Whether some queue may resolve to ``latest`` (a start that moves as messages arrive)."""
        if self.default_ms is not None:
            return False
        explicit = [v for k, v in self.explicit.items() if k not in self.explicit_ms]
        return self.default == LATEST or LATEST in explicit

    def resolve(
        self,
        bounds: Mapping[QueueKey, tuple[int, int]],
        found: Mapping[QueueKey, int] | None = None,
    ) -> dict[QueueKey, int]:
        """Offsets for every queue in ``bounds`` (``{queue: (min_offset, max_offset)}``);
        ``found`` holds the broker's answers for the queues of :meth:`by_time` (clamped into
        ``[min_offset, max_offset]``).

        Raises:
            txmq.errors.ConfigError: a map names a queue that is not in ``bounds``, or ``found``
                lacks a queue resolved by time.
        """
        explicit = normalize_brokers(self.explicit, bounds)
        explicit_ms = normalize_brokers(self.explicit_ms, bounds)
        unknown = sorted((set(explicit) | set(explicit_ms)) - set(bounds))
        if unknown:
            names = ", ".join(key_name(k) for k in unknown)
            raise ConfigError(f"offsets given for queues the broker does not have: {names}")
        timed = replace(self, explicit=explicit, explicit_ms=explicit_ms).by_time(bounds)
        found = found or {}
        if set(timed) - set(found):
            raise ConfigError(f"no offset found by timestamp for {sorted(set(timed) - set(found))}")
        out: dict[QueueKey, int] = {}
        for key in sorted(bounds):
            low, high = bounds[key]
            if key in timed:
                out[key] = min(max(found[key], low), high)
                continue
            value = explicit.get(key, self.default)
            out[key] = low if value == EARLIEST else high if value == LATEST else value
        return out


def check_start(
    start: Mapping[QueueKey, int],
    bounds: Mapping[QueueKey, tuple[int, int]],
    *,
    fail_on_data_loss: bool,
) -> None:
    """Reject starting offsets outside what the broker holds, before any batch runs.

    Raises:
        txmq.errors.ConfigError: a start beyond its queue's ``max_offset`` (nothing was ever there).
        DataLossError: with ``fail_on_data_loss``, a start below its queue's ``min_offset`` (retention
            deleted those messages); without it the read skips them with a warning.
    """
    for key, offset in sorted(start.items()):
        if key not in bounds:
            continue
        low, high = bounds[key]
        where = f"queue {key_name(key)}"
        if offset > high:
            raise ConfigError(f"startingOffsets: {offset} for {where} is beyond its max_offset {high}")
        if offset < low and fail_on_data_loss:
            raise DataLossError(
                f"txmq {where}: startingOffsets {offset} is below min_offset {low}; offsets "
                f"{offset}..{low - 1} were deleted by retention (set failOnDataLoss=false to start "
                f"at {low})"
            )


def parse_offset_spec(raw: str | None, default: int, option: str) -> OffsetSpec:
    """Parse a ``startingOffsets``/``endingOffsets`` value: empty (→ ``default``), ``earliest``,
    ``latest``, or a flat or nested JSON map (see :mod:`txmq.spark._source`).

    Raises:
        txmq.errors.ConfigError: malformed JSON, a bad ``<topic>/<queue_id>`` key or an offset
            that is not an integer >= -2; ``option`` names the option in the message.
    """
    text = (raw or "").strip()
    if not text:
        return OffsetSpec(default)
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(EARLIEST if text.lower() == "earliest" else LATEST)
    return OffsetSpec(default, _parse_queue_map(text, option, EARLIEST))


def with_timestamps(
    spec: OffsetSpec, timestamp: str | None, by_queue: str | None, options: tuple[str, str]
) -> OffsetSpec:
    """``spec`` with the timestamps of ``startingTimestamp`` (one value in ms since the epoch) and
    ``startingOffsetsByTimestamp`` (a JSON map like ``startingOffsets``, values in ms), or their
    ``ending`` pair; ``options`` names the two options for messages.

    Raises:
        txmq.errors.ConfigError: a value that is not an integer >= 0, or a malformed map.
    """
    text = (timestamp or "").strip()
    default_ms = None
    if text:
        try:
            default_ms = int(text)
        except ValueError:
            default_ms = -1
        if default_ms < 0:
            raise ConfigError(f"{options[0]}: expected ms since the epoch (an integer >= 0), "
                              f"got {timestamp!r}")
    mapped = (by_queue or "").strip()
    explicit_ms = _parse_queue_map(mapped, options[1], 0) if mapped else {}
    return replace(spec, default_ms=default_ms, explicit_ms=explicit_ms)


def _parse_queue_map(text: str, option: str, lowest: int) -> dict[QueueKey, int]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: expected earliest, latest or JSON, got {text!r}") from exc
    if not isinstance(parsed, dict):
        raise ConfigError(f"{option}: a JSON map is needed, got {text!r}")
    explicit: dict[QueueKey, int] = {}
    for name, value in parsed.items():
        if isinstance(value, dict):  # nested {"topic": {"0": 5}}
            for queue, offset in value.items():
                key = parse_queue_key(f"{name}/{queue}", option)
                explicit[key] = _check_offset(offset, option, lowest)
        else:
            explicit[parse_queue_key(name, option)] = _check_offset(value, option, lowest)
    return explicit


def _check_offset(value: object, option: str, lowest: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        raise ConfigError(f"{option}: values are integers >= {lowest}, got {value!r}")
    return value


def parse_queue_key(text: str, option: str) -> QueueKey:
    """``"<topic>/<broker_name>/<queue_id>"`` → ``(topic, broker_name, queue_id)``, and the
    one-broker form ``"<topic>/<queue_id>"`` → ``(topic, "", queue_id)``. Raises ConfigError naming
    ``option``."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts) or not parts[-1].isdigit():
        raise ConfigError(f"{option}: expected '<topic>/<broker_name>/<queue_id>' or "
                          f"'<topic>/<queue_id>', got {text!r}")
    return parts[0], parts[1] if len(parts) == 3 else "", int(parts[-1])


def key_name(key: QueueKey) -> str:
    """The JSON key of a queue: ``"<topic>/<broker_name>/<queue_id>"``, or ``"<topic>/<queue_id>"``
    when the broker is not named."""
    topic, broker, queue = key
    return f"{topic}/{broker}/{queue}" if broker else f"{topic}/{queue}"


def normalize_brokers(offsets: Mapping[QueueKey, _V], known: Iterable[QueueKey]) -> dict[QueueKey, _V]:
    """``offsets`` with every queue named without a broker (``(topic, "", queue_id)``, the
    one-broker format of checkpoints and options) given its topic's only broker group among
    ``known`` queues. Queues of topics ``known`` does not list are kept as they are.

    Raises:
        txmq.errors.ConfigError: such a queue's topic is on several broker groups (name the broker:
            ``"<topic>/<broker_name>/<queue_id>"``).
    """
    groups: dict[str, set[str]] = {}
    for topic, broker, _ in known:
        groups.setdefault(topic, set()).add(broker)
    out: dict[QueueKey, _V] = {}
    for key, value in offsets.items():
        topic, broker, queue = key
        names = groups.get(topic, set())
        if not broker and names and "" not in names:
            if len(names) > 1:
                raise ConfigError(
                    f"queue {key_name(key)} names no broker, but topic {topic!r} is on broker "
                    f"groups {sorted(names)}: write '<topic>/<broker_name>/<queue_id>'")
            key = (topic, next(iter(names)), queue)
        out[key] = value
    return out


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, int]:
    """``{(topic, broker, queue): offset}`` → the checkpointed form
    ``{"<topic>/<broker>/<queue>": offset}`` (:func:`key_name`).

    Keys are in (topic, broker, queue id) order, so equal offsets always serialise to the same JSON
    (Spark decides "no new data" by comparing the serialised end with the start).
    """
    return {key_name(k): offsets[k] for k in sorted(offsets)}


def offsets_from_json(data: Mapping[str, Any]) -> dict[QueueKey, int]:
    """Inverse of :func:`offsets_to_json`. Raises :class:`ConfigError` on a malformed offset."""
    out: dict[QueueKey, int] = {}
    for text, value in data.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"offset of {text!r} must be an integer >= 0, got {value!r}")
        out[parse_queue_key(text, "offset")] = value
    return out


def fair_shares(backlogs: Mapping[_K, int], budget: int, rotation: int = 0) -> dict[_K, int]:
    """Split ``budget`` rows over queues with ``backlogs`` rows waiting (max-min fairness).

    Every queue gets an equal share; a queue needing less than its share gets all it needs and the
    rest is shared again among the others. Rows that do not divide evenly go one each to queues
    in key order starting at ``rotation % n``, so that a caller passing a rotation that changes as
    offsets advance (the source passes the sum of the start offsets) serves every queue in turn
    even when ``budget`` is smaller than the number of queues.

    Returns:
        ``{key: rows}`` for every key of ``backlogs``; ``0 <= rows <= backlog`` and the total is
        ``min(budget, sum of backlogs)``. Deterministic for equal arguments.

    Raises:
        ValueError: ``budget`` is negative.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    keys = sorted(backlogs)  # type: ignore[type-var]
    shares = dict.fromkeys(keys, 0)
    pending = [k for k in keys if backlogs[k] > 0]
    remaining = budget
    while pending:
        share = remaining // len(pending)
        small = [k for k in pending if backlogs[k] <= share]
        if not small:
            break
        for k in small:
            shares[k] = backlogs[k]
            remaining -= backlogs[k]
        pending = [k for k in pending if backlogs[k] > share]
    if pending:
        base, extra = divmod(remaining, len(pending))
        first = rotation % len(pending)
        for i, k in enumerate(pending):
            shares[k] = base + (1 if (i - first) % len(pending) < extra else 0)
    return shares


def advance_offsets(
    start: Mapping[QueueKey, int],
    latest: Mapping[QueueKey, int],
    *,
    fail_on_data_loss: bool,
) -> dict[QueueKey, int]:
    """The end offsets reading everything up to ``latest`` (before any read limit).

    A queue only in ``start`` (gone from the broker or the topic list) keeps its offset; a queue
    only in ``latest`` is new and is read from offset 0 (see :func:`range_start`).

    Raises:
        DataLossError: with ``fail_on_data_loss``, a queue's ``latest`` is below its start (the
            broker lost or reset the queue). Otherwise the end follows the broker backwards, that
            range reads nothing, and the next batch starts from the broker's offset.
    """
    end = dict(start)
    for key, high in latest.items():
        low = start.get(key, 0)
        if high < low:
            message = (
                f"txmq queue {key_name(key)}: max_offset {high} is below the checkpointed "
                f"offset {low}; the broker lost or reset this queue"
            )
            if fail_on_data_loss:
                raise DataLossError(message + " (set failOnDataLoss=false to continue from there)")
            _log.warning("%s; continuing from %d (failOnDataLoss=false)", message, high)
        end[key] = high
    return end


def range_start(start: Mapping[QueueKey, int], key: QueueKey) -> int:
    """Where reading ``key`` begins: its start offset, or 0 for a queue that appeared later."""
    return start.get(key, 0)


def apply_read_limit(
    start: Mapping[QueueKey, int], end: Mapping[QueueKey, int], limit: ReadLimit
) -> dict[QueueKey, int]:
    """Clamp ``end`` so the batch ``(start, end]`` honours ``limit``.

    ``ReadAllAvailable`` keeps ``end``; ``ReadMaxRows(n)`` admits at most ``n`` rows spread with
    :func:`fair_shares`; ``ReadMinRows(n)`` returns ``start`` (no batch) until ``n`` rows wait.

    Raises:
        txmq.errors.ConfigError: any other limit (the source never asks for one).
    """
    backlogs = {k: max(0, e - range_start(start, k)) for k, e in end.items()}
    if isinstance(limit, ReadAllAvailable):
        return dict(end)
    if isinstance(limit, ReadMinRows):
        return dict(end) if sum(backlogs.values()) >= limit.min_rows else dict(start)
    if not isinstance(limit, ReadMaxRows):
        raise ConfigError(f"the txmq source does not support read limit {limit!r}")
    if sum(backlogs.values()) <= limit.max_rows:
        return dict(end)
    shares = fair_shares(backlogs, limit.max_rows, rotation=sum(start.values()))
    return {k: (range_start(start, k) + shares[k]) if backlogs[k] > 0 else e for k, e in end.items()}
