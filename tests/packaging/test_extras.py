"""Smoke tests of the extras: the wheel installed in fresh virtualenvs with one extra set each.

The core alone (``pip install txmq``) is the SDK: it imports :mod:`txmq.client` and sends to a broker
started from a ``txmq[broker]`` virtualenv, within the size and distribution bounds below, and a
feature of a missing extra names the ``pip install 'txmq[…]'`` that installs it. The wheel is
``$TXMQ_WHEEL`` (``.ci/test`` builds it once) or one ``uv build`` makes here; the versions are
uv.lock's (``uv export`` as constraints), installed from uv's cache (a second or two per venv).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from packaging_helpers import broker, distributions, run, site_bytes, txmq

CORE_MAX_BYTES = 25 * 1024 * 1024
"""Installed size of ``pip install txmq`` (issue 27's bound)."""
CORE_MAX_DISTRIBUTIONS = 5
BROKER_MAX_BYTES = 60 * 1024 * 1024
"""Installed size of ``pip install 'txmq[broker]'`` (issue 27's bound)."""


@pytest.fixture(scope="module")
def core(venv: Callable[[str], Path]) -> Path:
    return venv("")


@pytest.fixture(scope="module")
def broker_venv(venv: Callable[[str], Path]) -> Path:
    return venv("broker")


def test_core_is_the_sdk_within_its_bounds(core: Path) -> None:
    dists = distributions(core)
    assert "txmq" in dists and len(dists) <= CORE_MAX_DISTRIBUTIONS, dists
    assert not {"typer", "sqlalchemy", "pyspark", "crc32c"} & dists
    assert site_bytes(core) <= CORE_MAX_BYTES
    run(core, "import txmq.client, txmq.protocol, txmq.errors")


@pytest.mark.parametrize(("module", "extra"), [
    ("txmq.spark", "spark"), ("txmq.broker", "broker"), ("txmq.cli", "broker"),
    ("txmq.outbox", "outbox"), ("txmq.console", "console"), ("txmq.broker.grpc", "broker")])
def test_a_missing_extra_names_its_install_command(core: Path, module: str, extra: str) -> None:
    proc = run(core, f"""
import txmq.errors
try:
    import {module}
except txmq.errors.MissingExtra as exc:
    assert isinstance(exc, ModuleNotFoundError) and exc.extra == {extra!r}, exc
    print(exc)
""")
    assert f"pip install 'txmq[{extra}]'" in proc.stdout


def test_the_txmq_command_without_the_broker_extra_says_how_to_get_it(core: Path) -> None:
    proc = txmq(core, "--help")
    assert proc.returncode != 0
    assert "pip install 'txmq[broker]'" in proc.stderr


def test_core_sends_to_a_broker_of_the_broker_extra(core: Path, broker_venv: Path,
                                                     tmp_path: Path) -> None:
    assert site_bytes(broker_venv) <= BROKER_MAX_BYTES
    assert "grpcio" not in distributions(broker_venv)
    with broker(broker_venv, tmp_path) as port:
        proc = run(core, f"""
from txmq.client import Message, Producer
with Producer("smoke", "127.0.0.1:{port}") as p:
    print(p.send(Message(topic="smoke", body=b"hello")).status.name)
""")
    assert "SEND_OK" in proc.stdout


def test_core_without_opentelemetry_sends_and_consumes_with_no_trace_context(
        core: Path, broker_venv: Path, tmp_path: Path) -> None:
    """Issue #28: without ``opentelemetry-api`` (the core install has none) the SDK runs, traces
    nothing and adds no ``traceparent`` / ``tracestate`` property (docs/tracing.md)."""
    assert not {"opentelemetry-api", "opentelemetry-sdk"} & distributions(core)
    with broker(broker_venv, tmp_path) as port:
        proc = run(core, f"""
import txmq.tracing
from txmq.client import Message, Producer, PullConsumer, TransactionProducer, LocalTransactionState
assert not txmq.tracing.available()
class Commit:
    def execute_local_transaction(self, msg, arg): return LocalTransactionState.COMMIT_MESSAGE
    def check_local_transaction(self, msg): return LocalTransactionState.COMMIT_MESSAGE
with Producer("smoke", "127.0.0.1:{port}", tracing=txmq.tracing.Tracing()) as p:
    p.send(Message(topic="smoke", body=b"plain"))
with TransactionProducer("smoke-tx", "127.0.0.1:{port}", Commit()) as tp:
    assert tp.send_message_in_transaction(Message(topic="smoke", body=b"tx")).outcome == "COMMIT"
with PullConsumer("127.0.0.1:{port}") as pc:
    msgs = pc.pull("smoke", 0, 0).messages
assert [m.body for m in msgs] == [b"plain", b"tx"], msgs
assert not any(k in m.properties for m in msgs for k in ("traceparent", "tracestate")), msgs
print("untraced")
""")
    assert "untraced" in proc.stdout


def test_the_broker_extra_lists_every_command_and_runs_fuzz_and_trace(broker_venv: Path,
                                                                       tmp_path: Path) -> None:
    """``txmq[broker]`` alone: ``txmq --help`` (which once imported every command, SQLAlchemy
    first, and crashed here), ``txmq fuzz`` and ``txmq trace`` need nothing more."""
    listing = txmq(broker_venv, "--help")
    assert listing.returncode == 0, listing.stderr
    assert all(f" {name} " in listing.stdout for name in ("broker", "outbox", "console", "bench"))
    fuzz = txmq(broker_venv, "fuzz", "--target", "all", "--budget", "5", "--corpus", str(tmp_path / "c"),
                "--json")
    assert fuzz.returncode == 0, fuzz.stderr
    (tmp_path / "traces.jsonl").write_text("")
    trace = txmq(broker_venv, "trace", "list", str(tmp_path / "traces.jsonl"))
    assert trace.returncode == 0, trace.stderr


@pytest.mark.parametrize(("args", "extra"), [
    (("outbox", "status", "sqlite:///x.db"), "outbox"), (("console",), "console"), (("demo",), "demo"),
    (("chaos",), "outbox"), (("bench", "outbox"), "bench"), (("bench", "grpc"), "bench"),
    (("reconcile", "--help"), "spark")])
def test_a_command_whose_extra_is_missing_names_its_install_command(
        broker_venv: Path, args: tuple[str, ...], extra: str) -> None:
    proc = txmq(broker_venv, *args)
    assert proc.returncode == 2
    assert f"pip install 'txmq[{extra}]'" in proc.stderr
    assert "Traceback" not in proc.stderr
