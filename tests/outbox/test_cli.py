"""``txmq outbox``: init-db, status, purge and a relay process (on txmq, and by ``--transport`` on
RabbitMQ and NATS JetStream, the machine's servers), on a SQLite file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from outbox_helpers import TRANSPORT_URLS, put
from typer.testing import CliRunner

from txmq import outbox
from txmq.cli import app
from txmq.client import ConsumeStatus, MessageExt, PullConsumer
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


@pytest.mark.parametrize("kind", ["rabbitmq", "nats"])
def test_relay_process_sends_over_the_transport_url(tmp_path: Path, kind: str) -> None:
    """``txmq outbox relay URL --transport amqp://…|nats://…`` ships the outbox over that broker."""
    db = tmp_path / "app.db"
    engine = outbox.create_sqlite_engine(db)
    outbox.init_db(engine)
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    ids = set(put(engine, outbox.DEFAULT_TABLES, 5, topic=topic))
    got: list[MessageExt] = []
    transport = outbox.open_transport(TRANSPORT_URLS[kind])

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    sub = transport.subscribe("cli", topic, listener, max_reconsume_times=3)
    sub.start()  # RabbitMQ: the group's queue must be bound before the relay publishes
    proc = subprocess.Popen([sys.executable, "-m", "txmq", "outbox", "relay", f"sqlite:///{db}",
                             "--transport", TRANSPORT_URLS[kind], "--period-ms", "100"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len({m.properties[outbox.PROPERTY_OUTBOX_EVENT_ID] for m in got}) < 5:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        sub.shutdown()
        transport.close()
    assert proc.returncode == 0, err
    assert "guest:guest" not in err  # the start-up line names the broker without the password
    assert {m.properties[outbox.PROPERTY_OUTBOX_EVENT_ID] for m in got} == ids
    with engine.connect() as conn:
        assert outbox.outbox_status(conn).events == {"COMMIT": {"PRODUCE_PROCESSED": 5}}


@pytest.mark.parametrize(("url", "needle"), [
    ("kafka://127.0.0.1:9092", "unknown scheme"),
    ("amqp://guest:s3cret@127.0.0.1:notaport/", "not a number"),
    ("nats://", "names no host"),
])
def test_relay_refuses_a_bad_transport_url(tmp_path: Path, url: str, needle: str) -> None:
    r = CliRunner().invoke(app, ["outbox", "relay", f"sqlite:///{tmp_path / 'app.db'}", "--transport", url])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "s3cret" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_bench_outbox_compares_the_three_transports_in_one_run(tmp_path: Path) -> None:
    """``txmq bench outbox --transports txmq,rabbitmq,nats`` at a tiny scale: every transport has a
    plain rate, a relay rate and their ratio per round, on PostgreSQL, and a median."""
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "txmq", "bench", "outbox", "--no-databases",
                           "--events", "200", "--rounds", "1", "--transports", "txmq,rabbitmq,nats",
                           "--amqp-url", TRANSPORT_URLS["rabbitmq"], "--nats-url", TRANSPORT_URLS["nats"],
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())["transports"]
    assert r["database"] == "postgresql" and r["relays"] == r["publishers"] == 4
    assert list(r["median"]) == ["txmq", "rabbitmq", "nats"] and len(r["runs"]) == 1
    for k, x in r["runs"][0].items():
        assert x["plain_msgs_per_s"] > 0 and x["relay_events_per_s"] > 0, k
        assert x["ratio"] == round(x["relay_events_per_s"] / x["plain_msgs_per_s"], 2)
    assert "guest:guest" not in json.dumps(r)


def test_bench_outbox_refuses_an_unknown_transport() -> None:
    r = CliRunner().invoke(app, ["bench", "outbox", "--no-databases", "--transports", "txmq,kafka"])
    assert r.exit_code == 2 and "kafka" in r.output
