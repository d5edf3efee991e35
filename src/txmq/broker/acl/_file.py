"""The accounts file: users and their policies in TOML, read, written atomically and watched.

Format (every key of a user but ``secret_key`` optional)::

    [users."alice"]
    secret_key = "alice-secret"
    type = "Normal"                     # or "Super": may do everything
    policy = [
      { resource = "Topic:orders", actions = ["Pub"], decision = "Allow" },
      { resource = "Group:ledger*", actions = ["Sub", "Get"], source_ips = ["10.0.0.0/8"] },
      { resource = "*", actions = ["All"], decision = "Deny", source_ips = ["192.0.2.7"] },
    ]

RocketMQ 5.3 keeps users and ACLs in its metadata store (``AuthenticationMetadataManager``,
``AuthorizationMetadataManager``) and edits them through mqadmin; txmq keeps them in one file the
broker re-reads when it changes (:class:`AccountsWatcher`) and ``txmq acl`` edits (write a
temporary file, fsync, rename: a reader sees the old file or the new one, never half of one).
"""

from __future__ import annotations

import logging
import os
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from txmq.broker.acl._model import (
    Accounts,
    Action,
    Decision,
    PolicyEntry,
    Resource,
    User,
    UserType,
)
from txmq.errors import ConfigError

__all__ = ["AccountsWatcher", "load_accounts", "parse_accounts", "render_accounts", "save_accounts"]

log = logging.getLogger("txmq.broker.acl")

_USER_KEYS = {"secret_key", "type", "policy"}
_ENTRY_KEYS = {"resource", "actions", "decision", "source_ips"}


def _entry(user: str, raw: Any) -> PolicyEntry:
    if not isinstance(raw, dict) or not set(raw) <= _ENTRY_KEYS or "resource" not in raw:
        raise ConfigError(f"user {user!r}: a policy entry is a table of {sorted(_ENTRY_KEYS)} "
                          f"with a resource, got {raw!r}")
    actions = raw.get("actions", [])
    ips = raw.get("source_ips", [])
    if not isinstance(actions, list) or not isinstance(ips, list):
        raise ConfigError(f"user {user!r}: actions and source_ips are lists")
    decision = Decision.of(str(raw.get("decision", "Allow")))
    return PolicyEntry(Resource.parse(str(raw["resource"])),
                       tuple(_action(str(a)) for a in actions), decision,
                       tuple(str(i) for i in ips))


def _action(name: str) -> Action:
    return Action.of(name)


def _user(name: str, raw: Any) -> User:
    if not name:
        raise ConfigError("a user name (access key) must not be empty")
    if not isinstance(raw, dict) or not set(raw) <= _USER_KEYS:
        raise ConfigError(f"user {name!r}: keys are {sorted(_USER_KEYS)}, got {raw!r}")
    secret = raw.get("secret_key")
    if not isinstance(secret, str) or not secret:
        raise ConfigError(f"user {name!r}: secret_key must be a non-empty string")
    utype = UserType.of(str(raw.get("type", "Normal")))
    policy = raw.get("policy", [])
    if not isinstance(policy, list):
        raise ConfigError(f"user {name!r}: policy is a list of entries")
    return User(name, secret, utype, tuple(_entry(name, e) for e in policy))


def parse_accounts(text: str) -> Accounts:
    """An accounts file's users and policies. Raises ConfigError saying what is wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not TOML: {exc}") from exc
    if not set(data) <= {"users"}:
        raise ConfigError(f"unknown top-level keys {sorted(set(data) - {'users'})}; only [users]")
    users = data.get("users", {})
    if not isinstance(users, dict):
        raise ConfigError("users is a table of user name → settings")
    return Accounts({name: _user(name, raw) for name, raw in users.items()})


def _q(s: str) -> str:
    """``s`` as a TOML basic string: JSON's escapes, and DEL (which TOML forbids raw) escaped."""
    return msgspec.json.encode(s).decode().replace("\x7f", "\\u007f")


def _render_entry(e: PolicyEntry) -> str:
    parts = [f"resource = {_q(str(e.resource))}",
             "actions = [" + ", ".join(_q(a.value) for a in e.actions) + "]",
             f"decision = {_q(e.decision.value)}"]
    if e.source_ips:
        parts.append("source_ips = [" + ", ".join(_q(i) for i in e.source_ips) + "]")
    return "  { " + ", ".join(parts) + " },"


def render_accounts(accounts: Accounts) -> str:
    """The TOML text of ``accounts`` (users sorted by name; :func:`parse_accounts` reads it back)."""
    out = ["# txmq ACL accounts: users and their policies (docs/security.md). Edit with `txmq acl`."]
    for name in sorted(accounts.users):
        u = accounts.users[name]
        out += ["", f"[users.{_q(name)}]", f"secret_key = {_q(u.secret_key)}",
                f"type = {_q(u.type.value)}"]
        if u.policy:
            out += ["policy = [", *(_render_entry(e) for e in u.policy), "]"]
    return "\n".join(out) + "\n"


def load_accounts(path: Path) -> Accounts:
    """Read an accounts file. Raises ConfigError (unreadable or invalid, with the path)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read ACL file {path}: {exc}") from exc
    try:
        return parse_accounts(text)
    except ConfigError as exc:
        raise ConfigError(f"ACL file {path}: {exc}") from exc


def save_accounts(path: Path, accounts: Accounts) -> None:
    """Write ``accounts`` to ``path`` atomically (temporary file, fsync, rename; mode 0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_accounts(accounts))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class AccountsWatcher:
    """Re-reads the accounts file when its modification time, size or inode changes.

    Args:
        path: the file.

    Raises:
        ConfigError: at construction, when the file cannot be read or is invalid (the broker does
            not start on a bad file).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self.accounts = load_accounts(path)
        self.error = ""
        """Why the last changed file was refused ("" when it was loaded)."""

    def _stat(self) -> tuple[int, int, int]:
        try:
            st = self.path.stat()
        except OSError:
            return (0, 0, 0)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def poll(self) -> Accounts | None:
        """The new accounts if the file changed and is valid; None if it did not change, or if the
        new file is bad (logged; the old accounts stay in force until a good file comes)."""
        stamp = self._stat()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            self.accounts = load_accounts(self.path)
        except ConfigError as exc:
            self.error = str(exc)
            log.error("%s; keeping the previous users and policies", exc)
            return None
        self.error = ""
        log.info("ACL file %s reloaded: %d users", self.path, len(self.accounts.users))
        return self.accounts
