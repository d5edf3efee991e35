"""Re-record the golden frames in this directory from the real RocketMQ C++ client core.

Runs the scenarios of ``../clients/rocketmq_cpp_scenarios.py`` (in the environment made by
``client_envs.rocketmq_cpp.ensure_env``) against ``capture_server.py``, then keeps the first frame of
each kind as ``<code>-<name>.bin`` (the whole frame, length prefix included) and writes ``index.json``
(name -> direction, decoded header, body). Values that vary per run (``Signature``, timestamps,
``UNIQ_KEY``, pids in ``clientID``) differ between recordings; codes, field names and value types do not.

    PYTHONPATH=tests .venv/bin/python tests/conformance/captures/record_captures.py
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from client_envs.rocketmq_cpp import ensure_env
from txmq.testing import free_port

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE.parent / "clients" / "rocketmq_cpp_scenarios.py"
Frame = dict[str, Any]
Pick = Callable[[Frame], bool]


def _ext(f: Frame) -> dict[str, Any]:
    return dict(f["header"].get("extFields") or {})


def record(python: Path, work: Path, name: str, server_args: list[str],
           runs: list[list[str]]) -> list[Frame]:
    """Start a capture server, run each scenario command against it, return its frames."""
    port, out = free_port(), work / name
    srv = subprocess.Popen([sys.executable, str(HERE / "capture_server.py"), str(port), str(out),
                            *server_args])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        for run in runs:
            subprocess.run([str(python), str(SCENARIOS), run[0], "--namesrv", f"127.0.0.1:{port}", *run[1:]],
                           timeout=120, check=False, stdout=subprocess.DEVNULL)
    finally:
        srv.terminate()
        srv.wait()
    frames = [json.loads(line) for line in (out / "frames.jsonl").read_text().split("\n") if line]
    return [f for f in frames if f["dir"] in ("in", "out")]


def _code(code: int, direction: str = "in", **ext: str) -> Pick:
    def pick(f: Frame) -> bool:
        return (f["dir"] == direction and f["header"]["code"] == code
                and all(str(_ext(f).get(k)) == v for k, v in ext.items()))
    return pick


def _response_to(frames: list[Frame], code: int, ok: int = 0) -> Pick:
    """The server's response to the first client request with ``code`` answered with ``ok``."""
    opaques = {(f["conn"], f["header"]["opaque"]) for f in frames
               if f["dir"] == "in" and f["header"]["code"] == code}

    def pick(f: Frame) -> bool:
        return (f["dir"] == "out" and f["header"].get("flag") == 1 and f["header"]["code"] == ok
                and (f["conn"], f["header"]["opaque"]) in opaques)
    return pick


def _consumer_hb(f: Frame) -> bool:
    return f["dir"] == "in" and f["header"]["code"] == 34 and "consumerDataSet" in f["body"]


def _producer_hb(f: Frame) -> bool:
    return f["dir"] == "in" and f["header"]["code"] == 34 and "consumerDataSet" not in f["body"]


def _keep(frames: list[Frame], picks: dict[str, Pick]) -> dict[str, Frame]:
    kept: dict[str, Frame] = {}
    for name, pick in picks.items():
        hit = next((f for f in frames if pick(f)), None)
        if hit is None:
            print(f"not captured: {name}", file=sys.stderr)
        else:
            kept[name] = hit
    return kept


def record_all(python: Path) -> dict[str, Frame]:
    """Every recording; returns the kept frames by fixture name."""
    kept: dict[str, Frame] = {}
    with tempfile.TemporaryDirectory(prefix="txmq-captures-") as tmp:
        work = Path(tmp)
        prod = ["--topic", "CapT", "--group", "CapPG", "--count", "1"]
        f = record(python, work, "producer", [], [
            ["produce", *prod, "--mode", "sync", "--prefix", "sync"],
            ["produce", *prod, "--mode", "oneway", "--prefix", "oneway"],
            ["produce", *prod, "--mode", "orderly", "--prefix", "orderly"]])
        kept |= _keep(f, {
            "105-route-request": _code(105), "105-route-response-from-server": _response_to(f, 105),
            "310-send-sync": lambda x: _code(310)(x) and x["body"] == "sync:0",
            "310-send-oneway": lambda x: _code(310)(x) and x["body"] == "oneway:0",
            "310-send-orderly-sharding-key": lambda x: _code(310)(x) and x["body"] == "orderly:0",
            "310-send-response-from-server": _response_to(f, 310),
            "35-unregister-producer": _code(35)})
        f = record(python, work, "transaction", [], [
            ["transact", "--topic", "CapTx", "--group", "CapTPG", "--plan", "commit,rollback,unknown",
             "--check-answer", "commit", "--expect-checks", "1", "--linger", "30"]])
        kept |= _keep(f, {
            "310-send-half-prepared": _code(310, f="4"),
            "37-end-commit": _code(37, commitOrRollback="8", fromTransactionCheck="0"),
            "37-end-rollback": _code(37, commitOrRollback="12"),
            "37-end-unknown": _code(37, commitOrRollback="0"),
            "34-heartbeat-producer": _producer_hb,
            "39-check-request-from-server": _code(39, "out"),
            "37-end-commit-after-check": _code(37, fromTransactionCheck="1")})
        f = record(python, work, "consumer", [], [
            ["produce", "--topic", "CapC", "--group", "CapPG2", "--count", "2", "--prefix", "c"],
            ["consume", "--topic", "CapC", "--group", "CapCG", "--expect", "2", "--later", "c-1",
             "--later-times", "1", "--idle", "2", "--timeout", "40"]])
        kept |= _keep(f, {
            "34-heartbeat-consumer": _consumer_hb, "38-consumer-list-request": _code(38),
            "38-consumer-list-response-from-server": _response_to(f, 38),
            "14-query-consumer-offset": _code(14), "11-pull-first": _code(11, sysFlag="6", topic="CapC"),
            "11-pull-with-commit-offset": _code(11, sysFlag="7"),
            "11-pull-found-response-from-server": _response_to(f, 11),
            "36-consumer-send-msg-back": _code(36), "15-update-consumer-offset": _code(15),
            "310-trace-record-send": lambda x: _code(310)(x) and "TRACE" in str(_ext(x)),
            "35-unregister-consumer": _code(35, consumerGroup="CapCG")})
        f = record(python, work, "orderly", [], [
            ["produce", "--topic", "CapO", "--group", "CapPG3", "--count", "2", "--mode", "orderly"],
            ["consume", "--topic", "CapO", "--group", "CapOG", "--orderly", "--expect", "2",
             "--timeout", "30"]])
        kept |= _keep(f, {"41-lock-batch-mq": _code(41), "42-unlock-batch-mq": _code(42)})
        f = record(python, work, "offset-not-found", ["--offset-not-found"], [
            ["produce", "--topic", "CapN", "--group", "CapPG4", "--count", "1"],
            ["consume", "--topic", "CapN", "--group", "CapNG", "--timeout", "5"]])
        kept |= _keep(f, {"30-get-max-offset": _code(30)})
    return kept


def main() -> int:
    kept = record_all(ensure_env())
    for old in HERE.glob("*.bin"):
        old.unlink()
    index = {}
    for name, fr in sorted(kept.items(), key=lambda kv: (int(kv[0].split("-")[0]), kv[0])):
        (HERE / f"{name}.bin").write_bytes(bytes.fromhex(fr["hex"]))
        body = fr["body"]
        text = all(ch >= " " or ch in "\n\x01\x02" for ch in body)
        index[name] = {"direction": "client->server" if fr["dir"] == "in" else "server->client",
                       "header": fr["header"], "header_raw": fr.get("header_raw"),
                       "body_text": body if text else None,
                       "body_hex": None if text else body.encode("latin1").hex()}
    (HERE / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(kept)} frames written to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
