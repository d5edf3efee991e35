"""Driver-side metadata reads of the ``txmq`` Spark source (:mod:`txmq.spark._source`): the queues of
every broker group of the configured topics, their bounds, timestamps searched, and a start pinned
as the consumer group's offsets; and the client shape the source relies on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from txmq.errors import BrokerUnavailable, ConfigError, RequestTimeout, TxmqError
from txmq.spark._offsets import OffsetSpec, QueueKey
from txmq.spark._options import SourceOptions

if TYPE_CHECKING:  # not imported at run time: this module plans, the decoders are not needed
    from txmq.protocol import MessageExt

__all__ = ["Broker", "PullConsumerShape", "at_broker", "queue_keys"]

_log = logging.getLogger("txmq.spark._source")

class _PullResult(Protocol):
    @property
    def status(self) -> Any: ...  # an enum member whose .name is FOUND, NO_NEW_MSG, OFFSET_ILLEGAL
    @property
    def messages(self) -> Sequence[MessageExt]: ...


class PullConsumerShape(Protocol):
    """The queue-addressed calls take ``broker_name`` ("" = the topic's only broker group); the
    source passes it only when it names a group (:func:`_at`), so a client without broker groups
    (the tests' fakes) is called as before."""

    def queue_ids(self, topic: str) -> Sequence[int]: ...
    def min_offset(self, topic: str, queue_id: int, *, broker_name: str = ...) -> int: ...
    def max_offset(self, topic: str, queue_id: int, *, broker_name: str = ...) -> int: ...
    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = ..., *,
             broker_name: str = ...) -> _PullResult: ...
    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, *,
                      broker_name: str = ...) -> int: ...
    def fetch_consumer_offset(self, topic: str, queue_id: int, *,
                              broker_name: str = ...) -> int | None: ...
    def commit_offset(self, topic: str, queue_id: int, offset: int, *,
                      broker_name: str = ...) -> None: ...
    def shutdown(self) -> None: ...


def at_broker(broker_name: str) -> dict[str, Any]:
    """The ``broker_name`` keyword of a queue-addressed call: none for a queue of no named group."""
    return {"broker_name": broker_name} if broker_name else {}


def queue_keys(consumer: PullConsumerShape, topic: str) -> list[QueueKey]:
    """Every queue of ``topic`` over all broker groups: the consumer's ``queues(topic)`` (subscribe
    queues of every group, ``MessageQueue``), or ``queue_ids`` with no group named."""
    queues = getattr(consumer, "queues", None)
    if queues is None:
        return [(topic, "", q) for q in consumer.queue_ids(topic)]
    out = [(mq.topic, mq.broker_name, mq.queue_id) for mq in queues(topic)]
    bad = sorted({b for _, b, _ in out if "/" in b})
    if bad:
        raise ConfigError(f"broker names holding '/' cannot key source offsets: {bad}")
    return out



_T = TypeVar("_T")


class Broker:
    """Driver-side metadata reads with a lazily started consumer.

    After a retriable error (broker restarted, timeout) the consumer is replaced and the call is
    tried once more. Pickling drops the consumer (Spark pickles readers to ship them), so
    ``factory`` (it creates and starts a consumer for the options) must be a module-level function.
    """

    def __init__(self, opts: SourceOptions,
                 factory: Callable[[SourceOptions], PullConsumerShape]) -> None:
        self._opts = opts
        self._factory = factory
        self._consumer: PullConsumerShape | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_opts": self._opts, "_factory": self._factory, "_consumer": None}

    def _call(self, fn: Callable[[PullConsumerShape], _T]) -> _T:
        for attempt in (1, 2):
            try:
                if self._consumer is None:
                    self._consumer = self._factory(self._opts)
                return fn(self._consumer)
            except (BrokerUnavailable, RequestTimeout) as exc:
                if attempt == 2:
                    raise type(exc)(f"txmq source: no answer from {self._where()}: {exc}") from exc
                _log.warning("txmq source: %s; reconnecting to %s", exc, self._where())
                self.close()
            except TxmqError as exc:
                if not exc.retriable or attempt == 2:
                    raise
                _log.warning("txmq source: %s; reconnecting to %s", exc, self._opts.endpoints)
                self.close()
        raise AssertionError("unreachable")

    def _where(self) -> str:
        if self._opts.endpoints:
            return f"broker {self._opts.endpoints} (option endpoints)"
        return f"name server(s) {self._opts.namesrv_addr} (option namesrvAddr)"

    def queues(self) -> list[QueueKey]:
        """Every (topic, broker group, queue) of the configured topics, over every broker group of
        their routes, sorted.

        Raises:
            txmq.errors.RemoteError: TOPIC_NOT_EXIST for an unknown topic.
        """
        return self._call(lambda c: sorted(k for t in self._opts.topics for k in queue_keys(c, t)))

    def max_offsets(self) -> dict[QueueKey, int]:
        """``{queue: max_offset}`` (the next offset to be written) for every queue."""
        keys = self.queues()
        return self._call(lambda c: {k: c.max_offset(k[0], k[2], **at_broker(k[1])) for k in keys})

    def bounds(self) -> dict[QueueKey, tuple[int, int]]:
        """``{queue: (min_offset, max_offset)}`` for every queue."""
        keys = self.queues()
        return self._call(lambda c: {k: (c.min_offset(k[0], k[2], **at_broker(k[1])),
                                         c.max_offset(k[0], k[2], **at_broker(k[1]))) for k in keys})

    def resolve(self, spec: OffsetSpec) -> tuple[dict[QueueKey, int], dict[QueueKey, tuple[int, int]]]:
        """``spec`` resolved for every queue (timestamps searched on the broker), and the bounds
        it was resolved against."""
        bounds = self.bounds()
        times = spec.by_time(bounds)
        found = self._call(lambda c: {k: c.search_offset(k[0], k[2], t, **at_broker(k[1]))
                                      for k, t in times.items()})
        return spec.resolve(bounds, found), bounds

    def pin(self, start: Mapping[QueueKey, int]) -> dict[QueueKey, int]:
        """The start pinned as the consumer group's offsets on the broker: a queue that has a
        group offset keeps it, the others get (and store) ``start``'s."""
        stored = self._call(lambda c: {k: c.fetch_consumer_offset(k[0], k[2], **at_broker(k[1]))
                                       for k in start})
        missing = {k: v for k, v in start.items() if stored[k] is None}

        def store(c: PullConsumerShape) -> None:
            for (topic, broker, queue_id), offset in missing.items():
                c.commit_offset(topic, queue_id, offset, **at_broker(broker))

        self._call(store)
        return {k: start[k] if stored[k] is None else int(stored[k] or 0) for k in start}

    def close(self) -> None:
        """Shut the consumer down (it is recreated on the next call)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.shutdown()
            except TxmqError as exc:  # already broken; nothing to release
                _log.debug("txmq source: shutdown failed: %s", exc)

