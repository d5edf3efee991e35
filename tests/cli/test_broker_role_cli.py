"""`txmq broker --broker-role/--broker-id/--ha-master-address` reach BrokerConfig and its role rules."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from txmq.cli import app

_runner = CliRunner()


def test_a_slave_without_a_positive_broker_id_does_not_start(tmp_path: Path) -> None:
    r = _runner.invoke(app, ["broker", "--broker-role", "SLAVE", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "broker_id must be > 0" in r.output


def test_a_bad_ha_master_address_is_refused(tmp_path: Path) -> None:
    r = _runner.invoke(app, ["broker", "--broker-role", "SLAVE", "--broker-id", "1",
                             "--ha-master-address", "nohost", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "ha_master_address" in r.output


def test_controller_mode_needs_controller_addr(tmp_path: Path) -> None:
    r = _runner.invoke(app, ["broker", "--enable-controller-mode", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "needs controller_addr" in r.output


def test_controller_mode_refuses_a_static_role(tmp_path: Path) -> None:
    r = _runner.invoke(app, ["broker", "--enable-controller-mode", "--controller-addr",
                             "127.0.0.1:9878", "--broker-role", "SYNC_MASTER",
                             "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "broker_role" in r.output


def test_a_bad_controller_addr_is_refused(tmp_path: Path) -> None:
    r = _runner.invoke(app, ["broker", "--enable-controller-mode", "--controller-addr",
                             "127.0.0.1:9878;nohost", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2 and "controller_addr" in r.output


def test_controller_keys_go_together(tmp_path: Path) -> None:
    r = _runner.invoke(app, ["controller", "--raft-address", "127.0.0.1:1", "--store-dir",
                             str(tmp_path), "--access-key", "ctl"], env={"TXMQ_SECRET_KEY": ""})
    assert r.exit_code == 2 and "--secret-key" in r.output
    assert not (tmp_path / "controller.port").exists()  # refused before it started
