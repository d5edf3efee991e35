"""Broker configuration: the TOML file, its ``[store]`` table, and the errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq.broker import BrokerConfig
from txmq.broker._config import load_config
from txmq.broker.server import store_config
from txmq.client import Message, Producer
from txmq.errors import ConfigError
from txmq.testing import run_broker


def test_store_table_reaches_the_store(tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('port = 0\nfile_reserved_time_ms = 3600000\n'
                    '[store]\nmapped_file_size_commit_log = 65536\ndelete_when = "01;02"\n')
    cfg = load_config(toml)
    sc = store_config(cfg)
    assert (sc.mapped_file_size_commit_log, sc.delete_when) == (65536, "01;02")
    assert sc.file_reserved_time_ms == 3_600_000  # the top-level value, shared with the checker
    assert sc.store_host == "127.0.0.1:0"


@pytest.mark.parametrize(("table", "error"), [
    ("[store]\nsegment_bytes = 1\n", "segment_bytes"),  # unknown key
    ("[store]\nmapped_file_size_commit_log = 100\n", "at least"),
    ("[store]\nfile_reserved_time_ms = 5\n", "top level"),
    ("[store]\ndisk_space_warning_level_ratio = 2.0\n", "disk_max_used_space_ratio"),
])
def test_bad_store_settings_are_config_errors(tmp_path: Path, table: str, error: str) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text(table)
    with pytest.raises(ConfigError, match=error):
        load_config(toml)


def test_a_broker_process_rolls_segments_at_the_configured_size(tmp_path: Path) -> None:
    with run_broker(tmp_path / "b", topics={"t": 1},
                    store={"mapped_file_size_commit_log": 65536}) as b, \
            Producer("pg", b.endpoints) as p:
        for _ in range(80):
            p.send(Message(topic="t", body=b"x" * 2048))
    segments = sorted((tmp_path / "b" / "store" / "commitlog").iterdir())
    assert len(segments) >= 2
    assert all(s.stat().st_size <= 65536 for s in segments)
    assert BrokerConfig().store.mapped_file_size_commit_log > 65536  # the default is not what we saw


@pytest.mark.parametrize("addr", ["127.0.0.1:", "127.0.0.1", ":9876", "h:70000", "h:9876;x"])
def test_a_bad_name_server_address_is_a_config_error_at_start(addr: str) -> None:
    with pytest.raises(ConfigError, match="namesrv_addr"):
        load_config(None, namesrv_addr=addr)
    assert load_config(None, namesrv_addr="127.0.0.1:9876;10.0.0.2:9876").namesrv_addr


def test_controller_mode_fields_load_and_parse(tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('enable_controller_mode = true\ncontroller_addr = "10.0.0.1:9878; 10.0.0.2:9878;"\n'
                    'broker_election_priority = 2\nmin_in_sync_replicas = 2\n')
    cfg = load_config(toml)
    assert cfg.controller_addresses() == ["10.0.0.1:9878", "10.0.0.2:9878"]
    assert (cfg.broker_election_priority, cfg.min_in_sync_replicas) == (2, 2)
    assert (cfg.controller_lease_ms, cfg.broker_heartbeat_interval_ms) == (3000, 1000)
    assert cfg.all_ack_in_sync_state_set and cfg.ha_max_time_slave_not_catchup_ms == 15_000


@pytest.mark.parametrize(("table", "error"), [
    ('enable_controller_mode = true\n', "needs controller_addr"),
    ('enable_controller_mode = true\ncontroller_addr = "a:1"\nbroker_id = 0\n', "broker_id"),
    ('enable_controller_mode = true\ncontroller_addr = "a:1"\nbroker_role = "ASYNC_MASTER"\n',
     "broker_role"),
    ('enable_controller_mode = true\ncontroller_addr = "a:1"\nha_master_address = "a:2"\n',
     "ha_master_address"),
    ('controller_addr = "a:1;b"\n', "controller_addr"),
    ('controller_lease_ms = 1000\n', "exceed broker_heartbeat_interval_ms"),
    ('min_in_sync_replicas = 0\n', "min_in_sync_replicas"),
])
def test_bad_controller_settings_are_config_errors(tmp_path: Path, table: str, error: str) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text(table)
    with pytest.raises(ConfigError, match=error):
        load_config(toml)


def test_controller_mode_in_code_refuses_a_static_role() -> None:
    with pytest.raises(ConfigError, match="broker_role"):
        BrokerConfig(enable_controller_mode=True, controller_addr="a:1", broker_role="SLAVE",
                     broker_id=1).validate()
