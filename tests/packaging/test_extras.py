"""Smoke tests of the extras: the wheel installed in fresh virtualenvs with one extra set each.

The core alone (``pip install txmq``) is the SDK: it imports :mod:`txmq.client` and sends to a broker
started from a ``txmq[broker]`` virtualenv, within the size and distribution bounds below, and a
feature of a missing extra names the ``pip install 'txmq[…]'`` that installs it. The wheel is
``$TXMQ_WHEEL`` (``.ci/test`` builds it once) or one ``uv build`` makes here; the versions are
uv.lock's (``uv export`` as constraints), installed from uv's cache (a second or two per venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txmq.testing import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
CORE_MAX_BYTES = 25 * 1024 * 1024
"""Installed size of ``pip install txmq`` (issue 27's bound)."""
CORE_MAX_DISTRIBUTIONS = 5
BROKER_MAX_BYTES = 60 * 1024 * 1024
"""Installed size of ``pip install 'txmq[broker]'`` (issue 27's bound)."""
UV_TIMEOUT_S = 300
"""Longest a ``uv build`` / ``uv pip install`` may take (a cold cache downloads the wheels)."""


def _uv(*args: str) -> str:
    return subprocess.run(["uv", *args], cwd=ROOT, check=True, capture_output=True, text=True,
                          timeout=UV_TIMEOUT_S).stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("TXMQ_WHEEL"):
        return Path(os.environ["TXMQ_WHEEL"])
    out = tmp_path_factory.mktemp("dist")
    _uv("build", "--quiet", "--wheel", "--out-dir", str(out))
    return next(out.glob("txmq-*.whl"))


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    _uv("export", "--quiet", "--locked", "--all-extras", "--no-dev", "--no-emit-project", "--no-hashes",
        "--output-file", str(path))
    return path


def _venv(where: Path, wheel: Path, constraints: Path, extras: str = "") -> Path:
    """A fresh virtualenv at ``where`` with ``txmq[extras]`` from ``wheel``; its python."""
    _uv("venv", "--quiet", "--python", sys.executable, str(where))
    spec = f"txmq[{extras}] @ {wheel.as_uri()}" if extras else f"txmq @ {wheel.as_uri()}"
    _uv("pip", "install", "--quiet", "--python", str(where), "-c", str(constraints), spec)
    return where / "bin" / "python"


def _site_bytes(python: Path) -> int:
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return sum(p.stat().st_size for p in Path(site).rglob("*") if p.is_file() and not p.is_symlink())


def _distributions(python: Path) -> list[str]:
    out = _uv("pip", "list", "--python", str(python), "--format", "json")
    return sorted(d["name"] for d in json.loads(out))


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, wheel: Path, constraints: Path) -> Path:
    return _venv(tmp_path_factory.mktemp("venv") / "core", wheel, constraints)


@pytest.fixture(scope="module")
def broker_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path, constraints: Path) -> Path:
    return _venv(tmp_path_factory.mktemp("venv") / "broker", wheel, constraints, "broker")


def _run(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)


def test_core_is_the_sdk_within_its_bounds(core: Path) -> None:
    dists = _distributions(core)
    assert "txmq" in dists and len(dists) <= CORE_MAX_DISTRIBUTIONS, dists
    assert not {"typer", "sqlalchemy", "pyspark", "crc32c"} & set(dists)
    assert _site_bytes(core) <= CORE_MAX_BYTES
    assert _run(core, "import txmq.client, txmq.protocol, txmq.errors").returncode == 0


@pytest.mark.parametrize(("module", "extra"), [
    ("txmq.spark", "spark"), ("txmq.broker", "broker"), ("txmq.cli", "broker"),
    ("txmq.outbox", "outbox"), ("txmq.console", "console"), ("txmq.broker.grpc", "broker")])
def test_a_missing_extra_names_its_install_command(core: Path, module: str, extra: str) -> None:
    proc = _run(core, f"""
import txmq.errors
try:
    import {module}
except txmq.errors.MissingExtra as exc:
    assert isinstance(exc, ModuleNotFoundError) and exc.extra == {extra!r}, exc
    print(exc)
""")
    assert proc.returncode == 0, proc.stderr
    assert f"pip install 'txmq[{extra}]'" in proc.stdout


def test_the_txmq_command_without_the_broker_extra_says_how_to_get_it(core: Path) -> None:
    proc = subprocess.run([core.parent / "txmq", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "pip install 'txmq[broker]'" in proc.stderr


def test_core_sends_to_a_broker_of_the_broker_extra(core: Path, broker_venv: Path,
                                                     tmp_path: Path) -> None:
    assert _site_bytes(broker_venv) <= BROKER_MAX_BYTES
    assert "grpcio" not in _distributions(broker_venv)
    (tmp_path / "broker.toml").write_text('topics = { smoke = 1 }\n')
    port, port_file = free_port(), tmp_path / "port"
    broker = subprocess.Popen(
        [broker_venv, "-m", "txmq", "broker", "--config", tmp_path / "broker.toml", "--port", str(port),
         "--data-dir", tmp_path / "data", "--port-file", port_file], stderr=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        wait_until(port_file.exists, timeout_s=30)
        print(f"broker listening {time.monotonic() - started:.2f} s after start")
        proc = _run(core, f"""
from txmq.client import Message, Producer
with Producer("smoke", "127.0.0.1:{port}") as p:
    print(p.send(Message(topic="smoke", body=b"hello")).status.name)
""")
        assert proc.returncode == 0, proc.stderr
        assert "SEND_OK" in proc.stdout
    finally:
        broker.terminate()
        _, err = broker.communicate(timeout=30)
    assert broker.returncode == 0, err


def test_core_without_opentelemetry_sends_and_consumes_with_no_trace_context(
        core: Path, broker_venv: Path, tmp_path: Path) -> None:
    """Issue #28: without ``opentelemetry-api`` (the core install has none) the SDK runs, traces
    nothing and adds no ``traceparent`` / ``tracestate`` property (docs/tracing.md)."""
    assert not {"opentelemetry-api", "opentelemetry-sdk"} & set(_distributions(core))
    (tmp_path / "broker.toml").write_text('topics = { smoke = 1 }\n')
    port, port_file = free_port(), tmp_path / "port"
    broker = subprocess.Popen(
        [broker_venv, "-m", "txmq", "broker", "--config", tmp_path / "broker.toml", "--port", str(port),
         "--data-dir", tmp_path / "data", "--port-file", port_file], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(port_file.exists, timeout_s=30)
        proc = _run(core, f"""
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
        assert proc.returncode == 0, proc.stderr
        assert "untraced" in proc.stdout
    finally:
        broker.terminate()
        broker.communicate(timeout=30)
