"""``txmq store check``, ``txmq store repair`` and ``txmq store migrate``: the offline commit log
check and repair a broker that refuses to start names in its error (see :mod:`txmq.store._check`),
and the rewrite of a data directory of the earlier TXM1 format (:mod:`txmq.store._migrate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from txmq.errors import StoreError
from txmq.store import StoreCheck, StoreConfig, check_store, migrate_store, repair_store

__all__ = ["store_app"]

store_app = typer.Typer(help="Offline commit log check, repair and migration (no broker may use the "
                             "directory).",
                        no_args_is_help=True)

DataDir = Annotated[Path, typer.Argument(help="The broker's data directory.", exists=True,
                                         file_okay=False)]
_out = Console()
_err = Console(stderr=True)


def _print(found: StoreCheck) -> None:
    table = Table(title="commit log segments")
    for col in ("segment", "base", "end", "good records"):
        table.add_column(col)
    for s in found.segments:
        table.add_row(s.name, str(s.base), str(s.end), str(s.records))
    _out.print(table)
    _out.print(f"{found.records} good records; log ends at {found.log_end}; checkpoint offset "
               f"{found.checkpoint_offset}")
    for d in found.damaged:
        _out.print(f"[red]damaged[/red] [{d.start}, {d.end}): {d.reason}")
    if found.ok:
        _out.print("[green]no damage[/green]")
        return
    if found.torn_tail_only:
        _out.print("only a torn tail after the checkpoint: the broker cuts it when it starts")
    _out.print(f"repair would cut the log at offset {found.cut_at}, moving {found.cut_bytes} bytes "
               f"({found.records_after_damage} good records after the damage) into "
               f"quarantine/, and rebuild the consume queues, index and transaction index")


@store_app.command("check")
def check(data_dir: DataDir,
          as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Verify every commit log record's CRC (its __CRC32# property); exit 1 if the log is damaged."""
    try:
        found = check_store(data_dir)
    except StoreError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        _out.print_json(msgspec.json.encode(found).decode())
    else:
        _print(found)
    raise typer.Exit(0 if found.ok else 1)


@store_app.command("repair")
def repair(data_dir: DataDir,
           yes: Annotated[bool, typer.Option("--yes", help="Really cut the log.")] = False) -> None:
    """Cut the commit log at its first damaged record into quarantine/ and rebuild derived files."""
    try:
        found = check_store(data_dir)
        _print(found)
        if found.ok:
            return
        if not yes:
            _err.print("nothing changed: run again with --yes to repair")
            raise typer.Exit(1)
        _, moved = repair_store(data_dir)
    except StoreError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    for line in moved:
        _out.print(f"quarantined {line}")
    _out.print("[green]repaired[/green]: the store opens again")


@store_app.command("migrate")
def migrate(data_dir: DataDir,
            segment_bytes: Annotated[int, typer.Option(
                "--segment-bytes", help="Commit log segment size of the rewritten log "
                "(mapped_file_size_commit_log).")] = StoreConfig().mapped_file_size_commit_log,
            ) -> None:
    """Rewrite a data directory of txmq's earlier TXM1 store format into RocketMQ MessageExt
    records, keeping queue (and so consumer) offsets; the old files are kept in migrate.txm1/."""
    try:
        report = migrate_store(data_dir, StoreConfig(mapped_file_size_commit_log=segment_bytes))
    except StoreError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if report.already:
        _out.print(f"{data_dir} is already in the current format: nothing to do")
        return
    torn = (f", {report.torn_tail_bytes} bytes of torn tail dropped" if report.torn_tail_bytes
            else "")
    _out.print(f"migrated {report.records or 'the rest of'} records ({report.old_bytes} → "
               f"{report.new_bytes} bytes, {report.queues} consume queues{torn}); "
               f"the old files are in {report.kept_in} (delete it once the broker runs)")
