"""Who the console acts as: the logged-in user of the request being served (ACL on), or the
console itself (its own keys, or none)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["Credentials", "acting_user", "current_credentials"]


@dataclass(frozen=True)
class Credentials:
    """An ACL user's access key (its name) and secret key; the secret is left out of ``repr``."""

    user: str
    secret_key: str = field(repr=False)


current_credentials: ContextVar[Credentials | None] = ContextVar("txmq_console_user", default=None)
"""The logged-in user of the request being served (set by the console's login middleware when ACL
is on): every broker call of :class:`Backend` made while it is set is signed with its keys."""


def acting_user() -> str:
    """The logged-in user's name, or "" (ACL off, or the console's own background reads)."""
    creds = current_credentials.get()
    return creds.user if creds else ""
