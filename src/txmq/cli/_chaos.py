"""``txmq chaos``: the workload under a seeded nemesis over real processes, then the history check."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

_console = Console(stderr=True)


def chaos(
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule; the same seed replays it.")] = 1,
    faults: Annotated[int, typer.Option(help="How many faults to inject.")] = 12,
    duration_s: Annotated[float, typer.Option(help="Seconds the faults spread over.")] = 60.0,
    brokers: Annotated[int, typer.Option(
        min=1, max=26, help="2 or more: a cluster run (a name server and that many brokers; the "
                            "nemesis kills one broker at a time, and the workload's processes).")] = 1,
    replicas: Annotated[int, typer.Option(
        min=0, max=1, help="1: a replicated run (the broker a SYNC_MASTER with a slave behind a "
                           "fault proxy on the HA link; the nemesis kills and pauses either and "
                           "cuts, delays and half-opens the link). One broker only.")] = 0,
    cluster: Annotated[bool, typer.Option(
        "--cluster", help="A failover run (issue 26): 3 controllers, 2 groups of 2 controller-mode "
                          "brokers, a name server and clients, each in its own network namespace "
                          "(root); the nemesis kills, pauses, partitions and clock-jumps masters "
                          "and controllers. Refused when this txmq has no `txmq controller`.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write the Markdown report here.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="Keep histories, databases and logs here "
                                                      "(default: a temporary directory).")] = None,
) -> None:
    """Run producers, transactions, an outbox relay and two consumer groups while killing, pausing,
    partitioning, filling the disk and jumping the clock (or, with --replicas 1, killing and pausing
    a SYNC_MASTER and its slave and cutting the link between them); exit 1 on any violation."""
    from txmq.testing.chaos import ChaosConfig, run_chaos, write_reports

    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the run stops the processes it started
    # and removes its network namespaces instead of leaving them behind.
    signal.signal(signal.SIGTERM, _interrupt)
    if cluster:
        _failover(seed, faults, duration_s, report, json_path, run_dir)
        return
    if replicas and brokers > 1:
        raise typer.BadParameter("a replicated run has one broker group: drop --brokers",
                                 param_hint="--replicas")

    with tempfile.TemporaryDirectory(prefix="txmq-chaos-") as tmp:
        where = run_dir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        res = run_chaos(where, ChaosConfig(seed=seed, faults=faults, duration_s=duration_s,
                                           brokers=brokers, replicas=replicas))
    write_reports(res, report, json_path)
    t = Table("measure", "value",
              title=f"chaos seed {seed}" + (f", {brokers} brokers" if brokers > 1 else "")
              + (", master and slave" if replicas else ""))
    t.add_row("faults injected", str(sum(res.faults_by_kind.values())))
    for kind, n in sorted(res.faults_by_kind.items()):
        t.add_row(f"  {kind}", str(n))
    t.add_row("operations", str(sum(res.operations.values())))
    t.add_row("violations", str(len(res.violations)))
    _console.print(t)
    for kind, why in res.skipped_kinds.items():
        _console.print(f"[yellow]skipped {kind}:[/yellow] {why}")
    for v in res.violations:
        _console.print(f"[red]{v.kind}[/red] {v.key}: {v.detail}")
    if res.violations:
        raise typer.Exit(1)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM handler: raise KeyboardInterrupt, so that cleanup (finally, with) runs."""
    raise KeyboardInterrupt(f"signal {signum}")


def _failover(seed: int, faults: int, duration_s: float, report: Path | None,
              json_path: Path | None, run_dir: Path | None) -> None:
    from txmq.testing.chaos import (
        FailoverConfig,
        failover_refusal,
        run_failover_chaos,
        write_reports,
    )

    if why := failover_refusal():
        _console.print(f"[red]txmq chaos --cluster cannot run here:[/red] {why}")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="txmq-chaos-") as tmp:
        where = run_dir or Path(tmp)
        res = run_failover_chaos(where, FailoverConfig(seed=seed, faults=faults,
                                                       duration_s=duration_s))
    write_reports(res, report, json_path)
    s = res.failover_summary
    t = Table("measure", "value", title=f"failover chaos seed {seed}")
    t.add_row("faults injected", str(sum(1 for f in res.schedule if f.started_ms)))
    t.add_row("failover median / max (ms)", f"{s['median_ms']} / {s['max_ms']}")
    t.add_row("old master took its role back", str(s.get("reinstated", 0)))
    t.add_row("write outage median / max (ms)",
              f"{s.get('restored_median_ms')} / {s.get('restored_max_ms')}")
    t.add_row("violations", str(len(res.violations)))
    _console.print(t)
    for v in res.violations:
        _console.print(f"[red]{v.kind}[/red] {v.key}: {v.detail}")
    if res.violations:
        raise typer.Exit(1)
