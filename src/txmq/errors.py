"""One exception tree for txmq.

Every error txmq raises derives from :class:`TxmqError`. Errors are either *local* (detected in this
process: bad arguments, a malformed frame, a corrupt record) or *remote* (the broker answered with an
error response code). Each carries a stable ``code`` string and a ``retriable`` flag so callers can
decide whether to try again without parsing messages.

Response codes reuse RocketMQ's ``ResponseCode`` numbers where the condition exists there
(``remoting/protocol/ResponseCode.java``); txmq-specific ones live at 2000 and above.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "BrokerUnavailable",
    "CommitLogDamaged",
    "ConfigError",
    "ConnectTimeout",
    "CorruptRecord",
    "DataLossError",
    "DiskFull",
    "FrameTooLarge",
    "InvalidReceiptHandle",
    "InvalidRequest",
    "LocalError",
    "MalformedFrame",
    "MalformedHeader",
    "MalformedMessage",
    "MessageTooLarge",
    "OutboxError",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "ResponseCode",
    "StoreError",
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


class MessageTooLarge(LocalError):
    """A message body larger than the configured ``max_message_size`` (default 4 MiB)."""

    code = "MESSAGE_TOO_LARGE"


class OutboxError(LocalError):
    """The local message table was used wrongly (an autocommit connection, a value too long) or holds
    a row that cannot be relayed. Database errors themselves stay SQLAlchemy's (``sqlalchemy.exc``)."""

    code = "OUTBOX_ERROR"


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
