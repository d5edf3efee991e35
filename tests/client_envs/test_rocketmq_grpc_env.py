"""client_envs.rocketmq_grpc: the pinned environment of the official gRPC client (where it lives, that
it is built once, that its requirements are exact pins) and the scenario process runner.

The real build (PyPI) is exercised by tests/conformance/test_rocketmq_grpc.py; here the installer is
replaced, and the scenario runner runs this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from client_envs import rocketmq_grpc
from client_envs.rocketmq_grpc import (
    CLIENT_LOG,
    GrpcClientUnavailable,
    ScenarioProcess,
    ensure_env,
    env_dir,
    read_pins,
    run_scenario,
)

REAL_REQUIREMENTS = Path(__file__).resolve().parents[1] / "conformance" / "clients" / \
    "rocketmq_grpc_requirements.txt"


def requirements(tmp_path: Path, text: str = "rocketmq-python-client==5.1.2\ngrpcio==1.85.1\n") -> Path:
    p = tmp_path / "req.txt"
    p.write_text(text)
    return p


def test_the_shipped_requirements_pin_the_client_and_every_dependency() -> None:
    pins = read_pins(REAL_REQUIREMENTS)
    assert pins[rocketmq_grpc.CLIENT_PACKAGE] == rocketmq_grpc.CLIENT_VERSION
    assert {"grpcio", "protobuf", "opentelemetry-sdk"} <= set(pins)


@pytest.mark.parametrize("text", ["rocketmq-python-client>=5.1\n", "grpcio==1.85.1\n",
                                  "rocketmq-python-client==5.1.2\ngrpcio\n"])
def test_requirements_must_be_exact_pins_including_the_client(tmp_path: Path, text: str) -> None:
    with pytest.raises(GrpcClientUnavailable):
        read_pins(requirements(tmp_path, text))


def test_env_dir_names_the_version_the_pins_digest_and_the_python(tmp_path: Path) -> None:
    req = requirements(tmp_path)
    name = env_dir(req, tmp_path).name
    assert rocketmq_grpc.CLIENT_VERSION in name
    assert name.endswith(f"py{sys.version_info.major}{sys.version_info.minor}")
    req.write_text(req.read_text() + "protobuf==7.36.2\n")
    assert env_dir(req, tmp_path).name != name, "another pin set, another environment"


class FakeInstaller:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.builds = 0
        monkeypatch.setattr(rocketmq_grpc, "_install", self.install)
        monkeypatch.setattr(rocketmq_grpc, "_verify", lambda python: None)

    def install(self, venv: Path, req: Path) -> None:
        self.builds += 1
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("")


def test_built_once_then_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeInstaller(monkeypatch)
    req = requirements(tmp_path)
    python = ensure_env(req, tmp_path / "cache")
    assert python == env_dir(req, tmp_path / "cache") / "bin" / "python"
    assert ensure_env(req, tmp_path / "cache") == python
    assert fake.builds == 1


def test_an_interrupted_build_is_redone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    req = requirements(tmp_path)
    half = env_dir(req, tmp_path / "cache")
    (half / "bin").mkdir(parents=True)  # no ready marker: a build that died midway
    (half / "leftover").write_text("x")
    fake = FakeInstaller(monkeypatch)
    ensure_env(req, tmp_path / "cache")
    assert fake.builds == 1 and not (half / "leftover").exists()


def test_a_failed_install_is_an_error_and_not_marked_ready(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    def boom(venv: Path, req: Path) -> None:
        rocketmq_grpc._run([sys.executable, "-c", "import sys; print('no such wheel'); sys.exit(3)"], "pip")

    monkeypatch.setattr(rocketmq_grpc, "_install", boom)
    req = requirements(tmp_path)
    with pytest.raises(GrpcClientUnavailable, match="no such wheel"):
        ensure_env(req, tmp_path / "cache")
    assert not (env_dir(req, tmp_path / "cache") / ".txmq-ready").exists()


SCRIPT = """
import json, os, sys
print(json.dumps({"event": "started", "home": os.environ["HOME"], "args": sys.argv[1:]}), flush=True)
print("not json", flush=True)
os.makedirs(os.path.join(os.environ["HOME"], "logs", "rocketmq_python"), exist_ok=True)
open(os.path.join(os.environ["HOME"], "logs", "rocketmq_python", "rocketmq_client.log"), "w").write("LOGGED")
if sys.argv[1:] == ["fail"]:
    print(json.dumps({"event": "error", "stage": "x", "error": "bad"}), flush=True)
print(json.dumps({"event": "done"}), flush=True)
"""


def test_run_scenario_returns_the_json_events_with_home_set(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    events = run_scenario(Path(sys.executable), script, ["a", "b"], home=tmp_path / "h",
                          log_path=tmp_path / "l")
    assert [e["event"] for e in events] == ["started", "done"]
    assert events[0]["home"] == str(tmp_path / "h") and events[0]["args"] == ["a", "b"]
    assert (tmp_path / "h" / CLIENT_LOG).read_text() == "LOGGED"


def test_an_error_event_fails_the_scenario_quoting_the_client_log(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    p = ScenarioProcess(Path(sys.executable), script, ["fail"], home=tmp_path / "h", log_path=tmp_path / "l")
    with pytest.raises(AssertionError, match=r"(?s)errors:.*bad.*client log: LOGGED"):
        p.ok(30)
