"""What the console's backend parts share: one broker's clients, and the checks and not-found
handling every part applies before and after it asks a broker."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from txmq import limits
from txmq.client import AsyncAdmin, AsyncPullConsumer
from txmq.errors import InvalidRequest, RemoteError, ResponseCode

__all__ = ["NOT_FOUND", "BrokerClients", "bad", "check_ident", "check_page", "or_empty"]

T = TypeVar("T")
NOT_FOUND = (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.QUERY_NOT_FOUND,
             ResponseCode.TRANSACTION_NOT_FOUND)
"""The broker's answers that mean "no such topic, message or transaction" (404 in the API)."""


@dataclass
class BrokerClients:
    """One broker: its address, an admin client and a reader (pulls without committing)."""

    addr: str
    admin: AsyncAdmin
    reader: AsyncPullConsumer
    name: str = ""

    async def close(self) -> None:
        await self.admin.shutdown()
        await self.reader.shutdown()


def bad(reason: str, code: ResponseCode = ResponseCode.INVALID_PARAMETER) -> InvalidRequest:
    """The error for bad input (400 unless ``code`` says not found or conflict)."""
    return InvalidRequest(code, reason)


def check_page(limit: int, what: str = "limit") -> None:
    """Raises InvalidRequest unless ``limit`` is in 1..``limits.CONSOLE_PAGE_SIZE_MAX`` rows."""
    if not 1 <= limit <= limits.CONSOLE_PAGE_SIZE_MAX:
        raise bad(f"{what} {limit} not in 1..{limits.CONSOLE_PAGE_SIZE_MAX}")


def check_ident(ident: str) -> None:
    """Raises InvalidRequest unless ``ident`` could be a message id or ``half:<offset>``
    (printable, at most ``limits.TOPIC_NAME_MAX_CHARS`` characters)."""
    if not ident or len(ident) > limits.TOPIC_NAME_MAX_CHARS or not ident.isprintable():
        raise bad(f"{ident[:40]!r} is not a message id or half:<offset>")


async def or_empty(call: Awaitable[list[T]]) -> list[T]:
    """``call``'s answer, or [] when the broker says there is no such topic or message."""
    try:
        return await call
    except RemoteError as exc:
        if exc.response_code in NOT_FOUND:
            return []
        raise
