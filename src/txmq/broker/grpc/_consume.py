"""The gRPC door's consumption rpcs, sans-IO, over the broker's pop service (``broker.pop``).

ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue and
QueryAssignment as the RocketMQ 5 proxy answers them (``proxy/.../grpc/v2/consumer/*Activity``,
``route/RouteActivity#queryAssignment``); the receive's long polling is the shell's: it asks
:meth:`Consumption.receive` again when new data is durable or every ``GRPC_RECEIVE_RECHECK_MS``
until the polling time is spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txmq import limits
from txmq.broker.grpc._convert import (
    GrpcError,
    Result,
    check_group_name,
    duration_ms,
    status,
    to_message,
)
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.errors import InvalidReceiptHandle, InvalidRequest, ResponseCode
from txmq.protocol import retry_topic

if TYPE_CHECKING:
    from txmq.broker import PopService
    from txmq.broker.grpc._core import GrpcCore

__all__ = ["Consumption", "Receive"]


class Receive:
    """A validated ReceiveMessage: what to pop, and how long to wait for it (ms)."""

    __slots__ = ("batch", "group", "invisible_ms", "polling_ms", "queue_id", "tags", "topic")

    def __init__(self, group: str, topic: str, queue_id: int | None, tags: set[str] | None,
                 batch: int, invisible_ms: int, polling_ms: int) -> None:
        self.group, self.topic, self.queue_id, self.tags = group, topic, queue_id, tags
        self.batch, self.invisible_ms, self.polling_ms = batch, invisible_ms, polling_ms

    @property
    def topics(self) -> tuple[str, str]:
        """The topics whose new data may answer it: the topic and the group's retry topic."""
        return self.topic, retry_topic(self.group)


def _pop_error(exc: InvalidRequest) -> GrpcError:
    if isinstance(exc, InvalidReceiptHandle):
        return GrpcError(pd.INVALID_RECEIPT_HANDLE, str(exc))
    code = {ResponseCode.TOPIC_NOT_EXIST: pd.TOPIC_NOT_FOUND,
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pd.CONSUMER_GROUP_NOT_FOUND,
            ResponseCode.NO_PERMISSION: pd.FORBIDDEN}.get(exc.response_code, pd.BAD_REQUEST)
    return GrpcError(code, str(exc))


def parse_tags(expr: pd.FilterExpression) -> set[str] | None:
    """A TAG filter expression (``*``, or ``a || b``) as a tag set, None for every tag. Raises
    GrpcError: ILLEGAL_FILTER_EXPRESSION for SQL92, which txmq does not evaluate."""
    if expr.type == pd.SQL:
        raise GrpcError(pd.ILLEGAL_FILTER_EXPRESSION, "SQL92 filter expressions are not supported")
    text = expr.expression.strip()
    if text in ("", "*"):
        return None
    return {t.strip() for t in text.split("||") if t.strip()}


class Consumption:
    """The consumption rpcs of one :class:`GrpcCore`."""

    def __init__(self, core: GrpcCore) -> None:
        self.core = core

    @property
    def pop(self) -> PopService:
        """The broker's pop service."""
        return self.core.b.pop

    def _group_topic(self, group: pd.Resource, topic: pd.Resource, conn: int, now_ms: int
                     ) -> tuple[str, str, int]:
        g = check_group_name(group.name)
        n = self.core.queue_nums(conn, topic.name, now_ms)
        return g, topic.name, n

    # -- receive ----------------------------------------------------------------------------------
    def plan(self, client_id: str, req: ps.ReceiveMessageRequest, now_ms: int,
             time_left_ms: int | None) -> Receive:
        """Validate a ReceiveMessage (``ReceiveMessageActivity``): group and topic, batch size
        (at most ``GRPC_RECEIVE_BATCH_SIZE``), invisible time (``grpc_min_invisible_time_ms`` ..
        ``GRPC_INVISIBLE_MAX_MS``; ``GRPC_INVISIBLE_DEFAULT_MS`` when absent, as push consumers
        send it), long polling (the request's, else the client's settings', clamped to 5..20 s and
        to the call's deadline less ``GRPC_LONG_POLLING_RESERVE_MS``). Raises GrpcError."""
        c = self.core.client(client_id, now_ms)
        group, topic, n = self._group_topic(req.group, req.message_queue.topic, c.conn, now_ms)
        if req.batch_size <= 0:
            raise GrpcError(pd.BAD_REQUEST, f"batch size {req.batch_size} must be positive")
        invisible = limits.GRPC_INVISIBLE_DEFAULT_MS
        if req.HasField("invisible_duration"):
            invisible = duration_ms(req.invisible_duration)
            lowest = self.core.b.config.grpc_min_invisible_time_ms
            if not lowest <= invisible <= limits.GRPC_INVISIBLE_MAX_MS:
                raise GrpcError(pd.ILLEGAL_INVISIBLE_TIME, f"invisible time {invisible} ms not in "
                                f"{lowest}..{limits.GRPC_INVISIBLE_MAX_MS}")
        polling = limits.GRPC_LONG_POLLING_MAX_MS
        settings = c.settings
        if req.HasField("long_polling_timeout"):
            polling = duration_ms(req.long_polling_timeout)
        elif settings is not None and settings.subscription.HasField("long_polling_timeout"):
            polling = duration_ms(settings.subscription.long_polling_timeout)
        polling = min(max(polling, limits.GRPC_LONG_POLLING_MIN_MS), limits.GRPC_LONG_POLLING_MAX_MS)
        if time_left_ms is not None:
            left = time_left_ms - limits.GRPC_LONG_POLLING_RESERVE_MS
            if left < polling:
                if left < 0:
                    raise GrpcError(pd.ILLEGAL_POLLING_TIME,
                                    "the deadline time remaining is not enough for polling")
                polling = left
        qid = req.message_queue.id
        fifo = self.core.is_fifo(group)
        queue_id = qid if fifo and 0 <= qid < n else None
        batch = min(req.batch_size, limits.GRPC_RECEIVE_BATCH_SIZE)
        return Receive(group, topic, queue_id, parse_tags(req.filter_expression), batch, invisible,
                       polling)

    def receive(self, r: Receive, now_ms: int) -> list[pd.Message]:
        """Pop up to ``r.batch`` messages, as the proxy gives them to clients. Raises GrpcError."""
        try:
            got = self.pop.pop(r.group, r.topic, r.queue_id, r.batch, r.invisible_ms, r.tags, now_ms)
        except InvalidRequest as exc:
            raise _pop_error(exc) from exc
        return [to_message(p.message, receipt_handle=p.receipt_handle,
                           delivery_attempt=max(1, p.delivery_attempt),
                           invisible_ms=max(0, p.invisible_until_ms - now_ms)) for p in got]

    # -- ack, invisible time, DLQ -----------------------------------------------------------------
    def ack(self, client_id: str, req: ps.AckMessageRequest, now_ms: int) -> Result:
        """AckMessage: one result per entry (INVALID_RECEIPT_HANDLE for a forged, expired, acked
        or foreign handle); the top status is the entry's for one entry, else OK or
        MULTIPLE_RESULTS."""
        c = self.core.client(client_id, now_ms)
        group, topic, _ = self._group_topic(req.group, req.topic, c.conn, now_ms)
        if not req.entries:
            raise GrpcError(pd.BAD_REQUEST, "no entry to ack")
        pop = self.pop
        entries, durable = [], 0
        for e in req.entries:
            st = status(pd.OK)
            try:
                if not e.receipt_handle:
                    raise GrpcError(pd.INVALID_RECEIPT_HANDLE, "receipt handle is required")
                durable = max(durable, pop.ack(group, topic, e.receipt_handle, now_ms))
            except InvalidRequest as exc:
                err = _pop_error(exc)
                st = status(err.status_code, err.message)
            except GrpcError as err:
                st = status(err.status_code, err.message)
            entries.append(ps.AckMessageResultEntry(message_id=e.message_id,
                                                    receipt_handle=e.receipt_handle, status=st))
        codes = {e.status.code for e in entries}
        top = entries[0].status if len(entries) == 1 else (
            status(pd.OK) if codes == {pd.OK} else status(pd.MULTIPLE_RESULTS, "some acks failed"))
        return Result(ps.AckMessageResponse(status=top, entries=entries), durable)

    def change_invisible(self, client_id: str, req: ps.ChangeInvisibleDurationRequest,
                         now_ms: int) -> Result:
        """ChangeInvisibleDuration: a new receipt handle, invisible for the asked time from now
        (0 .. ``GRPC_INVISIBLE_MAX_MS``, else ILLEGAL_INVISIBLE_TIME)."""
        c = self.core.client(client_id, now_ms)
        group, topic, _ = self._group_topic(req.group, req.topic, c.conn, now_ms)
        ms = duration_ms(req.invisible_duration)
        if not 0 <= ms <= limits.GRPC_INVISIBLE_MAX_MS:
            raise GrpcError(pd.ILLEGAL_INVISIBLE_TIME,
                            f"invisible time {ms} ms not in 0..{limits.GRPC_INVISIBLE_MAX_MS}")
        if not req.receipt_handle:
            raise GrpcError(pd.INVALID_RECEIPT_HANDLE, "receipt handle is required")
        try:
            handle, durable = self.pop.change_invisible(group, topic, req.receipt_handle, ms, now_ms)
        except InvalidRequest as exc:
            raise _pop_error(exc) from exc
        return Result(ps.ChangeInvisibleDurationResponse(status=status(pd.OK),
                                                         receipt_handle=handle), durable)

    def forward_to_dlq(self, client_id: str, req: ps.ForwardMessageToDeadLetterQueueRequest,
                       now_ms: int) -> Result:
        """ForwardMessageToDeadLetterQueue: the message goes to ``%DLQ%<group>`` now, acked."""
        c = self.core.client(client_id, now_ms)
        group, topic, _ = self._group_topic(req.group, req.topic, c.conn, now_ms)
        if not req.receipt_handle:
            raise GrpcError(pd.INVALID_RECEIPT_HANDLE, "receipt handle is required")
        try:
            durable = self.pop.forward_to_dlq(group, topic, req.receipt_handle, now_ms)
        except InvalidRequest as exc:
            raise _pop_error(exc) from exc
        return Result(ps.ForwardMessageToDeadLetterQueueResponse(status=status(pd.OK)), durable)

    def query_assignment(self, client_id: str, req: ps.QueryAssignmentRequest, now_ms: int
                         ) -> Result:
        """QueryAssignment: one queue with id -1 (any queue) for a concurrent group, every queue
        for a FIFO group (``RouteActivity#queryAssignment``)."""
        c = self.core.client(client_id, now_ms)
        group, topic, n = self._group_topic(req.group, req.topic, c.conn, now_ms)
        qids = list(range(n)) if self.core.is_fifo(group) else [-1]
        assignments = [pd.Assignment(message_queue=self.core.queue(topic, q)) for q in qids]
        return Result(ps.QueryAssignmentResponse(status=status(pd.OK), assignments=assignments))
