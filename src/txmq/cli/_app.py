"""``txmq broker``, ``txmq demo`` and admin commands (Typer + Rich)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
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


_registered = False


def register_commands() -> None:
    """Add every sub-app and command to :data:`app`, explicitly (no module registers itself on
    import). Idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    from txmq.cli import _bench_consume, _bench_grpc, _bench_outbox, _bench_send, _bench_spark, _bench_tx
    from txmq.cli._acl import acl_app
    from txmq.cli._bench import bench_app
    from txmq.cli._bench_console import console as bench_console
    from txmq.cli._chaos import chaos
    from txmq.cli._console import consume, send
    from txmq.cli._console_app import console_cmd
    from txmq.cli._demo_cmd import demo
    from txmq.cli._fuzz import fuzz
    from txmq.cli._group import dlq_app, group_app
    from txmq.cli._message import message_app
    from txmq.cli._outbox import outbox_app
    from txmq.cli._reconcile import reconcile
    from txmq.cli._status import parked_app, status
    from txmq.cli._store import store_app
    from txmq.cli._topic import topic_app
    from txmq.cli._tx import tx_app
    from txmq.controller._main import controller
    from txmq.namesrv._main import namesrv

    broker_app.command("status")(status)
    for name, sub in (("tx", tx_app), ("outbox", outbox_app), ("store", store_app),
                      ("group", group_app), ("dlq", dlq_app), ("message", message_app),
                      ("parked", parked_app), ("bench", bench_app),
                      ("topic", topic_app), ("acl", acl_app)):
        app.add_typer(sub, name=name)
    commands: list[tuple[typer.Typer, str, Callable[..., None]]] = [
        (app, "reconcile", reconcile), (app, "namesrv", namesrv), (app, "demo", demo),
        (app, "controller", controller),
        (app, "chaos", chaos), (app, "fuzz", fuzz), (app, "send", send), (app, "consume", consume),
        (app, "console", console_cmd),
        (bench_app, "consume", _bench_consume.consume), (bench_app, "outbox", _bench_outbox.outbox),
        (bench_app, "send", _bench_send.send), (bench_app, "spark", _bench_spark.spark),
        (bench_app, "tx", _bench_tx.tx), (bench_app, "grpc", _bench_grpc.grpc_cmd),
        (bench_app, "console", bench_console)]
    for target, name, fn in commands:
        target.command(name)(fn)


@broker_app.callback(invoke_without_command=True)
def broker(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="TOML file of BrokerConfig keys.")] = None,
    host: Annotated[str | None, typer.Option(help="Listen address.")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port; 0 picks a free one.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where the commit log lives.")] = None,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port here.")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Prometheus /metrics port.")] = None,
    grpc_port: Annotated[int | None, typer.Option(
        help="Serve RocketMQ 5 gRPC clients on this port too (the proxy's default is 8081).")] = None,
    namesrv_addr: Annotated[str | None, typer.Option(
        help="Name servers to register with, host:port[;host:port] (RocketMQ namesrvAddr).")] = None,
    broker_name: Annotated[str | None, typer.Option(help="RocketMQ brokerName in routes.")] = None,
    broker_role: Annotated[str | None, typer.Option(
        help="ASYNC_MASTER, SYNC_MASTER or SLAVE (RocketMQ brokerRole; docs/replication.md).")] = None,
    broker_id: Annotated[int | None, typer.Option(
        help="0 for a master, > 0 for a slave (RocketMQ brokerId).")] = None,
    ha_master_address: Annotated[str | None, typer.Option(
        help="A slave's master HA address host:port (RocketMQ haMasterAddress).")] = None,
    enable_controller_mode: Annotated[bool | None, typer.Option(
        "--enable-controller-mode", help="The controller assigns id and role and fails the "
        "group over (RocketMQ enableControllerMode).")] = None,
    controller_addr: Annotated[str | None, typer.Option(
        help="Controllers host:port;host:port;… (RocketMQ controllerAddr).")] = None,
    broker_election_priority: Annotated[int | None, typer.Option(
        help="Lower is preferred at an election (RocketMQ brokerElectionPriority).")] = None,
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
                          data_dir=str(data_dir) if data_dir else None, metrics_port=metrics_port,
                          grpc_port=grpc_port,
                          namesrv_addr=namesrv_addr, broker_name=broker_name,
                          broker_role=broker_role, broker_id=broker_id,
                          ha_master_address=ha_master_address,
                          enable_controller_mode=enable_controller_mode,
                          controller_addr=controller_addr,
                          broker_election_priority=broker_election_priority)
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
    register_commands()
    app()
