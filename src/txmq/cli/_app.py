"""``txmq broker``, ``txmq demo`` and admin commands (Typer + Rich)."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from txmq.errors import TxmqError

app = typer.Typer(help="txmq: transactional messaging for Python services.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
console = Console(stderr=True)
broker_app = typer.Typer(help="Run a broker (`txmq broker [options]`), or ask one for its status.")
app.add_typer(broker_app, name="broker")


_SUB_APPS: dict[str, tuple[str, str]] = {
    "tx": ("txmq.cli._tx", "tx_app"), "outbox": ("txmq.cli._outbox", "outbox_app"),
    "store": ("txmq.cli._store", "store_app"), "group": ("txmq.cli._group", "group_app"),
    "dlq": ("txmq.cli._group", "dlq_app"), "message": ("txmq.cli._message", "message_app"),
    "parked": ("txmq.cli._status", "parked_app"), "bench": ("txmq.cli._bench", "bench_app"),
    "topic": ("txmq.cli._topic", "topic_app"), "acl": ("txmq.cli._acl", "acl_app"),
    "trace": ("txmq.cli._trace", "trace_app")}
"""Top-level sub-apps: name → (module, attribute), imported only when registered."""

_COMMANDS: dict[str, tuple[str, str]] = {
    "reconcile": ("txmq.cli._reconcile", "reconcile"), "namesrv": ("txmq.namesrv._main", "namesrv"),
    "demo": ("txmq.cli._demo_cmd", "demo"), "controller": ("txmq.controller._main", "controller"),
    "chaos": ("txmq.cli._chaos", "chaos"),
    "fuzz": ("txmq.cli._fuzz", "fuzz"), "send": ("txmq.cli._console", "send"),
    "consume": ("txmq.cli._console", "consume"), "console": ("txmq.cli._console_app", "console_cmd")}
"""Top-level commands: name → (module, function)."""

_BENCH_COMMANDS: dict[str, tuple[str, str]] = {
    "consume": ("txmq.cli._bench_consume", "consume"), "outbox": ("txmq.cli._bench_outbox", "outbox"),
    "send": ("txmq.cli._bench_send", "send"), "spark": ("txmq.cli._bench_spark", "spark"),
    "tx": ("txmq.cli._bench_tx", "tx"), "grpc": ("txmq.cli._bench_grpc", "grpc_cmd"),
    "tracing": ("txmq.cli._bench_tracing", "tracing"),
    "console": ("txmq.cli._bench_console", "console")}
"""``txmq bench`` commands: name → (module, function)."""

_registered: set[str] = set()


def _load(where: tuple[str, str]) -> Any:
    return getattr(importlib.import_module(where[0]), where[1])


def _register_one(name: str) -> None:
    """Add the top-level command or sub-app ``name`` (``broker``: its ``status``) to :data:`app`."""
    if name in _registered:
        return
    _registered.add(name)
    if name == "broker":
        broker_app.command("status")(_load(("txmq.cli._status", "status")))
    elif name in _SUB_APPS:
        sub = _load(_SUB_APPS[name])
        if name == "bench":
            for cmd, where in _BENCH_COMMANDS.items():
                sub.command(cmd)(_load(where))
        app.add_typer(sub, name=name)
    else:
        app.command(name)(_load(_COMMANDS[name]))


def register_commands(only: str | None = None) -> None:
    """Add every sub-app and command to :data:`app`, explicitly (no module registers itself on
    import); with ``only`` a top-level name (``broker``, ``namesrv``, ``tx`` …), just that one, so
    that ``python -m txmq broker`` does not import every command's dependencies (SQLAlchemy,
    NumPy, PySpark's helpers …: about 1.8 s of a broker's start). Idempotent."""
    names = [*_SUB_APPS, *_COMMANDS, "broker"]
    for name in [only] if only in names else names:
        _register_one(name)


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
    otlp_endpoint: Annotated[str | None, typer.Option(
        help="Export transactions' lives as OTLP spans to this OTLP/HTTP URL, e.g. "
             "http://127.0.0.1:4318/v1/traces (extra otlp; docs/tracing.md).")] = None,
    otlp_file: Annotated[Path | None, typer.Option(
        help="Append the same spans to this file as OTLP JSON lines (extra otlp).")] = None,
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
                          broker_election_priority=broker_election_priority,
                          otlp_endpoint=otlp_endpoint,
                          otlp_file=str(otlp_file) if otlp_file else None)
    except TxmqError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")  # (a MissingExtra says txmq[…])
        raise typer.Exit(2) from exc
    loop = new_event_loop()
    try:
        loop.run_until_complete(run_server(cfg, port_file=str(port_file) if port_file else None))
    except TxmqError as exc:  # e.g. a commit log damaged below its checkpoint: say what to do
        console.print(f"[red]error:[/red] {escape(str(exc))}")  # (a MissingExtra says txmq[…])
        raise typer.Exit(2) from exc
    finally:
        loop.close()


def main() -> None:
    """Entry point of the ``txmq`` script: registers only the command named in ``sys.argv``
    (every command when it names none, e.g. ``txmq --help``)."""
    register_commands(sys.argv[1] if len(sys.argv) > 1 else None)
    app()

