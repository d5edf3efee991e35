"""``txmq acl user|policy create|update|delete|list`` on an accounts file, and the broker's watcher
picking edits up (``AccountsWatcher``: a changed file is reloaded, a bad one keeps the old accounts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from txmq.broker.acl import AccountsWatcher, Action, Decision, Resource, UserType, load_accounts
from txmq.cli import app
from txmq.errors import ConfigError

_runner = CliRunner()


def acl(path: Path, *args: str) -> Result:
    return _runner.invoke(app, ["acl", *args, "--file", str(path)])


def test_users_and_policies_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "acl.toml"
    assert acl(f, "user", "create", "alice", "--secret-key", "sk1").exit_code == 0
    made = acl(f, "user", "create", "ops", "--super")
    assert made.exit_code == 0 and "secret key: " in made.stdout  # a random one, printed once
    assert acl(f, "policy", "create", "alice", "-r", "Topic:orders", "-a", "Pub,Sub").exit_code == 0
    assert acl(f, "policy", "create", "alice", "-r", "Group:ledger*", "-a", "Sub",
               "--source-ip", "10.0.0.0/8").exit_code == 0
    assert acl(f, "policy", "update", "alice", "-r", "Topic:orders", "-a", "Pub",
               "--decision", "Deny").exit_code == 0
    assert acl(f, "user", "update", "alice", "--secret-key", "sk2").exit_code == 0
    users = load_accounts(f).users
    assert users["ops"].type is UserType.SUPER and users["alice"].secret_key == "sk2"
    first = users["alice"].policy[0]
    assert (first.resource, first.actions, first.decision) == (
        Resource.parse("Topic:orders"), (Action.PUB,), Decision.DENY)
    assert users["alice"].policy[1].source_ips == ("10.0.0.0/8",)
    listed = json.loads(acl(f, "policy", "list", "--json").stdout)
    assert [(r["user"], r["resource"]) for r in listed] == [("alice", "Topic:orders"),
                                                            ("alice", "Group:ledger*")]
    shown = acl(f, "user", "list", "--json").stdout
    assert "sk2" not in shown and json.loads(shown)[0]["policy_entries"] == 2
    assert acl(f, "policy", "delete", "alice", "-r", "Topic:orders").exit_code == 0
    assert acl(f, "policy", "delete", "alice").exit_code == 0
    assert acl(f, "user", "delete", "alice").exit_code == 0
    assert list(load_accounts(f).users) == ["ops"]
    assert oct(f.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("args", [
    ("user", "create", "ops"),  # exists
    ("user", "update", "nobody", "--secret-key", "x"),
    ("user", "delete", "nobody"),
    ("policy", "create", "ops", "-r", "Topic:t", "-a", "Publish"),
    ("policy", "create", "ops", "-r", "Queue:t", "-a", "Pub"),
    ("policy", "create", "ops", "-r", "Topic:t", "-a", "Pub", "--source-ip", "nope"),
    ("policy", "update", "ops", "-r", "Topic:none", "-a", "Pub"),
    ("policy", "delete", "ops", "-r", "Topic:none"),
])
def test_mistakes_exit_2_and_change_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    f = tmp_path / "acl.toml"
    acl(f, "user", "create", "ops", "--secret-key", "s")
    before = f.read_bytes()
    r = acl(f, *args)
    assert r.exit_code == 2 and "error" in r.stdout
    assert f.read_bytes() == before


def test_the_watcher_reloads_changes_and_keeps_the_old_accounts_on_a_bad_file(tmp_path: Path) -> None:
    f = tmp_path / "acl.toml"
    acl(f, "user", "create", "alice", "--secret-key", "one")
    w = AccountsWatcher(f)
    assert w.poll() is None  # unchanged
    acl(f, "user", "update", "alice", "--secret-key", "two")
    new = w.poll()
    assert new is not None and new.users["alice"].secret_key == "two"
    f.write_text("[users.alice]\nsecret_key = ''\n")
    os.utime(f, ns=(1, 1))
    assert w.poll() is None and "secret_key" in w.error
    assert w.accounts.users["alice"].secret_key == "two"
    assert acl(f, "user", "list").exit_code == 2  # the CLI does not edit a broken file either
    f.write_text("[users.alice]\nsecret_key = 'three'\n")  # fixed by hand
    fixed = w.poll()
    assert fixed is not None and fixed.users["alice"].secret_key == "three" and w.error == ""


def test_a_broker_does_not_start_on_a_bad_file(tmp_path: Path) -> None:
    f = tmp_path / "acl.toml"
    f.write_text("[users.a]\n")
    with pytest.raises(ConfigError, match="secret_key"):
        AccountsWatcher(f)
