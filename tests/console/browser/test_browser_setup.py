"""Finding and installing Chromium (:mod:`txmq.testing.browser`), without touching the system: the
paths, ``PATH`` and the user id are patched."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq.testing import browser
from txmq.testing.browser import ChromiumUnavailable, ensure_chromium, find_chromium, install_chromium


@pytest.fixture
def no_chromium(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(browser.CHROMIUM_ENV, raising=False)
    monkeypatch.setattr(browser, "CHROMIUM_PATHS", (str(tmp_path / "chromium"),))
    monkeypatch.setenv("PATH", str(tmp_path))


def test_the_environment_variable_names_the_executable(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    exe = tmp_path / "my-chromium"
    exe.write_text("#!/bin/sh\n")
    monkeypatch.setenv(browser.CHROMIUM_ENV, str(exe))
    with pytest.raises(ChromiumUnavailable, match="not an executable"):
        find_chromium()
    exe.chmod(0o755)
    assert find_chromium() == exe


@pytest.mark.usefixtures("no_chromium")
def test_missing_chromium_is_reported_with_what_to_do() -> None:
    assert find_chromium() is None
    with pytest.raises(ChromiumUnavailable, match="apt-get install chromium"):
        ensure_chromium(install=False)


@pytest.mark.usefixtures("no_chromium")
def test_installing_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    with pytest.raises(ChromiumUnavailable, match="needs root"):
        install_chromium()


@pytest.mark.usefixtures("no_chromium")
def test_installing_needs_apt_get(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    with pytest.raises(ChromiumUnavailable, match="no apt-get"):
        install_chromium()
