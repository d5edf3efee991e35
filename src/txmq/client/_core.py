"""The sans-IO client core: request/response matching, message ids, queue allocation, offsets.

Nothing here opens a socket or reads the clock; the shells in :mod:`._async` and :mod:`._sync` do.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from itertools import count
from typing import Any

import msgspec

from txmq.errors import RemoteError, ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
    Command,
    FrameDecoder,
    Message,
    MessageExt,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    encode_command,
    from_ext,
    to_ext,
)

__all__ = [
    "ConsumeStatus",
    "LocalTransactionState",
    "MessageIdGenerator",
    "ProcessQueue",
    "PullResult",
    "PullStatus",
    "RemotingCore",
    "SendResult",
    "SendStatus",
    "TransactionSendResult",
    "allocate_averagely",
    "check_response",
    "restore_retry_topic",
    "send_request_header",
]


class LocalTransactionState(Enum):
    """What a local transaction decided (RocketMQ ``LocalTransactionState``)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"  # RocketMQ spells the value UNKNOW


class ConsumeStatus(Enum):
    """A listener's verdict (RocketMQ ``ConsumeConcurrentlyStatus``)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class SendStatus(IntEnum):
    SEND_OK = 0


class PullStatus(Enum):
    """RocketMQ ``PullStatus``."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


class SendResult(msgspec.Struct, frozen=True):
    """Where a sent message was stored."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    status: SendStatus = SendStatus.SEND_OK


class TransactionSendResult(msgspec.Struct, frozen=True):
    """Result of ``send_message_in_transaction``: the half message and the local outcome.

    ``outcome`` is the broker's recorded state after the end request ("COMMIT", "ROLLBACK", or
    "PENDING" for UNKNOWN, which check-back settles later).
    """

    msg_id: str
    topic: str
    queue_id: int
    half_offset: int
    local_transaction_state: LocalTransactionState
    outcome: str


class PullResult(msgspec.Struct):
    """One pull's messages and where to continue."""

    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


class MessageIdGenerator:
    """Unique client message ids (``UNIQ_KEY``): 32 hex digits of pid, start time and a counter.

    Args:
        pid: the process id (a parameter so simulations are deterministic).
        start_ms: when the client started, ms since the epoch.
        salt: 4 random bytes telling two clients of one process apart.
    """

    def __init__(self, pid: int, start_ms: int, salt: bytes) -> None:
        assert len(salt) == 4
        self._prefix = f"{pid & 0xFFFFFFFF:08X}{salt.hex().upper()}{start_ms & 0xFFFFFFFF:08X}"
        self._seq = count()

    def next(self) -> str:
        """The next id; unique for 2**32 messages of this generator."""
        return f"{self._prefix}{next(self._seq) & 0xFFFFFFFF:08X}"


class RemotingCore:
    """Frames in, commands out; opaque numbering for requests."""

    def __init__(self) -> None:
        self._decoder = FrameDecoder()
        self._opaque = count(1)

    def request(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"",
                oneway: bool = False) -> tuple[int, bytes]:
        """Encode a request; returns ``(opaque, frame bytes)``. Raises FrameTooLarge."""
        opaque = next(self._opaque)
        cmd = Command(code=int(code), opaque=opaque, flags=FLAG_ONEWAY if oneway else 0,
                      ext=ext or {}, body=body)
        return opaque, encode_command(cmd)

    def receive(self, data: bytes) -> list[Command]:
        """Feed bytes; returns complete commands. Raises ProtocolError on a broken stream."""
        return self._decoder.feed(data)


def check_response(cmd: Command, *ok: ResponseCode) -> Command:
    """Return ``cmd`` if its code is SUCCESS (or one of ``ok``), else raise RemoteError."""
    if cmd.code == ResponseCode.SUCCESS or cmd.code in ok:
        return cmd
    raise RemoteError(cmd.code, cmd.remark)


def send_request_header(msg: Message, group: str, queue_id: int, born_ms: int) -> dict[str, Any]:
    """The SEND_MESSAGE header fields for ``msg``."""
    return to_ext(SendMessageRequestHeader(
        producer_group=group, topic=msg.topic, queue_id=queue_id, tags=msg.tags, keys=msg.keys,
        properties=msg.properties, born_timestamp_ms=born_ms))


def send_result(topic: str, cmd: Command) -> SendResult:
    h = from_ext(cmd.ext, SendMessageResponseHeader)
    return SendResult(h.msg_id, topic, h.queue_id, h.queue_offset, h.commit_log_offset)


def ensure_msg_id(msg: Message, ids: MessageIdGenerator) -> str:
    """Give ``msg`` a ``UNIQ_KEY`` if it has none; return it."""
    if not msg.properties.get(PROPERTY_UNIQ_KEY):
        msg.properties = {**msg.properties, PROPERTY_UNIQ_KEY: ids.next()}
    return msg.properties[PROPERTY_UNIQ_KEY]


def allocate_averagely(queues: list[int], client_ids: list[str], me: str) -> list[int]:
    """The queues ``me`` consumes (RocketMQ ``AllocateMessageQueueAveragely``).

    Queues and client ids are sorted first, so every member computes the same split.
    """
    cids = sorted(client_ids)
    mqs = sorted(queues)
    if me not in cids or not mqs:
        return []
    index = cids.index(me)
    mod = len(mqs) % len(cids)
    if len(mqs) <= len(cids):
        size = 1
    elif mod > 0 and index < mod:
        size = len(mqs) // len(cids) + 1
    else:
        size = len(mqs) // len(cids)
    start = index * size if mod > 0 and index < mod else index * size + mod
    n = min(size, len(mqs) - start)
    return [mqs[(start + i) % len(mqs)] for i in range(max(n, 0))]


def restore_retry_topic(msg: MessageExt) -> MessageExt:
    """A message read from ``%RETRY%<group>`` shows its original topic to the listener."""
    original = msg.properties.get(PROPERTY_RETRY_TOPIC)
    if original and msg.topic.startswith("%RETRY%"):
        msg.topic = original
    return msg


class ProcessQueue:
    """Messages of one queue pulled but not yet consumed (RocketMQ ``ProcessQueue``).

    The offset safe to commit is the smallest in-flight queue offset, or the next pull offset when
    nothing is in flight, so a committed offset never passes an unconsumed message (I7).
    """

    def __init__(self, next_offset: int) -> None:
        self.next_offset = next_offset
        self._in_flight: dict[int, int] = {}  # queue offset -> body size
        self.dropped = False

    def put(self, msgs: list[MessageExt], next_offset: int) -> None:
        for m in msgs:
            self._in_flight[m.queue_offset] = len(m.body)
        self.next_offset = next_offset

    def remove(self, queue_offset: int) -> None:
        self._in_flight.pop(queue_offset, None)

    @property
    def cached_count(self) -> int:
        return len(self._in_flight)

    @property
    def cached_bytes(self) -> int:
        return sum(self._in_flight.values())

    def commit_offset(self) -> int:
        return min(self._in_flight) if self._in_flight else self.next_offset
