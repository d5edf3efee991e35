"""The admin and console commands given only a name server (``--namesrv-addr``), against real
``txmq namesrv`` and broker processes: the broker is found through the name server, topic list
comes from GET_ALL_TOPIC_LIST_FROM_NAMESERVER, and a deleted topic's route is gone there too
(DELETE_TOPIC_IN_NAMESRV), also after the broker registers again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from txmq import limits
from txmq.cli import app
from txmq.testing import run_broker, wait_until

_runner = CliRunner()


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port_file = tmp_path_factory.mktemp("namesrv") / "port"
    proc = subprocess.Popen([sys.executable, "-m", "txmq", "namesrv", "--port", "0",
                             "--port-file", str(port_file), "--log-level", "WARNING"])
    try:
        wait_until(lambda: port_file.exists() and port_file.read_text().strip() != "", 30)
        addr = f"127.0.0.1:{int(port_file.read_text())}"
        with run_broker(tmp_path_factory.mktemp("b"), namesrv_addr=addr, topics={"seed": 1}):
            wait_until(lambda: txmq(addr, "broker", "status").exit_code == 0, 30)
            yield addr
    finally:
        proc.terminate()
        proc.wait(10)


def txmq(namesrv: str, *args: str) -> Result:
    return _runner.invoke(app, [*args, "--namesrv-addr", namesrv])


def test_topic_send_consume_and_delete_through_the_name_server(namesrv: str) -> None:
    assert txmq(namesrv, "topic", "create", "nt", "--queues", "2").exit_code == 0
    wait_until(lambda: txmq(namesrv, "topic", "route", "nt").exit_code == 0, 10)
    listed = json.loads(txmq(namesrv, "topic", "list", "--json").stdout)
    assert {"topicName": "nt", "writeQueueNums": 2}.items() <= \
        next(t for t in listed if t["topicName"] == "nt").items()
    sent = txmq(namesrv, "send", "nt", "--body", "via namesrv", "--json")
    assert sent.exit_code == 0, sent.output
    got = [json.loads(ln) for ln in
           txmq(namesrv, "consume", "nt", "--json", "--count", "1").stdout.splitlines()]
    assert [g["body"] for g in got] == ["via namesrv"]
    gone = txmq(namesrv, "topic", "delete", "nt", "--yes")
    assert gone.exit_code == 0, gone.output
    for _ in range(2):  # at once, and after the broker registered its table again
        route = txmq(namesrv, "topic", "route", "nt")
        assert route.exit_code == 1 and "TOPIC_NOT_EXIST" in route.output, route.output
        time.sleep(limits.NAMESRV_REGISTER_CHECK_MS / 1000 * 1.5)
    listed = json.loads(txmq(namesrv, "topic", "list", "--json").stdout)
    assert "nt" not in {t["topicName"] for t in listed}
