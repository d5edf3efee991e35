"""The JSON API under ``/api``: one route per operation, each one :class:`Backend` call.

Errors of the ``txmq.errors`` tree become ``{"detail": reason}`` with 400 (bad input), 404
(unknown id, topic or group), 409 (conflict) or 502 (broker unreachable).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from txmq.console._backend import Backend
from txmq.console._models import (
    AuditPage,
    DlqPage,
    DlqSummary,
    EndTransactionBody,
    EndTransactionResult,
    GroupDetail,
    GroupSummary,
    MessageDetail,
    MessageList,
    MessageTrace,
    OutboxSummary,
    Overview,
    ParkedPage,
    PendingPage,
    ResendBody,
    ResendPage,
    ResetOffsetBody,
    ResetOffsetResult,
    ResumeResult,
    TopicCreateBody,
    TopicDeleted,
    TopicDetail,
    TopicQueues,
    TopicSummary,
    TopicUpdateBody,
)
from txmq.console._msgtrace import MsgTracePage
from txmq.errors import (
    BrokerUnavailable,
    InvalidRequest,
    LocalError,
    RemoteError,
    RequestTimeout,
    ResponseCode,
    TxmqError,
)

__all__ = ["api_router", "error_status", "install_error_handlers"]


_BY_CODE: dict[int, int] = {
    ResponseCode.TOPIC_NOT_EXIST: 404, ResponseCode.QUERY_NOT_FOUND: 404,
    ResponseCode.TRANSACTION_NOT_FOUND: 404, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: 404,
    ResponseCode.TOPIC_EXIST_ALREADY: 409, ResponseCode.ILLEGAL_OPERATION: 409,
    ResponseCode.TRANSACTION_STATE_GROUP_WRONG: 409,
    ResponseCode.MESSAGE_ILLEGAL: 400, ResponseCode.INVALID_PARAMETER: 400, ResponseCode.NO_PERMISSION: 400,
}


def error_status(exc: TxmqError) -> int:
    """The HTTP status of a ``txmq.errors`` exception: by its response code for
    ``InvalidRequest`` and ``RemoteError`` (404 not found, 409 conflict, 400 illegal; a broker's
    NO_PERMISSION, i.e. its ACL refused the logged-in user, 403; other
    broker errors 502), 400 for other local errors (``ConfigError`` …), 502 when a broker cannot
    be reached or answered too late."""
    if isinstance(exc, RemoteError) and exc.response_code == ResponseCode.NO_PERMISSION:
        return 403
    if isinstance(exc, InvalidRequest | RemoteError):
        return _BY_CODE.get(int(exc.response_code), 400 if isinstance(exc, InvalidRequest) else 502)
    if isinstance(exc, BrokerUnavailable | RequestTimeout):
        return 502
    return 400 if isinstance(exc, LocalError) else 502


def _reason(exc: TxmqError) -> str:
    return exc.remark if isinstance(exc, RemoteError) and exc.remark else str(exc)


def _validation_reason(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{where}: {e.get('msg', 'invalid')}" if where else str(e.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Answer ``TxmqError`` with ``{"detail": reason}`` and its status (:func:`error_status`),
    and a request that does not validate (bad JSON, a missing field, a non-integer) with 400."""

    async def on_txmq(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TxmqError)
        return JSONResponse({"detail": _reason(exc)}, status_code=error_status(exc))

    async def on_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse({"detail": _validation_reason(exc)}, status_code=400)

    app.add_exception_handler(TxmqError, on_txmq)
    app.add_exception_handler(RequestValidationError, on_invalid)


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def api_router() -> APIRouter:
    """Every route of the API (mounted under ``/api``)."""
    r = APIRouter()

    @r.get("/overview", response_model=Overview)
    async def overview(request: Request) -> Overview:
        return await _backend(request).overview()

    @r.get("/topics", response_model=list[TopicSummary])
    async def topics(request: Request, system: bool = False) -> list[TopicSummary]:
        return await _backend(request).topics(system)

    @r.get("/topics/{topic}", response_model=TopicDetail)
    async def topic(request: Request, topic: str) -> TopicDetail:
        return await _backend(request).topic(topic)

    @r.post("/topics", response_model=TopicQueues, status_code=201)
    async def create_topic(request: Request, body: TopicCreateBody) -> TopicQueues:
        return await _backend(request).create_topic(body.topic, body.queues)

    @r.put("/topics/{topic}", response_model=TopicQueues)
    async def update_topic(request: Request, topic: str, body: TopicUpdateBody) -> TopicQueues:
        return await _backend(request).update_topic(topic, body.queues)

    @r.delete("/topics/{topic}", response_model=TopicDeleted)
    async def delete_topic(request: Request, topic: str) -> TopicDeleted:
        return await _backend(request).delete_topic(topic)

    @r.get("/groups", response_model=list[GroupSummary])
    async def groups(request: Request) -> list[GroupSummary]:
        return await _backend(request).groups()

    @r.get("/groups/{group}", response_model=GroupDetail)
    async def group(request: Request, group: str) -> GroupDetail:
        return await _backend(request).group(group)

    @r.post("/groups/{group}/reset-offset", response_model=ResetOffsetResult)
    async def reset_offset(request: Request, group: str, body: ResetOffsetBody) -> ResetOffsetResult:
        return await _backend(request).reset_offset(group, body.topic, body.timestamp_ms)

    _transaction_routes(r)
    _dlq_routes(r)
    _message_routes(r)
    return r


def _transaction_routes(r: APIRouter) -> None:
    @r.get("/transactions", response_model=PendingPage)
    async def transactions(request: Request, limit: int = 100, offset: int = 0) -> PendingPage:
        return await _backend(request).tx.transactions(limit, offset)

    @r.get("/transactions/parked", response_model=ParkedPage)
    async def parked(request: Request, limit: int = 100) -> ParkedPage:
        return await _backend(request).tx.parked(limit)

    @r.get("/transactions/audit", response_model=AuditPage)
    async def audit(request: Request, limit: int = 100) -> AuditPage:
        return await _backend(request).tx.audit(limit)

    @r.get("/transactions/{id}")
    async def transaction(request: Request, id: str) -> dict[str, Any]:
        return dict(await _backend(request).tx.transaction(id))

    @r.post("/transactions/{id}/resume", response_model=ResumeResult)
    async def resume(request: Request, id: str) -> ResumeResult:
        return await _backend(request).tx.resume(id)

    @r.post("/transactions/{id}/commit", response_model=EndTransactionResult)
    async def commit(request: Request, id: str, body: EndTransactionBody) -> EndTransactionResult:
        return await _backend(request).tx.end_transaction(id, "COMMIT", body.operator, body.reason)

    @r.post("/transactions/{id}/rollback", response_model=EndTransactionResult)
    async def rollback(request: Request, id: str, body: EndTransactionBody) -> EndTransactionResult:
        return await _backend(request).tx.end_transaction(id, "ROLLBACK", body.operator, body.reason)


def _dlq_routes(r: APIRouter) -> None:
    @r.get("/dlq", response_model=list[DlqSummary])
    async def dlqs(request: Request) -> list[DlqSummary]:
        return await _backend(request).dlqs()

    @r.get("/dlq/{group}", response_model=DlqPage)
    async def dlq(request: Request, group: str, page: int = 0, size: int = 50) -> DlqPage:
        return await _backend(request).dlq(group, page, size)

    @r.get("/dlq/{group}/export")
    async def export(request: Request, group: str, format: Literal["json", "csv"] = "json") -> Response:
        media, data = await _backend(request).export_dlq(group, format)
        name = f"dlq-{group}.{format}"
        return Response(data, media_type=media,
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @r.get("/dlq/{group}/{msg_id}", response_model=MessageDetail)
    async def dlq_message(request: Request, group: str, msg_id: str) -> MessageDetail:
        return await _backend(request).dlq_message(group, msg_id)

    @r.post("/dlq/{group}/resend", response_model=ResendPage)
    async def resend(request: Request, group: str, body: ResendBody) -> ResendPage:
        return await _backend(request).resend_dlq(group, body.msg_ids)


def _message_routes(r: APIRouter) -> None:
    @r.get("/messages", response_model=MessageList)
    async def messages(request: Request, topic: str = "", key: str = "", begin_ms: int = 0,
                       end_ms: int = 0, msg_id: str = "", trace_id: str = "") -> MessageList:
        return await _backend(request).messages(topic, key, begin_ms, end_ms, msg_id, trace_id)

    @r.get("/messages/{msg_id}", response_model=MessageTrace)
    async def message(request: Request, msg_id: str) -> MessageTrace:
        return await _backend(request).message(msg_id)

    @r.get("/messages/{msg_id}/msg-trace", response_model=MsgTracePage)
    async def msg_trace(request: Request, msg_id: str,
                        trace_topic: Annotated[list[str] | None, Query()] = None) -> MsgTracePage:
        return await _backend(request).msg_trace(msg_id, trace_topic or [])

    @r.get("/outbox", response_model=OutboxSummary)
    async def outbox(request: Request) -> OutboxSummary:
        return await _backend(request).outbox()
