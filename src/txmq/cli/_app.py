"""``txmq broker``, ``txmq demo`` and admin commands (Typer + Rich)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from txmq.errors import TxmqError

app = typer.Typer(help="txmq: transactional messaging for Python services.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
console = Console(stderr=True)
broker_app = typer.Typer(help="Run a broker (`txmq broker [options]`), or ask one for its status.")
app.add_typer(broker_app, name="broker")


def _register_subapps() -> None:
    from txmq.cli._outbox import outbox_app
    from txmq.cli._reconcile import reconcile
    from txmq.cli._store import store_app
    from txmq.cli._tx import tx_app
    from txmq.namesrv._main import namesrv

    app.add_typer(tx_app, name="tx")
    app.add_typer(outbox_app, name="outbox")
    app.command("reconcile")(reconcile)
    app.add_typer(store_app, name="store")
    app.command("namesrv")(namesrv)


_register_subapps()


@broker_app.callback(invoke_without_command=True)
def broker(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="TOML file of BrokerConfig keys.")] = None,
    host: Annotated[str | None, typer.Option(help="Listen address.")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port; 0 picks a free one.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where the commit log lives.")] = None,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port here.")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Prometheus /metrics port.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING …")] = "INFO",
) -> None:
    """Run a broker until SIGINT/SIGTERM (`txmq broker status` asks a running one instead)."""
    if ctx.invoked_subcommand is not None:
        return
    from txmq.broker import load_config
    from txmq.broker.server import run_server
    from txmq.client._sync import new_event_loop

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(config, host=host, port=port,
                          data_dir=str(data_dir) if data_dir else None, metrics_port=metrics_port)
    except TxmqError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    loop = new_event_loop()
    try:
        loop.run_until_complete(run_server(cfg, port_file=str(port_file) if port_file else None))
    except TxmqError as exc:  # e.g. a commit log damaged below its checkpoint: say what to do
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    finally:
        loop.close()


def main() -> None:
    """Entry point of the ``txmq`` script."""
    from txmq.cli import (
        _bench_consume,  # noqa: F401  (registers `txmq bench consume`)
        _bench_outbox,  # noqa: F401  (registers `txmq bench outbox`)
        _bench_send,  # noqa: F401  (registers `txmq bench send`)
        _bench_spark,  # noqa: F401  (registers `txmq bench spark`)
        _bench_tx,  # noqa: F401  (registers `txmq bench tx`)
        _chaos,  # noqa: F401  (registers `txmq chaos`)
        _demo_cmd,  # noqa: F401  (registers `txmq demo`)
        _fuzz,  # noqa: F401  (registers `txmq fuzz`)
        _group,  # noqa: F401  (registers `txmq group`, `txmq dlq`)
        _message,  # noqa: F401  (registers `txmq message`)
        _status,  # noqa: F401  (registers `txmq broker status`, `txmq parked`)
    )

    app()

