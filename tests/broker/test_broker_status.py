"""Supervised timer tasks and the health check over a real broker: a poison delay message in the
data directory at start-up is parked, later delay messages are still delivered, and
``txmq broker status`` / ``txmq parked list`` / the metrics show it (issue 11, "Timers die
silently")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec

from txmq.broker import BrokerConfig
from txmq.broker.server import BrokerServer
from txmq.client import Message, Producer, PullConsumer
from txmq.store import FileStore, MemoryStore, Record
from txmq.testing import free_port, run_broker, wait_until


def _txmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txmq", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def _pulled(endpoints: str, topic: str) -> list[bytes]:
    out = []
    with PullConsumer(endpoints, "status-test") as pc:
        for qid in range(2):
            out += [m.body for m in pc.pull(topic, qid, 0, 32).messages]
    return out


def test_a_broker_started_on_a_poison_delay_message_keeps_delivering_and_reports_it(
        tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    store = FileStore(tmp_path / "b" / "store")
    store.append([Record(topic="SCHEDULE_TOPIC_XXXX", queue_id=level - 1, body=b"poison",
                         properties={**real, "DELAY": str(level), "UNIQ_KEY": f"POISON{level}"},
                         born_timestamp_ms=now, store_timestamp_ms=now)
                  for level, real in ((1, {"REAL_TOPIC": "../../../x", "REAL_QID": "0"}),
                                      (2, {"REAL_TOPIC": "t", "REAL_QID": "abc"}))])
    store.flush()
    store.close()
    metrics_port = free_port()
    with run_broker(tmp_path / "b", topics={"t": 2}, message_delay_level="200ms 400ms",
                    metrics_port=metrics_port) as b:
        with Producer("p", b.endpoints) as p:
            p.send(Message(topic="t", body=b"after"), delay_level=2)
        wait_until(lambda: b"after" in _pulled(b.endpoints, "t"), timeout_s=15)
        done = _txmq("broker", "status", "--broker", b.endpoints, "--json")
        assert done.returncode == 0, done.stderr
        st = json.loads(done.stdout)
        assert st["parked"]["schedule"] == 2 and st["parked_stored"] == 2 and not st["stale"]
        assert {"schedule", "transaction", "holds", "flusher"} <= set(st["timers"])
        assert all(st["now_ms"] - st["timers"][t] < 5_000 for t in ("schedule", "transaction"))
        table = _txmq("broker", "status", "--broker", b.endpoints)
        assert table.returncode == 0 and "schedule" in table.stdout, table.stderr
        assert _txmq("broker", "status", "--broker", b.endpoints, "--stale-ms", "-1").returncode == 1
        parked = _txmq("parked", "list", "--broker", b.endpoints, "--json")
        rows = json.loads(parked.stdout)
        assert [(r["id"], r["msg_id"]) for r in rows] == [("parked:0", "POISON1"),
                                                          ("parked:1", "POISON2")]
        assert "REAL_TOPIC" in rows[0]["properties"]["TXMQ_PARK_REASON"]
        assert "REAL_QID" in rows[1]["properties"]["TXMQ_PARK_REASON"]
        shown = _txmq("parked", "show", "POISON2", "--broker", b.endpoints)
        assert shown.returncode == 0 and "schedule:2" in shown.stdout
        resent = _txmq("parked", "resend", "POISON1", "--topic", "t", "--broker", b.endpoints)
        assert resent.returncode == 0, resent.stderr
        wait_until(lambda: b"poison" in _pulled(b.endpoints, "t"))
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'txmq_parked_messages_total{source="schedule"} 2.0' in text
        assert 'txmq_timer_last_tick_timestamp_seconds{timer="schedule"}' in text
    assert not (tmp_path / "x").exists()


def test_the_supervisor_restarts_a_timer_task_that_died(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int, int]:
        cfg = msgspec.convert({"port": 0, "data_dir": str(tmp_path), "topics": {"t": 1}},
                              BrokerConfig).validate()
        server = BrokerServer(cfg, MemoryStore())
        await server.start()
        broker, real_tick = server.broker, server.broker.tick
        try:
            def dying_tick(now_ms: int) -> list[object]:
                raise RuntimeError("the whole tick broke")

            broker.tick = dying_tick  # type: ignore[assignment,method-assign]
            await asyncio.sleep(0.5)
            broker.tick = real_tick  # type: ignore[method-assign]
            died_at = broker.health.last_tick_ms.get("schedule", 0)
            restarts = broker.health.restarts.get("ticker", 0)
            await asyncio.sleep(1.5)
            return restarts, died_at, broker.health.last_tick_ms["schedule"]
        finally:
            await server.close()

    restarts, died_at, later = asyncio.run(scenario())
    assert restarts == 1
    assert later > died_at  # ticking again after the restart


def test_txmq_broker_keeps_its_run_options_next_to_the_status_command() -> None:
    from typer.testing import CliRunner

    from txmq.cli import app  # every command registered

    runner = CliRunner()
    run_help = runner.invoke(app, ["broker", "--help"])
    assert run_help.exit_code == 0
    assert "--port" in run_help.output and "--data-dir" in run_help.output
    assert "status" in run_help.output
    status_help = runner.invoke(app, ["broker", "status", "--help"])
    assert status_help.exit_code == 0 and "--stale-ms" in status_help.output
    bad = runner.invoke(app, ["broker", "--config", "/nonexistent/broker.toml"])
    assert bad.exit_code == 2  # the run form still parses its options (and reports a bad config)
