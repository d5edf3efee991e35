"""The broker's topics and their queue counts, persisted as ``topics.json``.

At start: the saved table (or, if it is lost, the topics the store's consume queues show), plus
the system topics (transaction, parked, schedule) and the configured topics. Read-only to
everyone else: a :class:`~collections.abc.Mapping` of topic → queue count; changes go through
:meth:`TopicTable.create` (which saves) and the auto-create in :meth:`TopicTable.queue_nums`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

import msgspec

from txmq import limits
from txmq.broker._actions import Fail
from txmq.broker._config import BrokerConfig, parse_delay_levels
from txmq.broker._meta import load_json_meta
from txmq.broker._meta_log import META_TOPICS
from txmq.broker._schedule import SCHEDULE_TOPIC
from txmq.broker.transaction import (
    HALF_TOPIC,
    OP_TOPIC,
    SINK_BATCH_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from txmq.errors import ResponseCode, StoreError
from txmq.protocol import (
    PARKED_TOPIC,
    check_send_topic,
    check_topic,
    is_broker_topic,
    revive_topic,
)
from txmq.store import Store

__all__ = ["TOPICS_META", "TopicTable"]

log = logging.getLogger("txmq.broker")

TOPICS_META = "topics.json"
"""Name of the metadata blob (``meta/topics.json`` in a ``FileStore``)."""

_SYSTEM_TOPICS = {HALF_TOPIC: 1, OP_TOPIC: 1, TRANS_CHECK_MAX_TIME_TOPIC: 1, SINK_BATCH_TOPIC: 1,
                  PARKED_TOPIC: 1, **dict.fromkeys(META_TOPICS, 1)}
assert all(is_broker_topic(t) for t in (*_SYSTEM_TOPICS, SCHEDULE_TOPIC))


class TopicTable(Mapping[str, int]):
    """Topic → queue count.

    Args:
        config: ``topics`` (created at start when missing), ``message_delay_level`` (the schedule
            topic's queue count), ``auto_create_topic_enable``, ``default_topic_queue_nums``.
        store: where ``topics.json`` is loaded from and saved to. A full disk at start is logged,
            not fatal: the table is saved with the next change.
    """

    def __init__(self, config: BrokerConfig, store: Store) -> None:
        self._config, self._store = config, store
        saved = load_json_meta(store, TOPICS_META, dict[str, int],
                               "topics are re-derived from the stored consume queues")
        self._topics: dict[str, int] = dict(saved) if saved is not None else store.topic_queues()
        self._topics.update(_SYSTEM_TOPICS)
        self._topics[SCHEDULE_TOPIC] = len(parse_delay_levels(config.message_delay_level))
        self._topics[revive_topic(config.broker_cluster_name)] = 1  # pop's CK and ack records
        for name, n in config.topics.items():
            self._topics.setdefault(name, n)
        if config.trace_topic_enable:  # RocketMQ TopicConfigManager: traceTopicEnable
            for name in config.trace_topics():
                self._topics.setdefault(name, limits.TRACE_TOPIC_QUEUE_NUMS)
        self.on_change: Callable[[str, int], None] | None = None
        """Called with ``(topic, queue count)`` after :meth:`create` changed a topic or
        :meth:`delete` removed one (count 0): a master's system records (``MetaLog``)."""
        if self._topics != saved:  # a full disk must not stop the start (issue 11)
            try:
                self._save()
            except StoreError as exc:
                log.error("topics not saved at start (%s); they are saved with the next change",
                          exc)

    def __getitem__(self, topic: str) -> int:
        return self._topics[topic]

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def __iter__(self) -> Iterator[str]:
        return iter(self._topics)

    def __len__(self) -> int:
        return len(self._topics)

    def get(self, topic: str, default: int | None = None) -> int | None:  # type: ignore[override]
        """Queue count of ``topic``, or ``default`` (None) if it does not exist; no auto-create."""
        return self._topics.get(topic, default)

    def queue_nums(self, topic: str) -> int:
        """Queue count of ``topic``, created with ``default_topic_queue_nums`` queues when
        auto-creation is on (never a ``%`` topic). Raises InvalidRequest (illegal name) or
        :class:`~txmq.broker._actions.Fail` TOPIC_NOT_EXIST."""
        check_topic(topic)
        n = self._topics.get(topic)
        if n is None:
            if not self._config.auto_create_topic_enable or topic.startswith("%"):
                raise Fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
            n = self.create(topic, self._config.default_topic_queue_nums)
        return n

    def create(self, topic: str, queue_nums: int) -> int:
        """Create (or widen) a topic and save the table; returns its queue count. The name must
        pass :func:`~txmq.protocol.check_send_topic` (its charset has no ``@``, which separates
        the parts of a consumer offset key, and no ``.`` or ``/``); broker topics are refused.
        Raises InvalidRequest, ``Fail`` MESSAGE_ILLEGAL (queue count not in 1..QUEUE_NUMS_MAX)
        or StoreError (the table stays changed in memory)."""
        check_send_topic(topic)
        if not 0 < queue_nums <= limits.QUEUE_NUMS_MAX:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL,
                       f"queue count {queue_nums} not in 1..{limits.QUEUE_NUMS_MAX}")
        if self._topics.get(topic, 0) < queue_nums:
            self._topics[topic] = queue_nums
            if self.on_change is not None:
                self.on_change(topic, queue_nums)
            self._save()
        return self._topics[topic]

    def delete(self, topic: str) -> int:
        """Remove ``topic`` from the table and save it; returns the queue count it had. The stored
        messages are not touched (see :class:`~txmq.broker.TopicAdmin`). Raises InvalidRequest
        (illegal name, or NO_PERMISSION for a broker topic), ``Fail`` TOPIC_NOT_EXIST, or
        StoreError (the table stays changed in memory)."""
        check_send_topic(topic)
        n = self._topics.pop(topic, None)
        if n is None:
            raise Fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        if self.on_change is not None:
            self.on_change(topic, 0)
        self._save()
        return n

    def follow(self, topic: str, queue_nums: int) -> None:
        """Apply a system record: ``topic`` has ``queue_nums`` queues (0: deleted), without calling
        :attr:`on_change`; saved if it changed. The record's decoder checked the name and count.
        Raises StoreError (the table stays changed in memory)."""
        if queue_nums == 0:
            changed = self._topics.pop(topic, None) is not None
        else:
            changed = self._topics.get(topic) != queue_nums
            self._topics[topic] = queue_nums
        if changed:
            self._save()

    def snapshot(self) -> dict[str, int]:
        """A copy of the table (topic → queue count), e.g. for name server registration."""
        return dict(self._topics)

    def _save(self) -> None:
        self._store.save_meta(TOPICS_META, msgspec.json.encode(self._topics))
