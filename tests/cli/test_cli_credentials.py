"""Every broker command of the CLI takes ``--access-key`` / ``--secret-key`` (or ``TXMQ_ACCESS_KEY`` /
``TXMQ_SECRET_KEY``): against a real ACL-enabled broker process a command works with the right key
and is refused (exit 1, the broker's reason printed) without one, with a wrong one, or when the
user's policy does not allow it; the secret key is never printed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from txmq.broker.acl import Accounts, Action, PolicyEntry, Resource, User, UserType, save_accounts
from txmq.cli import app
from txmq.testing import BrokerProcess, run_broker

pytestmark = pytest.mark.slow

_runner = CliRunner()
ROOT_SK = "root-secret-key-1"
ALICE_SK = "alice-secret-key-1"
ROOT = {"TXMQ_ACCESS_KEY": "root", "TXMQ_SECRET_KEY": ROOT_SK}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("acl-cli")
    alice = (PolicyEntry(Resource.parse("Topic:orders"), (Action.PUB, Action.GET)),)
    save_accounts(tmp / "acl.toml", Accounts({
        "root": User("root", ROOT_SK, UserType.SUPER),
        "alice": User("alice", ALICE_SK, UserType.NORMAL, alice)}))
    with run_broker(tmp / "b", topics={"orders": 2}, acl_enable=True,
                    acl_file=str(tmp / "acl.toml")) as b:
        yield b


def txmq(b: BrokerProcess, *args: str, env: dict[str, str] | None = None) -> Result:
    env = {"TXMQ_ACCESS_KEY": "", "TXMQ_SECRET_KEY": ""} | (env or {})
    return _runner.invoke(app, [*args, "--endpoints", b.endpoints], env=env)


def refused(r: Result, reason: str) -> None:
    assert r.exit_code == 1, r.output
    assert "ACL" in r.output and reason in r.output, r.output


@pytest.mark.parametrize("args", [
    ("topic", "list"), ("topic", "status", "orders"), ("group", "list"), ("tx", "stats"),
    ("tx", "list"), ("dlq", "list", "g1"), ("parked", "list"), ("broker", "status"),
    ("message", "query", "orders", "k1"),
])
def test_admin_commands_need_credentials(broker: BrokerProcess, args: tuple[str, ...]) -> None:
    refused(txmq(broker, *args), "no credentials")
    refused(txmq(broker, *args, env={**ROOT, "TXMQ_SECRET_KEY": "wrong"}),
            "signature check failed for access key 'root'")
    ok = txmq(broker, *args, env=ROOT)
    assert ok.exit_code in (0, 1) and "ACL" not in ok.output, ok.output
    if args != ("message", "query", "orders", "k1"):     # no message with key k1: exit 1
        assert ok.exit_code == 0, ok.output


def test_options_sign_and_the_secret_is_not_printed(broker: BrokerProcess) -> None:
    r = txmq(broker, "topic", "list", "--json", "--access-key", "root", "--secret-key", ROOT_SK)
    assert r.exit_code == 0, r.output
    assert "orders" in json.dumps(json.loads(r.output))
    assert ROOT_SK not in txmq(broker, "topic", "list", "--help").output
    half = txmq(broker, "topic", "list", "--access-key", "root")
    assert half.exit_code == 2 and "both --access-key and --secret-key" in half.output


def test_send_consume_and_policies(broker: BrokerProcess) -> None:
    alice = {"TXMQ_ACCESS_KEY": "alice", "TXMQ_SECRET_KEY": ALICE_SK}
    refused(txmq(broker, "send", "orders", "--body", "x"), "no credentials")
    sent = txmq(broker, "send", "orders", "--body", "hello", "--key", "k-cli", "--json", env=alice)
    assert sent.exit_code == 0, sent.output
    refused(txmq(broker, "topic", "create", "other", env=alice),
            "user 'alice' has no policy allowing")
    refused(txmq(broker, "tx", "stats", env=alice), "user 'alice' has no policy allowing")
    got = txmq(broker, "consume", "orders", "--group", "cli-reader", "--from", "first",
               "--count", "1", "--json", env=ROOT)
    assert got.exit_code == 0 and "hello" in got.output, got.output
    created = txmq(broker, "topic", "create", "made-by-root", "--queues", "1", env=ROOT)
    assert created.exit_code == 0, created.output


def test_operator_defaults_to_the_access_key(broker: BrokerProcess, tmp_path: Path) -> None:
    r = txmq(broker, "tx", "commit", "half:999999999", "--reason", "test", env=ROOT)
    assert r.exit_code == 1 and "ACL" not in r.output, r.output      # not found, but authorized
