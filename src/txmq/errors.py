"""One exception tree for txmq.

Every error txmq raises derives from :class:`TxmqError`. Errors are either *local* (detected in this
process: bad arguments, a malformed frame, a corrupt record) or *remote* (the broker answered with an
error response code). Each carries a stable ``code`` string and a ``retriable`` flag so callers can
decide whether to try again without parsing messages.

Response codes reuse RocketMQ's ``ResponseCode`` numbers where the condition exists there
(``remoting/protocol/ResponseCode.java``); txmq-specific ones live at 9000 and above.

The tree (as httpx/httpcore document theirs)::

    TxmqError
    ├── LocalError
    │   ├── ConfigError
    │   │   └── MissingExtra           an optional dependency is not installed (also a ModuleNotFoundError)
    │   ├── ProtocolError
    │   │   ├── MalformedFrame
    │   │   ├── MalformedHeader
    │   │   ├── MalformedMessage
    │   │   ├── FrameTooLarge
    │   │   └── HaProtocolError        bad bytes on a replication (HA) connection
    │   ├── InvalidRequest
    │   │   └── InvalidReceiptHandle
    │   ├── MessageTooLarge
    │   ├── OutboxError
    │   └── StoreError
    │       ├── CorruptRecord
    │       ├── CommitLogDamaged
    │       └── DiskFull
    ├── DataLossError
    ├── TransportError                 the request may or may not have taken effect
    │   ├── BrokerUnavailable          no connection could be made or kept
    │   │   └── ConnectTimeout         no connection within the connect timeout (3 s)
    │   └── RequestTimeout             no answer within the request timeout
    └── RemoteError                    the broker answered an error code (``response_code``)
        ├── BrokerSystemError          SYSTEM_ERROR (1)
        ├── SystemBusy                 SYSTEM_BUSY (2), retriable
        ├── RequestCodeNotSupported    REQUEST_CODE_NOT_SUPPORTED (3)
        ├── MessageIllegal             MESSAGE_ILLEGAL (13)
        ├── ServiceNotAvailable        SERVICE_NOT_AVAILABLE (14), retriable
        ├── NoPermission               NO_PERMISSION (16)
        ├── TopicNotExist              TOPIC_NOT_EXIST (17)
        ├── SubscriptionGroupNotExist  SUBSCRIPTION_GROUP_NOT_EXIST (26)
        ├── InvalidParameter           INVALID_PARAMETER (29)
        ├── TransactionStateGroupWrong TRANSACTION_STATE_GROUP_WRONG (203)
        ├── IllegalOperation           ILLEGAL_OPERATION (604)
        ├── GoAway                     GO_AWAY (1500)
        └── TransactionNotFound        TRANSACTION_NOT_FOUND (9003, txmq)

The remote branch is keyed by response code: :meth:`RemoteError.of` builds the subclass registered
for a code (a plain :class:`RemoteError` for any other code), and every client raises through it, so
``except TopicNotExist`` and ``except RemoteError as e: e.response_code == 17`` both work.
:meth:`RemoteError.for_code` gives the class of a code.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

__all__ = [
    "BrokerSystemError",
    "BrokerUnavailable",
    "CommitLogDamaged",
    "ConfigError",
    "ConnectTimeout",
    "CorruptRecord",
    "DataLossError",
    "DiskFull",
    "FrameTooLarge",
    "GoAway",
    "HaProtocolError",
    "IllegalOperation",
    "InvalidParameter",
    "InvalidReceiptHandle",
    "InvalidRequest",
    "LocalError",
    "MalformedFrame",
    "MalformedHeader",
    "MalformedMessage",
    "MessageIllegal",
    "MessageTooLarge",
    "MissingExtra",
    "NetnsUnavailable",
    "NoPermission",
    "OutboxError",
    "ProtocolError",
    "RemoteError",
    "RequestCodeNotSupported",
    "RequestTimeout",
    "ResponseCode",
    "ServiceNotAvailable",
    "StoreError",
    "StoreFormatOld",
    "SubscriptionGroupNotExist",
    "SystemBusy",
    "TopicNotExist",
    "TransactionNotFound",
    "TransactionStateGroupWrong",
    "TransportError",
    "TxmqError",
]


class ResponseCode(IntEnum):
    """Response codes on the wire: RocketMQ ``ResponseCode`` numbers, plus txmq's own at 9000 and
    above for conditions RocketMQ has no code for (RocketMQ's stop at 3010 below the pop range)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    """Also the answer to a header that does not decode (RocketMQ ``NettyRemotingAbstract``)."""
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    """Stored, but not flushed to disk in time (RocketMQ ``SendStatus.FLUSH_DISK_TIMEOUT``)."""
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    """Stored on the master, not acknowledged by a slave in time."""
    MESSAGE_ILLEGAL = 13
    """A message RocketMQ refuses: too large a body or properties, a bad delay level."""
    SERVICE_NOT_AVAILABLE = 14
    """The broker cannot store now (RocketMQ's answer to a full disk)."""
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    """A well-framed request naming something illegal: a bad topic or group name, an id out of
    range, a value that does not parse (RocketMQ 5 ``TopicValidator`` answers)."""
    TRANSACTION_STATE_GROUP_WRONG = 203
    """An end request whose producer group is not the half message's."""
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500
    """The broker is going away: send elsewhere (RocketMQ ``ResponseCode.GO_AWAY``)."""
    # the controller's (RocketMQ ResponseCode CONTROLLER_*; docs/controller.md)
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014
    CONTROLLER_JRAFT_INTERNAL_ERROR = 2015
    CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS = 2016
    # txmq's own
    TRANSACTION_NOT_FOUND = 9003
    """No half message at the named offset or id (RocketMQ answers SYSTEM_ERROR "Find prepared
    transaction message failed")."""


_RETRIABLE = frozenset({ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE})


class TxmqError(Exception):
    """Base of every txmq error.

    Attributes:
        code: a stable, machine-readable name for the condition.
        retriable: whether the same call may succeed if tried again later.
    """

    code: str = "TXMQ_ERROR"
    retriable: bool = False

    def __init__(self, message: str = "", *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class LocalError(TxmqError):
    """An error detected in this process, before or without asking the broker."""

    code = "LOCAL_ERROR"


class ConfigError(LocalError):
    """An invalid configuration value or argument."""

    code = "CONFIG_ERROR"


class MissingExtra(ConfigError, ModuleNotFoundError):
    """A feature's optional dependency is not installed: the message names the ``pip install
    'txmq[<extra>]'`` that installs it. Also a :class:`ModuleNotFoundError` (``name`` is the missing
    module), so ``except ImportError`` keeps working.

    Attributes:
        extra: the extra that installs the missing module (``spark``, ``broker`` …).
        feature: what needs it (``txmq.spark``, ``txmq broker`` …).
    """

    code = "MISSING_EXTRA"

    def __init__(self, extra: str, feature: str, module: str) -> None:
        super().__init__(f"{feature} needs {module}, which is not installed: "
                         f"pip install 'txmq[{extra}]'")
        self.name = module
        self.extra = extra
        self.feature = feature


class ProtocolError(LocalError):
    """Bytes on the wire that do not form a valid frame or command."""

    code = "PROTOCOL_ERROR"


class MalformedFrame(ProtocolError):
    """A frame whose length fields, header or body cannot be decoded."""

    code = "MALFORMED_FRAME"


class MalformedHeader(ProtocolError):
    """A well-framed command whose header or body does not decode as its code's class (a missing
    required field, a value that does not parse). The broker answers it (SYSTEM_ERROR, with
    RocketMQ's remark such as ``the custom field <topic> is null``) and keeps the connection."""

    code = "MALFORMED_HEADER"


class MalformedMessage(ProtocolError):
    """A message in RocketMQ's binary encodings that cannot be encoded or decoded: a MessageExt
    record (pull and check-back bodies), a batch body, a properties string, an offset message id or
    a ``UNIQ_KEY`` (RocketMQ ``MessageDecoder``, ``MessageClientIDSetter``). Raised for short
    buffers, a bad magic code, lengths past the end, a body CRC mismatch, invalid UTF-8, a body
    that cannot be inflated, and on encode for fields that do not fit their width or property
    names and values that contain the separators."""

    code = "MALFORMED_MESSAGE"


class InvalidRequest(LocalError):
    """A well-framed request that names something illegal or forbidden (a bad topic or group name,
    a broker-only property, a queue id out of range, an unparsable number). The broker answers it
    with ``response_code`` and stores nothing; the connection stays usable.

    Attributes:
        response_code: the :class:`ResponseCode` to answer with (``MESSAGE_ILLEGAL``,
            ``NO_PERMISSION``, ``INVALID_PARAMETER``, ...).
    """

    code = "INVALID_REQUEST"

    def __init__(self, response_code: ResponseCode, message: str) -> None:
        super().__init__(message)
        self.response_code = response_code


class InvalidReceiptHandle(InvalidRequest):
    """A pop receipt handle the broker refuses: forged (does not parse, or names no in-flight
    checkpoint), expired (past its invisible time: RocketMQ's "receipt handle has expired"),
    already acked, or naming another group or topic. Answered ``INVALID_PARAMETER``."""

    code = "INVALID_RECEIPT_HANDLE"

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.INVALID_PARAMETER, message)


class FrameTooLarge(ProtocolError):
    """A frame whose declared length exceeds ``limits.FRAME_SIZE_MAX_BYTES``."""

    code = "FRAME_TOO_LARGE"


class HaProtocolError(ProtocolError):
    """Bytes on a master-slave replication (HA) connection that break RocketMQ's HA protocol
    (:mod:`txmq.protocol._ha`): a bad offset or size; the connection is closed."""

    code = "HA_PROTOCOL_ERROR"


class MessageTooLarge(LocalError):
    """A message body larger than the configured ``max_message_size`` (default 4 MiB)."""

    code = "MESSAGE_TOO_LARGE"


class OutboxError(LocalError):
    """The local message table was used wrongly (an autocommit connection, a value too long) or holds
    a row that cannot be relayed. Database errors themselves stay SQLAlchemy's (``sqlalchemy.exc``)."""

    code = "OUTBOX_ERROR"


class NetnsUnavailable(LocalError):
    """The test bed's network namespaces cannot be made here: not root, no ``ip`` (iproute2), or the
    kernel refuses (txmq.testing's hosts, ``txmq chaos --cluster``)."""

    code = "NETNS_UNAVAILABLE"


class StoreError(LocalError):
    """The store could not read or write a record."""

    code = "STORE_ERROR"


class CorruptRecord(StoreError):
    """A stored record whose length or CRC32C does not check out on read."""

    code = "CORRUPT_RECORD"


class CommitLogDamaged(StoreError):
    """The commit log is damaged before its last trusted checkpoint (not a torn tail): the store
    refuses to open rather than drop acknowledged messages. ``txmq store check`` reports the
    damage, ``txmq store repair --yes`` cuts the log there into the quarantine."""

    code = "COMMIT_LOG_DAMAGED"


class StoreFormatOld(StoreError):
    """The data directory was written in txmq's store format before MessageExt records (magic
    "TXM1"): the store refuses to open it; ``txmq store migrate DATA_DIR`` rewrites it."""

    code = "STORE_FORMAT_OLD"


class DiskFull(StoreError):
    """A write refused because the disk is (nearly) full; retriable once space returns."""

    code = "DISK_FULL"
    retriable = True


class DataLossError(TxmqError):
    """A planned offset range of the Spark source cannot be read completely.

    Raised when a range starts below the queue's ``min_offset`` or a queue's ``max_offset`` went
    backwards (both only with ``failOnDataLoss=true``), and always when the broker skips an offset
    inside ``[min_offset, max_offset)`` or returns a message of another queue.
    """

    code = "DATA_LOSS"


class TransportError(TxmqError):
    """The transport failed: no connection, a dropped one, or no answer in time. Whether a request
    in flight took effect is unknown (a send may have been stored)."""

    code = "TRANSPORT_ERROR"
    retriable = True


class BrokerUnavailable(TransportError):
    """No connection to the broker (or name server) could be made or kept."""

    code = "BROKER_UNAVAILABLE"
    retriable = True


class ConnectTimeout(BrokerUnavailable):
    """A connection was not established within the connect timeout (RocketMQ
    ``connectTimeoutMillis``, 3 s): the host does not answer at all."""

    code = "CONNECT_TIMEOUT"
    retriable = True


class RequestTimeout(TransportError):
    """The broker did not answer within the request timeout."""

    code = "REQUEST_TIMEOUT"
    retriable = True


class RemoteError(TxmqError):
    """The broker answered a request with an error response code.

    Attributes:
        response_code: the numeric :class:`ResponseCode` (or an unknown int) the broker sent.
        remark: the broker's human-readable explanation.
    """

    code = "REMOTE_ERROR"
    response_code_of_class: int | None = None
    """The response code a subclass stands for (None: any code)."""
    _by_code: ClassVar[dict[int, type[RemoteError]]] = {}

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if cls.response_code_of_class is not None:
            RemoteError._by_code[cls.response_code_of_class] = cls

    @classmethod
    def for_code(cls, response_code: int) -> type[RemoteError]:
        """The class raised for ``response_code``: its registered subclass, else RemoteError."""
        return RemoteError._by_code.get(response_code, RemoteError)

    @classmethod
    def of(cls, response_code: int, remark: str) -> RemoteError:
        """The error for a response: an instance of :meth:`for_code`'s class."""
        return RemoteError.for_code(response_code)(response_code, remark)

    def __init__(self, response_code: int, remark: str) -> None:
        self.response_code = response_code
        self.remark = remark
        try:
            name = ResponseCode(response_code).name
            retriable = ResponseCode(response_code) in _RETRIABLE
        except ValueError:
            name, retriable = f"CODE_{response_code}", False
        self.code = name
        super().__init__(f"{name} ({response_code}): {remark}", retriable=retriable)


class BrokerSystemError(RemoteError):
    """The broker failed to handle the request (RocketMQ SYSTEM_ERROR; also a header that does not
    decode). Response code ``SYSTEM_ERROR``."""

    response_code_of_class = ResponseCode.SYSTEM_ERROR


class SystemBusy(RemoteError):
    """The broker is overloaded (its page cache or send thread pool is busy); try again later.

    Response code ``SYSTEM_BUSY``."""

    response_code_of_class = ResponseCode.SYSTEM_BUSY


class RequestCodeNotSupported(RemoteError):
    """The peer does not know the request code (an older or foreign broker).

    Response code ``REQUEST_CODE_NOT_SUPPORTED``."""

    response_code_of_class = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class MessageIllegal(RemoteError):
    """The broker refused the message (too large a body or properties, a bad delay level).

    Response code ``MESSAGE_ILLEGAL``."""

    response_code_of_class = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailable(RemoteError):
    """The broker cannot serve now (a full disk, a slave asked to write, shutting down).

    Response code ``SERVICE_NOT_AVAILABLE``."""

    response_code_of_class = ResponseCode.SERVICE_NOT_AVAILABLE


class NoPermission(RemoteError):
    """Refused by permission: ACL, or a topic or broker not writable/readable.

    Response code ``NO_PERMISSION``."""

    response_code_of_class = ResponseCode.NO_PERMISSION


class TopicNotExist(RemoteError):
    """No route or no such topic on the broker.

    Response code ``TOPIC_NOT_EXIST``."""

    response_code_of_class = ResponseCode.TOPIC_NOT_EXIST


class SubscriptionGroupNotExist(RemoteError):
    """The consumer group is not known to the broker.

    Response code ``SUBSCRIPTION_GROUP_NOT_EXIST``."""

    response_code_of_class = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class InvalidParameter(RemoteError):
    """A request naming something illegal (a bad name, an id out of range).

    Response code ``INVALID_PARAMETER``."""

    response_code_of_class = ResponseCode.INVALID_PARAMETER


class TransactionStateGroupWrong(RemoteError):
    """An end request whose producer group is not the half message's.

    Response code ``TRANSACTION_STATE_GROUP_WRONG``."""

    response_code_of_class = ResponseCode.TRANSACTION_STATE_GROUP_WRONG


class IllegalOperation(RemoteError):
    """An operation the broker refuses in its state (RocketMQ ILLEGAL_OPERATION).

    Response code ``ILLEGAL_OPERATION``."""

    response_code_of_class = ResponseCode.ILLEGAL_OPERATION


class GoAway(RemoteError):
    """The broker is going away: send elsewhere.

    Response code ``GO_AWAY``."""

    response_code_of_class = ResponseCode.GO_AWAY


class TransactionNotFound(RemoteError):
    """No half message at the named offset or id (txmq).

    Response code ``TRANSACTION_NOT_FOUND``."""

    response_code_of_class = ResponseCode.TRANSACTION_NOT_FOUND
