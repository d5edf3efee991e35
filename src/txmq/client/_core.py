"""The sans-IO client core: request/response matching, message ids, queue allocation, offsets.

Nothing here opens a socket or reads the clock; the shells in :mod:`._async` and :mod:`._sync` do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum, IntEnum
from itertools import count
from typing import Any, Literal, TypeVar

import msgspec

from txmq import limits
from txmq.errors import ConfigError, MalformedHeader, RemoteError, ResponseCode
from txmq.protocol import (
    BROKER_ONLY_PROPERTIES,
    FLAG_ONEWAY,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RETRY_PREFIX,
    SERIALIZE_JSON,
    Command,
    ConsumerData,
    FrameDecoder,
    HeartbeatData,
    Message,
    MessageExt,
    MessageQueue,
    ProducerData,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    SubscriptionData,
    TopicRouteData,
    UniqKeyGenerator,
    decode_offset_msg_id,
    decode_route,
    encode_command,
    encode_properties,
    from_ext,
    retry_topic,
    sign_remoting,
    to_ext,
)

__all__ = [
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "LocalTransactionState",
    "MessageIdGenerator",
    "MessageModel",
    "ProcessQueue",
    "PullResult",
    "PullStatus",
    "RawPullResult",
    "RemotingCore",
    "RouteInfo",
    "SendResult",
    "SendStatus",
    "TransactionSendResult",
    "allocate",
    "allocate_averagely",
    "batches",
    "check_response",
    "consumer_heartbeat",
    "dead_letter_header",
    "decode_local_offsets",
    "encode_local_offsets",
    "is_consumed",
    "local_offset",
    "mq_sort_key",
    "orderly_failure",
    "producer_heartbeat",
    "rebalance_plan",
    "restore_retry_topic",
    "route_info",
    "send_request_header",
    "send_result",
    "set_delay_level",
    "start_offset_source",
]


Q = TypeVar("Q")


class LocalTransactionState(Enum):
    """What a local transaction decided (RocketMQ ``LocalTransactionState``)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"  # RocketMQ spells the value UNKNOW


class ConsumeStatus(Enum):
    """A listener's verdict (RocketMQ ``ConsumeConcurrentlyStatus``).

    An orderly listener may return it too: ``RECONSUME_LATER`` then means
    ``SUSPEND_CURRENT_QUEUE_A_MOMENT``.
    """

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(Enum):
    """An orderly listener's verdict (RocketMQ ``ConsumeOrderlyStatus``)."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


MessageModel = Literal["CLUSTERING", "BROADCASTING"]
"""Clustering: a group's members share the queues. Broadcasting: every member gets every message."""

ConsumeFromWhere = Literal["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                           "CONSUME_FROM_TIMESTAMP"]
"""Where a group with no stored offset starts (RocketMQ ``ConsumeFromWhere``)."""


class SendStatus(IntEnum):
    """RocketMQ ``SendStatus``: every value but SEND_OK means *stored on the master*, with a
    weaker guarantee than asked for (``MQClientAPIImpl.processSendResponse``)."""

    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    """Stored, not flushed to disk within the flush timeout (response code 10)."""
    FLUSH_SLAVE_TIMEOUT = 2
    """Stored on the master, no slave acknowledged it in time (response code 12)."""
    SLAVE_NOT_AVAILABLE = 3
    """Stored on the master, no slave in sync to replicate it (response code 11)."""


SEND_STATUS_OF_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
"""Response codes of a stored send → its status (RocketMQ ``processSendResponse``)."""

SEND_RETRY_CODES = frozenset({
    ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
    ResponseCode.SYSTEM_BUSY, ResponseCode.NO_PERMISSION, ResponseCode.GO_AWAY})
"""Error codes after which a send is tried again on another broker (RocketMQ
``DefaultMQProducer.retryResponseCodes``, less the codes txmq has no use for)."""


class PullStatus(Enum):
    """RocketMQ ``PullStatus``."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


class SendResult(msgspec.Struct, frozen=True):
    """Where a sent message was stored (RocketMQ ``SendResult``).

    Attributes:
        msg_id: the client message id (``UNIQ_KEY``).
        offset_msg_id: the broker's offset message id (store host + commit log offset).
        commit_log_offset: decoded from ``offset_msg_id`` (what RocketMQ's ``endTransaction``
            does).
        status: SEND_OK, or a weaker guarantee for a message that *was* stored
            (:class:`SendStatus`).
        broker_name: the broker group that stored it ("" when the broker did not say and the
            client was given only its address).
        master_epoch: the master epoch of the broker that stored it (txmq ``masterEpoch``, a
            broker in controller mode); None from a classic broker.
        region_id: the broker's region (its answer's ``MSG_REGION``; "" when it sent none), and
        trace_on: false when the broker asked for no message trace (``TRACE_ON`` "false"):
            RocketMQ ``SendResult.regionId`` / ``traceOn``.
    """

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    status: SendStatus = SendStatus.SEND_OK
    offset_msg_id: str = ""
    broker_name: str = ""
    master_epoch: int | None = None
    region_id: str = ""
    trace_on: bool = True

    @property
    def message_queue(self) -> MessageQueue:
        """Where it was stored (RocketMQ ``SendResult.messageQueue``)."""
        return MessageQueue(self.topic, self.queue_id, self.broker_name)


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
    broker_name: str = ""
    """The broker group holding the half."""

    @property
    def end_confirmed(self) -> bool:
        """False when the end request failed ("UNKNOWN_END"): check-back settles the
        transaction from the local transaction log."""
        return self.outcome != "UNKNOWN_END"


class PullResult(msgspec.Struct):
    """One pull's messages and where to continue."""

    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


class RawPullResult(msgspec.Struct):
    """One pull's reply body as the broker sent it (MessageExt records back to back, empty unless
    ``status`` is FOUND; :func:`txmq.protocol.decode_message_exts` reads it) and where to
    continue."""

    status: PullStatus
    body: bytes
    next_begin_offset: int
    min_offset: int
    max_offset: int


class MessageIdGenerator:
    """Unique client message ids (``UNIQ_KEY``) in RocketMQ's layout
    (:class:`~txmq.protocol.UniqKeyGenerator`: ip, pid, a per-client salt, ms since the start of
    the month and a 16-bit counter).

    Args:
        pid: the process id.
        salt: 4 random bytes telling two clients of one process apart.
        clock_ms: wall clock, ms since the epoch (a parameter, for simulations); read per id, so
            ids stay unique past 65,536 of them (the counter's range) as long as fewer than that
            are made in one ms.
        ip: the client's address as written into the id.
    """

    def __init__(self, pid: int, salt: bytes, clock_ms: Callable[[], int],
                 ip: str = "127.0.0.1") -> None:
        assert len(salt) == 4
        self._gen = UniqKeyGenerator(ip, pid, int.from_bytes(salt, "big"))
        self._clock = clock_ms

    def next(self) -> str:
        """The next id."""
        return self._gen.next(self._clock())


class RemotingCore:
    """Frames in, commands out; opaque numbering for requests. Requests go out in
    ``serialize_type`` (JSON: what measures faster here, see docs/benchmarks.md).

    With ``access_key`` and ``secret_key`` every request is signed as RocketMQ's
    ``AclClientRPCHook`` signs it (:func:`~txmq.protocol.sign_remoting`: ``AccessKey`` and
    ``Signature`` ext fields), for brokers with ACL on.
    """

    def __init__(self, serialize_type: int = SERIALIZE_JSON, *, access_key: str = "",
                 secret_key: str = "") -> None:
        if bool(access_key) != bool(secret_key):
            raise ConfigError("give both access_key and secret_key, or neither")
        self._decoder = FrameDecoder()
        self._opaque = count(1)
        self.serialize_type = serialize_type
        self._credentials = (access_key, secret_key)

    def request(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                oneway: bool = False) -> tuple[int, bytes]:
        """Encode a request; returns ``(opaque, frame bytes)``. Raises FrameTooLarge."""
        opaque = next(self._opaque)
        if self._credentials[0]:
            ext = sign_remoting(ext or {}, body, *self._credentials)
        cmd = Command(int(code), opaque, FLAG_ONEWAY if oneway else 0, ext=ext or {}, body=body,
                      serialize_type=self.serialize_type)
        return opaque, encode_command(cmd)

    def receive(self, data: bytes) -> list[Command]:
        """Feed bytes; returns complete commands. Raises ProtocolError on a broken stream."""
        return self._decoder.feed(data)


def check_response(cmd: Command, *ok: ResponseCode) -> Command:
    """Return ``cmd`` if its code is SUCCESS (or one of ``ok``), else raise RemoteError."""
    if cmd.code == ResponseCode.SUCCESS or cmd.code in ok:
        return cmd
    raise RemoteError.of(cmd.code, cmd.remark or "")


def send_request_header(msg: Message, group: str, queue_id: int, born_ms: int, *,
                        batch: bool = False) -> dict[str, str]:
    """The SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE header for ``msg`` (tags and keys travel in the
    properties string). Raises MalformedMessage for a property with a separator in it."""
    props = dict(msg.properties)
    if msg.tags:
        props["TAGS"] = msg.tags
    if msg.keys:
        props["KEYS"] = msg.keys
    return to_ext(SendMessageRequestHeaderV2(
        producer_group=group, topic=msg.topic, queue_id=queue_id, born_timestamp=born_ms,
        properties=encode_properties(props) if props else None, batch=batch or None))


def send_result(topic: str, msg_id: str, cmd: Command, broker_name: str = "") -> SendResult:
    """The :class:`SendResult` of a SEND_MESSAGE response (``msg_id``: the sent ``UNIQ_KEY``;
    for a batch, the first) whose code is SUCCESS or one of :data:`SEND_STATUS_OF_CODE`. Raises
    MalformedHeader for a header or an offset message id that does not decode (MalformedMessage)."""
    h = from_ext(cmd.ext, SendMessageResponseHeader)
    first = h.msg_id.split(",", 1)[0]
    _, offset = decode_offset_msg_id(first)
    return SendResult(msg_id, topic, h.queue_id, h.queue_offset, offset,
                      SEND_STATUS_OF_CODE[ResponseCode(cmd.code)], offset_msg_id=first,
                      broker_name=broker_name, master_epoch=h.master_epoch,
                      region_id=h.msg_region or "", trace_on=h.trace_on is not False)


class RouteInfo(msgspec.Struct, frozen=True):
    """What a client uses of a topic's route: the master broker's address and its write queue
    count (RocketMQ ``TopicPublishInfo`` of a one-broker route)."""

    broker_name: str
    addr: str
    queue_nums: int


def route_info(data: bytes, topic: str) -> RouteInfo:
    """The master broker and queue count of a ``TopicRouteData`` body. txmq's SDK uses the first
    broker with a master address; a route over several brokers is refused (ConfigError), as the
    SDK speaks to one broker per topic. Raises MalformedHeader for a body that does not decode."""
    route: TopicRouteData = decode_route(data)
    for qd in route.queue_datas:
        bd = next((b for b in route.broker_datas if b.broker_name == qd.broker_name), None)
        if bd is not None and 0 in bd.broker_addrs:
            if len(route.queue_datas) > 1:
                raise ConfigError(f"topic {topic!r} is on {len(route.queue_datas)} brokers; "
                                  "txmq's SDK writes to and reads from one broker per topic")
            return RouteInfo(qd.broker_name, bd.broker_addrs[0], qd.write_queue_nums)
    raise MalformedHeader(f"route of {topic!r} names no master broker")


def producer_heartbeat(client_id: str, groups: list[str]) -> HeartbeatData:
    """HEART_BEAT body of a producer client."""
    return HeartbeatData(client_id=client_id,
                         producer_data_set=[ProducerData(group_name=g) for g in groups])


def consumer_heartbeat(client_id: str, group: str, model: str, subscriptions: dict[str, str],
                       consume_from_where: str = "CONSUME_FROM_LAST_OFFSET") -> HeartbeatData:
    """HEART_BEAT body of a consumer client of ``group`` (``subscriptions``: topic → tag
    expression); ``CONSUME_ACTIVELY`` would be a pull consumer, txmq's consumers both push."""
    subs = [SubscriptionData(topic=t, sub_string=e) for t, e in subscriptions.items()]
    cd = ConsumerData(group_name=group, message_model=model, consume_from_where=consume_from_where,
                      subscription_data_set=subs)
    return HeartbeatData(client_id=client_id, consumer_data_set=[cd])


def ensure_msg_id(msg: Message, ids: MessageIdGenerator) -> str:
    """Give ``msg`` a ``UNIQ_KEY`` if it has none; return it."""
    if not msg.properties.get(PROPERTY_UNIQ_KEY):
        msg.properties = {**msg.properties, PROPERTY_UNIQ_KEY: ids.next()}
    return msg.properties[PROPERTY_UNIQ_KEY]


def set_delay_level(msg: Message, level: int) -> None:
    """Make ``msg`` a delay message of ``level`` (RocketMQ ``Message.setDelayTimeLevel``, property
    ``DELAY``). Raises ConfigError for a negative level; 0 clears it."""
    if level < 0:
        raise ConfigError(f"delay level {level} is negative")
    props = {k: v for k, v in msg.properties.items() if k != PROPERTY_DELAY_TIME_LEVEL}
    msg.properties = {**props, PROPERTY_DELAY_TIME_LEVEL: str(level)} if level else props


def mq_sort_key(mq: MessageQueue) -> tuple[str, str, int]:
    """RocketMQ's order of queues (``MessageQueue.compareTo``: topic, then broker name, then queue
    id); txmq's ``MessageQueue`` struct orders by its field order (topic, queue id, broker name)."""
    return mq.topic, mq.broker_name, mq.queue_id


def allocate_averagely(queues: Sequence[Q], client_ids: list[str], me: str,
                       key: Callable[[Q], Any] | None = None) -> list[Q]:
    """The queues ``me`` consumes: a contiguous block of the sorted queues (RocketMQ
    ``AllocateMessageQueueAveragely``); [] when ``me`` is not among ``client_ids``.

    Queues (by ``key``, e.g. :func:`mq_sort_key`) and client ids (as strings) are sorted first, as
    RocketMQ's ``RebalanceImpl.rebalanceByTopic`` does, so every member computes the same split.
    """
    cids = sorted(client_ids)
    mqs = sorted(queues, key=key)  # type: ignore[type-var, arg-type]
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


def allocate(topic_queues: Mapping[str, Sequence[MessageQueue]], client_ids: list[str], me: str,
             message_model: MessageModel) -> set[MessageQueue]:
    """Every queue ``me`` should consume: all of them when broadcasting, else its average share of
    each topic's queues over every broker group (RocketMQ ``RebalanceImpl.rebalanceByTopic``,
    queues sorted by :func:`mq_sort_key`).

    Args:
        topic_queues: topic → its subscribe queues (the retry topic included when clustering).
        client_ids: the group's members as a broker lists them. Clustering: a member not listed
            (an empty list included) owns nothing (RocketMQ's strategies return an empty set when
            ``cidAll`` lacks the current id).
    """
    out: set[MessageQueue] = set()
    for mqs in topic_queues.values():
        if message_model == "BROADCASTING":
            out.update(mqs)
        else:
            out.update(allocate_averagely(mqs, client_ids, me, mq_sort_key))
    return out


def rebalance_plan(owned: set[MessageQueue], wanted: set[MessageQueue]
                   ) -> tuple[list[MessageQueue], list[MessageQueue]]:
    """``(drop, add)``: queues to stop consuming and queues to start, each sorted."""
    return sorted(owned - wanted), sorted(wanted - owned)


CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
"""The producer group of a consumer's own sends (RocketMQ ``MixAll.CLIENT_INNER_PRODUCER_GROUP``)."""

_NOT_RESENT = BROKER_ONLY_PROPERTIES | {PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP,
                                        PROPERTY_DELAY_TIME_LEVEL, "TXMQ_SINK_BATCH", "TXMQ_SINK_TASK"}


def dead_letter_header(msg: MessageExt, group: str, max_reconsume_times: int,
                       born_ms: int) -> dict[str, str]:
    """The SEND_MESSAGE_V2 header that puts ``msg`` (body: ``msg.body``), out of an orderly
    consumer's local retries, into ``%DLQ%<group>`` with its retry count: a send to
    ``%RETRY%<group>`` whose ``reconsumeTimes`` (``msg.reconsume_times`` + 1) exceeds
    ``maxReconsumeTimes``, which the broker stores in the DLQ (RocketMQ
    ``ConsumeMessageOrderlyService.sendMessageBack``, ``SendMessageProcessor.handleRetryAndDLQ``).
    CONSUMER_SEND_MSG_BACK cannot carry a count kept by the client. Properties the broker sets,
    or that would make the copy a half or delay message, are left out."""
    props = {k: v for k, v in msg.properties.items() if k not in _NOT_RESENT}
    props[PROPERTY_RETRY_TOPIC] = msg.topic
    if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
        props[PROPERTY_ORIGIN_MESSAGE_ID] = msg.msg_id
    times = msg.reconsume_times + 1
    props[PROPERTY_RECONSUME_TIME] = str(times)
    props[PROPERTY_MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    if msg.tags:
        props["TAGS"] = msg.tags
    if msg.keys:
        props["KEYS"] = msg.keys
    return to_ext(SendMessageRequestHeaderV2(
        producer_group=CLIENT_INNER_PRODUCER_GROUP, topic=retry_topic(group), queue_id=0,
        born_timestamp=born_ms, flag=msg.flag, properties=encode_properties(props),
        reconsume_times=times, max_reconsume_times=max_reconsume_times))


def restore_retry_topic(msg: MessageExt) -> MessageExt:
    """A message read from ``%RETRY%<group>`` shows its original topic to the listener."""
    original = msg.properties.get(PROPERTY_RETRY_TOPIC)
    if original and msg.topic.startswith(RETRY_PREFIX):
        msg.topic = original
    return msg


def is_consumed(status: object) -> bool:
    """Whether a listener's return value means "consumed": ``CONSUME_SUCCESS`` or orderly
    ``SUCCESS``. Anything else (``RECONSUME_LATER``, ``SUSPEND_CURRENT_QUEUE_A_MOMENT``, None, a
    wrong type) is a failure, as in RocketMQ where a null status counts as RECONSUME_LATER."""
    return status is ConsumeStatus.CONSUME_SUCCESS or status is ConsumeOrderlyStatus.SUCCESS


def batches(msgs: list[MessageExt], size: int) -> list[list[MessageExt]]:
    """``msgs`` cut into listener calls of at most ``size`` (``consumeMessageBatchMaxSize``)."""
    assert size >= 1
    return [msgs[i:i + size] for i in range(0, len(msgs), size)]


def orderly_failure(msgs: list[MessageExt], max_reconsume_times: int) -> list[MessageExt]:
    """Orderly mode after a failed call: the messages that used up their retries (they go to the
    DLQ); every other message's ``reconsume_times`` is raised by one for the local retry
    (RocketMQ ``ConsumeMessageOrderlyService.checkReconsumeTimes``)."""
    dead = [m for m in msgs if m.reconsume_times >= max_reconsume_times]
    for m in msgs:
        if m.reconsume_times < max_reconsume_times:
            m.reconsume_times += 1
    return dead


def start_offset_source(stored: int | None, topic: str, consume_from_where: ConsumeFromWhere
                        ) -> int | Literal["min", "max", "timestamp"]:
    """Where a queue's consumption starts: the stored offset, else per ``ConsumeFromWhere`` (which
    only applies to a group with no offset). A retry topic always starts at its min offset."""
    if stored is not None and stored >= 0:
        return stored
    if topic.startswith(RETRY_PREFIX) or consume_from_where == "CONSUME_FROM_FIRST_OFFSET":
        return "min"
    if consume_from_where == "CONSUME_FROM_TIMESTAMP":
        return "timestamp"
    return "max"


def encode_local_offsets(offsets: dict[MessageQueue, int]) -> bytes:
    """The local offset file of a broadcasting consumer (RocketMQ ``LocalFileOffsetStore``):
    JSON ``{"offsetTable": {"<topic>@<broker name>@<queue id>": offset}}``; a queue with broker
    name "" (files of txmq before cluster routes) as ``"<topic>@<queue id>"``."""
    table = {(f"{mq.topic}@{mq.broker_name}@{mq.queue_id}" if mq.broker_name
              else f"{mq.topic}@{mq.queue_id}"): off
             for mq, off in sorted(offsets.items(), key=lambda kv: mq_sort_key(kv[0]))}
    return msgspec.json.encode({"offsetTable": table})


def decode_local_offsets(data: bytes) -> dict[MessageQueue, int]:
    """Parse :func:`encode_local_offsets` output (either key form). Raises ConfigError when it
    does not parse."""
    try:
        raw = msgspec.json.decode(data, type=dict[str, dict[str, int]])
        out: dict[MessageQueue, int] = {}
        for key, off in raw.get("offsetTable", {}).items():
            rest, _, qid = key.rpartition("@")
            topic, _, broker = rest.partition("@")
            if not topic:
                raise ValueError(f"key {key!r} is not topic[@broker]@queue")
            out[MessageQueue(topic, int(qid), broker)] = off
        return out
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"local offset file does not parse: {exc}") from exc


def local_offset(offsets: dict[MessageQueue, int], mq: MessageQueue,
                 sole_broker: bool) -> int | None:
    """``mq``'s offset in a local offset table: its own entry, else, when ``mq``'s topic is on one
    broker group only (``sole_broker``), the entry a file written before cluster routes keeps
    under broker name ""."""
    off = offsets.get(mq)
    if off is None and sole_broker and mq.broker_name:
        off = offsets.get(MessageQueue(mq.topic, mq.queue_id))
    return off


class ProcessQueue:
    """Messages of one queue pulled but not yet consumed (RocketMQ ``ProcessQueue``).

    Messages are kept in queue-offset order. The offset safe to commit is the smallest cached
    queue offset, or the next pull offset when nothing is cached, so a committed offset never
    passes an unconsumed message (I7). ``next_offset`` is -1 until the start offset is known.
    Orderly consumers also keep the queue's lock state here; times are monotonic ms.
    """

    def __init__(self, next_offset: int = -1) -> None:
        self.next_offset = next_offset
        self._msgs: dict[int, MessageExt] = {}  # queue offset -> message, ascending
        self._bytes = 0
        self.dropped = False
        self.committed_offset = -1
        self.locked = False
        self.last_lock_ms = 0
        self.lock_token: object = None

    def put(self, msgs: list[MessageExt], next_offset: int) -> list[MessageExt]:
        """Cache pulled messages; returns those not cached already. Sets the next pull offset."""
        new = [m for m in msgs if m.queue_offset not in self._msgs]
        for m in new:
            self._msgs[m.queue_offset] = m
            self._bytes += len(m.body)
        self.next_offset = next_offset
        return new

    def remove(self, msgs: list[MessageExt]) -> None:
        """Forget consumed (or parked) messages."""
        for m in msgs:
            if self._msgs.pop(m.queue_offset, None) is not None:
                self._bytes -= len(m.body)

    @property
    def cached_count(self) -> int:
        return len(self._msgs)

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    @property
    def span(self) -> int:
        """Queue offsets between the first and the last cached message (0 when empty)."""
        if not self._msgs:
            return 0
        return next(reversed(self._msgs)) - next(iter(self._msgs))

    def is_full(self, count_max: int, bytes_max: int, span_max: int = 0) -> bool:
        """Flow control: pulling pauses while any threshold is reached (``span_max`` 0: none)."""
        return (len(self._msgs) >= count_max or self._bytes >= bytes_max
                or (span_max > 0 and self.span >= span_max))

    def head(self, n: int) -> list[MessageExt]:
        """The first ``n`` cached messages in offset order (orderly mode takes them from here)."""
        out: list[MessageExt] = []
        for m in self._msgs.values():
            if len(out) >= n:
                break
            out.append(m)
        return out

    def commit_offset(self) -> int:
        """The offset to commit: smallest cached offset, else the next pull offset."""
        return next(iter(self._msgs)) if self._msgs else self.next_offset

    def on_locked(self, now_ms: int, token: object) -> None:
        """The broker granted or renewed this queue's lock at ``now_ms`` over connection ``token``."""
        self.locked, self.last_lock_ms, self.lock_token = True, now_ms, token

    def lock_valid(self, now_ms: int, token: object,
                   max_live_ms: int = limits.REBALANCE_LOCK_CLIENT_MAX_LIVE_TIME_MS) -> bool:
        """Whether an orderly consumer may consume now: locked over the current connection
        (``token``) and renewed within ``max_live_ms``."""
        return (self.locked and self.lock_token is token and token is not None
                and now_ms - self.last_lock_ms <= max_live_ms)
