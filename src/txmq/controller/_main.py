"""``txmq controller``: the command, defined here so it runs without the rest of the CLI
(``python -m txmq.controller``) and is registered in ``txmq.cli`` with ``app.command``."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["controller"]

_DEFAULT_PORT = 9878  # txmq.controller.CONTROLLER_PORT, repeated to keep this import light


def controller(
    raft_address: Annotated[str, typer.Option(help="This controller's Raft host:port.")],
    store_dir: Annotated[Path, typer.Option(help="Raft journal, snapshot and controller.port.")],
    raft_peers: Annotated[str, typer.Option(
        help="The other controllers' Raft addresses, host:port,host:port.")] = "",
    host: Annotated[str, typer.Option(help="Listen address (remoting).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port; 0 picks a free one.")] = _DEFAULT_PORT,
    port_file: Annotated[Path | None, typer.Option(
        help="Write the bound port here (default <store-dir>/controller.port).")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING …")] = "INFO",
    access_key: Annotated[str, typer.Option(
        "--access-key", envvar="TXMQ_ACCESS_KEY", show_default=False,
        help="ACL account that signs the role-change pushes to brokers with ACL on (allowed All "
             "on Cluster:<cluster>; docs/security.md).")] = "",
    secret_key: Annotated[str, typer.Option(
        "--secret-key", envvar="TXMQ_SECRET_KEY", show_default=False,
        help="Secret key of --access-key (prefer the environment variable: a command line is "
             "visible to other local users).")] = "",
) -> None:
    """Run a controller (RocketMQ 5 controller mode: elects each broker group's master) until
    SIGINT/SIGTERM. Run three; see docs/controller.md."""
    from txmq.controller._server import run_controller
    from txmq.protocol import parse_address

    peers = [p.strip() for p in raft_peers.split(",") if p.strip()]
    try:
        for addr in (raft_address, *peers):
            parse_address(addr)
    except Exception as exc:
        raise typer.BadParameter(str(exc)) from exc
    if bool(access_key) != bool(secret_key):
        raise typer.BadParameter("give both --access-key and --secret-key (or TXMQ_ACCESS_KEY and "
                                 "TXMQ_SECRET_KEY), or neither")
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run_controller(host, port, raft_address, peers, store_dir,
                               str(port_file) if port_file else None, access_key=access_key,
                               secret_key=secret_key))
