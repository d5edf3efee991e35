"""Options of the ``txmq`` Spark source: :class:`SourceOptions` parses Spark's string options
(documented in :mod:`txmq.spark._source`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from txmq import limits
from txmq.errors import ConfigError
from txmq.spark._offsets import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    parse_offset_spec,
    with_timestamps,
)

__all__ = ["DEFAULT_CONSUMER_GROUP", "SourceOptions", "fault"]

DEFAULT_CONSUMER_GROUP = "txmq-spark"
"""Consumer group the source identifies itself with when ``consumerGroup`` is not set."""


@dataclass(frozen=True)
class SourceOptions:
    """Parsed, validated options of the ``txmq`` source (see :mod:`txmq.spark._source`)."""

    endpoints: str
    topics: tuple[str, ...]
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    consumer_group: str
    namesrv_addr: str = ""
    consumer_group_set: bool = False
    faults: str = ""
    timeout_ms: int = limits.REQUEST_TIMEOUT_MS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Parse Spark's string options (keys in any case).

        Raises:
            txmq.errors.ConfigError: a required option is missing or a value is malformed.
        """
        opts = {k.lower(): v for k, v in options.items()}
        endpoints = opts.get("endpoints", "").strip()
        namesrv_addr = opts.get("namesrvaddr", "").strip()
        if not endpoints and not namesrv_addr:
            raise ConfigError("option 'endpoints' (a broker, e.g. '127.0.0.1:10911') or "
                              "'namesrvAddr' (name servers) is required")
        topics = tuple(dict.fromkeys(t.strip() for t in opts.get("topic", "").split(",")))
        topics = tuple(t for t in topics if t)
        if not topics:
            raise ConfigError("option 'topic' is required (one topic or a comma-separated list)")
        if any("/" in t for t in topics):
            raise ConfigError(f"option 'topic': topic names cannot contain '/': {topics!r}")
        start = with_timestamps(
            parse_offset_spec(opts.get("startingoffsets"), EARLIEST, "startingOffsets"),
            opts.get("startingtimestamp"), opts.get("startingoffsetsbytimestamp"),
            ("startingTimestamp", "startingOffsetsByTimestamp"))
        end = with_timestamps(
            parse_offset_spec(opts.get("endingoffsets"), LATEST, "endingOffsets"),
            opts.get("endingtimestamp"), opts.get("endingoffsetsbytimestamp"),
            ("endingTimestamp", "endingOffsetsByTimestamp"))
        for spec, option in ((start, "startingOffsets"), (end, "endingOffsets")):
            unknown = sorted({k[0] for k in (*spec.explicit, *spec.explicit_ms)} - set(topics))
            if unknown:
                raise ConfigError(f"{option} names topics not in option 'topic': {unknown}")
        return cls(
            endpoints=endpoints,
            namesrv_addr=namesrv_addr,
            topics=topics,
            starting_offsets=start,
            ending_offsets=end,
            max_offsets_per_trigger=_parse_max_offsets(opts.get("maxoffsetspertrigger")),
            fail_on_data_loss=_parse_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
            consumer_group=opts.get("consumergroup", DEFAULT_CONSUMER_GROUP).strip()
            or DEFAULT_CONSUMER_GROUP,
            consumer_group_set=bool(opts.get("consumergroup", "").strip()),
            faults=opts.get("txmq.test.faults", ""),
            timeout_ms=_parse_timeout_ms(opts.get("timeoutms")),
        )


def fault(path: str, point: str) -> None:
    """Test hook (option ``txmq.test.faults``): a file holding a JSON list of points to fail at,
    each once, like the sink's."""
    if not path or not Path(path).exists():
        return
    points: list[str] = json.loads(Path(path).read_text() or "[]")
    if point in points:
        points.remove(point)
        Path(path).write_text(json.dumps(points))
        raise RuntimeError(f"injected fault at {point}")


def _parse_max_offsets(raw: str | None) -> int | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"maxOffsetsPerTrigger: expected an integer > 0, got {raw!r}") from exc
    if value <= 0:
        raise ConfigError(f"maxOffsetsPerTrigger: expected an integer > 0, got {raw!r}")
    return value


def _parse_timeout_ms(raw: str | None) -> int:
    if raw is None or not raw.strip():
        return limits.REQUEST_TIMEOUT_MS
    try:
        value = int(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"timeoutMs: expected an integer > 0 (milliseconds), got {raw!r}") from exc
    if value <= 0:
        raise ConfigError(f"timeoutMs: expected an integer > 0 (milliseconds), got {raw!r}")
    return value


def _parse_bool(raw: str, option: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{option}: expected true or false, got {raw!r}")
    return value == "true"
