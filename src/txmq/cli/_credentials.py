"""ACL credentials of every txmq command that talks to a broker, defined once.

:func:`with_credentials` adds ``--access-key`` / ``--secret-key`` (defaults: env ``TXMQ_ACCESS_KEY``
/ ``TXMQ_SECRET_KEY``) to a Typer command; while the command runs, :func:`credential_kw` gives the
keyword arguments every SDK client takes (``access_key``, ``secret_key``). The secret key is never
printed (its default is not shown in ``--help``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any, TypeVar

import typer

__all__ = ["AccessKey", "SecretKey", "credential_kw", "with_credentials"]

AccessKey = Annotated[str, typer.Option(
    "--access-key", envvar="TXMQ_ACCESS_KEY", show_default=False,
    help="ACL access key (user name) to sign requests with (docs/security.md).")]
SecretKey = Annotated[str, typer.Option(
    "--secret-key", envvar="TXMQ_SECRET_KEY", show_default=False,
    help="ACL secret key of --access-key (prefer the environment variable: a command line is "
         "visible to other local users).")]

_current: ContextVar[tuple[str, str]] = ContextVar("txmq_cli_credentials", default=("", ""))
F = TypeVar("F", bound=Callable[..., Any])


def credential_kw() -> dict[str, str]:
    """``{"access_key": …, "secret_key": …}`` of the running command ("" and "" without ACL)."""
    ak, sk = _current.get()
    return {"access_key": ak, "secret_key": sk}


def with_credentials(fn: F) -> F:
    """``fn`` with two more keyword options, ``--access-key`` and ``--secret-key``, made available
    to :func:`credential_kw` while it runs.

    Raises:
        typer.BadParameter: (when the command runs) one of the two keys given without the other.
    """
    sig = inspect.signature(fn, eval_str=True)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default="", annotation=ann)
             for name, ann in (("access_key", AccessKey), ("secret_key", SecretKey))]

    @functools.wraps(fn)
    def command(*args: Any, access_key: str = "", secret_key: str = "", **kw: Any) -> Any:
        if bool(access_key) != bool(secret_key):
            raise typer.BadParameter(
                "give both --access-key and --secret-key (or TXMQ_ACCESS_KEY and TXMQ_SECRET_KEY), "
                "or neither")
        token = _current.set((access_key, secret_key))
        try:
            return fn(*args, **kw)
        finally:
            _current.reset(token)

    params = [*sig.parameters.values(), *extra]
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {
        "return": sig.return_annotation}
    return command  # type: ignore[return-value]
