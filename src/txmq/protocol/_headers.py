"""The typed request and response headers, with RocketMQ's field names on the wire.

A header travels as the command's ``extFields``: a map of strings. Each class here is one of
RocketMQ's ``*RequestHeader`` / ``*ResponseHeader`` classes (``remoting/protocol/header``), its
Python attributes in snake_case and its wire names RocketMQ's (camelCase, or the short ``a``...``n``
of :class:`SendMessageRequestHeaderV2`). :func:`to_ext` writes a header as strings the way Java's
``RemotingCommand.makeCustomHeaderToNet`` does (None fields left out, booleans ``true`` /
``false``); :func:`from_ext` reads one, converting numbers and booleans from their strings, and
raises :class:`~txmq.errors.MalformedHeader` with RocketMQ's remark when a required field is missing
or a value does not parse. txmq's extension headers (codes >= 9000) follow the same rules.
"""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Any, TypeVar

import msgspec

from txmq.errors import MalformedHeader
from txmq.protocol._codes import RequestCode
from txmq.protocol._remoting import Command

__all__ = [
    "DEFAULT_TOPIC",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "PULL_FLAG_COMMIT_OFFSET",
    "PULL_FLAG_SUBSCRIPTION",
    "PULL_FLAG_SUSPEND",
    "AdminEndTransactionRequestHeader",
    "CheckTransactionStateRequestHeader",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "DeleteTopicRequestHeader",
    "EndTransactionRequestHeader",
    "EndTransactionResponseHeader",
    "ExchangeHaInfoRequestHeader",
    "ExchangeHaInfoResponseHeader",
    "GetConsumerListByGroupRequestHeader",
    "GetMaxOffsetRequestHeader",
    "GetMinOffsetRequestHeader",
    "JLong",
    "NotifyConsumerIdsChangedRequestHeader",
    "OffsetResponseHeader",
    "PendingTransactionsRequestHeader",
    "PendingTransactionsResponseHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "QueryConsumerOffsetRequestHeader",
    "QueryMessageRequestHeader",
    "QueryMessageResponseHeader",
    "ResumeCheckHalfMessageRequestHeader",
    "ResumeResponseHeader",
    "SearchOffsetRequestHeader",
    "SendHeader",
    "SendMessageRequestHeader",
    "SendMessageRequestHeaderV2",
    "SendMessageResponseHeader",
    "SinkBatchRequestHeader",
    "TransactionIdRequestHeader",
    "UnregisterClientRequestHeader",
    "UpdateConsumerOffsetRequestHeader",
    "ViewMessageByUniqKeyRequestHeader",
    "ViewMessageRequestHeader",
    "from_ext",
    "from_ext_list",
    "from_ext_list_json",
    "send_header",
    "to_ext",
]

# RocketMQ PullSysFlag bits of PullMessageRequestHeader.sysFlag.
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4

DEFAULT_TOPIC = "TBW102"
"""The topic clients name as ``defaultTopic`` for auto-create (RocketMQ
``TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC``)."""
DEFAULT_TOPIC_QUEUE_NUMS = 4
"""RocketMQ ``DefaultMQProducer.defaultTopicQueueNums``."""

T = TypeVar("T", bound=msgspec.Struct)


def _conv(expr: str, tp: Any) -> str:
    if tp is bool:
        return f"('true' if {expr} else 'false')"
    return expr if tp is str else f"str({expr})"


@functools.cache
def _ext_writer(cls: type[msgspec.Struct]) -> Any:
    """A function writing ``cls`` as ext fields, generated once per class from its fields: a
    header is written on every send, and a generic loop over the fields costs it 2-3 µs more."""
    fixed, optional = [], []
    for f in msgspec.structs.fields(cls):
        args = typing.get_args(f.type)
        if type(None) in args:
            inner = next(a for a in args if a is not type(None))
            optional.append(f"    v = h.{f.name}\n    if v is not None:\n"
                            f"        out[{f.encode_name!r}] = {_conv('v', inner)}")
        else:
            fixed.append(f"{f.encode_name!r}: {_conv('h.' + f.name, f.type)}")
    src = "def write(h):\n    out = {" + ", ".join(fixed) + "}\n" + "\n".join(optional)
    scope: dict[str, Any] = {}
    exec(src + "\n    return out\n", scope)
    return scope["write"]


def to_ext(header: msgspec.Struct) -> dict[str, str]:
    """The ``extFields`` of a header: wire names to strings, None fields left out."""
    return _ext_writer(type(header))(header)  # type: ignore[no-any-return]


def _remark(exc: msgspec.ValidationError, cls: type[Any]) -> str:
    text = str(exc)
    if text.startswith("Object missing required field `"):
        return f"the custom field <{text.split('`')[1]}> is null"
    return f"bad {cls.__name__}: {text}"


JLong = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An integer header field: a Java ``long``, so a number out of its range is a malformed header
(checked in msgspec's conversion, at C speed)."""


def from_ext(ext: dict[str, str], cls: type[T]) -> T:
    """Read header ``cls`` from ``extFields``. Integers must fit a Java ``long`` (:data:`JLong`);
    unlike Java's ``Long.parseLong``, an integral number written as a float (``1e3``, ``1.0``) is
    read as that integer.

    Raises:
        MalformedHeader: a required field is missing (remark ``the custom field <name> is null``,
            as RocketMQ's ``RemotingCommand.decodeCommandCustomHeader``) or a value does not parse.
    """
    try:
        return msgspec.convert(ext, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise MalformedHeader(_remark(exc, cls)) from exc


def from_ext_list(exts: list[dict[str, str]], cls: type[T]) -> list[T]:
    """:func:`from_ext` of every ``extFields`` of a list at once (one conversion: a batch of
    headers). Raises MalformedHeader when any one does not read (read them one by one to know
    which)."""
    try:
        return msgspec.convert(exts, list[cls], strict=False)  # type: ignore[valid-type]
    except msgspec.ValidationError as exc:
        raise MalformedHeader(_remark(exc, cls)) from exc


@functools.cache
def _ext_list_decoder(cls: type[T]) -> msgspec.json.Decoder[list[T]]:
    return msgspec.json.Decoder(list[cls], strict=False)  # type: ignore[valid-type]


def from_ext_list_json(data: bytes, cls: type[T]) -> list[T]:
    """:func:`from_ext_list` of a JSON list of ``extFields`` objects, read in one pass (no
    dictionary per entry: an END_TRANSACTION_BATCH body, where the two steps cost about twice as
    much, docs/benchmarks.md). As lax as :func:`from_ext`, and about values too: a number or a
    boolean where ``extFields`` hold strings is read as one. Raises MalformedHeader when the
    body is not such a list or any entry does not read (read them one by one to know which)."""
    try:
        return _ext_list_decoder(cls).decode(data)
    except msgspec.ValidationError as exc:
        raise MalformedHeader(_remark(exc, cls)) from exc
    except msgspec.DecodeError as exc:
        raise MalformedHeader(f"bad {cls.__name__} list: {exc}") from exc


class _Header(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=False):
    """Base of every header: snake_case attributes, camelCase wire names."""


# --- send -------------------------------------------------------------------------------------


class SendMessageRequestHeader(_Header, kw_only=True):
    """SEND_MESSAGE (10): body = the message body, ``properties`` = the properties string
    (``key \\u0001 value \\u0002``). RocketMQ ``SendMessageRequestHeader``; ``born_timestamp`` in
    ms since the epoch; ``queue_id`` -1 lets the broker choose."""

    producer_group: str
    topic: str
    default_topic: str = DEFAULT_TOPIC
    default_topic_queue_nums: JLong = DEFAULT_TOPIC_QUEUE_NUMS
    queue_id: JLong
    sys_flag: JLong = 0
    born_timestamp: JLong
    flag: JLong = 0
    properties: str | None = None
    reconsume_times: JLong | None = None
    unit_mode: bool | None = None
    batch: bool | None = None
    max_reconsume_times: JLong | None = None
    broker_name: str | None = msgspec.field(default=None, name="bname")


class SendMessageRequestHeaderV2(msgspec.Struct, kw_only=True):
    """SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): :class:`SendMessageRequestHeader`
    with one-letter wire names (RocketMQ ``SendMessageRequestHeaderV2``: a producerGroup, b topic,
    c defaultTopic, d defaultTopicQueueNums, e queueId, f sysFlag, g bornTimestamp, h flag,
    i properties, j reconsumeTimes, k unitMode, l maxReconsumeTimes, m batch, n brokerName).
    The Python attributes are V1's, so code reading a send header takes either class."""

    producer_group: str = msgspec.field(name="a")
    topic: str = msgspec.field(name="b")
    default_topic: str = msgspec.field(default=DEFAULT_TOPIC, name="c")
    default_topic_queue_nums: JLong = msgspec.field(default=DEFAULT_TOPIC_QUEUE_NUMS, name="d")
    queue_id: JLong = msgspec.field(name="e")
    sys_flag: JLong = msgspec.field(default=0, name="f")
    born_timestamp: JLong = msgspec.field(name="g")
    flag: JLong = msgspec.field(default=0, name="h")
    properties: str | None = msgspec.field(default=None, name="i")
    reconsume_times: JLong | None = msgspec.field(default=None, name="j")
    unit_mode: bool | None = msgspec.field(default=None, name="k")
    max_reconsume_times: JLong | None = msgspec.field(default=None, name="l")
    batch: bool | None = msgspec.field(default=None, name="m")
    broker_name: str | None = msgspec.field(default=None, name="n")

    def to_v1(self) -> SendMessageRequestHeader:
        """RocketMQ ``SendMessageRequestHeaderV2.createSendMessageRequestHeaderV1``."""
        return SendMessageRequestHeader(**msgspec.structs.asdict(self))

    @classmethod
    def from_v1(cls, v1: SendMessageRequestHeader) -> SendMessageRequestHeaderV2:
        """RocketMQ ``SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2``."""
        return cls(**msgspec.structs.asdict(v1))


SendHeader = SendMessageRequestHeader | SendMessageRequestHeaderV2
"""A send request's header as either class (the same attributes)."""


def send_header(cmd: Command) -> SendHeader:
    """The header of a SEND_MESSAGE (V1 names) or SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (V2 names)
    request. Raises MalformedHeader."""
    if cmd.code == RequestCode.SEND_MESSAGE:
        return from_ext(cmd.ext, SendMessageRequestHeader)
    return from_ext(cmd.ext, SendMessageRequestHeaderV2)


class SendMessageResponseHeader(_Header, kw_only=True):
    """Where a sent message was stored (RocketMQ ``SendMessageResponseHeader``). ``msg_id`` is
    the offset message id (store host + commit log offset); for a batch, the ids joined by
    commas and ``queue_offset`` the first message's."""

    msg_id: str
    queue_id: JLong
    queue_offset: JLong
    transaction_id: str | None = None
    batch_uniq_id: str | None = None
    master_epoch: JLong | None = None
    """txmq extension: the master epoch of the broker that stored it (controller mode); the
    producer puts it on the half's END_TRANSACTION."""
    msg_region: str | None = msgspec.field(default=None, name="MSG_REGION")
    """The broker's region (RocketMQ ``SendMessageProcessor`` adds ``MSG_REGION`` to every send
    response; txmq's broker when it hosts message trace): clients write it into their message
    trace records."""
    trace_on: bool | None = msgspec.field(default=None, name="TRACE_ON")
    """The broker's ``traceOn`` (ext field ``TRACE_ON``): false asks clients not to trace the
    message (Java clients trace unless it is ``false``; the C++ client only when ``true``)."""


# --- pull and offsets -------------------------------------------------------------------------


class PullMessageRequestHeader(_Header, kw_only=True):
    """PULL_MESSAGE (11), RocketMQ ``PullMessageRequestHeader``. ``sys_flag`` holds
    ``PULL_FLAG_*``: commit ``commit_offset`` first, hold the request up to
    ``suspend_timeout_millis`` when nothing is there, ``subscription`` is set."""

    consumer_group: str
    topic: str
    queue_id: JLong
    queue_offset: JLong
    max_msg_nums: JLong
    sys_flag: JLong = 0
    commit_offset: JLong = 0
    suspend_timeout_millis: JLong = 0
    subscription: str | None = None
    sub_version: JLong = 0
    expression_type: str | None = None
    max_msg_bytes: JLong | None = None


class PullMessageResponseHeader(_Header, kw_only=True):
    """Where to pull next, and the queue's bounds (RocketMQ ``PullMessageResponseHeader``)."""

    suggest_which_broker_id: JLong = 0
    next_begin_offset: JLong
    min_offset: JLong
    max_offset: JLong


class QueryConsumerOffsetRequestHeader(_Header, kw_only=True):
    """QUERY_CONSUMER_OFFSET (14); answered QUERY_NOT_FOUND (22) when none is stored."""

    consumer_group: str
    topic: str
    queue_id: JLong
    set_zero_if_not_found: bool | None = None


class UpdateConsumerOffsetRequestHeader(_Header, kw_only=True):
    """UPDATE_CONSUMER_OFFSET (15)."""

    consumer_group: str
    topic: str
    queue_id: JLong
    commit_offset: JLong


class OffsetResponseHeader(_Header, kw_only=True):
    """The answer of QUERY_CONSUMER_OFFSET, GET_MAX_OFFSET, GET_MIN_OFFSET and
    SEARCH_OFFSET_BY_TIMESTAMP (RocketMQ's ``*ResponseHeader`` with one ``offset`` field)."""

    offset: JLong


class GetMaxOffsetRequestHeader(_Header, kw_only=True):
    """GET_MAX_OFFSET (30): the queue's next offset to be written."""

    topic: str
    queue_id: JLong
    committed: bool = True


class GetMinOffsetRequestHeader(_Header, kw_only=True):
    """GET_MIN_OFFSET (31)."""

    topic: str
    queue_id: JLong


class SearchOffsetRequestHeader(_Header, kw_only=True):
    """SEARCH_OFFSET_BY_TIMESTAMP (29): the first offset stored at or after ``timestamp`` (ms);
    the queue's max offset when every message is older, its min offset when every one is newer."""

    topic: str
    queue_id: JLong
    timestamp: JLong
    boundary_type: str | None = None


class ConsumerSendMsgBackRequestHeader(_Header, kw_only=True):
    """CONSUMER_SEND_MSG_BACK (36): put the message stored at commit log ``offset`` into the
    group's retry topic (or its DLQ after ``max_reconsume_times``; RocketMQ default 16)."""

    offset: JLong
    group: str
    delay_level: JLong
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: JLong | None = None


# --- transactions -----------------------------------------------------------------------------


class EndTransactionRequestHeader(_Header, kw_only=True):
    """END_TRANSACTION (37): settle the half message at ``tran_state_table_offset`` (its queue
    offset) / ``commit_log_offset``; ``commit_or_rollback`` is ``TRANSACTION_*_TYPE``
    (RocketMQ ``EndTransactionRequestHeader``)."""

    topic: str | None = None
    producer_group: str
    tran_state_table_offset: JLong
    commit_log_offset: JLong
    commit_or_rollback: JLong
    from_transaction_check: bool = False
    msg_id: str
    transaction_id: str | None = None
    master_epoch: JLong | None = None
    """txmq extension: the master epoch the half was stored under (its send answer's); a broker
    refuses an end whose epoch is not its own where that could act on another message
    (docs/replication.md)."""


class EndTransactionResponseHeader(_Header, kw_only=True):
    """txmq: the transaction's recorded outcome (COMMIT, ROLLBACK, PENDING, DISCARD);
    ``duplicate`` when it was decided before. RocketMQ answers END_TRANSACTION with no header."""

    outcome: str
    duplicate: bool = False


class ExchangeHaInfoRequestHeader(_Header, kw_only=True):
    """EXCHANGE_BROKER_HA_INFO (906; RocketMQ ``ExchangeHAInfoRequestHeader``): all None asks
    the broker for its HA info; ``masterHaAddress`` set tells a slave where its master is."""

    master_ha_address: str | None = None
    master_flush_offset: int | None = None
    master_address: str | None = None


class ExchangeHaInfoResponseHeader(_Header, kw_only=True):
    """The answer to EXCHANGE_BROKER_HA_INFO (RocketMQ ``ExchangeHAInfoResponseHeader``): the
    answering broker's HA address, flushed commit log end and remoting address."""

    master_ha_address: str | None = None
    master_flush_offset: int | None = None
    master_address: str | None = None


class CheckTransactionStateRequestHeader(_Header, kw_only=True):
    """CHECK_TRANSACTION_STATE (39, broker to producer); body = the half message as a MessageExt
    record with its real topic (RocketMQ ``CheckTransactionStateRequestHeader``)."""

    topic: str | None = None
    tran_state_table_offset: JLong
    commit_log_offset: JLong
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None


class ResumeCheckHalfMessageRequestHeader(_Header, kw_only=True):
    """RESUME_CHECK_HALF_MESSAGE (323): put a parked half message back into checking; txmq also
    accepts ``half:<offset>`` as ``msg_id``."""

    topic: str | None = None
    msg_id: str


# --- clients ----------------------------------------------------------------------------------


class UnregisterClientRequestHeader(_Header, kw_only=True):
    """UNREGISTER_CLIENT (35)."""

    client_id: str = msgspec.field(name="clientID")
    producer_group: str | None = None
    consumer_group: str | None = None


class GetConsumerListByGroupRequestHeader(_Header, kw_only=True):
    """GET_CONSUMER_LIST_BY_GROUP (38); body of the answer ``{"consumerIdList": [...]}``."""

    consumer_group: str


class NotifyConsumerIdsChangedRequestHeader(_Header, kw_only=True):
    """NOTIFY_CONSUMER_IDS_CHANGED (40, broker to consumer, one-way)."""

    consumer_group: str


# --- topics and messages ----------------------------------------------------------------------


class CreateTopicRequestHeader(_Header, kw_only=True):
    """UPDATE_AND_CREATE_TOPIC (17), RocketMQ ``CreateTopicRequestHeader`` (txmq reads
    ``write_queue_nums`` as the queue count; ``perm`` 6 is read + write)."""

    topic: str
    default_topic: str = DEFAULT_TOPIC
    read_queue_nums: JLong
    write_queue_nums: JLong
    perm: JLong = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: JLong | None = None
    order: bool = False


class DeleteTopicRequestHeader(_Header, kw_only=True):
    """DELETE_TOPIC_IN_BROKER (215)."""

    topic: str


class QueryMessageRequestHeader(_Header, kw_only=True):
    """QUERY_MESSAGE (12): at most ``max_num`` durable messages of ``topic`` whose keys include
    ``key``, stored within ``[begin_timestamp, end_timestamp]`` (ms), newest first."""

    topic: str
    key: str
    max_num: JLong = 32
    begin_timestamp: JLong = 0
    end_timestamp: JLong = 2**63 - 1


class QueryMessageResponseHeader(_Header, kw_only=True):
    """RocketMQ ``QueryMessageResponseHeader``: how current the index is."""

    index_last_update_timestamp: JLong
    index_last_update_phyoffset: JLong


class ViewMessageRequestHeader(_Header, kw_only=True):
    """VIEW_MESSAGE_BY_ID (33): the one record at commit log ``offset``."""

    topic: str | None = None
    offset: JLong


class ViewMessageByUniqKeyRequestHeader(_Header, kw_only=True):
    """txmq VIEW_MESSAGE_BY_UNIQ_KEY: every stored copy of the message ``msg_id`` (``UNIQ_KEY``)."""

    msg_id: str


# --- txmq extensions --------------------------------------------------------------------------


class TransactionIdRequestHeader(_Header, kw_only=True):
    """Names a transaction by message id (``UNIQ_KEY``) or ``half:<offset>``."""

    id: str


class AdminEndTransactionRequestHeader(_Header, kw_only=True):
    """ADMIN_END_TRANSACTION: an operator settles a pending transaction."""

    id: str
    outcome: str
    operator: str
    reason: str = ""


class PendingTransactionsRequestHeader(_Header, kw_only=True):
    """GET_PENDING_TRANSACTIONS: list at most ``limit`` of the oldest pending half messages."""

    limit: JLong = 100


class PendingTransactionsResponseHeader(_Header, kw_only=True):
    """GET_PENDING_TRANSACTIONS answer: how many are pending in all (the body lists the oldest)."""

    pending: JLong


class ResumeResponseHeader(_Header, kw_only=True):
    """RESUME_CHECK_HALF_MESSAGE answer (txmq): the queue offset of the half message put back."""

    half_offset: JLong


class SinkBatchRequestHeader(_Header, kw_only=True):
    """COMMIT_SINK_BATCH / ABORT_SINK_BATCH: the sink's ``<sink id>/<batch id>`` and, to commit,
    the producer group its halves were sent with."""

    batch: str
    producer_group: str = ""
