"""Operator requests on consumer groups, dead-letter queues and the message index, asyncio API.

What ``txmq group …``, ``txmq dlq …`` and ``txmq message …`` call: messages by key or id, list
groups, per-queue lag, offset reset (the broker tells online members to restart from the new
offsets), and reading and resending ``%DLQ%<group>``.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from txmq import limits
from txmq.client._core import PullStatus, check_response, send_request_header
from txmq.client._pull import PullMixin, validate_group
from txmq.errors import BrokerUnavailable, ConfigError, RemoteError, RequestTimeout, ResponseCode
from txmq.protocol import (
    BROKER_ONLY_PROPERTIES,
    PARKED_TOPICS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TXMQ_PARK_REASON,
    AdminEndTransactionRequestHeader,
    BrokerRuntimeInfo,
    ConsumerGroupInfo,
    ConsumeStatsRequestHeader,
    CreateTopicRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    DeleteTopicRequestHeader,
    EndTransactionResponseHeader,
    GetRouteInfoRequestHeader,
    GetTopicStatsInfoRequestHeader,
    HaRuntimeInfo,
    Message,
    MessageExt,
    PendingTransactionsRequestHeader,
    PendingTransactionsResponseHeader,
    QueryMessageRequestHeader,
    QueueConsumeStats,
    RequestCode,
    ResetOffsetEntry,
    ResetOffsetRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
    ResumeResponseHeader,
    SendMessageResponseHeader,
    SinkBatchRequestHeader,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    TopicStatsTable,
    TransactionIdRequestHeader,
    TransactionLife,
    TransactionTraceRequestHeader,
    ViewMessageByUniqKeyRequestHeader,
    ViewMessageRequestHeader,
    decode_body,
    decode_message_exts,
    decode_route,
    dlq_topic,
    encode_body,
    from_ext,
    retry_topic,
    to_ext,
)

__all__ = ["AsyncAdmin", "ResendResult", "TransactionAdmin"]

log = logging.getLogger("txmq.client.admin")

ADMIN_GROUP = "TXMQ_ADMIN"
_DROPPED_ON_RESEND = frozenset({PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                                PROPERTY_TRANSACTION_PREPARED, *BROKER_ONLY_PROPERTIES})
"""A DLQ copy of a committed transactional message carries broker-only properties
(``TRAN_PREPARED_QUEUE_OFFSET``), which the broker refuses from clients."""


class ResendResult(msgspec.Struct, frozen=True):
    """What happened to one message of a DLQ resend.

    Attributes:
        msg_id: the message id (``UNIQ_KEY``) asked for.
        status: ``OK`` (stored in ``%RETRY%<group>``), ``NOT_FOUND`` (no such id in the DLQ) or
            ``FAILED`` (the broker refused or could not be reached; ``detail`` says why).
        dlq_queue_offset: where it was in the DLQ (-1 when not found).
        retry_queue_offset: where the resent copy was stored (-1 unless OK).
    """

    msg_id: str
    status: str
    dlq_queue_offset: int = -1
    retry_queue_offset: int = -1
    detail: str = ""


class TransactionAdmin(PullMixin):
    """Operators' requests on transactions and Spark sink batches (txmq extension codes, with
    RocketMQ's RESUME_CHECK_HALF_MESSAGE). Every method raises RemoteError for an error answer
    (TRANSACTION_NOT_FOUND for an unknown id), BrokerUnavailable or RequestTimeout."""

    async def transaction_stats(self) -> dict[str, int]:
        """Counts of the transaction state index (PENDING, COMMIT, ROLLBACK, DISCARD, and PARKED:
        discarded and not resumed), check-backs sent and answered."""
        r = check_response(await self.call(RequestCode.GET_TRANSACTION_STATS))
        return decode_body(r.body, dict[str, int])

    async def pending_transactions(self, limit: int = 100) -> tuple[int, list[dict[str, Any]]]:
        """``(pending in all, the oldest ``limit`` pending half messages)``."""
        h = PendingTransactionsRequestHeader(limit=limit)
        r = check_response(await self.call(RequestCode.GET_PENDING_TRANSACTIONS, to_ext(h)))
        total = from_ext(r.ext, PendingTransactionsResponseHeader).pending
        return total, decode_body(r.body, list[dict[str, Any]])

    async def query_transaction(self, ident: str) -> dict[str, Any]:
        """One transaction's state by ``UNIQ_KEY`` or ``half:<offset>``."""
        h = TransactionIdRequestHeader(id=ident)
        r = check_response(await self.call(RequestCode.QUERY_TRANSACTION, to_ext(h)))
        return decode_body(r.body, dict[str, Any])

    async def transaction_lives(self, ident: str = "", *, trace_id: str = "",
                                limit: int = 16) -> list[TransactionLife]:
        """The lives the broker keeps (in memory, bounded: docs/tracing.md) of the transaction
        ``ident`` names (``UNIQ_KEY`` or ``half:<offset>``), or of every transaction whose
        ``traceparent`` carries W3C trace id ``trace_id``: half stored, check-backs and their
        answers, the end; newest first, at most ``limit`` (the broker caps it at
        ``limits.TRANSACTION_TRACE_QUERY_MAX``). [] when none is kept. Give one of ``ident`` and
        ``trace_id`` (else INVALID_PARAMETER). An Apache RocketMQ broker answers
        REQUEST_CODE_NOT_SUPPORTED (RemoteError)."""
        h = TransactionTraceRequestHeader(id=ident, trace_id=trace_id, limit=limit)
        r = check_response(await self.call(RequestCode.GET_TRANSACTION_TRACE, to_ext(h)))
        return decode_body(r.body, list[TransactionLife])

    async def operator_end(self, ident: str, outcome: str, operator: str,
                           reason: str = "") -> EndTransactionResponseHeader:
        """Commit or roll back (``outcome`` COMMIT or ROLLBACK) a pending transaction as an
        operator; recorded with ``operator`` and ``reason``."""
        h = AdminEndTransactionRequestHeader(id=ident, outcome=outcome, operator=operator,
                                             reason=reason)
        r = check_response(await self.call(RequestCode.ADMIN_END_TRANSACTION, to_ext(h)))
        return from_ext(r.ext, EndTransactionResponseHeader)

    async def resume_transaction(self, ident: str) -> int:
        """Put a half message discarded after ``transactionCheckMax`` back to be checked again;
        returns its new half queue offset (RESUME_CHECK_HALF_MESSAGE)."""
        h = ResumeCheckHalfMessageRequestHeader(msg_id=ident)
        r = check_response(await self.call(RequestCode.RESUME_CHECK_HALF_MESSAGE, to_ext(h)))
        return from_ext(r.ext, ResumeResponseHeader).half_offset

    async def commit_sink_batch(self, batch: str, producer_group: str,
                                tasks: dict[str, int]) -> EndTransactionResponseHeader:
        """COMMIT_SINK_BATCH: commit a Spark sink micro-batch (idempotent per ``batch``);
        ``tasks``: task attempt → rows it wrote as halves."""
        h = SinkBatchRequestHeader(batch=batch, producer_group=producer_group)
        r = check_response(await self.call(RequestCode.COMMIT_SINK_BATCH, to_ext(h),
                                           encode_body(tasks)))
        return from_ext(r.ext, EndTransactionResponseHeader)

    async def abort_sink_batch(self, batch: str) -> EndTransactionResponseHeader:
        """ABORT_SINK_BATCH: roll back an uncommitted sink micro-batch (no-op after its commit)."""
        h = SinkBatchRequestHeader(batch=batch)
        r = check_response(await self.call(RequestCode.ABORT_SINK_BATCH, to_ext(h)))
        return from_ext(r.ext, EndTransactionResponseHeader)


class AsyncAdmin(TransactionAdmin):
    """Inspect and steer consumer groups.

    Args:
        endpoints: broker address ``host:port``.
        timeout_ms: request timeout.
        access_key, secret_key: ACL credentials; every request is signed (docs/security.md).
        tls, tls_ca_file, tls_verify_hostname: TLS to the broker (RocketMQ ``tls.enable``; the
            certificate is checked against ``tls_ca_file`` or the system's CAs; docs/security.md).
    """

    def __init__(self, endpoints: str = "", *, timeout_ms: int = limits.REQUEST_TIMEOUT_MS,
                 namesrv_addr: str = "", access_key: str = "",
                 secret_key: str = "",
                 tls: bool = False, tls_ca_file: str = "",
                 tls_verify_hostname: bool = True) -> None:
        super().__init__(endpoints, timeout_ms, namesrv_addr, access_key=access_key,
                         secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                         tls_verify_hostname=tls_verify_hostname)
        self.group = ADMIN_GROUP

    async def groups(self) -> list[ConsumerGroupInfo]:
        """Every consumer group that is online or has offsets on the broker."""
        r = check_response(await self.call(RequestCode.GET_CONSUMER_GROUPS))
        return decode_body(r.body, list[ConsumerGroupInfo])

    async def query_messages(self, topic: str, key: str, *, begin_ms: int = 0,
                             end_ms: int = 2**63 - 1, max_num: int = 32) -> list[MessageExt]:
        """Durable messages of ``topic`` whose keys include ``key``, stored within
        ``[begin_ms, end_ms]`` (ms since the epoch), newest first, at most ``max_num`` (capped by
        the broker at ``limits.QUERY_MESSAGE_MAX_NUM``). RocketMQ ``queryMessage``.

        Raises:
            RemoteError: QUERY_NOT_FOUND when none matches, TOPIC_NOT_EXIST for an unknown topic.
        """
        h = QueryMessageRequestHeader(topic=topic, key=key, max_num=max_num, begin_timestamp=begin_ms,
                                      end_timestamp=end_ms)
        r = check_response(await self.call(RequestCode.QUERY_MESSAGE, to_ext(h)))
        return decode_message_exts(r.body)

    async def view_message(self, msg_id: str = "", *, offset: int = -1) -> list[MessageExt]:
        """By message id (``UNIQ_KEY``: the message and its half, retry or DLQ copies, newest first)
        or by the commit log ``offset`` of one record. RocketMQ ``viewMessage``.

        Raises:
            RemoteError: QUERY_NOT_FOUND when there is no such message.
            ConfigError: neither or both of ``msg_id`` and ``offset`` given.
        """
        if bool(msg_id) == (offset >= 0):
            raise ConfigError("give exactly one of msg_id and offset")
        if msg_id:
            u = ViewMessageByUniqKeyRequestHeader(msg_id=msg_id)
            r = check_response(await self.call(RequestCode.VIEW_MESSAGE_BY_UNIQ_KEY, to_ext(u)))
        else:
            h = ViewMessageRequestHeader(offset=offset)
            r = check_response(await self.call(RequestCode.VIEW_MESSAGE_BY_ID, to_ext(h)))
        return decode_message_exts(r.body)

    async def consume_stats(self, group: str, topic: str = "") -> list[QueueConsumeStats]:
        """Per queue of the group's topics (or of ``topic``): broker offset, consumer offset, lag.

        Raises:
            RemoteError: TOPIC_NOT_EXIST for an unknown ``topic``.
        """
        h = ConsumeStatsRequestHeader(consumer_group=group, topic=topic)
        r = check_response(await self.call(RequestCode.GET_CONSUME_STATS, to_ext(h)))
        return decode_body(r.body, list[QueueConsumeStats])

    async def reset_offset(self, group: str, topic: str, *, timestamp_ms: int | None = None,
                           offset: int | None = None, queue_id: int | None = None
                           ) -> list[ResetOffsetEntry]:
        """Move the group's offsets of ``topic`` to the first message stored at or after
        ``timestamp_ms``, or to ``offset`` (clamped to each queue's bounds); all queues unless
        ``queue_id``. Online members restart those queues from the new offsets.

        Raises:
            ConfigError: not exactly one of ``timestamp_ms`` and ``offset``, or a negative one.
            RemoteError: unknown topic or queue.
        """
        validate_group(group)
        if (timestamp_ms is None) == (offset is None) or (timestamp_ms or 0) < 0 or (offset or 0) < 0:
            raise ConfigError("give exactly one of timestamp_ms and offset, not negative")
        h = ResetOffsetRequestHeader(
            consumer_group=group, topic=topic,
            timestamp_ms=-1 if timestamp_ms is None else timestamp_ms,
            offset=-1 if offset is None else offset, queue_id=-1 if queue_id is None else queue_id)
        r = check_response(await self.call(RequestCode.RESET_OFFSET, to_ext(h)))
        return decode_body(r.body, list[ResetOffsetEntry])

    # -- topics (mqadmin updateTopic, topicList, topicRoute, topicStatus, deleteTopic) ------------
    async def topic_configs(self) -> TopicConfigSerializeWrapper:
        """Every topic of the broker with its queue counts and perm (GET_ALL_TOPIC_CONFIG 21)."""
        r = check_response(await self.call(RequestCode.GET_ALL_TOPIC_CONFIG))
        return decode_body(r.body, TopicConfigSerializeWrapper)

    async def update_topic(self, topic: str, queue_nums: int) -> int:
        """Create ``topic`` or widen it to ``queue_nums`` queues on the broker
        (UPDATE_AND_CREATE_TOPIC 17, mqadmin ``updateTopic``); returns its queue count as the
        broker's topic table now says (not through a route: a name server learns it with the
        broker's next registration, within ``limits.NAMESRV_REGISTER_CHECK_MS``).

        Raises:
            RemoteError: MESSAGE_ILLEGAL (name or queue count), NO_PERMISSION (broker topic).
        """
        h = CreateTopicRequestHeader(topic=topic, read_queue_nums=queue_nums,
                                     write_queue_nums=queue_nums)
        check_response(await self.call(RequestCode.UPDATE_AND_CREATE_TOPIC, to_ext(h)))
        self._routes.pop(topic, None)
        cfg = (await self.topic_configs()).topic_config_table.get(topic)
        return queue_nums if cfg is None else cfg.write_queue_nums

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The full route of ``topic`` (GET_ROUTEINFO_BY_TOPIC 105), from the name server when one
        is configured, else from the broker.

        Raises:
            RemoteError: TOPIC_NOT_EXIST for a topic with no route.
        """
        ext = to_ext(GetRouteInfoRequestHeader(topic=topic))
        if self.namesrv_addr:
            r = check_response(await self._namesrv_call(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
        else:
            r = check_response(await self.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
        return decode_route(r.body)

    async def topic_stats(self, topic: str) -> TopicStatsTable:
        """Per queue: min and max queue offset and the newest message's store time (ms)
        (GET_TOPIC_STATS_INFO 202).

        Raises:
            RemoteError: TOPIC_NOT_EXIST.
        """
        h = GetTopicStatsInfoRequestHeader(topic=topic)
        r = check_response(await self.call(RequestCode.GET_TOPIC_STATS_INFO, to_ext(h)))
        return decode_body(r.body, TopicStatsTable)

    async def topic_names(self) -> list[str]:
        """Every topic the name server has a route for (GET_ALL_TOPIC_LIST_FROM_NAMESERVER 206),
        sorted.

        Raises:
            ConfigError: no name server configured.
            RemoteError: the name server refuses (``enableAllTopicList`` off).
        """
        if not self.namesrv_addr:
            raise ConfigError("topic_names needs a name server (namesrv_addr)")
        r = check_response(await self._namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        return sorted(decode_body(r.body, TopicList).topic_list)

    async def delete_topic(self, topic: str) -> str:
        """Delete ``topic`` on the broker (DELETE_TOPIC_IN_BROKER 215), then its routes on the name
        server when one is configured (DELETE_TOPIC_IN_NAMESRV 216), as mqadmin ``deleteTopic``;
        returns the broker's account of it (queues, consumer offsets dropped, what happens to the
        stored messages).

        Raises:
            RemoteError: TOPIC_NOT_EXIST, NO_PERMISSION (a broker, default or configured topic) or
                MESSAGE_ILLEGAL (an illegal name).
        """
        h = DeleteTopicRequestHeader(topic=topic)
        r = check_response(await self.call(RequestCode.DELETE_TOPIC_IN_BROKER, to_ext(h)))
        if self.namesrv_addr:
            n = DeleteTopicFromNamesrvRequestHeader(topic=topic)
            check_response(await self._namesrv_call(RequestCode.DELETE_TOPIC_IN_NAMESRV, to_ext(n)))
        self._routes.pop(topic, None)
        return r.remark or f"topic {topic} deleted"

    async def dlq_messages(self, group: str, limit: int = 100_000) -> list[MessageExt]:
        """The messages in ``%DLQ%<group>`` (oldest first, at most ``limit``); [] if it has none.

        The DLQ is append-only: a message resent and dead again appears twice, with the same id.
        Its original topic is in property ``RETRY_TOPIC``.
        """
        return await self._read_topic(dlq_topic(group), limit)

    async def _read_topic(self, topic: str, limit: int) -> list[MessageExt]:
        try:
            mqs = await self.queues(topic)
        except RemoteError as exc:
            if exc.response_code == ResponseCode.TOPIC_NOT_EXIST:
                return []
            raise
        out: list[MessageExt] = []
        for mq in mqs:
            b = mq.broker_name
            off = await self.min_offset(topic, mq.queue_id, broker_name=b)
            while len(out) < limit:
                r = await self._pull(topic, mq.queue_id, off, limits.PULL_BATCH_MAX, broker_name=b)
                if r.status is not PullStatus.FOUND and r.next_begin_offset == off:
                    break
                out += r.messages
                off = r.next_begin_offset
        return out[:limit]

    async def runtime_info(self) -> BrokerRuntimeInfo:
        """The broker's health: each timer's last tick, parked messages, pending transactions
        (RocketMQ GET_BROKER_RUNTIME_INFO).

        Raises:
            MalformedFrame: the answer is not a runtime info ``KVTable``.
        """
        r = check_response(await self.call(RequestCode.GET_BROKER_RUNTIME_INFO))
        return BrokerRuntimeInfo.decode(r.body)

    async def ha_status(self) -> HaRuntimeInfo:
        """The broker's replication state: its role, commit log end, and for a master each
        connected slave's acknowledged offset and lag in bytes and ms, for a slave its link to
        the master (RocketMQ GET_BROKER_HA_STATUS, ``mqadmin haStatus``).

        Raises:
            MalformedFrame: the answer is not an ``HARuntimeInfo``.
        """
        r = check_response(await self.call(RequestCode.GET_BROKER_HA_STATUS))
        return HaRuntimeInfo.decode(r.body)

    async def parked_messages(self, limit: int = 100_000) -> list[MessageExt]:
        """Messages the broker's schedulers parked (oldest first per topic, at most ``limit``):
        ``TXMQ_SYS_PARKED_TOPIC``, then the half messages discarded as uncommittable from
        ``TRANS_CHECK_MAX_TIME_TOPIC``. Each carries ``TXMQ_PARK_REASON``, ``TXMQ_PARK_SOURCE`` and
        its origin (``TXMQ_PARK_ORIGIN_*``)."""
        out: list[MessageExt] = []
        for topic in PARKED_TOPICS:
            out += [m for m in await self._read_topic(topic, limit)
                    if PROPERTY_TXMQ_PARK_REASON in m.properties]
        return out[:limit]

    async def resend_parked(self, m: MessageExt, topic: str, queue_id: int = -1) -> int:
        """Send parked message ``m`` (body, tags, keys, user properties) to ``topic`` as a new
        message; returns its queue offset. Its schedule, transaction and park properties are
        dropped: it is delivered at once.

        Raises:
            RemoteError: the broker refused (unknown topic or queue, …).
        """
        props = {k: v for k, v in m.properties.items()
                 if k not in _DROPPED_ON_RESEND and not k.startswith("TXMQ_PARK_")}
        out = Message(topic=topic, body=m.body, tags=m.tags, keys=m.keys, properties=props)
        ext = send_request_header(out, ADMIN_GROUP, queue_id, m.born_timestamp_ms)
        r = check_response(await self.call(RequestCode.SEND_MESSAGE_V2, ext, m.body))
        return from_ext(r.ext, SendMessageResponseHeader).queue_offset

    async def resend_dlq(self, group: str, msg_ids: list[str] | None = None) -> list[ResendResult]:
        """Put DLQ messages back in ``%RETRY%<group>`` with their retry count reset, so the group
        (and only it) consumes them again; the listener sees the original topic.

        Args:
            msg_ids: ids to resend (the latest DLQ entry of each); None resends the latest entry
                of every id in the DLQ.

        Returns:
            One result per id, in the order asked (DLQ order for all).
        """
        validate_group(group)
        latest: dict[str, MessageExt] = {}
        for m in await self.dlq_messages(group):
            latest.pop(m.msg_id, None)
            latest[m.msg_id] = m
        wanted = list(latest) if msg_ids is None else list(dict.fromkeys(msg_ids))
        if any(i in latest for i in wanted):
            await self.create_topic(retry_topic(group), 1)
        out = []
        for mid in wanted:
            found = latest.get(mid)
            out.append(ResendResult(mid, "NOT_FOUND") if found is None else await self._resend(group, found))
        return out

    async def _resend(self, group: str, m: MessageExt) -> ResendResult:
        props = {k: v for k, v in m.properties.items() if k not in _DROPPED_ON_RESEND}
        out = Message(topic=retry_topic(group), body=m.body, tags=m.tags, keys=m.keys,
                      properties=props)
        ext = send_request_header(out, ADMIN_GROUP, 0, m.born_timestamp_ms)
        try:
            r = check_response(await self.call(RequestCode.SEND_MESSAGE_V2, ext, m.body))
        except (BrokerUnavailable, RequestTimeout, RemoteError) as exc:
            return ResendResult(m.msg_id, "FAILED", m.queue_offset, detail=str(exc))
        stored = from_ext(r.ext, SendMessageResponseHeader)
        log.info("resent %s from %s to %s", m.msg_id, dlq_topic(group), retry_topic(group))
        return ResendResult(m.msg_id, "OK", m.queue_offset, stored.queue_offset)

