"""Pull decisions, sans-IO: which member of a broker group a pull goes to, and what a PULL_MESSAGE
answer means.

Sources: RocketMQ ``PullAPIWrapper`` (``pullFromWhichNodeTable``, ``recalculatePullFromWhichNode``,
``processPullResult``), ``MQClientInstance.findBrokerAddressInSubscribe`` and
``MQClientAPIImpl.processPullResponse``.
"""

from __future__ import annotations

from collections.abc import Mapping

from txmq.client._core import PullStatus, RawPullResult, mq_sort_key
from txmq.errors import RemoteError, ResponseCode
from txmq.protocol import (
    MASTER_ID,
    Command,
    MessageQueue,
    PullMessageResponseHeader,
    from_ext,
)

__all__ = ["PullNodeTable", "mq_sort_key", "pull_result", "subscribe_broker_id"]


def subscribe_broker_id(addrs: Mapping[int, str], broker_id: int) -> int | None:
    """The member of a broker group a read goes to, given the wanted ``broker_id`` and the group's
    ``{broker id → address}``: that id; else, for a slave id, the next id; else the group's first
    member (lowest id, a slave when the master is gone); None for an empty group (RocketMQ
    ``findBrokerAddressInSubscribe(brokerName, brokerId, onlyThisBroker=false)``)."""
    if broker_id in addrs:
        return broker_id
    if broker_id != MASTER_ID and broker_id + 1 in addrs:
        return broker_id + 1
    return min(addrs) if addrs else None


class PullNodeTable:
    """Queue → broker id the broker suggested pulling from next (RocketMQ
    ``PullAPIWrapper.pullFromWhichNodeTable``): updated from every pull's
    ``suggestWhichBrokerId``; the master (0) until a broker suggests otherwise."""

    def __init__(self) -> None:
        self._table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, suggested: int) -> None:
        """Record a pull answer's ``suggestWhichBrokerId``."""
        self._table[mq] = suggested

    def suggested(self, mq: MessageQueue) -> int:
        """The id to pull ``mq`` from (RocketMQ ``recalculatePullFromWhichNode``)."""
        return self._table.get(mq, MASTER_ID)

    def choose(self, mq: MessageQueue, addrs: Mapping[int, str]) -> int:
        """The broker id to pull ``mq`` from, given its group's members ``addrs``: the suggested
        one, by :func:`subscribe_broker_id`; the master when the group's members are not known
        (the client was given a broker address only)."""
        bid = subscribe_broker_id(addrs, self.suggested(mq))
        return MASTER_ID if bid is None else bid

    def forget(self, mq: MessageQueue) -> None:
        """Drop what is known of ``mq`` (it is no longer consumed)."""
        self._table.pop(mq, None)


def pull_result(resp: Command, offset: int) -> tuple[RawPullResult, int]:
    """A PULL_MESSAGE answer to a pull from ``offset`` → ``(result, suggestWhichBrokerId)``
    (RocketMQ ``MQClientAPIImpl.processPullResponse``): SUCCESS → FOUND; PULL_NOT_FOUND →
    NO_NEW_MSG (NO_MATCHED_MSG when the broker moved the offset past filtered messages);
    PULL_RETRY_IMMEDIATELY (20, Apache RocketMQ's answer when every message read was filtered out)
    → NO_MATCHED_MSG with the header's next offset; PULL_OFFSET_MOVED → OFFSET_ILLEGAL.

    Raises:
        RemoteError: any other code.
        MalformedHeader: the header does not decode.
    """
    code = resp.code
    if code not in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED):
        raise RemoteError(code, resp.remark or "")
    h = from_ext(resp.ext, PullMessageResponseHeader)
    if code == ResponseCode.SUCCESS:
        status = PullStatus.FOUND
    elif code == ResponseCode.PULL_OFFSET_MOVED:
        status = PullStatus.OFFSET_ILLEGAL
    elif code == ResponseCode.PULL_RETRY_IMMEDIATELY or h.next_begin_offset != offset:
        status = PullStatus.NO_MATCHED_MSG
    else:
        status = PullStatus.NO_NEW_MSG
    body = resp.body if status is PullStatus.FOUND else b""
    return (RawPullResult(status, body, h.next_begin_offset, h.min_offset, h.max_offset),
            h.suggest_which_broker_id)
