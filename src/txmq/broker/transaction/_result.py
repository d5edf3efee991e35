"""The answer to an end request (END_TRANSACTION, its batch, an operator's end, a sink batch):
what :class:`~txmq.broker.transaction.TransactionService` decided and when it may be sent."""

from __future__ import annotations

from txmq.broker.transaction._index import Outcome
from txmq.errors import ResponseCode
from txmq.protocol import TRANS_CHECK_MAX_TIME_TOPIC

__all__ = ["EndResult", "end_result"]


class EndResult:
    """What END_TRANSACTION decided: response code, recorded outcome, whether it repeats an earlier
    decision, and the durability target (the reply waits until the commit log is durable, and on
    a SYNC_MASTER replicated, up to ``durable_offset``; 0: nothing to wait for)."""

    __slots__ = ("code", "duplicate", "durable_offset", "outcome", "remark")

    def __init__(self, code: ResponseCode, outcome: str = "", *, duplicate: bool = False,
                 durable_offset: int = 0, remark: str = "") -> None:
        self.code, self.outcome, self.duplicate = code, outcome, duplicate
        self.durable_offset, self.remark = durable_offset, remark


def end_result(outcome: Outcome, durable: int, park_reason: str | None) -> EndResult:
    """The answer to an end request that settled its half message (or, when the commit could not
    be done, discarded it: MESSAGE_ILLEGAL with the reason)."""
    if park_reason is None:  # (``_value_``: the value without the ``value`` property's call)
        return EndResult(ResponseCode.SUCCESS, outcome._value_, durable_offset=durable)
    return EndResult(ResponseCode.MESSAGE_ILLEGAL, Outcome.DISCARD.value, durable_offset=durable,
                     remark=f"half message {park_reason}; discarded to {TRANS_CHECK_MAX_TIME_TOPIC}")
