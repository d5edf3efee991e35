"""ACL credentials and TLS of every txmq command that talks to a broker, defined once.

:func:`with_credentials` adds ``--access-key`` / ``--secret-key`` (defaults: env ``TXMQ_ACCESS_KEY``
/ ``TXMQ_SECRET_KEY``) and ``--tls`` / ``--tls-ca-file`` (env ``TXMQ_TLS`` / ``TXMQ_TLS_CA_FILE``)
to a Typer command; while the command runs, :func:`credential_kw` gives the keyword arguments every
SDK client takes (``access_key``, ``secret_key``, ``tls``, ``tls_ca_file``). The secret key is never
printed (its default is not shown in ``--help``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any, TypeVar

import typer

__all__ = ["AccessKey", "SecretKey", "Tls", "TlsCaFile", "credential_kw", "with_credentials"]

AccessKey = Annotated[str, typer.Option(
    "--access-key", envvar="TXMQ_ACCESS_KEY", show_default=False,
    help="ACL access key (user name) to sign requests with (docs/security.md).")]
SecretKey = Annotated[str, typer.Option(
    "--secret-key", envvar="TXMQ_SECRET_KEY", show_default=False,
    help="ACL secret key of --access-key (prefer the environment variable: a command line is "
         "visible to other local users).")]

Tls = Annotated[bool, typer.Option(
    "--tls", envvar="TXMQ_TLS",
    help="Connect to the broker over TLS (RocketMQ tls.enable; docs/security.md).")]
TlsCaFile = Annotated[str, typer.Option(
    "--tls-ca-file", envvar="TXMQ_TLS_CA_FILE", show_default=False,
    help="PEM file of the CA that signed the broker's certificate (default: the system's CAs).")]

_current: ContextVar[tuple[str, str, bool, str]] = ContextVar("txmq_cli_credentials",
                                                              default=("", "", False, ""))
F = TypeVar("F", bound=Callable[..., Any])


def credential_kw() -> dict[str, Any]:
    """``{"access_key", "secret_key", "tls", "tls_ca_file"}`` of the running command (empty keys
    without ACL; ``tls`` False unless ``--tls`` or ``--tls-ca-file``)."""
    ak, sk, tls, ca = _current.get()
    return {"access_key": ak, "secret_key": sk, "tls": tls or bool(ca), "tls_ca_file": ca}


def with_credentials(fn: F) -> F:
    """``fn`` with four more keyword options, ``--access-key``, ``--secret-key``, ``--tls`` and
    ``--tls-ca-file``, made available to :func:`credential_kw` while it runs.

    Raises:
        typer.BadParameter: (when the command runs) one of the two keys given without the other.
    """
    sig = inspect.signature(fn, eval_str=True)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default="", annotation=ann)
             for name, ann in (("access_key", AccessKey), ("secret_key", SecretKey))]
    extra += [inspect.Parameter("tls", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Tls),
              inspect.Parameter("tls_ca_file", inspect.Parameter.KEYWORD_ONLY, default="",
                                annotation=TlsCaFile)]

    @functools.wraps(fn)
    def command(*args: Any, access_key: str = "", secret_key: str = "", tls: bool = False,
                tls_ca_file: str = "", **kw: Any) -> Any:
        if bool(access_key) != bool(secret_key):
            raise typer.BadParameter(
                "give both --access-key and --secret-key (or TXMQ_ACCESS_KEY and TXMQ_SECRET_KEY), "
                "or neither")
        token = _current.set((access_key, secret_key, tls, tls_ca_file))
        try:
            return fn(*args, **kw)
        finally:
            _current.reset(token)

    params = [*sig.parameters.values(), *extra]
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {
        "return": sig.return_annotation}
    return command  # type: ignore[return-value]
