"""``txmq broker``, ``txmq demo`` and admin commands (Typer + Rich)."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape

from txmq.errors import MissingExtra, TxmqError
from txmq.extras import require_extra, requires_extra

app = typer.Typer(help="txmq: transactional messaging for Python services.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
console = Console(stderr=True)
broker_app = typer.Typer(help="Run a broker (`txmq broker --port …`), or ask one for its status.")
app.add_typer(broker_app, name="broker")


class _Command(NamedTuple):
    """A command (or sub-app) of the ``txmq`` app, imported only when it is registered."""

    module: str
    attr: str
    short_help: str
    """Its line in ``txmq --help`` (the same whether the command is loaded or listed only)."""
    extra: str = ""
    """The extra whose modules it needs beyond ``broker``'s (checked before it is imported)."""
    needs: tuple[str, ...] = ()
    """Those modules (top-level names), checked with :func:`~txmq.extras.require_extra`."""


_SUB_APPS: dict[str, _Command] = {
    "tx": _Command("txmq.cli._tx", "tx_app", "Transactional messages: inspect and settle half messages."),
    "outbox": _Command("txmq.cli._outbox", "outbox_app",
                       "The local message table (outbox and inbox): init-db, status, purge, relay.",
                       "outbox", ("sqlalchemy", "alembic")),
    "store": _Command("txmq.cli._store", "store_app",
                      "Offline commit log check, repair and migration (no broker may use the directory)."),
    "group": _Command("txmq.cli._group", "group_app",
                      "Consumer groups: members, lag per queue, offset reset."),
    "dlq": _Command("txmq.cli._group", "dlq_app",
                    "Dead-letter queues (%DLQ%<group>): list, show, resend, export."),
    "message": _Command("txmq.cli._message", "message_app",
                        "Messages by key (in a time range) or by id, through the index."),
    "parked": _Command("txmq.cli._status", "parked_app",
                       "Messages the broker's schedulers could not deliver: list, show, resend."),
    "bench": _Command("txmq.cli._bench", "bench_app",
                      "Benchmarks: each prints a table and writes JSON with --json PATH."),
    "topic": _Command("txmq.cli._topic", "topic_app",
                      "Topics: create, update, delete, list, route, per-queue status."),
    "acl": _Command("txmq.cli._acl", "acl_app",
                    "ACL users and policies (the broker's acl_file; docs/security.md)."),
    "trace": _Command("txmq.cli._trace", "trace_app",
                      "Read OTLP JSON lines trace files (e.g. a demo run's traces.jsonl)."),
}
"""Top-level sub-apps."""

_COMMANDS: dict[str, _Command] = {
    "reconcile": _Command("txmq.cli._reconcile", "reconcile",
                          "Report missing, phantom and duplicated messages; exit 1 when there are any.",
                          "spark", ("pyspark", "pyarrow")),
    "namesrv": _Command("txmq.namesrv._main", "namesrv",
                        "Run a name server (RocketMQ's route registry) until SIGINT/SIGTERM."),
    "demo": _Command("txmq.cli._demo_cmd", "demo", "Run the main job: TPC-H orders as transactional messages "
                     "into a ledger and Spark; verify.", "demo", ("pyspark", "sqlalchemy")),
    "controller": _Command("txmq.controller._main", "controller",
                           "Run a controller (RocketMQ 5 controller mode: elects each broker group's master) "
                           "until SIGINT/SIGTERM. Run three; see docs/controller.md."),
    "chaos": _Command("txmq.cli._chaos", "chaos",
                      "Run producers, transactions, an outbox relay and two consumer groups under a seeded "
                      "nemesis (kill, pause, partition, disk full, clock jumps); exit 1 on any violation.",
                      "outbox", ("sqlalchemy",)),
    "fuzz": _Command("txmq.cli._fuzz", "fuzz", "Fuzz decoders and the broker; exit 1 if any target found "
                     "something it does not expect."),
    "send": _Command("txmq.cli._console", "send", "Send a message to TOPIC (COUNT times); one line (or JSON "
                     "object) per stored message: message id, queue, queue offset."),
    "consume": _Command("txmq.cli._console", "consume",
                        "Read TOPIC's messages and print one line (or, with --json, one JSON object) per "
                        "message."),
    "console": _Command("txmq.cli._console_app", "console_cmd",
                        "Serve the web console: overview, topics, groups and lag, transactions, dead-letter "
                        "queues, message search and trace, outbox.",
                        "console", ("fastapi", "uvicorn", "jinja2")),
}
"""Top-level commands."""

_BENCH_COMMANDS: dict[str, _Command] = {
    "consume": _Command("txmq.cli._bench_consume", "consume", "End-to-end latency (send ack → listener call) "
                        "at a fixed rate; consume vs send throughput."),
    "outbox": _Command("txmq.cli._bench_outbox", "outbox", "Relay throughput beside the plain durable "
                       "publish rate: per database, per transport."),
    "send": _Command("txmq.cli._bench_send", "send", "Send throughput vs a bare framed echo ceiling "
                     "(sync and async flush), batch send, pull; with --secure, ACL + TLS on against off."),
    "spark": _Command("txmq.cli._bench_spark", "spark", "Source vs reference source vs Parquet, and "
                      "transactional sink vs plain send (rows/s)."),
    "tx": _Command("txmq.cli._bench_tx", "tx", "Plain vs transactional send, check-round cost vs pending and "
                   "settled history, and the cost of the broker's record of transactions' lives."),
    "grpc": _Command("txmq.cli._bench_grpc", "grpc_cmd", "gRPC door vs remoting door on one broker: "
                     "send msgs/s, and receive + ack (pop vs pull)."),
    "tracing": _Command("txmq.cli._bench_tracing", "tracing", "Send and consume throughput with tracing off, "
                        "with OpenTelemetry's no-op provider, and with the SDK's batch exporter to a file."),
    "console": _Command("txmq.cli._bench_console", "console",
                        "Console page load times (server HTML and full browser load) on a busy broker."),
}
"""``txmq bench`` commands; a module's missing dependency names the ``bench`` extra."""

_registered: set[str] = set()


def _load(name: str, cmd: _Command) -> Any:
    """``cmd``'s command object, its extra checked first. Raises MissingExtra."""
    if cmd.extra:
        require_extra(cmd.extra, name, *cmd.needs)
    return getattr(importlib.import_module(cmd.module), cmd.attr)


def _listed_only() -> None:
    """Stands in for a command in ``txmq --help`` (never run: ``main`` loads the command it runs)."""
    raise typer.Exit(2)


def _register_bench(sub: typer.Typer, only: str | None) -> None:
    """The ``txmq bench`` commands on ``sub``: every one (``only`` None), just ``only``, or (``only``
    not a bench command, e.g. ``--help``) stand-ins that only list them."""
    for name, cmd in _BENCH_COMMANDS.items():
        if only is None or only == name:
            with requires_extra("bench", f"txmq bench {name}"):
                sub.command(name, short_help=cmd.short_help)(_load(f"txmq bench {name}", cmd))
        elif only not in _BENCH_COMMANDS:
            sub.command(name, short_help=cmd.short_help)(_listed_only)


def _register_one(name: str, sub: str | None = None) -> None:
    """Add the top-level command or sub-app ``name`` (``broker``: its ``status``) to :data:`app`;
    ``sub``: the bench command to load (see :func:`_register_bench`). Raises MissingExtra."""
    if name in _registered:
        return
    _registered.add(name)
    if name == "broker":
        broker_app.command("status")(_load("txmq broker status", _Command("txmq.cli._status", "status", "")))
    elif name in _SUB_APPS:
        cmd = _SUB_APPS[name]
        group = _load(f"txmq {name}", cmd)
        if name == "bench":
            _register_bench(group, sub)
        app.add_typer(group, name=name, short_help=cmd.short_help)
    else:
        app.command(name, short_help=_COMMANDS[name].short_help)(_load(f"txmq {name}", _COMMANDS[name]))


def _list_only() -> None:
    """Stand-ins for every command and sub-app but ``broker`` (already there): what ``txmq --help``
    lists, in the order :func:`register_commands` adds the real ones, without importing any."""
    for name, cmd in _COMMANDS.items():
        app.command(name, short_help=cmd.short_help)(_listed_only)
    for name, cmd in _SUB_APPS.items():
        app.add_typer(typer.Typer(), name=name, short_help=cmd.short_help)


def register_commands(only: str | None = None, sub: str | None = None) -> None:
    """Add every sub-app and command to :data:`app`, explicitly (no module registers itself on
    import); with ``only`` a top-level name (``broker``, ``namesrv``, ``tx`` …), just that one (and
    with ``only="bench"``, ``sub`` a bench command, just that one of them), so that
    ``python -m txmq broker`` does not import every command's dependencies (SQLAlchemy, NumPy,
    PySpark's helpers …: about 1.8 s of a broker's start). Idempotent.

    Raises:
        MissingExtra: a command's extra is not installed.
    """
    names = [*_COMMANDS, "broker", *_SUB_APPS]
    for name in [only] if only in names else names:
        _register_one(name, sub if only == "bench" else None)


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
    from txmq.serving import new_event_loop

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
    """Entry point of the ``txmq`` script: registers only the command named in ``sys.argv`` (and
    of ``txmq bench``, only the benchmark named), or, when it names none (``txmq --help``), lists
    every command without importing one. A missing extra is an error naming its install command."""
    args = sys.argv[1:]
    try:
        if args and args[0] in (*_COMMANDS, *_SUB_APPS, "broker"):
            register_commands(args[0], args[1] if len(args) > 1 else "")
        else:
            _list_only()
    except MissingExtra as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise SystemExit(2) from exc
    app()
