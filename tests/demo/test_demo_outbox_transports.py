"""The demo's rollback flow over RabbitMQ and NATS JetStream (issue #14.6): the transactional orders
go through a real txmq broker process, the ledger's ROLLBACK events through the machine's RabbitMQ
(127.0.0.1:5672, guest/guest, vhost ``txmq-test``, which ``.ci/services`` makes) or NATS with
JetStream (127.0.0.1:4222); override with ``TXMQ_TEST_AMQP_URL`` / ``TXMQ_TEST_NATS_URL``.
A server that is down fails the test.

TPC-H SF 0.001 (1,500 orders) without the Spark stage: about 20 s each on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from demo_helpers import assert_example_trace

from txmq import outbox

URLS = {
    "rabbitmq": os.environ.get("TXMQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/txmq-test"),
    "nats": os.environ.get("TXMQ_TEST_NATS_URL", "nats://127.0.0.1:4222"),
}


def _rollback_topics(ledger_db: Path) -> set[str]:
    engine = outbox.create_sqlite_engine(ledger_db)
    t = outbox.DEFAULT_TABLES.outbox
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.select(t.c.topic).where(t.c.tx_type == "ROLLBACK").distinct())
                       .scalars())
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["rabbitmq", "nats"])
def test_demo_rollback_flow_over_another_broker_is_consistent(tmp_path: Path, transport: str) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "--sf", "0.001", "--no-spark",
         "--outbox-transport", transport, "--outbox-url", URLS[transport],
         "--run-dir", str(tmp_path / "run"), "--report", str(report)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["consistent"] is True
    assert r["outbox_transport"] == transport
    assert "guest:guest" not in r["outbox_url"]  # the report never carries the password
    assert r["rollback_topic"].startswith("orders-rollback-")  # per run: no earlier run's leftovers
    assert r["orders_total"] == 1500 and r["committed"] > 0
    assert r["lost"] == 0 and r["phantom"] == 0
    # the rollback flow: every planned rejection given up, sent over that broker, compensated once
    assert r["ledger_rejected"] == r["rollback_events_sent"] == r["compensated"] == r["rejects_planned"] > 0
    assert r["uncompensated"] == 0 and r["wrongly_cancelled"] == 0
    assert r["spark_skipped"] is True
    # the ROLLBACK events went to the per-run topic, which only that broker's consumer reads
    assert _rollback_topics(tmp_path / "run" / "ledger.db") == {r["rollback_topic"]}
    assert transport in proc.stdout
    assert_example_trace(r, proc.stdout, transport)


def test_demo_refuses_a_bad_outbox_transport(tmp_path: Path) -> None:
    for args, needle in ((["--outbox-transport", "kafka"], "kafka"),
                         (["--outbox-transport", "nats", "--outbox-url", "amqp://h:5672/"], "rabbitmq URL"),
                         (["--outbox-transport", "rabbitmq", "--outbox-url", "amqp://h:port/"], "port"),
                         (["--outbox-url", "nats://127.0.0.1:4222"], "needs --outbox-transport")):
        proc = subprocess.run(
            [sys.executable, "-m", "txmq", "demo", "--sf", "0.001", "--no-spark", *args,
             "--run-dir", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert needle in proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
