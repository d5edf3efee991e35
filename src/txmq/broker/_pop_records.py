"""Pop's stored records and receipt handles (RocketMQ 5 names).

A pop writes one checkpoint (CK) record per popped run of one queue, an ack writes one ack record,
both to queue 0 of the revive topic ``rmq_sys_REVIVE_LOG_<cluster>`` (RocketMQ
``PopAckConstants.REVIVE_TOPIC``), tagged ``ck`` / ``ack`` (``PopAckConstants.CK_TAG`` /
``ACK_TAG``). Bodies are JSON with the short field names of RocketMQ ``PopCheckPoint`` and
``AckMsg``; the store's record CRC covers them.

A receipt handle is the space-separated text of RocketMQ ``ExtraInfoUtil`` followed by the commit
log offset, as the proxy's ``ReceiptHandle`` adds it::

    ckQueueOffset startOffset popTime invisibleTime reviveQid topicType brokerName queueId
    queueOffset commitLogOffset

``topicType`` is ``1`` for a message popped from the group's retry topic, ``0`` otherwise.
"""

from __future__ import annotations

import msgspec

from txmq import limits
from txmq.errors import InvalidReceiptHandle

__all__ = ["ACK_TAG", "CK_TAG", "AckMsg", "Handle", "PopCheckPoint", "decode_record"]

CK_TAG = "ck"
"""Tag of a checkpoint record (RocketMQ ``PopAckConstants.CK_TAG``)."""
ACK_TAG = "ack"
"""Tag of an ack record (RocketMQ ``PopAckConstants.ACK_TAG``)."""


class PopCheckPoint(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One popped run of one queue (RocketMQ ``PopCheckPoint``): queue offsets
    ``so + d[i]`` for ``i < n``, invisible from ``pt`` for ``it`` ms (revive time ``pt + it``).

    ``at`` is txmq's: the delivery attempt of the run in a FIFO group (0: not FIFO, the attempt is
    the message's reconsume times + 1)."""

    so: int
    """startOffset: the first popped queue offset."""
    pt: int
    """popTime, ms since the epoch."""
    it: int
    """invisibleTime, ms."""
    bm: int = 0
    """bitMap of acked indexes (RocketMQ keeps it in memory; stored as 0)."""
    n: int
    """num: messages in the run."""
    q: int
    """queueId."""
    t: str
    """topic (the group's retry topic for a retry run)."""
    c: str
    """cid: the consumer group."""
    d: list[int]
    """queueOffsetDiff: offset of each message minus ``so``."""
    bn: str
    """brokerName."""
    at: int = 0

    @property
    def revive_time_ms(self) -> int:
        """``pt + it``: when un-acked messages of the run are delivered again."""
        return self.pt + self.it

    def offsets(self) -> list[int]:
        """The popped queue offsets, in order."""
        return [self.so + x for x in self.d]


class AckMsg(msgspec.Struct, kw_only=True):
    """One acked (or revived, or forwarded) offset of a checkpoint (RocketMQ ``AckMsg``).

    ``co`` is txmq's: the checkpoint's queue offset in the revive queue, so an ack names its
    checkpoint exactly (RocketMQ matches on topic, group, queue, start offset and pop time)."""

    ao: int
    """ackOffset: the acked queue offset."""
    so: int
    """startOffset of the checkpoint."""
    c: str
    """consumerGroup."""
    t: str
    """topic."""
    q: int
    """queueId."""
    pt: int
    """popTime of the checkpoint."""
    bn: str
    """brokerName."""
    co: int


_CK = msgspec.json.Decoder(PopCheckPoint)
_ACK = msgspec.json.Decoder(AckMsg)


def decode_record(tag: str, body: bytes) -> PopCheckPoint | AckMsg | None:
    """A revive topic record's body by its tag; None for another tag.

    Raises:
        msgspec.DecodeError: the body does not decode (the caller logs and skips it).
    """
    if tag == CK_TAG:
        return _CK.decode(body)
    if tag == ACK_TAG:
        return _ACK.decode(body)
    return None


class Handle(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed receipt handle (see the module docstring for its text)."""

    ck_offset: int
    start_offset: int
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    retry: bool
    broker_name: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int

    @property
    def invisible_until_ms(self) -> int:
        """When the handle expires."""
        return self.pop_time_ms + self.invisible_ms

    def encode(self) -> str:
        """The opaque text given to clients."""
        return " ".join(str(v) for v in (
            self.ck_offset, self.start_offset, self.pop_time_ms, self.invisible_ms,
            self.revive_qid, int(self.retry), self.broker_name, self.queue_id, self.queue_offset,
            self.commit_log_offset))

    @classmethod
    def parse(cls, text: str) -> Handle:
        """Parse a client's handle.

        Raises:
            InvalidReceiptHandle: not ten fields, or a number that does not parse.
        """
        short = isinstance(text, str) and len(text) <= limits.POP_RECEIPT_HANDLE_CHARS_MAX
        parts = text.split(" ") if short else []
        if len(parts) != _HANDLE_FIELDS or parts[5] not in ("0", "1"):
            raise InvalidReceiptHandle(f"receipt handle is not valid: {str(text)[:80]!r}")
        try:
            nums = [int(p) for i, p in enumerate(parts) if i != _BROKER_NAME_FIELD]
        except ValueError:
            raise InvalidReceiptHandle(f"receipt handle is not valid: {text[:80]!r}") from None
        if any(v < 0 for v in nums):
            raise InvalidReceiptHandle(f"receipt handle is not valid: {text[:80]!r}")
        ck, so, pt, it, rq, retry, qid, qo, clo = nums
        return cls(ck_offset=ck, start_offset=so, pop_time_ms=pt, invisible_ms=it, revive_qid=rq,
                   retry=retry == 1, broker_name=parts[_BROKER_NAME_FIELD], queue_id=qid,
                   queue_offset=qo, commit_log_offset=clo)


_HANDLE_FIELDS = 10
_BROKER_NAME_FIELD = 6
