"""``txmq namesrv``: the command, defined here so it runs without the rest of the CLI
(``python -m txmq.namesrv``) and is registered in ``txmq.cli`` with ``app.command``."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from txmq import limits

__all__ = ["namesrv"]


def namesrv(
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port; 0 picks a free one.")] = limits.NAMESRV_PORT,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port here.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING …")] = "INFO",
) -> None:
    """Run a name server (RocketMQ's route registry) until SIGINT/SIGTERM."""
    from txmq.namesrv._server import run_namesrv

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run_namesrv(host, port, str(port_file) if port_file else None))
