"""client_envs.rocketmq_cpp: where the C++-client environment lives, and that it is built once.

The real build (PyPI) is exercised by tests/conformance; here the installer is replaced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from client_envs import rocketmq_cpp
from client_envs.rocketmq_cpp import CppClientUnavailable, cache_root, ensure_env, env_dir


def test_cache_root_prefers_txmq_cache_dir_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TXMQ_CACHE_DIR", raising=False)
    assert cache_root() == tmp_path / "xdg" / "txmq"
    monkeypatch.setenv("TXMQ_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_env_dir_names_both_pinned_versions_and_the_python(tmp_path: Path) -> None:
    name = env_dir(tmp_path).name
    assert rocketmq_cpp.CLIENT_VERSION in name and rocketmq_cpp.CORE_VERSION in name
    assert name.endswith(f"py{sys.version_info.major}{sys.version_info.minor}")


class FakeInstaller:
    """Stands in for uv/pip: lays out a venv and the core wheel's library, counting builds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.builds = 0
        monkeypatch.setattr(rocketmq_cpp, "_check_platform", lambda: None)
        monkeypatch.setattr(rocketmq_cpp, "_install", self.install)
        monkeypatch.setattr(rocketmq_cpp, "_site_packages", lambda python: python.parent.parent / "site")
        monkeypatch.setattr(rocketmq_cpp, "_verify", lambda python: None)

    def install(self, venv: Path, scratch: Path) -> None:
        self.builds += 1
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text("")
        (venv / "site" / "rocketmq").mkdir(parents=True)
        (scratch / "rocketmq").mkdir()
        (scratch / "rocketmq" / rocketmq_cpp.LIBRARY_NAME).write_bytes(b"\x7fELF")


def test_built_once_then_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeInstaller(monkeypatch)
    python = ensure_env(tmp_path)
    assert python == env_dir(tmp_path) / "bin" / "python"
    assert (env_dir(tmp_path) / "site" / "rocketmq" / rocketmq_cpp.LIBRARY_NAME).read_bytes() == b"\x7fELF"
    assert ensure_env(tmp_path) == python
    assert fake.builds == 1


def test_an_interrupted_build_is_redone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    half = env_dir(tmp_path)
    (half / "bin").mkdir(parents=True)  # no ready marker: a build that died midway
    (half / "leftover").write_text("x")
    fake = FakeInstaller(monkeypatch)
    ensure_env(tmp_path)
    assert fake.builds == 1 and not (half / "leftover").exists()


def test_a_core_wheel_without_the_library_is_an_error(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    fake = FakeInstaller(monkeypatch)

    def install_without_library(venv: Path, scratch: Path) -> None:
        fake.install(venv, scratch)
        (scratch / "rocketmq" / rocketmq_cpp.LIBRARY_NAME).unlink()

    monkeypatch.setattr(rocketmq_cpp, "_install", install_without_library)
    with pytest.raises(CppClientUnavailable, match=rocketmq_cpp.LIBRARY_NAME):
        ensure_env(tmp_path)
    assert not (env_dir(tmp_path) / ".txmq-ready").exists()


def test_unsupported_platform_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rocketmq_cpp.platform, "machine", lambda: "aarch64")
    with pytest.raises(CppClientUnavailable, match="x86-64 Linux"):
        ensure_env(tmp_path)


def test_installer_failure_carries_its_output(tmp_path: Path) -> None:
    with pytest.raises(CppClientUnavailable, match="boom"):
        rocketmq_cpp._run([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], "a step")
