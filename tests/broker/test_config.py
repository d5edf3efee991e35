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
