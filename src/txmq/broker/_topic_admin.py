"""Topic administration requests: every topic's config, a topic's per-queue stats, deleting a
topic (RocketMQ ``AdminBrokerProcessor``: GET_ALL_TOPIC_CONFIG 21, GET_TOPIC_STATS_INFO 202,
DELETE_TOPIC_IN_BROKER 215). Sans-IO, like the rest of the broker core.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from txmq.broker._actions import Action, Fail, Reply, ok_reply
from txmq.errors import ResponseCode
from txmq.protocol import (
    DEFAULT_TOPIC,
    PERM_READ,
    PERM_WRITE,
    Command,
    DeleteTopicRequestHeader,
    GetTopicStatsInfoRequestHeader,
    QueueTopicOffset,
    RequestCode,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicStatsTable,
    check_send_topic,
    encode_body,
    from_ext,
    is_broker_topic,
)

if TYPE_CHECKING:
    from txmq.broker._broker import Broker

__all__ = ["TopicAdmin"]

log = logging.getLogger("txmq.broker.topics")

Handler = Callable[[int, Command, int], list[Action]]


class TopicAdmin:
    """Answers the topic administration requests of ``txmq topic`` (and mqadmin).

    Args:
        broker: the broker whose topic table, store and consumer offsets it reads and changes.
    """

    def __init__(self, broker: Broker) -> None:
        self.b = broker

    def handlers(self) -> dict[int, Handler]:
        """Request code → handler, for the broker's dispatch table."""
        return {RequestCode.GET_ALL_TOPIC_CONFIG: self._all_configs,
                RequestCode.GET_TOPIC_STATS_INFO: self._stats,
                RequestCode.DELETE_TOPIC_IN_BROKER: self._delete}

    def configs(self) -> TopicConfigSerializeWrapper:
        """Every topic with its queue count; broker topics are read-only (``perm`` 4)."""
        table = {t: TopicConfig(topic_name=t, read_queue_nums=n, write_queue_nums=n,
                                perm=PERM_READ if is_broker_topic(t) else PERM_READ | PERM_WRITE)
                 for t, n in sorted(self.b.topics.snapshot().items())}
        return TopicConfigSerializeWrapper(topic_config_table=table)

    def stats(self, topic: str) -> TopicStatsTable:
        """Per queue of ``topic``: min and max queue offset and the store time (ms) of its newest
        message. Raises ``Fail`` TOPIC_NOT_EXIST (never auto-creates) or InvalidRequest."""
        n = self.b.topics.get(topic)
        if n is None:
            raise Fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        store, out = self.b.store, []
        for qid in range(n):
            lo, hi = store.queue_bounds(topic, qid)
            last = store.commit_log_offset_at(topic, qid, hi - 1) if hi > lo else None
            ts = store.read_at(last).store_timestamp_ms if last is not None else 0
            out.append(QueueTopicOffset(topic=topic, broker_name=self.b.config.broker_name,
                                        queue_id=qid, min_offset=lo, max_offset=hi,
                                        last_update_timestamp=ts))
        return TopicStatsTable(offset_table=out)

    def delete(self, topic: str) -> str:
        """Delete ``topic`` as mqadmin ``deleteTopic`` does on a broker: it leaves the topic
        table (and the name server's routes with the next registration) and every consumer
        group's offsets of it are dropped (``cleanOffsetByTopic``). Unlike RocketMQ, which deletes
        the consume queue files, the stored messages stay in the commit log and consume queues
        until retention removes them: a topic created again under the same name reads them
        again. Delay messages still waiting for it are parked when due (``txmq parked``).
        Refused (NO_PERMISSION): broker topics, the default topic, topics of the broker's
        configuration, and a topic with pending transactions (their commit would have nowhere to
        go: settle them first). Returns what was done, for the reply's remark."""
        check_send_topic(topic)
        if topic == DEFAULT_TOPIC or topic in self.b.config.topics:
            what = "the default topic" if topic == DEFAULT_TOPIC else "in the broker's configuration"
            raise Fail(ResponseCode.NO_PERMISSION,
                       f"topic {topic!r} is {what}; it would come back at the next start")
        pending = sum(1 for e in self.b.tx.index.pending.values() if e.real_topic == topic)
        if pending and topic in self.b.topics:
            raise Fail(ResponseCode.NO_PERMISSION,
                       f"topic {topic!r} has {pending} pending transactions; commit or roll them "
                       f"back first (txmq tx list)")
        n = self.b.topics.delete(topic)
        dropped = sum(self.b.offsets.reset(g, topic)
                      for g, ts in self.b.offsets.group_topics().items() if topic in ts)
        stored = sum(max(0, hi - lo) for lo, hi in
                     (self.b.store.queue_bounds(topic, q) for q in range(n)))
        log.warning("topic %s deleted (%d queues, %d consumer offsets dropped)", topic, n, dropped)
        return (f"topic {topic} deleted: {n} queues, {dropped} consumer offsets dropped; its "
                f"{stored} stored messages stay in the commit log until retention removes them "
                f"(a topic created again under this name reads them again)")

    def _all_configs(self, conn: int, cmd: Command, now: int) -> list[Action]:
        return ok_reply(conn, cmd, body=encode_body(self.configs()))

    def _stats(self, conn: int, cmd: Command, now: int) -> list[Action]:
        h = from_ext(cmd.ext, GetTopicStatsInfoRequestHeader)
        return ok_reply(conn, cmd, body=encode_body(self.stats(h.topic)))

    def _delete(self, conn: int, cmd: Command, now: int) -> list[Action]:
        remark = self.delete(from_ext(cmd.ext, DeleteTopicRequestHeader).topic)
        return [] if cmd.is_oneway else [Reply(conn, cmd.response(ResponseCode.SUCCESS, remark))]
