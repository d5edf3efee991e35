"""``txmq console``: the web console (JSON API under /api, pages at /) on uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from txmq.cli._credentials import AccessKey, SecretKey
from txmq.errors import TxmqError
from txmq.extras import require_extra

__all__ = ["console_cmd"]

_err = Console(stderr=True)


def console_cmd(
    port: Annotated[int, typer.Option(help="HTTP port (0 picks a free one).")] = 8080,
    host: Annotated[str, typer.Option(
        help="Listen address; 127.0.0.1 keeps the console local (without --acl it has no "
             "login).")] = "127.0.0.1",
    broker: Annotated[list[str] | None, typer.Option(
        "--broker", "--endpoints", help="Broker host:port (repeatable). Default 127.0.0.1:10911 "
                                        "unless --namesrv-addr is given.")] = None,
    namesrv_addr: Annotated[str, typer.Option(
        help="Name servers host:port[;host:port]: the masters found there, and routes.")] = "",
    cluster: Annotated[str, typer.Option(
        "--cluster", "-c", help="With --namesrv-addr: only the masters of this cluster (default: "
                                "every master the name servers list).")] = "",
    outbox_url: Annotated[str, typer.Option(
        help="SQLAlchemy URL of an outbox database, for the outbox page.")] = "",
    outbox_prefix: Annotated[str, typer.Option(help="The outbox tables' name prefix.")] = "txmq_",
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    acl: Annotated[bool, typer.Option(
        "--acl", help="Require a login as a user of the brokers' ACL; every action is then made "
                      "with that user's keys and authorized by the brokers.")] = False,
    access_key: AccessKey = "",
    secret_key: SecretKey = "",
    tls_cert: Annotated[Path | None, typer.Option(
        help="Serve HTTPS with this PEM certificate (chain) file; needs --tls-key.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The PEM private key of --tls-cert.")] = None,
    broker_tls: Annotated[bool, typer.Option(
        "--broker-tls", envvar="TXMQ_TLS", help="Reach the brokers over TLS.")] = False,
    broker_tls_ca_file: Annotated[str, typer.Option(
        "--broker-tls-ca-file", envvar="TXMQ_TLS_CA_FILE", show_default=False,
        help="PEM file of the CA that signed the brokers' certificates (default: the system's "
             "CAs); implies --broker-tls.")] = "",
) -> None:
    """Serve the web console: overview, topics, groups and lag, transactions (pending, parked,
    operator commit/rollback, audit log), dead-letter queues, message search and trace, outbox.
    The API is documented at /api/docs. --access-key/--secret-key are the console's own keys (the
    charts' background sampling; without --acl, every request)."""
    import uvicorn

    from txmq.console import ConsoleConfig, create_app

    if (tls_cert is None) != (tls_key is None):
        _err.print("[red]error:[/red] give both --tls-cert and --tls-key, or neither")
        raise typer.Exit(2)
    brokers = list(broker or ([] if namesrv_addr else ["127.0.0.1:10911"]))
    try:
        if outbox_url:  # the outbox page reads the tables through txmq.outbox
            require_extra("outbox", "txmq console --outbox-url", "sqlalchemy", "alembic")
        app = create_app(ConsoleConfig(brokers=brokers, namesrv_addr=namesrv_addr,
                                       outbox_url=outbox_url, outbox_prefix=outbox_prefix, acl=acl,
                                       access_key=access_key, secret_key=secret_key,
                                       tls=broker_tls, tls_ca_file=broker_tls_ca_file,
                                       cluster=cluster))
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {escape(str(exc))}")  # (a MissingExtra says txmq[…])
        raise typer.Exit(2) from exc
    if not acl and host not in ("127.0.0.1", "localhost", "::1"):
        _err.print(f"[yellow]warning:[/yellow] the console listens on {host} without --acl: anyone "
                   "who reaches it can do everything it offers")
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(),
                ssl_certfile=str(tls_cert) if tls_cert else None,
                ssl_keyfile=str(tls_key) if tls_key else None)
