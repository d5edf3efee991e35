"""What every request needs: the remoting door's request codes and the gRPC door's rpcs.

Each entry is a :class:`Rule`: **public** (no credentials asked: route lookups), **authenticated**
(valid credentials, no resource: e.g. a producer's heartbeat), **unsupported** (the gRPC rpcs the door
answers NOT_IMPLEMENTED whatever the caller), or the resources and actions read from the request.
The resources follow apache/rocketmq's ``DefaultAuthorizationContextBuilder`` (5.3), for remoting
(``build(ChannelHandlerContext, RemotingCommand)``: sends need Pub on the topic, or Sub on the group for
a retry topic; pulls and offsets need Sub on topic and group; …) and for gRPC (``build(Metadata,
GeneratedMessageV3)``). Departures, each said in its rule's text: route lookups are public on both
doors (as the issue asks; RocketMQ asks Pub|Sub|Get on the topic), max/min offset and offset-by-time
accept Sub as well as Get (txmq's consumers ask them), a gRPC SendMessage needs Pub on *every*
message's topic (the proxy looks at the first), and txmq's own codes (9001–9012, 323) need its own
actions on the cluster, group or topic they touch.

A request code the remoting door dispatches but this table does not list is refused (and
``tests/broker/test_acl_table.py`` fails): a new code must be decided before it ships.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txmq.broker.acl._model import Action, Need, Resource, ResourceType
from txmq.errors import MalformedHeader, MalformedMessage
from txmq.protocol import (
    RETRY_PREFIX,
    Command,
    EndTransactionRequestHeader,
    HeartbeatData,
    LockBatchRequestBody,
    RequestCode,
    decode_body,
    decode_offset_msg_id,
    from_ext,
)

__all__ = ["GRPC_RULES", "REMOTING_RULES", "HalfTopic", "Rule", "RuleKind", "Scope", "rules_markdown"]

HalfTopic = Callable[[EndTransactionRequestHeader], str | None]
"""``end request -> REAL_TOPIC of the half message it names``, None when it names none."""


@dataclass(frozen=True)
class Scope:
    """What the needs of a request may depend on besides the request: the broker's cluster name
    (the resource ``Cluster:<name>``) and its half messages (:data:`HalfTopic`), so that an end
    of a transaction is authorized against the half's real topic, not the topic it claims."""

    cluster: str
    half_topic: HalfTopic = field(default=lambda h: None)


Needs = Callable[[Command, Scope], list[Need]]
"""``(request, scope) -> needs``; raises (any exception) when the request cannot be read."""
GrpcNeeds = Callable[[Any, Scope], list[Need]]
"""``(parsed request message, scope) -> needs``."""

A = Action
SUB_GET = (A.SUB, A.GET)


class RuleKind:
    PUBLIC = "public"
    AUTHENTICATED = "authenticated"
    RESOURCE = "resource"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Rule:
    """How one request code or rpc is authorized; ``text`` is its line in docs/security.md."""

    kind: str
    text: str
    needs: Callable[[Any, Scope], list[Need]] | None = None


def _public(text: str) -> Rule:
    return Rule(RuleKind.PUBLIC, text)


def _authenticated(text: str) -> Rule:
    return Rule(RuleKind.AUTHENTICATED, text)


def _rule(text: str, needs: Callable[[Any, Scope], list[Need]]) -> Rule:
    return Rule(RuleKind.RESOURCE, text, needs)


def _topic(name: str, *actions: Action) -> Need:
    return Need(Resource.topic(name), actions)


def _group(name: str, *actions: Action) -> Need:
    return Need(Resource.group(name), actions)


def _cluster(cluster: str, *actions: Action) -> Need:
    return Need(Resource(ResourceType.CLUSTER, cluster), actions)


def _topic_and_group(topic: str, group: str, *actions: Action) -> list[Need]:
    """Sub-like access: the topic (unless it is the group's retry topic) and the group."""
    out = [] if topic.startswith(RETRY_PREFIX) else [_topic(topic, *actions)]
    return [*out, _group(group, *actions)]


# -- remoting -----------------------------------------------------------------------------------
def _send(topic_key: str) -> Needs:
    def needs(cmd: Command, scope: Scope) -> list[Need]:
        topic = cmd.ext.get(topic_key, "")
        if topic.startswith(RETRY_PREFIX):  # a consumer's retry, or an operator's DLQ resend
            return [_group(topic, A.SUB, A.DLQ_RESEND)]
        return [_topic(topic, A.PUB)]
    return needs


def _field_topic(key: str, *actions: Action) -> Needs:
    return lambda cmd, scope: [_topic(cmd.ext.get(key, ""), *actions)]


def _field_group(key: str, *actions: Action) -> Needs:
    return lambda cmd, scope: [_group(cmd.ext.get(key, ""), *actions)]


def _consumer_offsets(*actions: Action) -> Needs:
    return lambda cmd, scope: _topic_and_group(cmd.ext.get("topic", ""),
                                                 cmd.ext.get("consumerGroup", ""), *actions)


def _on_cluster(*actions: Action) -> Needs:
    return lambda cmd, scope: [_cluster(scope.cluster, *actions)]


def _heartbeat(cmd: Command, scope: Scope) -> list[Need]:
    out: list[Need] = []
    for cd in decode_body(cmd.body, HeartbeatData).consumer_data_set:
        out.append(_group(cd.group_name, A.SUB))
        out += [_topic(s.topic, A.SUB) for s in cd.subscription_data_set
                if not s.topic.startswith(RETRY_PREFIX)]
    return out


def _lock(cmd: Command, scope: Scope) -> list[Need]:
    body = decode_body(cmd.body, LockBatchRequestBody)
    return [_group(body.consumer_group, A.SUB),
            *(_topic(mq.topic, A.SUB) for mq in body.mq_set if not mq.topic.startswith(RETRY_PREFIX))]


def _unregister(cmd: Command, scope: Scope) -> list[Need]:
    group = cmd.ext.get("consumerGroup", "")
    return [_group(group, A.SUB)] if group else []


def _end_need(h: EndTransactionRequestHeader, scope: Scope) -> list[Need]:
    """Pub on the real topic of the half message ``h`` names (its ``REAL_TOPIC``, whatever topic
    ``h`` claims); when it names none, Pub on the claimed topic if any (the broker then answers
    TRANSACTION_NOT_FOUND). RocketMQ 5 (``DefaultAuthorizationContextBuilder``, END_TRANSACTION)
    asks Pub on the header's topic only, if present."""
    topic = scope.half_topic(h) or h.topic or ""
    return [_topic(topic, A.PUB)] if topic else []


def _end_transaction(cmd: Command, scope: Scope) -> list[Need]:
    return _end_need(from_ext(cmd.ext, EndTransactionRequestHeader), scope)


def _end_transaction_batch(cmd: Command, scope: Scope) -> list[Need]:
    out: list[Need] = []
    for ext in decode_body(cmd.body, list[dict[str, str]]):
        try:
            h = from_ext(ext, EndTransactionRequestHeader)
        except MalformedHeader:  # answered INVALID_PARAMETER for that entry, nothing ended
            continue
        out += [n for n in _end_need(h, scope) if n not in out]
    return out


def _consume_stats(cmd: Command, scope: Scope) -> list[Need]:
    out = [_group(cmd.ext.get("consumerGroup", ""), A.GET)]
    topic = cmd.ext.get("topic", "")
    return out + ([_topic(topic, A.GET)] if topic else [])


R = RequestCode
REMOTING_RULES: dict[int, Rule] = {
    R.SEND_MESSAGE: _rule("Pub on Topic:`topic`; a retry topic `%RETRY%g`: Sub or DlqResend on "
                          "Group:g", _send("topic")),
    R.SEND_MESSAGE_V2: _rule("as SEND_MESSAGE (topic in field `b`)", _send("b")),
    R.SEND_BATCH_MESSAGE: _rule("as SEND_MESSAGE (topic in field `b`)", _send("b")),
    R.PULL_MESSAGE: _rule("Sub on Topic:`topic` (unless the group's retry topic) and on "
                          "Group:`consumerGroup`", _consumer_offsets(A.SUB)),
    R.QUERY_MESSAGE: _rule("Sub or Get on Topic:`topic`", _field_topic("topic", *SUB_GET)),
    R.QUERY_CONSUMER_OFFSET: _rule("Sub or Get on Topic:`topic` and Group:`consumerGroup`",
                                   _consumer_offsets(*SUB_GET)),
    R.UPDATE_CONSUMER_OFFSET: _rule("Sub or Update on Topic:`topic` and Group:`consumerGroup`",
                                    _consumer_offsets(A.SUB, A.UPDATE)),
    R.UPDATE_AND_CREATE_TOPIC: _rule("Create or Update on Topic:`topic`",
                                     _field_topic("topic", A.CREATE, A.UPDATE)),
    R.GET_ALL_TOPIC_CONFIG: _rule("List on Cluster", _on_cluster(A.LIST)),
    R.GET_BROKER_RUNTIME_INFO: _rule("Get on Cluster", _on_cluster(A.GET)),
    R.GET_BROKER_HA_STATUS: _rule("Get on Cluster", _on_cluster(A.GET)),
    R.NOTIFY_BROKER_ROLE_CHANGED: _rule("All on Cluster (a controller's push, signed by "
                                        "`txmq controller --access-key`; refused unsigned: the "
                                        "broker then learns its role from its next heartbeat "
                                        "answer)", _on_cluster(A.ALL)),
    R.EXCHANGE_BROKER_HA_INFO: _rule("All on Cluster (a slave asks its master's HA address, or is "
                                     "told it: the HA account)", _on_cluster(A.ALL)),
    R.SEARCH_OFFSET_BY_TIMESTAMP: _rule("Sub or Get on Topic:`topic` (RocketMQ: Get)",
                                        _field_topic("topic", *SUB_GET)),
    R.GET_MAX_OFFSET: _rule("Sub or Get on Topic:`topic` (RocketMQ: Get)",
                            _field_topic("topic", *SUB_GET)),
    R.GET_MIN_OFFSET: _rule("Sub or Get on Topic:`topic` (RocketMQ: Get)",
                            _field_topic("topic", *SUB_GET)),
    R.VIEW_MESSAGE_BY_ID: _rule("Get on Cluster (a commit log offset names no topic)",
                                _on_cluster(A.GET)),
    R.HEART_BEAT: _rule("Sub on each consumer group and each subscribed topic of the body; "
                        "a producer's: credentials only", _heartbeat),
    R.UNREGISTER_CLIENT: _rule("Sub on Group:`consumerGroup` if given; else credentials only",
                               _unregister),
    R.CONSUMER_SEND_MSG_BACK: _rule("Sub on Group:`group`", _field_group("group", A.SUB)),
    R.END_TRANSACTION: _rule("Pub on the Topic of the half message it names (its REAL_TOPIC, "
                             "whatever `topic` says; RocketMQ: Pub on `topic` if given); no such "
                             "half: Pub on `topic` if given, else credentials only", _end_transaction),
    R.GET_CONSUMER_LIST_BY_GROUP: _rule("Sub or Get on Group:`consumerGroup`",
                                        _field_group("consumerGroup", *SUB_GET)),
    R.LOCK_BATCH_MQ: _rule("Sub on the body's group and its queues' topics", _lock),
    R.UNLOCK_BATCH_MQ: _rule("Sub on the body's group and its queues' topics", _lock),
    R.GET_ROUTEINFO_BY_TOPIC: _public("public: route lookup (RocketMQ: Pub, Sub or Get on the "
                                      "topic)"),
    R.GET_TOPIC_STATS_INFO: _rule("Get on Topic:`topic`", _field_topic("topic", A.GET)),
    R.DELETE_TOPIC_IN_BROKER: _rule("Delete on Topic:`topic`", _field_topic("topic", A.DELETE)),
    R.RESUME_CHECK_HALF_MESSAGE: _rule("TxAdmin on Cluster (resume a parked half message)",
                                       _on_cluster(A.TX_ADMIN)),
    R.GET_TRANSACTION_STATS: _rule("Get on Cluster", _on_cluster(A.GET)),
    R.GET_PENDING_TRANSACTIONS: _rule("List on Cluster", _on_cluster(A.LIST)),
    R.QUERY_TRANSACTION: _rule("Get on Cluster", _on_cluster(A.GET)),
    R.GET_TRANSACTION_TRACE: _rule("Get on Cluster", _on_cluster(A.GET)),
    R.ADMIN_END_TRANSACTION: _rule("TxAdmin on Cluster (an operator's commit or rollback)",
                                   _on_cluster(A.TX_ADMIN)),
    R.END_TRANSACTION_BATCH: _rule("as END_TRANSACTION, for every entry", _end_transaction_batch),
    R.VIEW_MESSAGE_BY_UNIQ_KEY: _rule("Get on Cluster (every copy of a message, any topic)",
                                      _on_cluster(A.GET)),
    R.GET_CONSUMER_GROUPS: _rule("List on Cluster", _on_cluster(A.LIST)),
    R.GET_CONSUME_STATS: _rule("Get on Group:`consumerGroup` (and Topic:`topic` if given)",
                               _consume_stats),
    R.RESET_OFFSET: _rule("ResetOffset on Group:`consumerGroup`",
                          _field_group("consumerGroup", A.RESET_OFFSET)),
    R.COMMIT_SINK_BATCH: _authenticated("credentials only (the batch's half messages needed Pub "
                                        "when sent)"),
    R.ABORT_SINK_BATCH: _authenticated("credentials only (the batch's half messages needed Pub "
                                       "when sent)"),
}
"""Request code → :class:`Rule`, for every code the broker dispatches."""


# -- gRPC -----------------------------------------------------------------------------------------
_PRODUCER_TYPES = (0, 1)  # ClientType CLIENT_TYPE_UNSPECIFIED, PRODUCER


def _g_heartbeat(req: Any, scope: Scope) -> list[Need]:
    if req.client_type in _PRODUCER_TYPES:
        return []
    return [_group(req.group.name, A.SUB)]


def _g_send(req: Any, scope: Scope) -> list[Need]:
    return [_topic(t, A.PUB) for t in sorted({m.topic.name for m in req.messages})]


def _g_end(req: Any, scope: Scope) -> list[Need]:
    """Pub on the real topic of the half message ``transaction_id`` names (its commit log
    offset), else on the request's topic."""
    try:
        _, clo = decode_offset_msg_id(req.transaction_id)
    except MalformedMessage:  # answered INVALID_TRANSACTION_ID, nothing ended
        return [_topic(req.topic.name, A.PUB)]
    h = EndTransactionRequestHeader(topic=req.topic.name, producer_group=req.topic.name,
                                    tran_state_table_offset=-1, commit_log_offset=clo,
                                    commit_or_rollback=0, msg_id=req.message_id)
    return _end_need(h, scope) or [_topic(req.topic.name, A.PUB)]


def _g_terminate(req: Any, scope: Scope) -> list[Need]:
    return [_group(req.group.name, A.SUB)] if req.group.name else []


def _g_telemetry(cmd: Any, scope: Scope) -> list[Need]:
    if cmd.WhichOneof("command") != "settings":
        return []
    s, out = cmd.settings, []
    if s.HasField("publishing"):
        out += [_topic(t.name, A.PUB) for t in s.publishing.topics]
    if s.HasField("subscription"):
        out.append(_group(s.subscription.group.name, A.SUB))
        out += [_topic(e.topic.name, A.SUB) for e in s.subscription.subscriptions]
    return out


def _g_receive(req: Any, scope: Scope) -> list[Need]:
    return _topic_and_group(req.message_queue.topic.name, req.group.name, A.SUB)


def _g_group_topic(req: Any, scope: Scope) -> list[Need]:
    return _topic_and_group(req.topic.name, req.group.name, A.SUB)


def _g_group(req: Any, scope: Scope) -> list[Need]:
    return [_group(req.group.name, A.SUB)]


def _unsupported() -> Rule:
    return Rule(RuleKind.UNSUPPORTED, "answered NOT_IMPLEMENTED whatever the credentials")


GRPC_RULES: dict[str, Rule] = {
    "QueryRoute": _public("public: route lookup, as on the remoting door (the proxy asks Pub or "
                          "Sub on the topic)"),
    "Heartbeat": _rule("a consumer's: Sub on Group:`group`; a producer's: credentials only",
                       _g_heartbeat),
    "SendMessage": _rule("Pub on every message's topic (the proxy checks the first)", _g_send),
    "QueryAssignment": _rule("Sub on Topic:`topic` and Group:`group`", _g_group_topic),
    "ReceiveMessage": _rule("Sub on the queue's topic and Group:`group`", _g_receive),
    "AckMessage": _rule("Sub on Topic:`topic` and Group:`group`", _g_group_topic),
    "ForwardMessageToDeadLetterQueue": _rule("Sub on Topic:`topic` and Group:`group`",
                                             _g_group_topic),
    "PullMessage": _unsupported(),
    "UpdateOffset": _unsupported(),
    "GetOffset": _unsupported(),
    "QueryOffset": _unsupported(),
    "EndTransaction": _rule("Pub on the Topic of the half message `transaction_id` names (its "
                            "REAL_TOPIC), else on Topic:`topic` (the proxy: Pub on `topic`)", _g_end),
    "Telemetry": _rule("settings: Pub on each publishing topic; Sub on the subscription's group "
                       "and topics; other commands: credentials only", _g_telemetry),
    "NotifyClientTermination": _rule("Sub on Group:`group` if given; else credentials only",
                                     _g_terminate),
    "ChangeInvisibleDuration": _rule("Sub on Group:`group`", _g_group),
    "RecallMessage": _unsupported(),
    "SyncLiteSubscription": _unsupported(),
}
"""rpc name of ``apache.rocketmq.v2.MessagingService`` → :class:`Rule`."""


def rules_markdown() -> str:
    """The two tables of docs/security.md (every request code, every rpc, and what it needs),
    generated from :data:`REMOTING_RULES` and :data:`GRPC_RULES`."""
    out = ["| code | request | needs |", "|---:|---|---|"]
    for code in sorted(REMOTING_RULES):
        name = RequestCode(code).name if code in RequestCode._value2member_map_ else "?"
        out.append(f"| {code} | `{name}` | {REMOTING_RULES[code].text} |")
    out += ["", "| rpc | needs |", "|---|---|"]
    out += [f"| `{rpc}` | {rule.text} |" for rpc, rule in sorted(GRPC_RULES.items())]
    return "\n".join(out) + "\n"
