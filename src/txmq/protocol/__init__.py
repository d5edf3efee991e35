"""The native wire protocol: a sans-IO codec of frames, commands, headers and messages."""

from txmq.protocol._codes import RequestCode
from txmq.protocol._consume import *  # noqa: F403
from txmq.protocol._consume import __all__ as _consume_all
from txmq.protocol._frame import FLAG_ONEWAY, FLAG_RESPONSE, Command, FrameDecoder, encode_command
from txmq.protocol._headers import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    AdminEndTransactionRequestHeader,
    CheckTransactionStateRequestHeader,
    ConsumerData,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    EndTransactionResponseHeader,
    GroupRequestHeader,
    HeartbeatData,
    OffsetRequestHeader,
    PendingTransactionsRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryMessageRequestHeader,
    QueueRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    SinkBatchRequestHeader,
    TopicRequestHeader,
    TransactionIdRequestHeader,
    ViewMessageRequestHeader,
    from_ext,
    to_ext,
)
from txmq.protocol._message import *  # noqa: F403
from txmq.protocol._message import __all__ as _message_all
from txmq.protocol._parked import *  # noqa: F403
from txmq.protocol._parked import __all__ as _parked_all
from txmq.protocol._route import *  # noqa: F403
from txmq.protocol._route import __all__ as _route_all
from txmq.protocol._validate import *  # noqa: F403
from txmq.protocol._validate import __all__ as _validate_all

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "CheckTransactionStateRequestHeader",
    "Command",
    "ConsumerData",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "EndTransactionRequestHeader",
    "EndTransactionResponseHeader",
    "FrameDecoder",
    "GroupRequestHeader",
    "HeartbeatData",
    "OffsetRequestHeader",
    "PendingTransactionsRequestHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "QueryMessageRequestHeader",
    "QueueRequestHeader",
    "RequestCode",
    "SendMessageRequestHeader",
    "SendMessageResponseHeader",
    "SinkBatchRequestHeader",
    "TopicRequestHeader",
    "TransactionIdRequestHeader",
    "ViewMessageRequestHeader",
    "AdminEndTransactionRequestHeader",
    "encode_command",
    "from_ext",
    "to_ext",
    *_consume_all,
    *_message_all,
    *_parked_all,
    *_route_all,
    *_validate_all,
]
