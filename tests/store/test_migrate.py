"""``txmq store migrate``: a data directory written by main before the MessageExt store (fixture
``fixtures/store-txm1.tar.gz``, made by ``fixtures/make_store_txm1.py`` at 5bb4480) is refused at
start and rewritten with its queue offsets, records and broker state kept."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from txmq.cli import app
from txmq.errors import StoreFormatOld
from txmq.store import FileStore, StoreConfig, check_store, migrate_store, needs_migration
from txmq.testing import BrokerHarness

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURES / "store-txm1.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def _body(b: bytes) -> str:
    return b.hex() if len(b) < 200 else "sha256:" + hashlib.sha256(b).hexdigest()


def test_an_old_store_is_refused_naming_the_migrate_command(old_store: Path) -> None:
    with pytest.raises(StoreFormatOld, match=f"txmq store migrate {old_store}"):
        FileStore(old_store)
    with pytest.raises(StoreFormatOld):
        check_store(old_store)
    assert needs_migration(old_store)


def test_migrate_keeps_every_record_at_its_queue_offset(old_store: Path) -> None:
    expect = json.loads((FIXTURES / "store-txm1.json").read_text())
    report = migrate_store(old_store, StoreConfig(mapped_file_size_commit_log=64 * 1024))
    assert report.records == sum(len(v) for v in expect.values()) and report.torn_tail_bytes == 0
    assert (old_store / "migrate.txm1" / "commitlog").is_dir()
    assert not (old_store / "meta" / "transactionIndex.snapshot").exists()
    assert check_store(old_store).ok
    s = FileStore(old_store)
    got: dict[str, list[dict[str, object]]] = {}
    for key in expect:
        topic, qid = key.rsplit("/", 1)
        lo, hi = s.queue_bounds(topic, int(qid))
        for m in s.read_queue(topic, int(qid), lo, hi - lo, 1 << 30):
            got.setdefault(key, []).append(
                {"queue_offset": m.queue_offset, "body": _body(m.body), "tags": m.tags,
                 "keys": m.keys, "properties": m.properties, "born": m.born_timestamp_ms,
                 "stored": m.store_timestamp_ms, "reconsume": m.reconsume_times, "flag": m.flag,
                 "born_host": m.born_host, "store_host": m.store_host})
    assert got == expect
    [commit] = [m for m in s.read_queue("t", 0, 0, 100, 1 << 30) if m.body == b"tx-commit"]
    half = s.read_at(commit.prepared_transaction_offset)
    assert half.body == b"tx-commit" and half.topic == "RMQ_SYS_TRANS_HALF_TOPIC"
    s.close()
    assert migrate_store(old_store).already


def test_a_broker_runs_on_the_migrated_store_with_its_offsets_and_transactions(
        old_store: Path) -> None:
    migrate_store(old_store)
    h = BrokerHarness(store=FileStore(old_store), topics={"t": 2, "u": 1})
    assert h.broker.offsets.get("cg", "t", 0) == 3
    pending = [m for m in h.all_messages("RMQ_SYS_TRANS_HALF_TOPIC") if m.body == b"tx-pending"]
    assert pending
    assert len(h.broker.tx.index.pending) == 1  # the pending half still waits for its outcome
    h.send(1, "t", b"after", queue_id=0)
    assert [m.body for m in h.pull("t", 0, 6)][-1] == b"after"
    h.store.close()


def test_an_interrupted_swap_is_refused_and_finished_by_running_again(old_store: Path) -> None:
    migrate_store(old_store)
    (old_store / "MIGRATING").touch()
    with pytest.raises(StoreFormatOld, match="interrupted"):
        FileStore(old_store)
    migrate_store(old_store)
    assert not (old_store / "MIGRATING").exists()
    FileStore(old_store).close()


def test_the_cli_migrates_and_a_second_run_has_nothing_to_do(old_store: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["store", "migrate", str(old_store)])
    assert r.exit_code == 0, r.output
    assert "migrated 26 records" in r.output.replace("\n", " ")
    r = runner.invoke(app, ["store", "migrate", str(old_store)])
    assert r.exit_code == 0 and "nothing to do" in r.output
    assert os.listdir(old_store / "migrate.txm1")


def test_the_broker_command_refuses_to_start_on_an_old_store(old_store: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "txmq", "broker", "--data-dir", str(old_store),
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "txmq store migrate" in " ".join(r.stderr.split())
