"""What the sans-IO broker asks its shell to do."""

from __future__ import annotations

import msgspec

from txmq.errors import ResponseCode
from txmq.protocol import Command

__all__ = ["Action", "Close", "Hold", "Reply", "SendTo", "ok_reply"]


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
