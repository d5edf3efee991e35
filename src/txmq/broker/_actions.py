"""What the sans-IO broker asks its shell to do."""

from __future__ import annotations

import logging

import msgspec

from txmq.errors import (
    DiskFull,
    InvalidRequest,
    MalformedHeader,
    MalformedMessage,
    ResponseCode,
    StoreError,
)
from txmq.protocol import Command

__all__ = ["Action", "Close", "Fail", "Hold", "Reply", "SendTo", "failure", "ok_reply"]

log = logging.getLogger("txmq.broker")


class Fail(InvalidRequest):
    """A request handler's failure answered with ``response_code`` and ``remark`` (the broker's
    dispatch turns it into the error response; :meth:`Broker.send` into a failed
    ``SendOutcome``). Part of the one exception tree: an :class:`~txmq.errors.InvalidRequest`."""

    def __init__(self, code: ResponseCode, remark: str) -> None:
        super().__init__(code, remark)
        self.remark = remark


class Reply(msgspec.Struct):
    """Send ``command`` on connection ``conn`` once the store is durable up to ``durable_offset``."""

    conn: int
    command: Command
    durable_offset: int = 0


class SendTo(msgspec.Struct):
    """Send a broker-initiated request (check-back, notification) on connection ``conn``."""

    conn: int
    command: Command


class Hold(msgspec.Struct):
    """Park a pull with no messages (long polling) until new data on (topic, queue) or deadline."""

    conn: int
    request: Command
    topic: str
    queue_id: int
    deadline_ms: int
    held_at_ms: int = 0
    """When the pull arrived (its latency, ``rocketmq_rpc_latency{is_long_polling="true"}``)."""


class Close(msgspec.Struct):
    """Close connection ``conn`` (after sending what is queued)."""

    conn: int


Action = Reply | SendTo | Hold | Close


def ok_reply(conn: int, cmd: Command, ext: dict[str, str] | None = None, body: bytes = b"",
             durable_offset: int = 0) -> list[Action]:
    """The SUCCESS answer to ``cmd`` (none for a one-way request), sent once the store is durable
    up to ``durable_offset``."""
    if cmd.is_oneway:
        return []
    return [Reply(conn, cmd.response(ResponseCode.SUCCESS, None, ext, body), durable_offset)]


def failure(exc: Exception, doing: str) -> tuple[ResponseCode, str]:
    """The response code and remark that answer a request whose handling raised ``exc``
    (``doing``: what failed, for the log). Call it in the ``except`` block: an unexpected
    exception is logged with its traceback."""
    if isinstance(exc, InvalidRequest):
        return exc.response_code, str(exc)
    if isinstance(exc, MalformedMessage):  # a batch body, a compressed body, a property
        return ResponseCode.MESSAGE_ILLEGAL, str(exc)
    if isinstance(exc, MalformedHeader):  # RocketMQ NettyRemotingAbstract.processRequestCommand
        return ResponseCode.SYSTEM_ERROR, str(exc)
    if isinstance(exc, DiskFull):  # RocketMQ's answer to PutMessageStatus.SERVICE_NOT_AVAILABLE
        return (ResponseCode.SERVICE_NOT_AVAILABLE,
                f"service not available now: the broker's disk is full ({exc})")
    if isinstance(exc, StoreError):
        log.error("store error %s: %s", doing, exc)
        return ResponseCode.SYSTEM_ERROR, str(exc)
    log.exception("unexpected error %s", doing)  # the broker never crashes on input
    return ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
