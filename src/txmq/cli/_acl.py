"""``txmq acl user|policy create|update|delete|list``: edit the broker's accounts file.

Every change reads the file, changes it and writes it back atomically (temporary file, fsync,
rename) under an exclusive lock (``<file>.lock``), so two edits at once do not lose one; a broker
with ``acl_file`` pointing at it picks the change up within ``limits.ACL_RELOAD_POLL_MS``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from txmq.broker.acl import (
    Accounts,
    Action,
    Decision,
    PolicyEntry,
    Resource,
    User,
    UserType,
    load_accounts,
    save_accounts,
)
from txmq.errors import ConfigError

acl_app = typer.Typer(help="ACL users and policies (the broker's acl_file; docs/security.md).",
                      no_args_is_help=True)
user_app = typer.Typer(help="Users: access key (name), secret key, Normal or Super.",
                       no_args_is_help=True)
policy_app = typer.Typer(help="A user's policy entries: resource, actions, Allow/Deny, source IPs.",
                         no_args_is_help=True)
acl_app.add_typer(user_app, name="user")
acl_app.add_typer(policy_app, name="policy")

AclFile = Annotated[Path, typer.Option("--file", "-f", envvar="TXMQ_ACL_FILE",
                                       help="The accounts file (the broker's acl_file).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ResourceOpt = Annotated[str, typer.Option("--resource", "-r",
                                          help="Topic:name, Group:name, Cluster:name; a trailing * "
                                               "is a prefix; * alone is every resource.")]
ActionsOpt = Annotated[str, typer.Option("--actions", "-a",
                                         help="Comma-separated: Pub, Sub, Create, Update, Delete, "
                                              "Get, List, All, TxAdmin, ResetOffset, DlqResend.")]
DecisionOpt = Annotated[str, typer.Option("--decision", help="Allow or Deny.")]
SourceIps = Annotated[list[str] | None, typer.Option("--source-ip",
                                                     help="An address or CIDR range the entry "
                                                          "applies to (repeat; none: any).")]
_console = Console()
_DEFAULT_FILE = Path("acl.toml")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _edit(path: Path, change: Callable[[Accounts], str]) -> None:
    """Apply ``change`` to the file's accounts (a new file if there is none) and save; print
    what ``change`` returns. A ConfigError exits 2 with its message, nothing written."""
    try:
        with _locked(path):
            accounts = load_accounts(path) if path.exists() else Accounts()
            said = change(accounts)
            save_accounts(path, accounts)
    except ConfigError as exc:
        _console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    print(said)


def _read(path: Path) -> Accounts:
    try:
        return load_accounts(path)
    except ConfigError as exc:
        _console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


def _user(accounts: Accounts, name: str) -> User:
    user = accounts.users.get(name)
    if user is None:
        raise ConfigError(f"no user {name!r}")
    return user


def _user_type(is_super: bool) -> UserType:
    return UserType.SUPER if is_super else UserType.NORMAL


@user_app.command("create")
def user_create(name: str, secret_key: Annotated[str, typer.Option(
                    help="The secret key; a random one is made and printed when omitted.")] = "",
                is_super: Annotated[bool, typer.Option("--super", help="May do everything.")] = False,
                file: AclFile = _DEFAULT_FILE) -> None:
    """Add a user (its access key is NAME). Exits 2 if it exists."""
    sk = secret_key or secrets.token_urlsafe(24)

    def change(a: Accounts) -> str:
        if not name or name in a.users:
            raise ConfigError(f"user {name!r} exists already" if name else "empty user name")
        a.users[name] = User(name, sk, _user_type(is_super))
        return f"user {name} created" + ("" if secret_key else f"; secret key: {sk}")
    _edit(file, change)


@user_app.command("update")
def user_update(name: str, secret_key: Annotated[str, typer.Option(help="A new secret key.")] = "",
                user_type: Annotated[str, typer.Option("--type", help="Normal or Super.")] = "",
                file: AclFile = _DEFAULT_FILE) -> None:
    """Change a user's secret key or type. Exits 2 if there is no such user."""
    def change(a: Accounts) -> str:
        u = _user(a, name)
        new_type = u.type if not user_type else UserType.of(user_type)
        a.users[name] = replace(u, secret_key=secret_key or u.secret_key, type=new_type)
        return f"user {name} updated"
    _edit(file, change)


@user_app.command("delete")
def user_delete(name: str, file: AclFile = _DEFAULT_FILE) -> None:
    """Remove a user and its policy. Exits 2 if there is no such user."""
    def change(a: Accounts) -> str:
        _user(a, name)
        del a.users[name]
        return f"user {name} deleted"
    _edit(file, change)


@user_app.command("list")
def user_list(file: AclFile = _DEFAULT_FILE, as_json: AsJson = False) -> None:
    """Users, their type and number of policy entries (secret keys are not shown)."""
    rows = [{"user": u.name, "type": u.type.value, "policy_entries": len(u.policy)}
            for u in sorted(_read(file).users.values(), key=lambda u: u.name)]
    _print(rows, as_json, "users")


def _entry(resource: str, actions: str, decision: str, source_ip: list[str] | None) -> PolicyEntry:
    parsed = tuple(Action.of(a) for a in actions.split(",") if a.strip())
    return PolicyEntry(Resource.parse(resource), parsed, Decision.of(decision),
                       tuple(source_ip or ()))


@policy_app.command("create")
def policy_create(user: str, resource: ResourceOpt, actions: ActionsOpt,
                  decision: DecisionOpt = "Allow", source_ip: SourceIps = None,
                  file: AclFile = _DEFAULT_FILE) -> None:
    """Add an entry to USER's policy. Exits 2 if USER has one for that resource already (use
    update)."""
    def change(a: Accounts) -> str:
        u = _user(a, user)
        e = _entry(resource, actions, decision, source_ip)
        if any(x.resource == e.resource for x in u.policy):
            raise ConfigError(f"user {user!r} has an entry for {e.resource} already; use update")
        a.users[user] = replace(u, policy=(*u.policy, e))
        return f"policy entry {e.resource} added to {user}"
    _edit(file, change)


@policy_app.command("update")
def policy_update(user: str, resource: ResourceOpt, actions: ActionsOpt,
                  decision: DecisionOpt = "Allow", source_ip: SourceIps = None,
                  file: AclFile = _DEFAULT_FILE) -> None:
    """Replace USER's entry for a resource. Exits 2 if there is none."""
    def change(a: Accounts) -> str:
        u = _user(a, user)
        e = _entry(resource, actions, decision, source_ip)
        if not any(x.resource == e.resource for x in u.policy):
            raise ConfigError(f"user {user!r} has no entry for {e.resource}; use create")
        a.users[user] = replace(u, policy=tuple(e if x.resource == e.resource else x
                                                 for x in u.policy))
        return f"policy entry {e.resource} of {user} updated"
    _edit(file, change)


@policy_app.command("delete")
def policy_delete(user: str, resource: Annotated[str, typer.Option(
                      "--resource", "-r", help="The entry's resource; omitted: every entry.")] = "",
                  file: AclFile = _DEFAULT_FILE) -> None:
    """Remove USER's entry for a resource, or its whole policy. Exits 2 if there is none."""
    def change(a: Accounts) -> str:
        u = _user(a, user)
        target = Resource.parse(resource) if resource else None
        kept = tuple(x for x in u.policy if target is not None and x.resource != target)
        if len(kept) == len(u.policy):
            raise ConfigError(f"user {user!r} has no entry for {resource or 'any resource'}")
        a.users[user] = replace(u, policy=kept)
        return f"{len(u.policy) - len(kept)} policy entries of {user} deleted"
    _edit(file, change)


@policy_app.command("list")
def policy_list(user: Annotated[str, typer.Argument(help="Only this user's entries.")] = "",
                file: AclFile = _DEFAULT_FILE, as_json: AsJson = False) -> None:
    """Policy entries: user, resource, actions, decision, source IPs."""
    rows = [{"user": u.name, "resource": str(e.resource),
             "actions": ",".join(x.value for x in e.actions), "decision": e.decision.value,
             "source_ips": ",".join(e.source_ips)}
            for u in sorted(_read(file).users.values(), key=lambda u: u.name)
            if not user or u.name == user for e in u.policy]
    _print(rows, as_json, "policy entries")


def _print(rows: Sequence[Mapping[str, object]], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        _console.print(f"{title}: none")
        return
    table = Table(*rows[0].keys(), title=title)
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    _console.print(table)
