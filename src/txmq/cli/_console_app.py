"""``txmq console``: the web console (JSON API under /api, pages at /) on uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from txmq.errors import TxmqError

__all__ = ["console_cmd"]

_err = Console(stderr=True)


def console_cmd(
    port: Annotated[int, typer.Option(help="HTTP port (0 picks a free one).")] = 8080,
    host: Annotated[str, typer.Option(
        help="Listen address; 127.0.0.1 keeps the console local (it has no login).")] = "127.0.0.1",
    broker: Annotated[list[str] | None, typer.Option(
        "--broker", "--endpoints", help="Broker host:port (repeatable). Default 127.0.0.1:10911 "
                                        "unless --namesrv-addr is given.")] = None,
    namesrv_addr: Annotated[str, typer.Option(
        help="Name servers host:port[;host:port]: the masters found there, and routes.")] = "",
    outbox_url: Annotated[str, typer.Option(
        help="SQLAlchemy URL of an outbox database, for the outbox page.")] = "",
    outbox_prefix: Annotated[str, typer.Option(help="The outbox tables' name prefix.")] = "txmq_",
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the web console: overview, topics, groups and lag, transactions (pending, parked,
    operator commit/rollback, audit log), dead-letter queues, message search and trace, outbox.
    The API is documented at /api/docs."""
    import uvicorn

    from txmq.console import ConsoleConfig, create_app

    brokers = list(broker or ([] if namesrv_addr else ["127.0.0.1:10911"]))
    try:
        app = create_app(ConsoleConfig(brokers=brokers, namesrv_addr=namesrv_addr,
                                       outbox_url=outbox_url, outbox_prefix=outbox_prefix))
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower())
