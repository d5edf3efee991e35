"""``txmq broker``, ``txmq demo`` and admin commands (Typer + Rich)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from txmq.errors import TxmqError

app = typer.Typer(help="txmq: transactional messaging for Python services.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
tx_app = typer.Typer(help="Transactional messages: inspect the broker's transaction index.")
app.add_typer(tx_app, name="tx")
console = Console(stderr=True)


@app.command()
def broker(
    config: Annotated[Path | None, typer.Option(help="TOML file of BrokerConfig keys.")] = None,
    host: Annotated[str | None, typer.Option(help="Listen address.")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port; 0 picks a free one.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where the commit log lives.")] = None,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port here.")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Prometheus /metrics port.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING …")] = "INFO",
) -> None:
    """Run a broker until SIGINT/SIGTERM."""
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
    finally:
        loop.close()


@tx_app.command("stats")
def tx_stats(endpoints: Annotated[str, typer.Option(help="Broker host:port.")] = "127.0.0.1:10911",
             as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Counts of the transaction state index: pending, committed, rolled back, discarded, checks."""
    from txmq.client import PullConsumer

    with PullConsumer(endpoints) as pc:
        stats = pc.transaction_stats()
    if as_json:
        print(json.dumps(stats, indent=2))
        return
    table = Table("counter", "value", title="transactions")
    for k, v in stats.items():
        table.add_row(k, str(v))
    Console().print(table)


def main() -> None:
    """Entry point of the ``txmq`` script."""
    from txmq.cli import _demo_cmd  # noqa: F401  (registers `txmq demo`)

    app()

