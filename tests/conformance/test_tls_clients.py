"""The official RocketMQ 5 Python client (gRPC) over TLS against a txmq broker whose ``[tls]`` table is
``enforcing`` (issue 16 item 3): with ``tls_enable=True`` and the test CA it sends and receives, also
with ACL credentials on the same broker; in plaintext it is refused and nothing is stored.

The C++-core client (``rocketmq-client-python`` 2.0 over ``librocketmq`` 2.1) has no TLS: its C API has
no TLS setting and its library links no TLS implementation (no OpenSSL symbols). So it is run in
plaintext: a ``permissive`` broker serves it beside txmq's SDK over TLS on the same port. (Against an
``enforcing`` broker it retries the closed connections for minutes instead of failing; the refusal of
plaintext remoting is tested with raw frames and the SDK in ``tests/broker/test_tls.py``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client_envs.rocketmq_grpc import REQUIRE_ENV as GRPC_REQUIRE_ENV
from client_envs.rocketmq_grpc import GrpcClientUnavailable, ensure_env
from txmq.broker.acl import Accounts, User, UserType, save_accounts
from txmq.client import Admin, Message, Producer, PullConsumer
from txmq.testing import BrokerProcess, TestCertificates, free_port, make_test_certificates, run_broker

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).resolve().parent / "clients"
GRPC_SCRIPT = CLIENTS / "rocketmq_grpc_tls.py"
CPP_SCRIPT = CLIENTS / "rocketmq_cpp_acl.py"
REQUIREMENTS = CLIENTS / "rocketmq_grpc_requirements.txt"
TOPICS = {"tls-grpc": 2, "tls-plain": 1, "tls-cpp": 1}
ROOT = {"access_key": "root", "secret_key": "root-sk"}
RUN_TIMEOUT_S = 120
Event = dict[str, Any]


@pytest.fixture(scope="module")
def grpc_python() -> Path:
    try:
        return ensure_env(REQUIREMENTS)
    except GrpcClientUnavailable as e:
        if os.environ.get(GRPC_REQUIRE_ENV) == "1":
            pytest.fail(f"{GRPC_REQUIRE_ENV}=1 but the official gRPC client environment cannot be built: {e}")
        pytest.skip(f"the official gRPC client environment cannot be built here: {e}")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    return make_test_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, certs: TestCertificates) -> Iterator[BrokerProcess]:
    acl = tmp_path_factory.mktemp("acl") / "acl.toml"
    save_accounts(acl, Accounts({"root": User("root", "root-sk", UserType.SUPER)}))
    tls = {"server_mode": "enforcing", "cert_file": str(certs.cert_file), "key_file": str(certs.key_file)}
    with run_broker(tmp_path_factory.mktemp("broker"), topics=TOPICS, grpc_port=free_port(), tls=tls,
                    acl_enable=True, acl_file=str(acl)) as b:
        yield b


def stored(b: BrokerProcess, certs: TestCertificates) -> dict[str, int]:
    with Admin(b.endpoints, tls=True, tls_ca_file=str(certs.ca_file), **ROOT) as a:
        return {t: sum(q.max_offset for q in a.topic_stats(t).offset_table) for t in TOPICS}


def run(python: Path, b: BrokerProcess, home: Path, *args: str) -> list[Event]:
    endpoints = f"127.0.0.1:{b.config['grpc_port']}"
    return script(python, GRPC_SCRIPT, home, "--endpoints", endpoints, "--count", "2", "--ak", "root",
                  "--sk", "root-sk", *args)


def script(python: Path, path: Path, home: Path, *args: str) -> list[Event]:
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(python), str(path), *args], capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S, env=env, cwd=home)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert any(e["event"] == "done" for e in events), f"exit {p.returncode}: {p.stdout}\n{p.stderr[-3000:]}"
    return events


def of(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e["event"] == name]


def test_the_grpc_client_sends_and_receives_over_tls(grpc_python: Path, broker: BrokerProcess,
                                                     certs: TestCertificates, tmp_path: Path) -> None:
    before = stored(broker, certs)
    events = run(grpc_python, broker, tmp_path, "--topic", "tls-grpc", "--tls", "--ca-file",
                 str(certs.ca_file), "--consume-group", "tls-simple")
    assert not of(events, "error"), events
    assert [e["key"] for e in of(events, "sent")] == ["tls-0", "tls-1"], events
    assert sorted(of(events, "received")[0]["keys"]) == ["tls-0", "tls-1"], events
    assert stored(broker, certs)["tls-grpc"] == before["tls-grpc"] + 2


def test_the_grpc_client_in_plaintext_is_refused(grpc_python: Path, broker: BrokerProcess,
                                                 certs: TestCertificates, tmp_path: Path) -> None:
    events = run(grpc_python, broker, tmp_path, "--topic", "tls-plain")
    assert not of(events, "sent"), events
    assert {e["stage"] for e in of(events, "error")} >= {"send"}, events
    assert stored(broker, certs)["tls-plain"] == 0


def test_the_grpc_client_refuses_an_unknown_ca(grpc_python: Path, broker: BrokerProcess,
                                               certs: TestCertificates, tmp_path: Path) -> None:
    events = run(grpc_python, broker, tmp_path, "--topic", "tls-plain", "--tls", "--ca-file",
                 str(certs.other_ca_file))
    assert not of(events, "sent") and of(events, "error"), events
    assert stored(broker, certs)["tls-plain"] == 0


# -- the C++ core: plaintext only ------------------------------------------------------------------
def cpp(python: Path, b: BrokerProcess, home: Path, role: str, group: str) -> list[Event]:
    return script(python, CPP_SCRIPT, home / f"cpp-{role}", role, "--namesrv", b.endpoints, "--topic",
                  "tls-cpp", "--group", group, "--count", "2", "--timeout", "30")


def test_the_cpp_client_in_plaintext_beside_tls_on_a_permissive_port(
        cpp_python: Path, certs: TestCertificates, tmp_path: Path) -> None:
    tls = {"server_mode": "permissive", "cert_file": str(certs.cert_file), "key_file": str(certs.key_file)}
    with run_broker(tmp_path / "b", topics=TOPICS, tls=tls) as b:
        sent = cpp(cpp_python, b, tmp_path, "produce", "tls-pg")
        assert [e["key"] for e in of(sent, "sent")] == ["acl-0", "acl-1"], sent
        with Producer("pg", b.endpoints, tls=True, tls_ca_file=str(certs.ca_file)) as p:
            p.send(Message(topic="tls-cpp", body=b"over tls", keys="tls-sdk"), queue_id=0)
        got = cpp(cpp_python, b, tmp_path, "consume", "tls-cg")
        assert {e["key"] for e in of(got, "received")} >= {"acl-0", "acl-1"}, got
        with PullConsumer(b.endpoints, "check") as c:  # a plaintext SDK client reads all three
            assert len(c.pull("tls-cpp", 0, 0).messages) == 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
