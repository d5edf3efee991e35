"""``txmq outbox``: init-db, status, purge and a relay process, on a SQLite file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from outbox_helpers import put
from typer.testing import CliRunner

from txmq import outbox
from txmq.cli import app
from txmq.client import PullConsumer
from txmq.testing import run_broker


def test_init_db_status_and_purge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    runner = CliRunner()
    r = runner.invoke(app, ["outbox", "init-db", url, "--prefix", "shop_"])
    assert r.exit_code == 0 and "shop_outbox" in r.output
    engine = outbox.create_sqlite_engine(tmp_path / "app.db")
    tables = outbox.make_tables("shop_")
    put(engine, tables, 3)
    r = runner.invoke(app, ["outbox", "status", url, "--prefix", "shop_"])
    assert r.exit_code == 0 and "PRODUCE_INIT" in r.output and "backlog 3" in r.output
    r = runner.invoke(app, ["outbox", "purge", url, "--prefix", "shop_", "--older-than", "1d"])
    assert r.exit_code == 0 and "purged 0 events" in r.output
    r = runner.invoke(app, ["outbox", "status", "sqlite:///" + str(tmp_path / "missing" / "x.db")])
    assert r.exit_code == 2


def test_relay_process_sends_and_stops_on_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    engine = outbox.create_sqlite_engine(db)
    outbox.init_db(engine)
    put(engine, outbox.DEFAULT_TABLES, 5, topic="t")
    with run_broker(tmp_path / "broker", topics={"t": 1}) as b:
        proc = subprocess.Popen([sys.executable, "-m", "txmq", "outbox", "relay", f"sqlite:///{db}",
                                 "--endpoints", b.endpoints, "--period-ms", "100"],
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            with PullConsumer(b.endpoints) as pc:
                while pc.max_offset("t", 0) < 5:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.1)
                msgs = pc.pull("t", 0, 0, 10).messages
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(m.keys for m in msgs) == ["k0", "k1", "k2", "k3", "k4"]
    with engine.connect() as conn:
        st = outbox.outbox_status(conn)
    assert st.events == {"COMMIT": {"PRODUCE_PROCESSED": 5}}
    assert json.loads(json.dumps(st.as_dict()))["backlog"]["total"] == 0
    assert sa.inspect(engine).has_table("txmq_inbox")
