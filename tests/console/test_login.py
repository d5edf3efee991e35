"""The console with ACL (``ConsoleConfig(acl=True)``, ``txmq console --acl``) over a real
ACL-enabled broker process, served by uvicorn: nothing but the login page without a login (API
401, pages redirect), a wrong key is refused with the broker's reason, a login gives a signed
HttpOnly SameSite=Strict cookie with which pages and API work, every action is made with the
user's keys (a denied topic answers 403 with the broker's reason, and nothing is changed), an
operator's decision is recorded under the user's name, HTTP Basic works for scripts, and logout
ends the session. ``txmq console --tls-cert/--tls-key`` serves HTTPS."""

from __future__ import annotations

import base64
import contextlib
import html
import logging
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from txmq.broker.acl import (
    Accounts,
    Action,
    Decision,
    PolicyEntry,
    Resource,
    User,
    UserType,
    save_accounts,
)
from txmq.client import Admin, LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.console import ConsoleConfig
from txmq.testing import BrokerProcess, free_port, run_broker, wait_until

pytestmark = pytest.mark.slow

ROOT = {"access_key": "root", "secret_key": "root-sk-123"}
OPS = ("ops", "ops-sk-123")
ALICE = ("alice", "alice-sk-123")


def _accounts() -> Accounts:
    r = Resource.parse
    alice = (PolicyEntry(r("Cluster:*"), (Action.GET, Action.LIST)),
             PolicyEntry(r("Group:*"), (Action.GET, Action.SUB)),
             PolicyEntry(r("Topic:*"), (Action.GET, Action.LIST, Action.SUB, Action.CREATE,
                                        Action.UPDATE, Action.DELETE)),
             PolicyEntry(r("Topic:secret*"), (Action.ALL,), Decision.DENY))
    return Accounts({"root": User("root", ROOT["secret_key"], UserType.SUPER),
                     "ops": User("ops", OPS[1], UserType.SUPER),
                     "alice": User("alice", ALICE[1], UserType.NORMAL, alice)})


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("login")
    save_accounts(tmp / "acl.toml", _accounts())
    with run_broker(tmp / "b", acl_enable=True, acl_file=str(tmp / "acl.toml"),
                    transaction_timeout_ms=60_000) as b:
        yield b


@pytest.fixture(scope="module")
def console(acl_broker: BrokerProcess, serve_console: Callable[..., Any]) -> Iterator[Any]:
    cfg = ConsoleConfig(brokers=[acl_broker.endpoints], sample_interval_ms=200, acl=True, **ROOT)
    with serve_console(cfg) as s:
        yield s


@pytest.fixture
def web(console: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.url, timeout=30) as client:
        yield client


def login(web: httpx.Client, user: str, secret: str, next_: str = "/") -> httpx.Response:
    return web.post("/login", data={"user": user, "secret_key": secret, "next": next_})


class Undecided:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def test_nothing_without_a_login(web: httpx.Client) -> None:
    r = web.get("/api/topics")
    assert r.status_code == 401 and r.json() == {"detail": "login required"}
    assert r.headers["www-authenticate"].startswith("Basic")
    js = web.get("/api/topics", headers={"X-Requested-With": "txmq-console"})
    assert js.status_code == 401 and "www-authenticate" not in js.headers
    for path in ("/api/overview", "/api/transactions", "/api/openapi.json"):
        assert web.get(path).status_code == 401
    assert web.post("/api/topics", json={"topic": "t", "queues": 1}).status_code == 401
    page = web.get("/topics?system=true")
    assert page.status_code == 303 and page.headers["location"] == "/login?next=%2Ftopics%3Fsystem%3Dtrue"
    form = web.get("/login")
    assert form.status_code == 200 and 'id="login-form"' in form.text
    assert web.get("/static/console.css").status_code == 200
    web.cookies.set("txmq_session", "abc.99999999999999.00")
    assert web.get("/api/topics").status_code == 401


def test_a_wrong_key_is_refused_with_the_brokers_reason(web: httpx.Client) -> None:
    for user, secret, reason in (("alice", "wrong", "signature check failed for access key 'alice'"),
                                 ("mallory", "x", "unknown access key 'mallory'"),
                                 ("alice", "", "give a user name and a secret key")):
        r = login(web, user, secret)
        assert r.status_code == 401 and 'id="login-error"' in r.text, r.text
        assert reason in html.unescape(r.text), r.text
        assert "set-cookie" not in r.headers
    basic = base64.b64encode(b"alice:wrong").decode()
    r = web.get("/api/topics", headers={"Authorization": f"Basic {basic}"})
    assert r.status_code == 401 and "signature check failed" in r.json()["detail"]


def test_login_pages_api_and_logout(web: httpx.Client) -> None:
    r = login(web, *ALICE, next_="/topics")
    assert r.status_code == 303 and r.headers["location"] == "/topics"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "Secure" not in cookie and ALICE[1] not in cookie       # plain HTTP here; no secret
    assert web.get("/api/session").json() == {"user": "alice"}
    assert web.get("/api/topics").status_code == 200
    assert web.get("/api/overview").status_code == 200
    page = web.get("/topics")
    assert page.status_code == 200 and 'data-testid="session-user">alice<' in page.text
    assert web.get("/login", params={"next": "/groups"}).headers["location"] == "/groups"
    assert login(web, *ALICE, next_="https://evil.example/").headers["location"] == "/"
    old = web.cookies["txmq_session"]
    out = web.post("/logout")
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert web.get("/api/topics").status_code == 401
    web.cookies.set("txmq_session", old)       # a logged-out session stays out
    assert web.get("/api/topics").status_code == 401


def test_the_users_policies_decide_every_action(web: httpx.Client, acl_broker: BrokerProcess,
                                                unique: Callable[[str], str],
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="txmq.console.audit")
    secret, mine = unique("secret"), unique("alices")
    with Admin(acl_broker.endpoints, **ROOT) as adm:
        adm.update_topic(secret, 1)
    assert login(web, *ALICE).status_code == 303
    denied = "user 'alice' is denied"
    for r in (web.post("/api/topics", json={"topic": unique("secret"), "queues": 1}),
              web.delete(f"/api/topics/{secret}"), web.get(f"/api/topics/{secret}")):
        assert r.status_code == 403 and denied in r.json()["detail"], r.text
    page = web.get(f"/topics/{secret}")
    assert page.status_code == 403 and denied in html.unescape(page.text) and "Forbidden" in page.text
    assert web.post("/api/transactions/half:1/resume").status_code == 403   # no TxAdmin
    with Admin(acl_broker.endpoints, **ROOT) as adm:
        assert secret in adm.topic_configs().topic_config_table                 # not deleted
    assert web.post("/api/topics", json={"topic": mine, "queues": 2}).status_code == 201
    assert web.delete(f"/api/topics/{mine}").json()["deleted"] is True
    said = [r.getMessage() for r in caplog.records if r.name == "txmq.console.audit"]
    assert f"user alice: DELETE /api/topics/{secret} -> 403" in said
    assert "user alice: POST /api/topics -> 201" in said


def test_operator_decisions_are_recorded_with_the_users_name(web: httpx.Client,
                                                            acl_broker: BrokerProcess,
                                                            unique: Callable[[str], str]) -> None:
    topic = unique("tx")
    with Admin(acl_broker.endpoints, **ROOT) as adm:
        adm.update_topic(topic, 1)
    with TransactionProducer("txp", acl_broker.endpoints, Undecided(), **ROOT) as tp:
        ids = [tp.send_message_in_transaction(Message(topic=topic, body=b"x")).msg_id
               for _ in range(2)]
    assert login(web, *ALICE).status_code == 303
    r = web.post(f"/api/transactions/{ids[0]}/commit", json={"operator": "alice", "reason": "x"})
    assert r.status_code == 403 and "TxAdmin" in r.json()["detail"]
    web.post("/logout")
    assert login(web, *OPS).status_code == 303
    page = web.get("/transactions")
    assert 'value="ops" readonly' in page.text
    r = web.post(f"/api/transactions/{ids[0]}/commit", json={"operator": "someone-else", "reason": "paid"})
    assert r.json() == {"id": ids[0], "outcome": "COMMIT", "operator": "ops", "reason": "paid"}
    basic = base64.b64encode(f"{OPS[0]}:{OPS[1]}".encode()).decode()
    with httpx.Client(base_url=str(web.base_url), timeout=30,
                      headers={"Authorization": f"Basic {basic}"}) as script:
        r = script.post(f"/api/transactions/{ids[1]}/rollback", json={"reason": "fraud"})
        assert r.status_code == 200 and r.json()["operator"] == "ops", r.text
        audit = [e for e in script.get("/api/transactions/audit").json()["items"]
                 if e["topic"] == topic]
    assert [(e["id"], e["outcome"], e["operator"]) for e in audit] == [
        (ids[1], "ROLLBACK", "ops"), (ids[0], "COMMIT", "ops")]


# -- txmq console --acl --tls-cert/--tls-key --------------------------------------------------------
@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is needed to make the test certificate"
    d = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    return d / "cert.pem", d / "key.pem"


@contextlib.contextmanager
def _console_process(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "TXMQ_ACCESS_KEY": ROOT["access_key"], "TXMQ_SECRET_KEY": ROOT["secret_key"]}
    proc = subprocess.Popen([sys.executable, "-m", "txmq", "console", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_txmq_console_serves_https_with_a_login(acl_broker: BrokerProcess,
                                                cert: tuple[Path, Path]) -> None:
    port = free_port()
    with _console_process("--broker", acl_broker.endpoints, "--port", str(port), "--acl",
                          "--tls-cert", str(cert[0]), "--tls-key", str(cert[1]),
                          "--log-level", "warning") as proc:
        url = f"https://127.0.0.1:{port}"
        ctx = ssl.create_default_context(cafile=str(cert[0]))

        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/login", verify=ctx, timeout=5).status_code == 200
            return False

        wait_until(up, timeout_s=60)
        with httpx.Client(base_url=url, verify=ctx, timeout=30) as web:
            r = login(web, *ALICE)
            assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]
            assert web.get("/api/session").json() == {"user": "alice"}
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/login", timeout=5)       # no plaintext


def test_console_refuses_half_a_tls_configuration(cert: tuple[Path, Path]) -> None:
    r = subprocess.run([sys.executable, "-m", "txmq", "console", "--tls-cert", str(cert[0])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "both --tls-cert and --tls-key" in r.stderr
