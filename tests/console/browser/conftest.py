"""Browser tests of the web console: headless Debian Chromium under Playwright, against a real
``txmq console`` process (uvicorn on a free port) over a real broker process.

Chromium comes from :func:`txmq.testing.browser.ensure_chromium` (installed with apt when missing and
running as root). When it cannot be had the tests are skipped with the reason, unless
``TXMQ_REQUIRE_BROWSER=1`` (CI sets it), where that is a failure.

Playwright's sync API keeps an event loop running in this thread while a browser is open, so async
txmq clients must not run here: use the sync clients (their loops run on their own threads).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from txmq.testing import BrokerProcess, ChromiumUnavailable, chromium, ensure_chromium, run_broker
from txmq.testing.browser import ConsoleProcess, run_console

EXPECT_TIMEOUT_MS = 20_000
"""Playwright's auto-waiting ``expect`` and actions: generous, for a loaded 2-core machine."""

BROKER_CONFIG = {
    "topics": {"orders": 2, "dlq-source": 1, "lines": 1},
    # the parked-transaction flow: checked after 300 ms, every 300 ms, discarded after 2 UNKNOWNs
    "transaction_timeout_ms": 300, "transaction_check_interval_ms": 300, "transaction_check_max": 2,
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        path = ensure_chromium()
    except ChromiumUnavailable as exc:
        if os.environ.get("TXMQ_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TXMQ_REQUIRE_BROWSER=1 but no Chromium: {exc}")
        pytest.skip(f"no Chromium for the browser tests: {exc}")
    with chromium(path) as b:
        yield b


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("broker"), **BROKER_CONFIG) as b:
        yield b


@pytest.fixture(scope="module")
def console(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    log = tmp_path_factory.mktemp("console") / "console.log"
    with run_console([broker.endpoints], log) as c:
        yield c


@pytest.fixture
def page(browser: Browser, console: ConsoleProcess, tmp_path: Path) -> Iterator[Page]:
    """A fresh page whose relative URLs go to the console; its console errors fail the test."""
    context: BrowserContext = browser.new_context(base_url=console.url)
    context.set_default_timeout(EXPECT_TIMEOUT_MS)
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield p
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"
