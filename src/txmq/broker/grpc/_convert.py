"""Protobuf ↔ broker conversions of the gRPC door, sans-IO: statuses, times, and messages both ways.

Facts follow the RocketMQ 5 proxy (``proxy/.../grpc/v2/common/GrpcConverter``,
``producer/SendMessageActivity#buildMessage``, ``common/ResponseBuilder``, ``ProxyConfig``):
a message group is the ``__SHARDINGKEY``, the client's message id the ``UNIQ_KEY``, keys are
joined by a space, a delivery timestamp becomes a delay level, a half message's producer group
is its topic.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from txmq import limits
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.errors import InvalidRequest, LocalError, ResponseCode
from txmq.protocol import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RETRY_PREFIX,
    SYSTEM_PROPERTIES,
    MessageExt,
    check_group,
    check_properties,
    check_send_topic,
    check_topic,
)

if TYPE_CHECKING:
    from txmq.broker import Action

__all__ = [
    "REPLICATION_CODES",
    "GrpcError",
    "Outgoing",
    "Result",
    "check_group_name",
    "check_topic_name",
    "code_of",
    "delay_level_for",
    "duration_ms",
    "host_port",
    "not_replicated",
    "outgoing",
    "status",
    "timestamp_ms",
    "to_message",
]

KEY_SEPARATOR = " "
"""RocketMQ ``MessageConst.KEY_SEPARATOR``: keys travel as one space-separated ``KEYS`` value."""

_HIDDEN = SYSTEM_PROPERTIES | {PROPERTY_SHARDING_KEY, "POP_CK"}  # POP_CK: the pop service's handle
"""Stored properties that are not user properties (they travel as system properties or not at all)."""


class GrpcError(LocalError):
    """A request the door answers with ``status_code`` (an ``apache.rocketmq.v2.Code``) and
    ``message`` in its ``Status``."""

    code = "GRPC_STATUS"

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code, self.message = status_code, message


class Result:
    """A response, the commit log offset the store must be durable to before it goes (0: none),
    and actions for the broker's shell (notifications, check-backs)."""

    __slots__ = ("actions", "durable_offset", "response")

    def __init__(self, response: object, durable_offset: int = 0,
                 actions: list[Action] | None = None) -> None:
        self.response, self.durable_offset = response, durable_offset
        self.actions = actions or []


def check_topic_name(topic: str) -> str:
    """``topic`` if legal; GrpcError ILLEGAL_TOPIC otherwise."""
    try:
        return check_topic(topic)
    except InvalidRequest as exc:
        raise GrpcError(pd.ILLEGAL_TOPIC, str(exc)) from exc


def check_group_name(group: str) -> str:
    """``group`` if legal; GrpcError ILLEGAL_CONSUMER_GROUP otherwise."""
    try:
        return check_group(group)
    except InvalidRequest as exc:
        raise GrpcError(pd.ILLEGAL_CONSUMER_GROUP, str(exc)) from exc


def status(code: int, message: str = "") -> pd.Status:
    """``Status{code, message}``; an OK status says ``OK`` as the proxy's does."""
    return pd.Status(code=code, message=message or ("OK" if code == pd.OK else ""))  # type: ignore[arg-type]


_CODES: dict[int, int] = {
    ResponseCode.SUCCESS: pd.OK,
    ResponseCode.SYSTEM_BUSY: pd.TOO_MANY_REQUESTS,  # ResponseBuilder.RESPONSE_CODE_MAPPING
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: pd.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pd.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: pd.TOPIC_NOT_FOUND,  # TopicRouteHelper.isTopicNotExistError
    # the proxy's own validation (GrpcValidator) answers these before a broker sees them:
    ResponseCode.MESSAGE_ILLEGAL: pd.BAD_REQUEST,
    ResponseCode.INVALID_PARAMETER: pd.BAD_REQUEST,
    ResponseCode.NO_PERMISSION: pd.FORBIDDEN,
    ResponseCode.TRANSACTION_NOT_FOUND: pd.INVALID_TRANSACTION_ID,
    ResponseCode.TRANSACTION_STATE_GROUP_WRONG: pd.INVALID_TRANSACTION_ID,
    ResponseCode.ILLEGAL_OPERATION: pd.INVALID_TRANSACTION_ID,
    # SendMessageActivity.convertToSendMessageResponse, by the send's SendStatus:
    ResponseCode.FLUSH_DISK_TIMEOUT: pd.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: pd.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: pd.HA_NOT_AVAILABLE,
}

REPLICATION_CODES = frozenset({ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE})
"""A SYNC_MASTER's answers for data stored on the master but not acknowledged by its slaves in
time (docs/replication.md)."""


def not_replicated(response: Any, rc: int) -> Any:
    """``response`` (a SendMessageResponse, an EndTransactionResponse, any response with a
    ``status``) whose data a SYNC_MASTER stored but its slaves did not acknowledge: its status,
    and each OK entry's of a SendMessageResponse, become :func:`code_of` ``rc``
    (SLAVE_PERSISTENCE_TIMEOUT for FLUSH_SLAVE_TIMEOUT, HA_NOT_AVAILABLE for SLAVE_NOT_AVAILABLE)
    with the proxy's message "send message failed, sendStatus=..."
    (``SendMessageActivity.convertToSendMessageResponse``). Unlike the proxy's, the entries keep
    their message id, transaction id and offset, so a transactional producer can roll its half
    back at once. Returns ``response``, changed in place."""
    st = status(code_of(rc), f"send message failed, sendStatus={ResponseCode(rc).name}")
    for e in getattr(response, "entries", ()):
        if e.status.code == pd.OK:
            e.status.CopyFrom(st)
    response.status.CopyFrom(st)
    return response


def code_of(rc: int) -> int:
    """The ``Code`` for a broker response code: ResponseBuilder's mapping, the proxy's validation
    codes for requests the broker refuses as illegal, else INTERNAL_SERVER_ERROR."""
    return _CODES.get(rc, pd.INTERNAL_SERVER_ERROR)


def invalid(exc: InvalidRequest, code: int = pd.BAD_REQUEST) -> GrpcError:
    """An :class:`InvalidRequest` from the protocol's checks as the door's error."""
    if exc.response_code == ResponseCode.NO_PERMISSION:
        code = pd.FORBIDDEN
    return GrpcError(code, str(exc))


def duration_ms(d: object) -> int:
    """A ``google.protobuf.Duration`` in ms (negative stays negative)."""
    return int(getattr(d, "seconds", 0)) * 1000 + int(getattr(d, "nanos", 0)) // 1_000_000


def timestamp_ms(t: object) -> int:
    """A ``google.protobuf.Timestamp`` in ms since the epoch."""
    return duration_ms(t)


def host_port(peer: str) -> str:
    """grpc's ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) as txmq's ``ip:port``,
    "" when it is neither (a unix socket)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4" and rest.count(":") == 1:
        return rest
    if kind == "ipv6" and rest.startswith("["):
        return rest
    return ""


def delay_level_for(deliver_at_ms: int, now_ms: int, levels_ms: list[int]) -> int:
    """The delay level of a message to deliver at ``deliver_at_ms``: the first level at least as
    long as the wait, i.e. the delay rounded up to a level (RocketMQ ``ProxyConfig
    .computeDelayLevel``, the proxy's ``useDelayLevel`` mode); 0 (none) when the time has come.
    Raises GrpcError ILLEGAL_DELIVERY_TIME beyond ``limits.GRPC_DELAY_MAX_MS``
    (``maxDelayTimeMills``) or beyond the longest delay level (txmq has no timer wheel: such a
    message would be delivered early)."""
    wait = deliver_at_ms - now_ms
    if wait <= 0:
        return 0
    if wait > limits.GRPC_DELAY_MAX_MS:
        raise GrpcError(pd.ILLEGAL_DELIVERY_TIME, f"delivery timestamp is more than "
                        f"{limits.GRPC_DELAY_MAX_MS // 3_600_000} h ahead")
    for i in sorted(range(len(levels_ms)), key=lambda i: levels_ms[i]):
        if levels_ms[i] >= wait:
            return i + 1
    raise GrpcError(pd.ILLEGAL_DELIVERY_TIME, f"delivery timestamp is {wait} ms ahead, beyond the "
                    f"broker's longest delay level ({max(levels_ms)} ms, message_delay_level)")


class Outgoing:
    """What a gRPC ``Message`` asks the broker to store (the fields of a send request)."""

    __slots__ = ("body", "born_ms", "deliver_at_ms", "half", "message_id", "properties", "topic")

    def __init__(self, topic: str, body: bytes, properties: dict[str, str], born_ms: int,
                 message_id: str, half: bool, deliver_at_ms: int) -> None:
        self.topic, self.body, self.properties, self.born_ms = topic, body, properties, born_ms
        self.message_id, self.half, self.deliver_at_ms = message_id, half, deliver_at_ms


def outgoing(msg: pd.Message, max_body: int) -> Outgoing:
    """Validate a message a producer sends and turn it into broker properties (validation as the
    proxy's ``GrpcValidator`` / ``SendMessageActivity``). Raises GrpcError: ILLEGAL_TOPIC,
    ILLEGAL_MESSAGE_ID, MESSAGE_BODY_EMPTY, MESSAGE_BODY_TOO_LARGE, MESSAGE_CORRUPTED (digest or
    gzip), ILLEGAL_MESSAGE_PROPERTY_KEY, MESSAGE_PROPERTIES_TOO_LARGE, ILLEGAL_MESSAGE_GROUP,
    ILLEGAL_MESSAGE_TAG, MESSAGE_PROPERTY_CONFLICT_WITH_TYPE."""
    topic = msg.topic.name
    try:
        check_send_topic(topic)
    except InvalidRequest as exc:
        raise invalid(exc, pd.ILLEGAL_TOPIC) from exc
    sp = msg.system_properties
    if not sp.message_id:
        raise GrpcError(pd.ILLEGAL_MESSAGE_ID, "message id is required")
    body = _body(msg, max_body)
    props = _user_properties(msg.user_properties)
    props[PROPERTY_UNIQ_KEY] = sp.message_id
    if sp.HasField("tag"):
        if not sp.tag.strip() or "|" in sp.tag:
            raise GrpcError(pd.ILLEGAL_MESSAGE_TAG, f"illegal tag {sp.tag[:64]!r}")
        props[PROPERTY_TAGS] = sp.tag
    if any(not k.strip() or KEY_SEPARATOR in k for k in sp.keys):
        raise GrpcError(pd.ILLEGAL_MESSAGE_KEY, "a message key is blank or holds a space")
    if sp.keys:
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(sp.keys)
    half = sp.message_type == pd.TRANSACTION
    deliver_at = timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else 0
    if sp.HasField("message_group"):
        group = sp.message_group
        if not group or len(group) > limits.GRPC_MESSAGE_GROUP_MAX_CHARS:
            raise GrpcError(pd.ILLEGAL_MESSAGE_GROUP, f"message group must be 1..."
                            f"{limits.GRPC_MESSAGE_GROUP_MAX_CHARS} characters")
        props[PROPERTY_SHARDING_KEY] = group
    if half and (sp.HasField("message_group") or deliver_at):
        raise GrpcError(pd.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        "a transactional message has no message group or delivery timestamp")
    if deliver_at and sp.HasField("message_group"):
        raise GrpcError(pd.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        "a delay message has no message group")
    if half:
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        props[PROPERTY_PRODUCER_GROUP] = topic  # SendMessageActivity: topic as producer group
        if sp.HasField("orphaned_transaction_recovery_duration"):
            secs = duration_ms(sp.orphaned_transaction_recovery_duration) // 1000
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(max(0, secs))
    born = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0
    try:
        check_properties(props)
    except InvalidRequest as exc:
        raise GrpcError(pd.BAD_REQUEST, str(exc)) from exc
    return Outgoing(topic, body, props, max(0, born), sp.message_id, half, deliver_at)


def _body(msg: pd.Message, max_body: int) -> bytes:
    sp, body = msg.system_properties, msg.body
    if sp.body_encoding == pd.GZIP:
        inflater = zlib.decompressobj(wbits=31)
        try:
            body = inflater.decompress(body, max_body + 1)
        except zlib.error as exc:
            raise GrpcError(pd.MESSAGE_CORRUPTED, f"GZIP body does not inflate: {exc}") from exc
    if not body:
        raise GrpcError(pd.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body:
        raise GrpcError(pd.MESSAGE_BODY_TOO_LARGE, f"message body cannot exceed the max {max_body}")
    digest = sp.body_digest if sp.HasField("body_digest") else None
    if digest is not None and digest.type != pd.DIGEST_TYPE_UNSPECIFIED and (
            _digest(digest.type, msg.body).upper() != digest.checksum.upper()):
        raise GrpcError(pd.MESSAGE_CORRUPTED, "message body does not match its digest")
    return body


def _user_properties(user: Mapping[str, str]) -> dict[str, str]:
    if len(user) > limits.GRPC_USER_PROPERTIES_MAX:
        raise GrpcError(pd.MESSAGE_PROPERTIES_TOO_LARGE,
                        f"more than {limits.GRPC_USER_PROPERTIES_MAX} user properties")
    size = 0
    for k, v in user.items():
        if not k or k in _HIDDEN:
            raise GrpcError(pd.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {k[:64]!r} is reserved")
        size += len(k.encode()) + len(v.encode())
    if size > limits.GRPC_USER_PROPERTIES_MAX_BYTES:
        raise GrpcError(pd.MESSAGE_PROPERTIES_TOO_LARGE,
                        f"user properties exceed {limits.GRPC_USER_PROPERTIES_MAX_BYTES} bytes")
    return dict(user)


def _digest(kind: int, body: bytes) -> str:
    if kind == pd.CRC32:
        return format(zlib.crc32(body), "08X")
    if kind == pd.SHA1:
        return hashlib.sha1(body).hexdigest()
    return hashlib.md5(body).hexdigest()


def _message_type(props: Mapping[str, str]) -> int:
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return pd.TRANSACTION
    if PROPERTY_SHARDING_KEY in props:
        return pd.FIFO
    if PROPERTY_DELAY_TIME_LEVEL in props or PROPERTY_TIMER_DELIVER_MS in props:
        return pd.DELAY
    return pd.NORMAL


def to_message(ext: MessageExt, *, receipt_handle: str | None = None,
               delivery_attempt: int | None = None, invisible_ms: int | None = None) -> pd.Message:
    """A stored message as the proxy gives it to a client (``GrpcConverter#buildMessage``): the
    real topic of a retried message, user properties (every non-system property), IDENTITY
    encoding, an upper-case MD5 ``body_digest``, and the system properties the store knows."""
    props = ext.properties
    topic = ext.topic
    if topic.startswith(RETRY_PREFIX) and props.get(PROPERTY_RETRY_TOPIC):
        topic = props[PROPERTY_RETRY_TOPIC]
    sp = pd.SystemProperties(
        message_id=props.get(PROPERTY_UNIQ_KEY) or ext.offset_msg_id,
        body_digest=pd.Digest(type=pd.MD5, checksum=hashlib.md5(ext.body).hexdigest().upper()),
        body_encoding=pd.IDENTITY, message_type=_message_type(props),  # type: ignore[arg-type]
        born_host=_ip(ext.born_host), store_host=ext.store_host, queue_id=ext.queue_id,
        queue_offset=ext.queue_offset)
    if ext.tags:
        sp.tag = ext.tags
    sp.keys.extend(k for k in ext.keys.split(KEY_SEPARATOR) if k)
    sp.born_timestamp.FromMilliseconds(ext.born_timestamp_ms)
    sp.store_timestamp.FromMilliseconds(ext.store_timestamp_ms)
    if PROPERTY_SHARDING_KEY in props:
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if props.get(PROPERTY_TIMER_DELIVER_MS, "").isdigit():
        sp.delivery_timestamp.FromMilliseconds(int(props[PROPERTY_TIMER_DELIVER_MS]))
    if PROPERTY_DLQ_ORIGIN_TOPIC in props:
        sp.dead_letter_queue.topic = props[PROPERTY_DLQ_ORIGIN_TOPIC]
        sp.dead_letter_queue.message_id = props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID, "")
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    user = {k: v for k, v in props.items() if k not in _HIDDEN}
    return pd.Message(topic=pd.Resource(name=topic), user_properties=user, system_properties=sp,
                      body=ext.body)


def _ip(host: str) -> str:
    """``ip:port`` → ``ip`` (the proxy sends the born host's address)."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] or host
