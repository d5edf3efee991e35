"""``txmq send`` and ``txmq consume`` (console producer and consumer) against a real broker
process over TCP: round trip, JSON and line output, --from first|last|time, bad input."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from txmq.cli import app
from txmq.client import Message, Producer, PullConsumer
from txmq.testing import BrokerProcess, run_broker

_runner = CliRunner()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("b"), topics={"t": 2, "old": 1, "bin": 1, "late": 2},
                    message_delay_level="1s 2s") as b:
        yield b


def txmq(b: BrokerProcess, *args: str) -> Result:
    return _runner.invoke(app, [*args, "--endpoints", b.endpoints])


def _json_lines(r: Result) -> list[dict[str, Any]]:
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_send_then_consume_round_trip(broker: BrokerProcess) -> None:
    sent = _json_lines(txmq(broker, "send", "t", "--body", "héllo", "--key", "k1", "--key", "k2",
                            "--tag", "TagA", "--count", "3", "--json"))
    assert len(sent) == 3 and all(s["status"] == "SEND_OK" for s in sent)
    got = _json_lines(txmq(broker, "consume", "t", "--json", "--idle-ms", "200"))
    assert sorted(g["msg_id"] for g in got) == sorted(s["msg_id"] for s in sent)
    g = got[0]
    assert (g["body"], g["body_encoding"], g["keys"], g["tags"]) == ("héllo", "utf-8", "k1 k2", "TagA")
    assert g["reconsume_times"] == 0 and g["store_timestamp_ms"] >= g["born_timestamp_ms"] > 0
    assert {(s["queue_id"], s["queue_offset"]) for s in sent} == \
        {(x["queue_id"], x["queue_offset"]) for x in got}
    lines = txmq(broker, "consume", "t", "--count", "2", "--group", "g2", "--commit")
    assert lines.exit_code == 0
    out = [ln for ln in lines.stdout.splitlines() if "msg_id" not in ln and ln.strip()]
    assert len(out) == 2 and all("body='héllo'" in ln and "tags='TagA'" in ln for ln in out)
    with PullConsumer(broker.endpoints, "g2") as pc:
        committed = sum(pc.fetch_consumer_offset("t", q) or 0 for q in (0, 1))
    assert committed == 2


def test_binary_body_from_a_file_is_printed_as_base64(broker: BrokerProcess, tmp_path: Path) -> None:
    f = tmp_path / "body.bin"
    f.write_bytes(b"\xff\x00\xfe")
    assert txmq(broker, "send", "bin", "--body-file", str(f)).exit_code == 0
    got = _json_lines(txmq(broker, "consume", "bin", "--json", "--count", "1"))
    assert got[0]["body_encoding"] == "base64"
    assert base64.b64decode(got[0]["body"]) == b"\xff\x00\xfe"
    line = txmq(broker, "consume", "bin", "--count", "1")
    assert "body='base64:/wD+'" in line.stdout


def test_from_last_and_from_a_timestamp(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        p.send(Message(topic="old", body=b"before"))
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        p.send(Message(topic="old", body=b"after"))
    since = _json_lines(txmq(broker, "consume", "old", "--from", str(cut), "--json"))
    assert [m["body"] for m in since] == ["after"]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(cut / 1000 - 3600))
    assert len(_json_lines(txmq(broker, "consume", "old", "--from", iso, "--json"))) == 2
    assert _json_lines(txmq(broker, "consume", "old", "--from", "last", "--json",
                            "--idle-ms", "100")) == []


def test_delay_level_is_delivered_later(broker: BrokerProcess) -> None:
    sent = _json_lines(txmq(broker, "send", "late", "--body", "d", "--delay-level", "1", "--json"))
    assert _json_lines(txmq(broker, "consume", "late", "--json", "--idle-ms", "0")) == []
    got = _json_lines(txmq(broker, "consume", "late", "--json", "--count", "1", "--idle-ms", "5000"))
    assert [g["msg_id"] for g in got] == [sent[0]["msg_id"]]


@pytest.mark.parametrize(("args", "reason"), [
    (("send", "bad.topic", "--body", "x"), "illegal topic name"),
    (("send", "RMQ_SYS_TRANS_HALF_TOPIC", "--body", "x"), "forbidden"),
    (("send", "t"), "exactly one of --body and --body-file"),
    (("send", "t", "--body", "x", "--body-file", "/etc/hostname"), "exactly one"),
    (("send", "t", "--body-file", "/no/such/file"), "cannot read"),
    (("send", "t", "--body", "x", "--count", "0"), "--count 0 not in"),
    (("send", "t", "--body", "x", "--delay-level", "-1"), "negative"),
    (("send", "t", "--body", "x", "--key", "a b"), "without spaces"),
    (("send", "t", "--body", "x", "--group", "g/1"), "illegal"),
    (("consume", "a/b"), "illegal topic name"),
    (("consume", "t", "--from", "yesterday"), "give first, last or a time"),
    (("consume", "t", "--count", "-1"), "must not be negative"),
])
def test_bad_input_exits_2_with_the_reason(broker: BrokerProcess, args: tuple[str, ...],
                                           reason: str) -> None:
    r = txmq(broker, *args)
    assert r.exit_code == 2, r.output
    assert reason in " ".join(r.output.split())


def test_unknown_topic_exits_1(broker: BrokerProcess) -> None:
    for args in (("send", "nope", "--body", "x"), ("consume", "nope")):
        r = txmq(broker, *args)
        assert r.exit_code == 1 and "nope" in r.output, r.output
