"""Debian's Chromium for browser tests, screenshots and the console benchmark: find it, install it
with apt when it is missing and this process is root, and launch it headless with Playwright's sync
API. Playwright's own browser download needs the internet, so it is never used: Playwright drives
the system's ``chromium`` through ``executable_path``.

    from txmq.testing.browser import chromium

    with chromium() as browser:
        page = browser.new_page()
        page.goto("http://127.0.0.1:8080/")

Playwright is a development dependency of txmq: it is imported only when a browser is launched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from txmq import limits
from txmq.errors import BrokerUnavailable, LocalError
from txmq.testing._ports import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser

__all__ = ["CHROMIUM_ARGS", "ChromiumUnavailable", "ConsoleProcess", "chromium", "ensure_chromium",
           "find_chromium", "install_chromium", "run_console"]

log = logging.getLogger(__name__)

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
"""Where Debian (``chromium``) and Ubuntu (``chromium-browser``) put the browser."""

CHROMIUM_ENV = "TXMQ_CHROMIUM"
"""Environment variable naming a Chromium executable to use instead of the system's."""

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")
"""Chromium's flags: headless, no sandbox (containers run as root, where the sandbox refuses to
start), and nothing that reaches the network on its own (updates, sync, QUIC probes)."""


class ChromiumUnavailable(LocalError):
    """No Chromium executable, and none could be installed (not root, no ``apt-get``, or apt
    failed); the message says which."""


def find_chromium() -> Path | None:
    """The Chromium executable: ``$TXMQ_CHROMIUM`` if set, else the first of
    :data:`CHROMIUM_PATHS` (or ``chromium`` on ``PATH``) that exists; None when there is none.

    Raises:
        ChromiumUnavailable: ``$TXMQ_CHROMIUM`` names no executable file.
    """
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise ChromiumUnavailable(f"${CHROMIUM_ENV}={override} is not an executable file")
        return Path(override)
    for candidate in CHROMIUM_PATHS:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    found = shutil.which("chromium")
    return Path(found) if found else None


def _apt_get(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log.warning("running apt-get %s (timeout %.0f s)", " ".join(args), timeout_s)
    try:
        done = subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ChromiumUnavailable(f"apt-get {' '.join(args)} did not finish in {timeout_s:.0f} s") from exc
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    log.warning("apt-get %s exited %d: %s", args[0], done.returncode, " | ".join(tail))
    return done


def install_chromium(timeout_s: float = limits.BROWSER_INSTALL_TIMEOUT_S) -> Path:
    """Install Debian's ``chromium`` package with ``apt-get install -y chromium`` (non-interactive),
    refreshing the package lists first if the install fails without them. Logs each step at WARNING.

    Returns:
        the installed executable.

    Raises:
        ChromiumUnavailable: not root, no ``apt-get``, apt failed or took longer than ``timeout_s``
            per step (default :data:`txmq.limits.BROWSER_INSTALL_TIMEOUT_S`).
    """
    if os.geteuid() != 0:
        raise ChromiumUnavailable("chromium is not installed, and installing it needs root "
                                  "(apt-get install chromium)")
    if shutil.which("apt-get") is None:
        raise ChromiumUnavailable("chromium is not installed, and there is no apt-get to install it")
    done = _apt_get(["install", "-y", "chromium"], timeout_s)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        _apt_get(["update"], timeout_s)
        done = _apt_get(["install", "-y", "chromium"], timeout_s)
    path = find_chromium()
    if done.returncode != 0 or path is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ChromiumUnavailable(f"apt-get install chromium failed: {tail[0]}")
    return path


def ensure_chromium(install: bool = True) -> Path:
    """:func:`find_chromium`, else (with ``install``) :func:`install_chromium`.

    Raises:
        ChromiumUnavailable: no Chromium, and it could not (or was not to) be installed.
    """
    path = find_chromium()
    if path is not None:
        return path
    if not install:
        raise ChromiumUnavailable("chromium is not installed (apt-get install chromium)")
    return install_chromium()


@contextlib.contextmanager
def chromium(executable: Path | None = None, *, install: bool = True) -> Iterator[Browser]:
    """A headless Chromium driven by Playwright's sync API, closed on exit. ``executable`` defaults
    to :func:`ensure_chromium` (which may install it). Use it from one thread: Playwright's sync
    API runs its own event loop in the calling thread (so not inside a running asyncio loop).

    Raises:
        ChromiumUnavailable: no Chromium (see :func:`ensure_chromium`), or it would not start.
    """
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    path = executable or ensure_chromium(install)
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=str(path), args=list(CHROMIUM_ARGS),
                                         headless=True,
                                         timeout=limits.BROWSER_LAUNCH_TIMEOUT_S * 1000)
        except PlaywrightError as exc:
            raise ChromiumUnavailable(f"{path} did not start: {exc.message.splitlines()[0]}") from exc
        try:
            yield browser
        finally:
            browser.close()


class ConsoleProcess:
    """A ``txmq console`` subprocess (uvicorn) on a free loopback port, over ``brokers``.

    Args:
        brokers: broker addresses ``host:port`` (``--broker`` each).
        log_path: where the console's stdout and stderr go.
        args: more ``txmq console`` options (e.g. ``["--outbox-url", url]``).
    """

    def __init__(self, brokers: Sequence[str], log_path: Path, args: Sequence[str] = ()) -> None:
        self.brokers = list(brokers)
        self.log_path = Path(log_path)
        self.args = list(args)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until it answers ``/api/openapi.json``.

        Raises:
            BrokerUnavailable: it exited, or did not answer within
                :data:`txmq.limits.BROWSER_CONSOLE_START_TIMEOUT_S`; the log says why.
        """
        self.port = free_port()
        cmd = [sys.executable, "-m", "txmq", "console", "--host", "127.0.0.1", "--port", str(self.port),
               *(a for b in self.brokers for a in ("--broker", b)), *self.args]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + limits.BROWSER_CONSOLE_START_TIMEOUT_S
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrokerUnavailable(f"txmq console did not start; see {self.log_path}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/api/openapi.json", timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (uvicorn's clean shutdown), SIGKILL if it does not exit in time."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def run_console(brokers: Sequence[str], log_path: Path, args: Sequence[str] = ()
                ) -> Iterator[ConsoleProcess]:
    """Context manager: a started :class:`ConsoleProcess`, stopped on exit."""
    console = ConsoleProcess(brokers, log_path, args)
    console.start()
    try:
        yield console
    finally:
        console.stop()
