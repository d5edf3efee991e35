"""The retry (or DLQ) copy of a consumed message, shared by send-back and pop's revive."""

from __future__ import annotations

from txmq.protocol import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC, PROPERTY_UNIQ_KEY, MessageExt
from txmq.store import Record

__all__ = ["retry_record"]


def retry_record(m: MessageExt, topic: str, now_ms: int, origin_msg_id: str = "") -> Record:
    """``m`` copied to ``topic`` (a ``%RETRY%`` or ``%DLQ%`` topic, queue 0) with reconsume times
    + 1, the same body, tags, keys, flag, born host and born time, its original topic in
    ``RETRY_TOPIC`` and its id in ``ORIGIN_MESSAGE_ID`` (kept when already set; RocketMQ
    ``SendMessageProcessor.consumerSendMsgBack``, ``PopReviveService.reviveRetry``)."""
    props = dict(m.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, m.topic)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_msg_id or props.get(PROPERTY_UNIQ_KEY, ""))
    return Record(topic=topic, queue_id=0, body=m.body, tags=m.tags, keys=m.keys, properties=props,
                  born_timestamp_ms=m.born_timestamp_ms, store_timestamp_ms=now_ms,
                  reconsume_times=m.reconsume_times + 1, flag=m.flag, born_host=m.born_host)
