"""Committing and aborting one Spark sink micro-batch on every broker group that may hold its halves.

A task attempt's halves go wherever its producer sends them, so one batch has a part on each broker
group of the topic's route. Each broker commits its part atomically and idempotently per (sink id,
batch id) (:mod:`txmq.broker.transaction._sink`); this module makes one batch commit out of those
parts (the guarantees are in :mod:`txmq.spark._sink`):

* :func:`plan_batch` (pure) says which task attempts, with how many rows, each broker group commits,
  and which group decides: the first by name. Its part is committed first, and only then the others.
* :func:`commit_batch` commits the decision group's part, then every other part, each tried again
  every ``limits.SINK_COMMIT_RETRY_INTERVAL_MS`` until its broker answered or the sink's
  ``timeoutSeconds`` passed.
* :func:`abort_batch` asks the decision group first: if its part was committed, the batch was
  decided and the others are committed too (never rolled back); otherwise every group rolls its part
  back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from txmq import limits
from txmq.client import AsyncAdmin
from txmq.errors import RemoteError, ResponseCode, TransportError, TxmqError
from txmq.protocol import (
    EndTransactionResponseHeader,
    RequestCode,
    SinkBatchRequestHeader,
    encode_body,
    from_ext,
    to_ext,
)

__all__ = ["BatchPlan", "abort_batch", "commit_batch", "plan_batch"]

log = logging.getLogger("txmq.spark.sink")

RETRY_INTERVAL_S = limits.SINK_COMMIT_RETRY_INTERVAL_MS / 1000
"""Pause between two tries of one broker group's part (s)."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class BatchPlan:
    """What each broker group commits of one batch.

    Attributes:
        decision: the broker group whose commit decides the batch (the first by name).
        others: the other groups, by name.
        parts: broker group → {task attempt key → rows it stored there}; every group of
            ``decision`` and ``others`` has an entry (empty: it holds no accepted rows, and its
            commit rolls back whatever halves of the batch it has).
    """

    decision: str
    others: tuple[str, ...]
    parts: dict[str, dict[str, int]]

    @property
    def brokers(self) -> tuple[str, ...]:
        """Every broker group, the decision group first."""
        return (self.decision, *self.others)


def plan_batch(route_brokers: Iterable[str],
               tasks: Mapping[str, Mapping[str, int]]) -> BatchPlan:
    """The parts of one batch: every broker group of the topic's route (``route_brokers``) and
    every group a task attempt stored rows on; ``tasks`` is task attempt key → {broker group →
    rows}. Groups with 0 rows of a task do not name it.

    Raises:
        ValueError: no broker group at all.
    """
    brokers = sorted(set(route_brokers) | {b for by in tasks.values() for b in by})
    if not brokers:
        raise ValueError("a sink batch needs at least one broker group")
    parts: dict[str, dict[str, int]] = {b: {} for b in brokers}
    for task, by_broker in sorted(tasks.items()):
        for broker, rows in by_broker.items():
            if rows > 0:
                parts[broker][task] = rows
    return BatchPlan(brokers[0], tuple(brokers[1:]), parts)


async def _answered(what: str, fn: Callable[[], Awaitable[_T]], deadline: float) -> _T:
    """``fn()`` tried again every :data:`RETRY_INTERVAL_S` after a transport error or a retriable
    refusal until ``deadline`` (``time.monotonic``); then (or on any other error) it raises."""
    while True:
        try:
            return await fn()
        except (TransportError, RemoteError) as exc:
            if not exc.retriable or time.monotonic() + RETRY_INTERVAL_S > deadline:
                raise
            log.warning("txmq sink: %s failed (%s); trying again in %.1f s", what, exc,
                        RETRY_INTERVAL_S)
        await asyncio.sleep(RETRY_INTERVAL_S)


async def _request(admin: AsyncAdmin, broker: str, topic: str, code: RequestCode,
                   header: SinkBatchRequestHeader, body: bytes = b"") -> EndTransactionResponseHeader:
    r = await admin.call_broker(broker, code, to_ext(header), body, topic=topic)
    if r.code != ResponseCode.SUCCESS:
        raise RemoteError(r.code, f"broker group {broker or admin.endpoints}: {r.remark or ''}")
    return from_ext(r.ext, EndTransactionResponseHeader)


class _Batch:
    """One batch's requests over one admin client (every broker group reached by its name)."""

    def __init__(self, admin: AsyncAdmin, topic: str, batch: str, producer_group: str,
                 deadline: float) -> None:
        self.admin, self.topic, self.batch = admin, topic, batch
        self.group, self.deadline = producer_group, deadline

    async def brokers(self) -> list[str]:
        """The broker groups of the topic's route (fetched again, retried until the deadline)."""
        route = await _answered(f"route of {self.topic}",
                                lambda: self.admin.route(self.topic, refresh=True), self.deadline)
        return sorted(route.brokers)

    async def commit(self, broker: str, tasks: dict[str, int]) -> EndTransactionResponseHeader:
        h = SinkBatchRequestHeader(batch=self.batch, producer_group=self.group)
        return await _answered(
            f"commit of {self.batch} on {broker}",
            lambda: _request(self.admin, broker, self.topic, RequestCode.COMMIT_SINK_BATCH, h,
                             encode_body(tasks)), self.deadline)

    async def abort(self, broker: str) -> EndTransactionResponseHeader:
        h = SinkBatchRequestHeader(batch=self.batch)
        return await _answered(
            f"abort of {self.batch} on {broker}",
            lambda: _request(self.admin, broker, self.topic, RequestCode.ABORT_SINK_BATCH, h),
            self.deadline)

    async def commit_others(self, plan: BatchPlan) -> dict[str, EndTransactionResponseHeader]:
        answers = await asyncio.gather(*(self.commit(b, plan.parts[b]) for b in plan.others))
        return dict(zip(plan.others, answers, strict=True))


async def _with_admin(endpoints: str, namesrv_addr: str,
                      fn: Callable[[AsyncAdmin], Awaitable[_T]]) -> _T:
    admin = AsyncAdmin(endpoints, namesrv_addr=namesrv_addr)
    try:  # not started: connections open on first use, no heartbeat loop is needed
        return await fn(admin)
    finally:
        await admin.shutdown()


async def commit_batch(endpoints: str, namesrv_addr: str, topic: str, batch: str,
                       producer_group: str, tasks: Mapping[str, Mapping[str, int]],
                       timeout_s: float) -> dict[str, EndTransactionResponseHeader]:
    """Commit ``batch`` (``<sink id>/<batch id>``) on every broker group: the decision group's
    part first, then the others' together, each retried until answered or ``timeout_s`` passed.

    Returns:
        broker group → its answer (``duplicate`` when that part was committed before).

    Raises:
        TransportError: a group did not answer within ``timeout_s`` (the parts committed stay
            committed; committing the batch again completes it).
        RemoteError: a group refused its part (TRANSACTION_NOT_FOUND: its halves timed out).
    """
    deadline = time.monotonic() + timeout_s

    async def run(admin: AsyncAdmin) -> dict[str, EndTransactionResponseHeader]:
        b = _Batch(admin, topic, batch, producer_group, deadline)
        plan = plan_batch(await b.brokers(), tasks)
        out = {plan.decision: await b.commit(plan.decision, plan.parts[plan.decision])}
        out.update(await b.commit_others(plan))
        return out

    return await _with_admin(endpoints, namesrv_addr, run)


async def abort_batch(endpoints: str, namesrv_addr: str, topic: str, batch: str,
                      producer_group: str, tasks: Mapping[str, Mapping[str, int]],
                      timeout_s: float) -> dict[str, EndTransactionResponseHeader]:
    """Roll back ``batch`` on every broker group, unless the decision group committed its part: then
    commit the others' parts (``tasks`` as for :func:`commit_batch`) instead.

    Returns:
        broker group → its answer. A group that does not answer within ``timeout_s`` is logged and
        left out: its halves are rolled back by the next commit of the batch or their timeout.

    Raises:
        TransportError: the decision group did not answer (nothing else was touched).
        RemoteError: a group refused.
    """
    deadline = time.monotonic() + timeout_s

    async def run(admin: AsyncAdmin) -> dict[str, EndTransactionResponseHeader]:
        b = _Batch(admin, topic, batch, producer_group, deadline)
        plan = plan_batch(await b.brokers(), tasks)
        first = await b.abort(plan.decision)
        if first.duplicate:  # decided: committed on the decision group
            log.warning("txmq sink: abort of %s after its commit on %s: completing the commit",
                        batch, plan.decision)
            return {plan.decision: first, **await b.commit_others(plan)}
        out = {plan.decision: first}
        for broker in plan.others:
            try:
                out[broker] = await b.abort(broker)
            except TxmqError as exc:
                log.warning("txmq sink: abort of %s on %s failed: %s", batch, broker, exc)
        return out

    return await _with_admin(endpoints, namesrv_addr, run)
