"""``txmq topic create|update|delete|list|route|status`` against a real broker process over TCP
(the CLI runs in-process through Typer's runner; one subprocess run checks the real entry point)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from txmq.cli import app
from txmq.client import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    TransactionProducer,
)
from txmq.testing import BrokerProcess, run_broker

_runner = CliRunner()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("b"), topics={"configured": 2}) as b:
        yield b


def txmq(b: BrokerProcess, *args: str) -> Result:
    return _runner.invoke(app, [*args, "--endpoints", b.endpoints])


def test_create_list_route_status_update(broker: BrokerProcess) -> None:
    made = txmq(broker, "topic", "create", "orders", "--queues", "3")
    assert made.exit_code == 0, made.output
    assert "created with 3 queues" in made.output
    again = txmq(broker, "topic", "create", "orders", "--queues", "3")
    assert again.exit_code == 1 and "exists" in again.output
    listed = json.loads(txmq(broker, "topic", "list", "--json").stdout)
    assert {"topicName": "orders", "readQueueNums": 3, "writeQueueNums": 3}.items() <= \
        next(t for t in listed if t["topicName"] == "orders").items()
    assert not any(t["topicName"].startswith("RMQ_SYS") for t in listed)
    every = json.loads(txmq(broker, "topic", "list", "--all", "--json").stdout)
    assert any(t["topicName"] == "RMQ_SYS_TRANS_HALF_TOPIC" and t["perm"] == 4 for t in every)
    route = json.loads(txmq(broker, "topic", "route", "orders", "--json").stdout)
    assert route["queueDatas"][0]["writeQueueNums"] == 3
    assert route["brokerDatas"][0]["brokerAddrs"]["0"] == broker.endpoints
    with Producer("p", broker.endpoints) as p:
        for i in range(3):
            p.send(Message(topic="orders", body=b"x"), queue_id=1 if i else 0)
    status = json.loads(txmq(broker, "topic", "status", "orders", "--json").stdout)
    rows = {q["queueId"]: q for q in status["offsetTable"]}
    assert [(rows[q]["minOffset"], rows[q]["maxOffset"]) for q in range(3)] == [(0, 1), (0, 2), (0, 0)]
    assert rows[1]["lastUpdateTimestamp"] > 0 and rows[2]["lastUpdateTimestamp"] == 0
    table = txmq(broker, "topic", "status", "orders")
    assert table.exit_code == 0 and "status of orders" in table.output
    widened = txmq(broker, "topic", "update", "orders", "--queues", "5")
    assert widened.exit_code == 0 and "3 → 5 queues" in widened.output
    shrink = txmq(broker, "topic", "update", "orders", "--queues", "2")
    assert shrink.exit_code == 2 and "cannot shrink" in shrink.output
    unknown = txmq(broker, "topic", "update", "nope", "--queues", "2")
    assert unknown.exit_code == 1 and "does not exist" in unknown.output


@pytest.mark.parametrize(("args", "reason"), [
    (("create", "bad.name"), "illegal topic name"),
    (("create", "x" * 200), "illegal topic name"),
    (("create", "ok", "--queues", "0"), "queue count 0 not in 1..1024"),
    (("create", "ok", "--queues", "5000"), "queue count 5000"),
    (("create", "RMQ_SYS_TRANS_HALF_TOPIC"), "forbidden"),
    (("update", "ok", "--queues", "-1"), "queue count -1"),
    (("delete", "RMQ_SYS_TRANS_HALF_TOPIC", "--yes"), "forbidden"),
    (("delete", "SCHEDULE_TOPIC_XXXX", "--yes"), "forbidden"),
    (("delete", "TBW102", "--yes"), "default topic"),
    (("route", "a/b"), "illegal topic name"),
    (("status", ""), "illegal topic name"),
])
def test_bad_input_exits_2_with_the_reason(broker: BrokerProcess, args: tuple[str, ...],
                                           reason: str) -> None:
    r = txmq(broker, "topic", *args)
    assert r.exit_code == 2, r.output
    assert reason in " ".join(r.output.split())


def test_unknown_topic_and_unreachable_broker_exit_1(broker: BrokerProcess) -> None:
    for cmd in ("route", "status"):
        r = txmq(broker, "topic", cmd, "missing")
        assert r.exit_code == 1 and "TOPIC_NOT_EXIST" in r.output, r.output
    r = txmq(broker, "topic", "delete", "missing", "--yes")
    assert r.exit_code == 1 and "does not exist" in r.output
    r = txmq(broker, "topic", "delete", "configured", "--yes")
    assert r.exit_code == 1 and "configuration" in r.output
    down = _runner.invoke(app, ["topic", "list", "--endpoints", "127.0.0.1:1"])
    assert down.exit_code == 1 and "error" in down.output


def test_delete_drops_the_topic_and_its_offsets_then_route_is_refused(broker: BrokerProcess) -> None:
    assert txmq(broker, "topic", "create", "doomed", "--queues", "2").exit_code == 0
    with Producer("p", broker.endpoints) as p:
        p.send(Message(topic="doomed", body=b"x"), queue_id=0)
    with PullConsumer(broker.endpoints, "g1") as pc:
        pc.commit_offset("doomed", 0, 1)
    refused = _runner.invoke(app, ["topic", "delete", "doomed", "--endpoints", broker.endpoints],
                             input="n\n")
    assert refused.exit_code == 1 and txmq(broker, "topic", "route", "doomed").exit_code == 0
    gone = txmq(broker, "topic", "delete", "doomed", "--yes")
    assert gone.exit_code == 0, gone.output
    text = " ".join(gone.output.split())
    assert "2 queues, 1 consumer offsets dropped" in text and "1 stored messages stay" in text
    route = txmq(broker, "topic", "route", "doomed")
    assert route.exit_code == 1 and "TOPIC_NOT_EXIST" in route.output
    listed = json.loads(txmq(broker, "topic", "list", "--json").stdout)
    assert "doomed" not in {t["topicName"] for t in listed}
    with PullConsumer(broker.endpoints, "g1") as pc:
        assert pc.fetch_consumer_offset("doomed", 0) is None


def test_the_entry_point_exits_2_on_a_bad_queue_count(broker: BrokerProcess, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "txmq", "topic", "create", "t", "--queues", "0",
                        "--endpoints", broker.endpoints], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "queue count 0" in r.stderr


def test_broker_status_shows_the_store(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        p.send(Message(topic="configured", body=b"y" * 100))
    info = json.loads(txmq(broker, "broker", "status", "--json").stdout)
    st = info["store"]
    assert st["commit_log_max_offset"] > 100 and st["commit_log_min_offset"] == 0
    assert st["store_size_bytes"] == st["commit_log_max_offset"] - st["commit_log_min_offset"]
    assert 0 < st["disk_ratio"] <= 1
    assert info["commit_log_max_offset"] == st["commit_log_max_offset"]
    text = txmq(broker, "broker", "status")
    assert text.exit_code == 0 and "bytes of commit log" in text.output and "% used" in text.output
    down = _runner.invoke(app, ["broker", "status", "--endpoints", "127.0.0.1:1"])
    assert down.exit_code == 1 and "error" in down.output
    bad = _runner.invoke(app, ["broker", "status", "--endpoints", "no-port"])
    assert bad.exit_code == 1 and "error" in bad.output


class _Undecided:
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def test_a_topic_with_pending_transactions_is_not_deleted(broker: BrokerProcess) -> None:
    assert txmq(broker, "topic", "create", "txt", "--queues", "1").exit_code == 0
    with TransactionProducer("tp", broker.endpoints, _Undecided()) as tp:
        sent = tp.send_message_in_transaction(Message(topic="txt", body=b"half"))
        refused = txmq(broker, "topic", "delete", "txt", "--yes")
        assert refused.exit_code == 1 and "1 pending transactions" in " ".join(refused.output.split())
        with Admin(broker.endpoints) as adm:
            adm.operator_end(sent.msg_id, "ROLLBACK", "test", "topic goes")
    assert txmq(broker, "topic", "delete", "txt", "--yes").exit_code == 0
