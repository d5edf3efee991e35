"""``txmq demo``: the main job, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from txmq.errors import TxmqError

_KEYS = ("brokers", "orders_stored_per_broker", "outbox_transport", "rollback_topic",
         "orders_total", "committed", "rolled_back", "unknown_resolved_by_check",
         "producer_crashes", "crash_orders_committed_by_check", "crash_orders_rolled_back_by_check",
         "resent_after_crash", "check_backs", "ledger_received_distinct", "ledger_duplicates",
         "ledger_rejected", "compensated", "lost", "phantom", "spark_orders", "q1_matches_oracle",
         "revenue_matches_oracle", "spark_skipped", "spark_master", "spark_stage_s", "elapsed_s")


_REPLICA_KEYS = ("replicas", "slave_lag_bytes_at_end", "slave_log_bytes", "slave_log_identical")


def _print_traces(console: Console, rep: dict[str, object]) -> None:
    """Where the spans went, and the command that shows one order's whole trace."""
    if not rep.get("trace_file"):
        console.print("traces: off (--no-traces, or the extra otlp is not installed)")
        return
    console.print(f"traces: {rep['trace_file']} (OTLP JSON lines)", highlight=False, soft_wrap=True)
    example = rep.get("trace_example")
    if isinstance(example, dict):
        console.print(f"order {example['order_key']} (UNKNOWN, committed by a check-back, rejected "
                      f"by the ledger, compensated): {example['command']}", highlight=False,
                      soft_wrap=True)


def demo(
    sf: Annotated[float, typer.Option(help="TPC-H scale factor (0.01 = 15,000 orders).")] = 0.01,
    broker: Annotated[str | None, typer.Option(help="Use this broker (host:port) instead of "
                                                    "starting one.")] = None,
    namesrv_addr: Annotated[str | None, typer.Option(
        help="Find the broker through these name servers (host:port[;host:port]).")] = None,
    brokers: Annotated[int, typer.Option(
        min=1, max=26, help="Brokers to start: 2 or more start a name server and that many "
                            "brokers (broker-a, broker-b, …), every topic on each.")] = 1,
    replicas: Annotated[int, typer.Option(
        min=0, max=1, help="1: the broker the demo starts is a SYNC_MASTER with one slave; the "
                           "report says whether the slave's log ended byte-identical.")] = 0,
    report: Annotated[Path | None, typer.Option(help="Where to write report.json.")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Working directory of the run.")] = None,
    producers: Annotated[int, typer.Option(min=3, help="Order service processes.")] = 3,
    threads: Annotated[int, typer.Option(min=1, help="Sending threads per producer.")] = 2,
    outbox_transport: Annotated[str, typer.Option(
        help="Where the ledger's ROLLBACK events go: txmq, rabbitmq or nats (the transactional "
             "orders always go through txmq).")] = "txmq",
    outbox_url: Annotated[str | None, typer.Option(
        help="URL of that broker (default amqp://guest:guest@127.0.0.1:5672/, "
             "nats://127.0.0.1:4222).")] = None,
    spark: Annotated[bool, typer.Option(help="Run the Spark stage.")] = True,
    spark_master: Annotated[str, typer.Option(
        help="Run the Spark stage on this master: local[N] or a standalone spark://host:port "
             "(its workers need this Python environment at the same path, the broker, and the run "
             "directory).")] = "local[2]",
    spark_cluster: Annotated[bool, typer.Option(
        "--spark-cluster", help="Start a standalone Spark cluster of 2 workers (1 core each) on "
                                "loopback for the Spark stage, and stop it after.")] = False,
    traces: Annotated[bool, typer.Option(
        help="Export the services' spans to <run dir>/traces.jsonl (OTLP JSON lines; needs the "
             "extra otlp); `txmq trace show` reads it.")] = True,
) -> None:
    """Run the main job: TPC-H orders as transactional messages into a ledger and Spark; verify."""
    from txmq.demo._run import DemoOptions, run_demo

    console = Console()
    opts = DemoOptions(sf=sf, broker=broker, namesrv_addr=namesrv_addr, brokers=brokers,
                       replicas=replicas, report=report,
                       producers=producers,
                       producer_threads=threads, outbox_transport=outbox_transport,
                       outbox_url=outbox_url, spark=spark, spark_master=spark_master,
                       spark_cluster=spark_cluster, traces=traces)
    if run_dir is not None:
        opts.run_dir = run_dir
    try:
        rep = run_demo(opts, console)
    except TxmqError as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    table = Table("measure", "value",
                  title=f"txmq demo, TPC-H SF {sf}, ROLLBACK events over {rep['outbox_transport']}")
    for k in _KEYS + (_REPLICA_KEYS if rep.get("replicas") else ()):
        table.add_row(k, str(rep[k]))
    for k, v in rep["stages"].items():
        table.add_row(f"stage {k} (s)", str(v))
    console.print(table)
    for d in rep["q1_diffs"] + rep["revenue_diffs"]:
        console.print(f"[red]diff[/red] {d}")
    _print_traces(console, rep)
    verdict = "[green]consistent[/green]" if rep["consistent"] else "[red]INCONSISTENT[/red]"
    console.print(f"{verdict}; report: {report or opts.run_dir / 'report.json'}")
    if not rep["consistent"]:
        raise typer.Exit(1)
