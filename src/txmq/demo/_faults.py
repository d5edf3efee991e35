"""Deterministic faults of the demo, chosen by order key.

A multiplicative hash spreads the keys (TPC-H order keys are sparse) over 10,000 buckets:

| buckets       | share | fault                                                             |
|---------------|-------|-------------------------------------------------------------------|
| 0 – 499       | 5 %   | local transaction fails: nothing inserted, ROLLBACK_MESSAGE        |
| 500 – 999     | 5 %   | local transaction commits but returns UNKNOWN (check-back settles) |
| 1000 – 1019   | 0.2 % | producer killed with SIGKILL after the half message is stored:     |
|               |       | 1000–1009 after the local commit, 1010–1019 before it              |
| 1020 – 1219   | 2 %   | committed normally, but the ledger rejects the order every time:   |
|               |       | after 10 attempts it emits a ROLLBACK event (local message table)  |
|               |       | and the order service compensates by cancelling the order          |
| 1220 – 1239   | 0.2 % | both: UNKNOWN (a check-back commits it), then rejected by the      |
|               |       | ledger and compensated (one trace shows every leg: docs/tracing.md) |
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Fault", "fault_of", "ledger_rejects", "returns_unknown"]

_BUCKETS = 10_000


class Fault(Enum):
    NONE = "none"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"
    CRASH_AFTER_COMMIT = "crash_after_commit"
    CRASH_BEFORE_COMMIT = "crash_before_commit"
    LEDGER_REJECT = "ledger_reject"
    UNKNOWN_REJECT = "unknown_reject"


def _bucket(orderkey: int) -> int:
    return (orderkey * 2654435761 + 0x9E3779B9) % (1 << 32) % _BUCKETS


def fault_of(orderkey: int) -> Fault:
    """The fault injected for ``orderkey`` (pure function: every process agrees)."""
    b = _bucket(orderkey)
    if b < 500:
        return Fault.ROLLBACK
    if b < 1000:
        return Fault.UNKNOWN
    if b < 1020:
        return Fault.CRASH_AFTER_COMMIT if b < 1010 else Fault.CRASH_BEFORE_COMMIT
    if b < 1220:
        return Fault.LEDGER_REJECT
    if b < 1240:
        return Fault.UNKNOWN_REJECT
    return Fault.NONE


def ledger_rejects(orderkey: int) -> bool:
    """Whether the ledger refuses ``orderkey`` (it is then compensated)."""
    return fault_of(orderkey) in (Fault.LEDGER_REJECT, Fault.UNKNOWN_REJECT)


def returns_unknown(orderkey: int) -> bool:
    """Whether the local transaction of ``orderkey`` commits but answers UNKNOWN."""
    return fault_of(orderkey) in (Fault.UNKNOWN, Fault.UNKNOWN_REJECT)
