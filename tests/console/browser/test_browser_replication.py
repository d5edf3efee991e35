"""The overview's replication panel in a real browser: a master and its slave (real processes), the
console over both; the page lists the group's members with the slave's acknowledged offset equal
to the master's end once it caught up, and the slave's own view of its master."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from txmq.client import Admin, Message, Producer
from txmq.testing import BrokerProcess, free_port, wait_until
from txmq.testing.browser import ConsoleProcess, run_console


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    ha, d = free_port(), tmp_path_factory.mktemp("group")
    master = BrokerProcess(d / "master", {"ha_listen_port": ha, "topics": {"t": 1}})
    slave = BrokerProcess(d / "slave", {"broker_role": "SLAVE", "broker_id": 1, "topics": {"t": 1},
                                        "ha_master_address": f"127.0.0.1:{ha}"})
    try:
        master.start()
        slave.start()
        yield master, slave
    finally:
        slave.stop()
        master.stop()


@pytest.fixture(scope="module")
def console(group: tuple[BrokerProcess, BrokerProcess],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleProcess]:
    log = tmp_path_factory.mktemp("console") / "console.log"
    with run_console([b.endpoints for b in group], log) as c:
        yield c


def _caught_up(master: BrokerProcess) -> int:
    """The master's end once its one slave acknowledged all of it (else 0)."""
    with Admin(master.endpoints) as a:
        ha = a.ha_status()
    [conn] = ha.ha_connection_info or [None]
    return ha.master_commit_log_max_offset if conn is not None and conn.diff == 0 else 0


def test_overview_lists_the_group_with_the_slave_caught_up(
        page: Page, group: tuple[BrokerProcess, BrokerProcess], tmp_path: Path) -> None:
    master, slave = group
    with Producer("pg", master.endpoints) as p:
        for i in range(20):
            p.send(Message(topic="t", body=f"m{i}".encode()))
    wait_until(lambda: _caught_up(master) > 0, 30)
    end = _caught_up(master)
    page.goto("/")
    rows = page.get_by_test_id("replica-row")
    expect(rows).to_have_count(4)  # the master's view (itself, its slave), the slave's (itself, master)
    slave_rows = page.locator("[data-testid=replica-row][data-role=SLAVE]")
    expect(slave_rows).to_have_count(2)  # as the master sees it, and as it sees itself
    offsets = {t.strip() for t in slave_rows.get_by_test_id("replica-offset").all_inner_texts()}
    assert offsets == {f"{end:,}"}, offsets  # the page writes thousands with commas
    expect(slave_rows.first.get_by_test_id("replica-lag-bytes")).to_have_text("0")
    expect(slave_rows.first.get_by_test_id("replica-in-sync")).to_have_text("yes")
    master_row = page.locator("[data-testid=replica-row][data-role=MASTER]")
    expect(master_row).to_contain_text(f"127.0.0.1:{master.config['ha_listen_port']}")
    expect(page.locator(f'[data-testid=replica-row]:has-text("{slave.endpoints}")')).to_have_count(1)
