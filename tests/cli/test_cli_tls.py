"""txmq's own tools reach a TLS-enforcing broker: every broker command takes ``--tls`` /
``--tls-ca-file`` (env ``TXMQ_TLS`` / ``TXMQ_TLS_CA_FILE``), and the console
``--broker-tls-ca-file`` (``ConsoleConfig.tls``). Without TLS, or trusting another CA, they are
refused with exit code 1 and the reason. A real broker process, certificates made by ``openssl``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from txmq.cli import app
from txmq.console import ConsoleConfig, create_app
from txmq.testing import BrokerProcess, TestCertificates, make_test_certificates, run_broker

pytestmark = pytest.mark.slow

_runner = CliRunner()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    return make_test_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, certs: TestCertificates) -> Iterator[BrokerProcess]:
    tls = {"server_mode": "enforcing", "cert_file": str(certs.cert_file), "key_file": str(certs.key_file)}
    with run_broker(tmp_path_factory.mktemp("tls-cli"), topics={"orders": 2}, tls=tls) as b:
        yield b


def txmq(b: BrokerProcess, *args: str, env: dict[str, str] | None = None) -> Result:
    env = {"TXMQ_TLS": "", "TXMQ_TLS_CA_FILE": ""} | (env or {})
    return _runner.invoke(app, [*args, "--endpoints", b.endpoints], env=env)


def test_commands_reach_a_tls_broker_with_its_ca(broker: BrokerProcess, certs: TestCertificates) -> None:
    ok = txmq(broker, "topic", "list", "--json", "--tls-ca-file", str(certs.ca_file))
    assert ok.exit_code == 0, ok.output
    assert "orders" in json.dumps(json.loads(ok.output))
    sent = txmq(broker, "send", "orders", "--body", "over tls", "--key", "k-tls",
                env={"TXMQ_TLS": "1", "TXMQ_TLS_CA_FILE": str(certs.ca_file)})
    assert sent.exit_code == 0, sent.output
    found = txmq(broker, "message", "query", "orders", "k-tls", "--json",
                 env={"TXMQ_TLS_CA_FILE": str(certs.ca_file)})
    assert found.exit_code == 0 and "k-tls" in found.output, found.output


def test_commands_without_tls_or_with_another_ca_are_refused(broker: BrokerProcess,
                                                            certs: TestCertificates) -> None:
    plain = txmq(broker, "topic", "list")
    assert plain.exit_code == 1, plain.output
    other = txmq(broker, "topic", "list", "--tls-ca-file", str(certs.other_ca_file))
    assert other.exit_code == 1 and "certificate" in other.output.lower(), other.output


def test_the_console_reaches_a_tls_broker(broker: BrokerProcess, certs: TestCertificates) -> None:
    import httpx

    async def topics(cfg: ConsoleConfig) -> httpx.Response:
        a = create_app(cfg)
        async with a.router.lifespan_context(a):
            transport = httpx.ASGITransport(app=a)
            async with httpx.AsyncClient(transport=transport, base_url="http://console") as c:
                return await c.get("/api/topics")

    r = asyncio.run(topics(ConsoleConfig(brokers=[broker.endpoints], tls=True,
                                         tls_ca_file=str(certs.ca_file))))
    assert r.status_code == 200 and "orders" in [t["topic"] for t in r.json()], r.text
