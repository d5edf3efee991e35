"""``txmq tx``: operators' view of transactions — list, show, commit, rollback, resume, stats."""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from txmq.cli._credentials import credential_kw, with_credentials
from txmq.client import Admin
from txmq.errors import TxmqError

tx_app = typer.Typer(help="Transactional messages: inspect and settle half messages.",
                     no_args_is_help=True)
Endpoints = Annotated[str, typer.Option(help="Broker host:port.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
_console = Console()
T = TypeVar("T")


def _call(endpoints: str, fn: Callable[[Admin], T]) -> T:
    try:
        with Admin(endpoints, **credential_kw()) as admin:
            return fn(admin)
    except TxmqError as exc:
        _console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


def _print(obj: Any, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(obj, indent=2))
        return
    rows = obj if isinstance(obj, list) else [obj]
    if not rows:
        _console.print(f"{title}: none")
        return
    table = Table(*rows[0].keys(), title=title)
    for r in rows:
        table.add_row(*(str(r.get(k, "")) for k in rows[0]))
    _console.print(table)


@tx_app.command("stats")
@with_credentials
def stats(endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False) -> None:
    """Counts of the transaction state index: pending, committed, rolled back, discarded, checks."""
    _print(_call(endpoints, lambda a: a.transaction_stats()), as_json, "transactions")


@tx_app.command("list")
@with_credentials
def list_pending(endpoints: Endpoints = "127.0.0.1:10911", limit: int = 100,
                 as_json: AsJson = False) -> None:
    """Pending half messages, oldest first: age, check count, group, topic, key."""
    total, rows = _call(endpoints, lambda a: a.pending_transactions(limit))
    _print(rows, as_json, f"pending half messages ({total} in all)")


@tx_app.command("show")
@with_credentials
def show(ident: Annotated[str, typer.Argument(help="Message id, or half:<offset>.")],
         endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False) -> None:
    """One transaction's state."""
    _print(_call(endpoints, lambda a: a.query_transaction(ident)), as_json, ident)


def _end(ident: str, outcome: str, endpoints: str, reason: str, operator: str | None) -> None:
    who = operator or credential_kw()["access_key"] or getpass.getuser()
    r = _call(endpoints, lambda a: a.operator_end(ident, outcome, who, reason))
    dup = " (already decided)" if r.duplicate else ""
    _console.print(f"{ident}: {r.outcome}{dup}")


def _decision(outcome: str, verb: str) -> Callable[..., None]:
    def command(ident: Annotated[str, typer.Argument(help="Message id, or half:<offset>.")],
                reason: Annotated[str, typer.Option(help="Why (recorded).")],
                endpoints: Endpoints = "127.0.0.1:10911",
                operator: Annotated[str | None, typer.Option(
                    help="Who (default: the access key, else the login).")] = None) -> None:
        _end(ident, outcome, endpoints, reason, operator)

    command.__doc__ = f"{verb} a pending transaction as an operator (recorded with who and why)."
    return command


tx_app.command("commit")(with_credentials(_decision("COMMIT", "Commit")))
tx_app.command("rollback")(with_credentials(_decision("ROLLBACK", "Roll back")))


@tx_app.command("resume")
@with_credentials
def resume(ident: Annotated[str, typer.Argument(help="Message id, or half:<offset>.")],
           endpoints: Endpoints = "127.0.0.1:10911") -> None:
    """Put a half message discarded after transactionCheckMax back to be checked again."""
    offset = _call(endpoints, lambda a: a.resume_transaction(ident))
    _console.print(f"{ident}: resumed as half offset {offset}")
