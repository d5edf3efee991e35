"""The broker's record of a transaction's life in the message trace: check-backs and answers, who
ended it, and its W3C trace id.

The broker keeps each transaction's life in memory (``GET_TRANSACTION_TRACE``, bounded, lost at a
restart: docs/tracing.md, "The broker's leg"); what the log keeps (the half message, the op
record) the trace already shows. So a life adds to the trace, where the broker still has it:

- ``answer``: the producer's own end request that answered UNKNOWN (by ``producer``, ``client``);
- ``check-back``: each check-back, with the producer it went to (``client``), and in ``detail`` its
  number, the answer and who gave it after how long (or that none came);
- the decision (commit or rollback) gets ``client``: the producer whose request settled it.

A broker that does not record lives (an Apache RocketMQ broker: REQUEST_CODE_NOT_SUPPORTED) adds
nothing. The trace id is the message's own ``traceparent`` property's, so it survives a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txmq import limits
from txmq.console._models import TraceEvent
from txmq.errors import RemoteError, ResponseCode
from txmq.protocol import PROPERTY_TRACEPARENT, MessageExt, TransactionLife, TransactionStep, trace_id_of

if TYPE_CHECKING:
    from txmq.console._backend_common import BrokerClients

__all__ = ["add_life", "lives_of", "trace_id", "trace_msg_ids"]

_NO_LIVES = (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.TRANSACTION_NOT_FOUND)


def trace_id(m: MessageExt) -> str:
    """The W3C trace id of message ``m`` (its ``traceparent`` property), or ""."""
    return trace_id_of(m.properties.get(PROPERTY_TRACEPARENT, ""))


async def lives_of(b: BrokerClients, halves: list[MessageExt]) -> list[TransactionLife]:
    """The lives broker ``b`` keeps of the transactions of ``halves`` (by half queue offset)."""
    out: list[TransactionLife] = []
    for h in halves:
        try:
            out += await b.admin.transaction_lives(f"half:{h.queue_offset}")
        except RemoteError as exc:
            if exc.response_code not in _NO_LIVES:
                raise
    return out


async def trace_msg_ids(b: BrokerClients, trace: str) -> list[str]:
    """Message ids of the transactions broker ``b`` recorded in W3C trace ``trace``, newest
    first, each once."""
    try:
        lives = await b.admin.transaction_lives(trace_id=trace,
                                                limit=limits.TRANSACTION_TRACE_QUERY_MAX)
    except RemoteError as exc:
        if exc.response_code not in _NO_LIVES:
            raise
        return []
    return list(dict.fromkeys(life.msg_id for life in lives if life.msg_id))


def _who(client_id: str, address: str) -> str:
    return f"{client_id} ({address})" if client_id and address else client_id or address


def _check_event(check: TransactionStep, answer: TransactionStep | None) -> TraceEvent:
    if answer is None:
        said = "no answer"
    else:
        said = (f"answered {answer.answer} by {_who(answer.client_id, answer.address)} after "
                f"{max(0, answer.time_ms - check.time_ms)} ms")
    return TraceEvent(kind="check-back", time_ms=check.time_ms,
                      client=_who(check.client_id, check.address),
                      detail=f"check-back {check.check_count}: {said}")


def _life_events(life: TransactionLife) -> list[TraceEvent]:
    """The answer and check-back events of one life, in order."""
    out: list[TraceEvent] = []
    checks: dict[int, tuple[TransactionStep, TransactionStep | None]] = {}
    for step in life.steps:
        if step.kind == "check-back":
            checks[step.check_count] = (step, None)
        elif step.kind == "answer" and step.check_count in checks and step.sent_ms:
            checks[step.check_count] = (checks[step.check_count][0], step)
        elif step.kind == "answer" and not step.sent_ms:
            out.append(TraceEvent(kind="answer", time_ms=step.time_ms, by="producer",
                                  client=_who(step.client_id, step.address),
                                  detail=f"{step.answer}: left to check-back"))
    out += [_check_event(check, answer) for check, answer in checks.values()]
    return sorted(out, key=lambda e: e.time_ms)


def add_life(events: list[TraceEvent], lives: list[TransactionLife]) -> list[TraceEvent]:
    """``events`` (half events first, then the decision and the rest) with the lives' answer and
    check-back events after the halves, and the deciding client on the decision."""
    if not lives:
        return events
    halves = [e for e in events if e.kind == "half"]
    rest = [e for e in events if e.kind != "half"]
    ends = [s for life in lives for s in life.steps if s.kind == "end"]
    if ends and ends[-1].client_id:
        for e in rest:
            if e.kind in ("commit", "rollback"):
                e.client = _who(ends[-1].client_id, ends[-1].address)
    added = [e for life in sorted(lives, key=lambda x: x.half_offset) for e in _life_events(life)]
    return [*halves, *added, *rest]
