"""The broker's one send path: requests validated and staged into records, then ONE store append.

:meth:`SendPath.send` (``Broker.send``) is the only place a client's message becomes a stored
record. Remoting's SEND_MESSAGE / SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and the pipelined runs of
``Broker.handle_sends`` convert their headers into :class:`SendRequest` s here and turn the
:class:`SendOutcome` s back into replies; other doors (gRPC) call ``send`` directly.
"""

from __future__ import annotations

import logging
import zlib
from itertools import count
from typing import TYPE_CHECKING

import msgspec

from txmq import limits
from txmq.broker._actions import Action, Fail, failure, ok_reply
from txmq.broker._traffic import (
    DELAY,
    FIFO,
    MESSAGE_SIZE_BUCKETS_BYTES,
    NORMAL,
    TRANSACTION,
    size_bucket,
)
from txmq.broker.transaction import HALF_TOPIC
from txmq.errors import ProtocolError, ResponseCode
from txmq.protocol import (
    COMPRESSED_FLAG,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_MSG_REGION,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_TRACE_SWITCH,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    RETRY_PREFIX,
    Command,
    SendHeader,
    SendMessageResponseHeader,
    check_group,
    check_send_properties,
    check_send_topic,
    check_timestamp,
    decode_batch,
    decode_properties,
    delay_level,
    dlq_topic,
    inflate_body,
    offset_msg_id,
    send_header,
    to_ext,
)
from txmq.store import AppendResult, Record

if TYPE_CHECKING:
    from txmq.broker._broker import Broker

__all__ = ["SendOutcome", "SendPath", "SendRequest"]

log = logging.getLogger("txmq.broker")


class SendRequest(msgspec.Struct, kw_only=True, gc=False):
    """One message a producer sends, whatever the door.

    Attributes:
        topic: the destination topic (a retry topic past ``max_reconsume_times`` goes to the DLQ).
        body: the message body; inflated first when ``sys_flag`` has ``COMPRESSED_FLAG``.
        properties: RocketMQ property names → values (``TAGS``, ``KEYS``, ``UNIQ_KEY``,
            ``DELAY``, ``TRAN_MSG``, ``PGROUP``, ``__SHARDINGKEY``, user properties). Staging
            takes ``TAGS`` and ``KEYS`` out of it (the dict is the request's own: not copied).
        queue_id: the queue; None: the broker picks (the crc32 of ``__SHARDINGKEY`` modulo the
            queue count when set, else round robin).
        flag: RocketMQ ``Message.flag`` (stored as is).
        sys_flag: ``MessageSysFlag`` bits of the request (COMPRESSED).
        born_timestamp_ms: ms since the epoch; 0: the broker's ``now_ms``.
        born_host: ``ip:port`` of the producer (RocketMQ ``bornHost``).
        producer_group: required (a legal group) for half messages, checked when given.
        reconsume_times: for sends to a retry topic (remoting's ``reconsumeTimes``).
        max_reconsume_times: None: ``limits.MAX_RECONSUME_TIMES``.
    """

    topic: str
    body: bytes
    properties: dict[str, str]
    queue_id: int | None = None
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: str = ""
    producer_group: str = ""
    reconsume_times: int = 0
    max_reconsume_times: int | None = None


class SendOutcome(msgspec.Struct, kw_only=True, gc=False):
    """What became of one :class:`SendRequest` (one per request, in order).

    Attributes:
        code: SUCCESS, or the failure (``remark`` says why); a failed request stored nothing.
        msg_id: the offset message id (32 hex: store host + commit log offset).
        uniq_key: the ``UNIQ_KEY`` property (the client's message id), "" if none.
        transaction_id: for a half message its ``UNIQ_KEY`` (remoting's ``transactionId``).
        queue_id, queue_offset, commit_log_offset: where it was stored (-1 on failure). A delay
            message reports its real topic's queue id and the schedule queue's offset, as
            RocketMQ does.
        durable_offset: reply only once the store is durable up to this commit log offset.
    """

    code: ResponseCode
    remark: str = ""
    msg_id: str = ""
    uniq_key: str = ""
    transaction_id: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    commit_log_offset: int = -1
    durable_offset: int = 0


_SUCCESS = ResponseCode.SUCCESS  # (a module constant: enum attribute lookups cost, per send)
_SIZE_1, _SIZE_2 = MESSAGE_SIZE_BUCKETS_BYTES[:2]  # the usual message sizes' buckets, compared inline
_Staged = tuple[int, Record, Record]
"""(request index, the record the client sent, the record stored: itself, a half or a delay copy)"""


class SendPath:
    """Validation, staging and the one append of every send, and the remoting send handlers.

    Args:
        broker: the broker whose topics, store, transactions, schedule and clients it uses.
    """

    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._rr = count()
        self._peer = broker.peers.get
        self._in = broker.traffic.messages_in
        self._topic_in = broker.traffic.topic_in
        cfg = broker.config
        hosted = cfg.trace_topic_enable or not cfg.trace_on
        self._trace_fields = (cfg.region_id, cfg.trace_on) if hosted else (None, None)
        """``MSG_REGION`` and ``TRACE_ON`` of every send response (RocketMQ ``SendMessageProcessor``
        adds them always; txmq when it hosts message trace, ``trace_topic_enable``, or asks clients
        not to trace, ``trace_on`` false: they are two more ext fields on every send reply)."""

    # -- the one path -----------------------------------------------------------------------------
    def send(self, conn: int, requests: list[SendRequest], now_ms: int, *,
             batch: bool = False) -> list[SendOutcome]:
        """Validate and stage each request, append every staged record with ONE store append,
        and return one outcome per request, in order. A failed request gets its own failure;
        when the append fails, every staged request fails alike. ``batch``: all or nothing, in
        the queue the first message gets (remoting's SEND_BATCH_MESSAGE). Never raises."""
        if len(requests) == 1 and not batch:  # the common case, with fewer allocations
            return [self._send_one(conn, requests[0], now_ms)]
        out: list[SendOutcome | None] = [None] * len(requests)
        recs: list[tuple[int, Record]] = []
        for i, req in enumerate(requests):
            try:
                recs.append((i, self.record(req, now_ms)))
            except Exception as exc:
                out[i] = _failed(exc)
        failed = len(recs) < len(requests)
        if batch and not failed:
            for _, r in recs[1:]:
                r.queue_id = recs[0][1].queue_id
        staged: list[_Staged] = []
        retries: dict[int, int] = {}  # request index → the index of the same half staged before
        halves: dict[tuple[str, str, str], int] = {}  # (UNIQ_KEY, group, topic) → request index
        for i, rec in [] if batch and failed else recs:
            p = rec.properties
            if PROPERTY_TRANSACTION_PREPARED not in p and PROPERTY_DELAY_TIME_LEVEL not in p:
                staged.append((i, rec, rec))  # plain: no half to retry, stored as it is
                continue
            try:
                group = requests[i].producer_group
                again = None if batch else self._retried(rec, group, halves, i)
                if isinstance(again, SendOutcome):
                    out[i] = again
                    continue
                if again is not None:
                    retries[i] = again
                    continue
                staged.append((i, rec, self._stored(conn, rec, group)))
            except Exception as exc:
                out[i] = _failed(exc)
                failed = True
        if batch and failed:
            return [next(o for o in out if o is not None)] * len(requests)
        try:
            results = self.b.append([s for _, _, s in staged]) if staged else []
        except Exception as exc:  # nothing was written: each staged send fails alike
            fail = _failed(exc)
            return [fail if o is None else o for o in out]
        for (i, rec, stored), res in zip(staged, results, strict=True):
            self._stored_one(rec, stored, res)
            out[i] = self._outcome(rec, res)
        for i, first in retries.items():
            out[i] = out[first]
        return out  # type: ignore[return-value]  # every slot is filled

    def _retried(self, rec: Record, group: str, halves: dict[tuple[str, str, str], int],
                 i: int) -> SendOutcome | int | None:
        """For half send ``i`` that retries a half already stored (same ``UNIQ_KEY``, producer
        group and topic): the stored half's outcome (:meth:`_retried_half`); one that repeats a
        half staged earlier in this call: that request's index (``halves`` records the half
        sends of the call). Else None."""
        if (again := self._retried_half(rec, group)) is not None:
            return again
        uniq = rec.properties.get(PROPERTY_UNIQ_KEY, "")
        if not uniq or rec.properties.get(PROPERTY_TRANSACTION_PREPARED) != "true":
            return None
        key = (uniq, group, rec.topic)
        first = halves.get(key)
        if first is None:
            halves[key] = i
        return first

    def _retried_half(self, rec: Record, group: str) -> SendOutcome | None:
        """The SEND_OK of the pending half a half send retries, storing nothing: its msgId,
        queue and offsets (:meth:`~txmq.broker.transaction.TransactionService.stored_half`:
        same ``UNIQ_KEY``, producer group and topic); None for any other send."""
        p = rec.properties
        if p.get(PROPERTY_TRANSACTION_PREPARED) != "true" or self.b.config.reject_transaction_message:
            return None
        uniq = p.get(PROPERTY_UNIQ_KEY, "")
        half = self.b.tx.stored_half(uniq, group, rec.topic)
        if half is None:
            return None
        clo = half.commit_log_offset
        return SendOutcome(code=_SUCCESS, msg_id=offset_msg_id(self.b.store_host, clo),
                           uniq_key=uniq, transaction_id=uniq, queue_id=half.real_queue_id,
                           queue_offset=half.half_offset, commit_log_offset=clo,
                           durable_offset=half.end_offset)

    def _send_one(self, conn: int, req: SendRequest, now_ms: int) -> SendOutcome:
        try:
            rec = self.record(req, now_ms)
            p = rec.properties
            plain = PROPERTY_TRANSACTION_PREPARED not in p and PROPERTY_DELAY_TIME_LEVEL not in p
            if not plain and (again := self._retried_half(rec, req.producer_group)) is not None:
                return again
            stored = rec if plain else self._stored(conn, rec, req.producer_group)
            res = self.b.append([stored])[0]
        except Exception as exc:
            return _failed(exc)
        self._stored_one(rec, stored, res)
        return self._outcome(rec, res)

    def _stored_one(self, rec: Record, stored: Record, res: AppendResult) -> None:
        """After a record is stored: index a half message; count it in ``traffic.messages_in``
        under the topic the producer named, as a transaction, delay, FIFO (``__SHARDINGKEY``) or
        normal message (RocketMQ ``TopicMessageType.parseFromMessageProperty``)."""
        if stored is rec:
            kind = FIFO if PROPERTY_SHARDING_KEY in rec.properties else NORMAL
        elif stored.topic == HALF_TOPIC:
            self._index_half(stored, res)
            kind = TRANSACTION
        else:
            kind = DELAY
        # TrafficStats.sent, inlined: this runs once per message stored
        c = (self._in.get(rec.topic) or self._topic_in(rec.topic))[kind]
        size = res.size
        c[0] += 1
        c[1] += size
        c[2 if size <= _SIZE_1 else 3 if size <= _SIZE_2 else 2 + size_bucket(size)] += 1

    def _index_half(self, stored: Record, res: AppendResult) -> None:
        """Index a stored half message. It is stored whatever happens here, so a failure is
        logged, not answered (a retry would store it twice); a restart re-indexes it."""
        try:
            self.b.tx.on_half_stored(stored, res)
        except Exception:
            log.exception("half message at commit log offset %d stored but not indexed",
                          res.commit_log_offset)

    def record(self, req: SendRequest, now: int) -> Record:
        """The record a client's send stores, after validating all it names: the topic (not a
        broker topic), the properties (:func:`~txmq.protocol.check_send_properties`), the queue,
        the producer group of a half message, the born timestamp and the body size. A body the
        client compressed (``sysFlag`` COMPRESSED) is stored inflated. With
        ``trace_topic_enable`` the record gets the broker's ``MSG_REGION`` and ``TRACE_ON``
        properties, which consumers write into their message trace records (RocketMQ's broker
        adds them to every message). A send to a retry topic
        past ``maxReconsumeTimes`` goes to the group's DLQ (RocketMQ
        ``SendMessageProcessor.handleRetryAndDLQ``). Raises Fail, InvalidRequest,
        MalformedMessage, StoreError (saving an auto-created topic)."""
        body, cfg = req.body, self.b.config
        if req.sys_flag & COMPRESSED_FLAG:
            body = inflate_body(body, req.sys_flag, cfg.max_message_size)
        if len(body) > cfg.max_message_size:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, "the message body size over max value, "
                       f"MAX: {cfg.max_message_size} (body of {len(body)} bytes)")
        props = req.properties
        tags, keys = props.pop(PROPERTY_TAGS, ""), props.pop(PROPERTY_KEYS, "")
        check_send_topic(req.topic)
        if check_send_properties(props) or req.producer_group:
            check_group(req.producer_group)
        check_timestamp(req.born_timestamp_ms, "born timestamp")
        topic, reconsumed = req.topic, req.reconsume_times
        max_times = (limits.MAX_RECONSUME_TIMES if req.max_reconsume_times is None
                     else req.max_reconsume_times)
        if topic.startswith(RETRY_PREFIX) and reconsumed > max_times:
            topic = dlq_topic(topic[len(RETRY_PREFIX):])
            self.b.topics.create(topic, 1)
        n = self.b.topics.queue_nums(topic)
        asked = req.queue_id
        if asked is not None and asked >= 0 and topic == req.topic:
            qid = asked
        elif asked is None and (sharding := props.get(PROPERTY_SHARDING_KEY)):
            qid = zlib.crc32(sharding.encode()) % n
        else:
            qid = next(self._rr) % n
        if (asked is not None and asked < 0) or qid >= n:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, f"queue {asked} not in topic {topic!r} ({n})")
        if cfg.trace_topic_enable:  # RocketMQ AbstractSendMessageProcessor.buildMsgContext
            props[PROPERTY_MSG_REGION] = cfg.region_id
            props[PROPERTY_TRACE_SWITCH] = "true" if cfg.trace_on else "false"
        return Record(topic=topic, queue_id=qid, body=body, tags=tags, keys=keys,
                      properties=props, born_timestamp_ms=req.born_timestamp_ms or now,
                      store_timestamp_ms=now, reconsume_times=reconsumed, flag=req.flag,
                      born_host=req.born_host)

    def _stored(self, conn: int, rec: Record, producer_group: str) -> Record:
        """What a send stores: ``rec`` itself, for a ``TRAN_MSG`` send its half record, for a
        ``DELAY`` send its copy in the schedule topic."""
        if rec.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true":
            if self.b.config.reject_transaction_message:
                raise Fail(ResponseCode.NO_PERMISSION, "this broker rejects transaction messages")
            return self.b.tx.half_record(rec, producer_group, self.b.clients.client_id(conn))
        if PROPERTY_DELAY_TIME_LEVEL in rec.properties and (level := delay_level(rec.properties)) > 0:
            return self.b.schedule.schedule_record(rec, level)
        return rec

    def _outcome(self, rec: Record, res: AppendResult) -> SendOutcome:
        props, clo = rec.properties, res.commit_log_offset
        uniq = props.get(PROPERTY_UNIQ_KEY, "")
        return SendOutcome(code=_SUCCESS, msg_id=offset_msg_id(self.b.store_host, clo),
                           uniq_key=uniq,
                           transaction_id=uniq if props.get(PROPERTY_TRANSACTION_PREPARED) == "true"
                           else "",
                           queue_id=rec.queue_id, queue_offset=res.queue_offset,
                           commit_log_offset=clo, durable_offset=clo + res.size)

    # -- remoting ---------------------------------------------------------------------------------
    def request_of(self, conn: int, h: SendHeader, body: bytes,
                   props: dict[str, str] | None = None) -> SendRequest:
        """A remoting send header (and its already decoded properties) as a :class:`SendRequest`.
        Raises MalformedMessage (properties that do not decode)."""
        return SendRequest(
            topic=h.topic, body=body,
            properties=decode_properties(h.properties or "") if props is None else props,
            queue_id=None if h.queue_id == -1 else h.queue_id, flag=h.flag, sys_flag=h.sys_flag,
            born_timestamp_ms=h.born_timestamp, born_host=self._peer(conn, ""),
            producer_group=h.producer_group, reconsume_times=h.reconsume_times or 0,
            max_reconsume_times=h.max_reconsume_times)

    def handle_send(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """SEND_MESSAGE / SEND_MESSAGE_V2. Raises what the header and properties raise."""
        return self.reply(conn, cmd, self._send_one(conn, self.request_of(conn, send_header(cmd),
                                                                          cmd.body), now))

    def handle_sends(self, conn: int, cmds: list[Command], now: int) -> list[Action]:
        """Sends that arrived together, in order, through :meth:`send` (one store append).
        A request whose header or properties do not decode gets its error reply in its place."""
        early: dict[int, list[Action]] = {}
        reqs: list[SendRequest] = []
        order: list[Command] = []
        for cmd in cmds:
            if cmd.is_response:
                continue
            try:
                reqs.append(self.request_of(conn, send_header(cmd), cmd.body))
                order.append(cmd)
            except Exception as exc:  # MalformedHeader, MalformedMessage (properties)
                early[len(order)] = self.b.error_reply(conn, cmd, *failure(exc, "decoding a send"))
                order.append(cmd)
                reqs.append(_NO_REQUEST)
        if not early:
            outcomes = self.send(conn, reqs, now)
            return [a for cmd, o in zip(order, outcomes, strict=True) for a in self.reply(conn, cmd, o)]
        good = [i for i in range(len(order)) if i not in early]
        for i, o in zip(good, self.send(conn, [reqs[i] for i in good], now), strict=True):
            early[i] = self.reply(conn, order[i], o)
        return [a for i in range(len(order)) for a in early[i]]

    def _epoch(self) -> int | None:
        """``masterEpoch`` of a send answer: controller mode only."""
        return self.b.role.master_epoch if self.b.role.controller_mode else None

    def reply(self, conn: int, cmd: Command, o: SendOutcome) -> list[Action]:
        """The remoting reply to a send: ``SendMessageResponseHeader`` or the error response."""
        if o.code != _SUCCESS:
            return self.b.error_reply(conn, cmd, o.code, o.remark)
        region, trace_on = self._trace_fields
        out = SendMessageResponseHeader(msg_id=o.msg_id, queue_id=o.queue_id,
                                        queue_offset=o.queue_offset,
                                        transaction_id=o.transaction_id or None,
                                        master_epoch=self._epoch(), msg_region=region,
                                        trace_on=trace_on)
        return ok_reply(conn, cmd, to_ext(out), durable_offset=o.durable_offset)

    def handle_batch(self, conn: int, cmd: Command, now: int) -> list[Action]:
        """SEND_BATCH_MESSAGE: 1..BATCH_MESSAGES_MAX messages of the request's topic, all half or
        all plain, none delayed, in one queue; one reply with the msg ids joined by commas."""
        h = send_header(cmd)
        try:
            msgs = decode_batch(cmd.body)
        except ProtocolError as exc:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, f"batch body does not decode: {exc}") from exc
        if not 0 < len(msgs) <= limits.BATCH_MESSAGES_MAX:
            raise Fail(ResponseCode.MESSAGE_ILLEGAL,
                       f"batch of {len(msgs)} not in 1..{limits.BATCH_MESSAGES_MAX}")
        tx = [m.properties.get(PROPERTY_TRANSACTION_PREPARED) == "true" for m in msgs]
        if any(tx) and not all(tx):
            raise Fail(ResponseCode.MESSAGE_ILLEGAL, "a batch is all half messages or all plain")
        reqs = []
        for m in msgs:  # RocketMQ MessageDecoder.decodeMessages: body, flag, properties per message
            if m.topic and m.topic != h.topic:
                raise Fail(ResponseCode.MESSAGE_ILLEGAL,
                           "a batch holds messages of the request's topic only")
            props = dict(m.properties)
            if m.tags:
                props[PROPERTY_TAGS] = m.tags
            if m.keys:
                props[PROPERTY_KEYS] = m.keys
            if PROPERTY_DELAY_TIME_LEVEL in props:
                raise Fail(ResponseCode.MESSAGE_ILLEGAL, "delay messages cannot be batched")
            hh = msgspec.structs.replace(h, flag=m.flag, sys_flag=h.sys_flag & ~COMPRESSED_FLAG)
            reqs.append(self.request_of(conn, hh, m.body, props))
        outcomes = self.send(conn, reqs, now, batch=True)
        first, last = outcomes[0], outcomes[-1]
        if first.code != _SUCCESS:
            raise Fail(first.code, first.remark)
        out = SendMessageResponseHeader(msg_id=",".join(o.msg_id for o in outcomes),
                                        queue_id=first.queue_id, queue_offset=first.queue_offset,
                                        master_epoch=self._epoch(),
                                        msg_region=self._trace_fields[0],
                                        trace_on=self._trace_fields[1])
        return ok_reply(conn, cmd, to_ext(out), durable_offset=last.durable_offset)


_NO_REQUEST = SendRequest(topic="", body=b"", properties={})
"""Placeholder for a remoting send whose header did not decode (never sent)."""


def _failed(exc: Exception) -> SendOutcome:
    code, remark = failure(exc, "staging a send")
    return SendOutcome(code=code, remark=remark)
