"""Third-party RocketMQ clients against a txmq broker with ACL on (issue 16): the C++-core Python client
(remoting, ``set_session_credentials``) and the official RocketMQ 5 Python client (gRPC,
``Credentials(ak, sk)``), each in its own pinned environment and process. The right key works; a wrong
key, a denied topic, an expired ``x-mq-date-time`` (gRPC) and no credentials are refused with the
door's code (remoting NO_PERMISSION 16, gRPC UNAUTHORIZED 40100 / FORBIDDEN 40300), and nothing is
stored.

The C++ core retries a refused send and then reports "No route info", hiding the broker's answer; the
test therefore reads the answers off the wire: the broker advertises a recording TCP relay
(``store.store_host``) as its address, so every frame the client exchanges with it passes the relay.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client_envs.rocketmq_grpc import REQUIRE_ENV as GRPC_REQUIRE_ENV
from client_envs.rocketmq_grpc import GrpcClientUnavailable, ensure_env
from txmq.broker.acl import Accounts, Action, Decision, PolicyEntry, Resource, User, UserType, save_accounts
from txmq.client import Admin
from txmq.errors import ResponseCode
from txmq.protocol import FrameDecoder
from txmq.testing import BrokerProcess, free_port, run_broker

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).resolve().parent / "clients"
CPP_SCRIPT = CLIENTS / "rocketmq_cpp_acl.py"
GRPC_SCRIPT = CLIENTS / "rocketmq_grpc_acl.py"
REQUIREMENTS = CLIENTS / "rocketmq_grpc_requirements.txt"
TOPICS = {"acl-orders": 2, "acl-grpc": 2, "acl-secret": 1, "acl-other": 1}
ROOT = {"access_key": "root", "secret_key": "root-sk"}
UNAUTHORIZED, FORBIDDEN = 40100, 40300
RUN_TIMEOUT_S = 120
Event = dict[str, Any]


def _accounts() -> Accounts:
    r = Resource.parse
    alice = (PolicyEntry(r("Topic:acl-orders"), (Action.PUB, Action.SUB)),
             PolicyEntry(r("Topic:acl-grpc"), (Action.PUB, Action.SUB)),
             PolicyEntry(r("Group:acl-*"), (Action.SUB,)),
             PolicyEntry(r("Topic:acl-secret"), (Action.ALL,), Decision.DENY))
    return Accounts({"alice": User("alice", "alice-sk", UserType.NORMAL, alice),
                     "root": User("root", "root-sk", UserType.SUPER)})


class Relay:
    """A TCP relay on ``port`` to ``target`` that records the code of every response frame it carries
    from the broker (:attr:`codes`)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.target = ("", 0)
        self.codes: list[int] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, FrameDecoder()), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, decoder: FrameDecoder | None) -> None:
        with contextlib.suppress(OSError), src, dst:
            while data := src.recv(65536):
                if decoder is not None:
                    with self._lock:
                        self.codes += [c.code for c in decoder.feed(data) if c.is_response]
                dst.sendall(data)

    def take(self) -> list[int]:
        with self._lock:
            codes, self.codes = self.codes, []
        return codes


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    r = Relay()
    yield r
    r.sock.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, relay: Relay) -> Iterator[BrokerProcess]:
    d = tmp_path_factory.mktemp("acl-broker")
    save_accounts(d / "acl.toml", _accounts())
    with run_broker(d / "b", topics=TOPICS, acl_enable=True, acl_file=str(d / "acl.toml"),
                    grpc_port=free_port(), store={"store_host": f"127.0.0.1:{relay.port}"}) as b:
        relay.target = ("127.0.0.1", b.port)
        yield b


def stored(b: BrokerProcess) -> dict[str, int]:
    with Admin(b.endpoints, **ROOT) as a:
        return {t: sum(q.max_offset for q in a.topic_stats(t).offset_table) for t in TOPICS}


def run(python: Path, script: Path, args: list[str], home: Path) -> list[Event]:
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(python), str(script), *args], capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S, env=env, cwd=home)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert any(e["event"] == "done" for e in events), f"exit {p.returncode}: {p.stdout}\n{p.stderr[-3000:]}"
    return events


def of(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e["event"] == name]


# -- the C++ core (remoting) ----------------------------------------------------------------------
def cpp(python: Path, b: BrokerProcess, tmp: Path, role: str, topic: str, group: str,
        *creds: str) -> list[Event]:
    ak_sk = ["--ak", creds[0], "--sk", creds[1]] if creds else []
    return run(python, CPP_SCRIPT, [role, "--namesrv", b.endpoints, "--topic", topic, "--group", group,
                                    "--count", "2", "--timeout", "30", *ak_sk], tmp / f"cpp-{role}")


def test_cpp_client_with_the_right_key_sends_and_consumes(cpp_python: Path, broker: BrokerProcess,
                                                           relay: Relay, tmp_path: Path) -> None:
    before = stored(broker)
    sent = cpp(cpp_python, broker, tmp_path, "produce", "acl-orders", "acl-pg", "alice", "alice-sk")
    assert [e["key"] for e in of(sent, "sent")] == ["acl-0", "acl-1"], sent
    assert ResponseCode.NO_PERMISSION not in relay.take()
    got = cpp(cpp_python, broker, tmp_path, "consume", "acl-orders", "acl-cg", "alice", "alice-sk")
    assert {e["key"] for e in of(got, "received")} == {"acl-0", "acl-1"}, got
    assert stored(broker)["acl-orders"] == before["acl-orders"] + 2


@pytest.mark.parametrize(("topic", "creds"), [
    ("acl-orders", ("alice", "wrong-secret")),
    ("acl-orders", ("mallory", "alice-sk")),
    ("acl-secret", ("alice", "alice-sk")),
    ("acl-other", ("alice", "alice-sk")),
    ("acl-orders", ()),
], ids=["wrong-key", "unknown-user", "denied-topic", "no-policy", "no-credentials"])
def test_cpp_client_is_refused_with_no_permission(cpp_python: Path, broker: BrokerProcess, relay: Relay,
                                                  tmp_path: Path, topic: str, creds: tuple[str, ...]) -> None:
    before = stored(broker)
    relay.take()
    events = cpp(cpp_python, broker, tmp_path, "produce", topic, "acl-pg", *creds)
    assert not of(events, "sent") and len(of(events, "error")) == 2, events
    codes = relay.take()  # what the broker answered, on the wire
    assert codes.count(ResponseCode.NO_PERMISSION) >= 2, codes  # every send (and its retries)
    if topic == "acl-orders":  # bad credentials: heartbeats and unregistering are refused too
        assert set(codes) == {ResponseCode.NO_PERMISSION}, codes
    assert stored(broker) == before


# -- the official gRPC client ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def grpc_python() -> Path:
    try:
        return ensure_env(REQUIREMENTS)
    except GrpcClientUnavailable as e:
        if os.environ.get(GRPC_REQUIRE_ENV) == "1":
            pytest.fail(f"{GRPC_REQUIRE_ENV}=1 but the official gRPC client environment cannot be built: {e}")
        pytest.skip(f"the official gRPC client environment cannot be built here: {e}")


def grpc(python: Path, b: BrokerProcess, tmp: Path, topic: str, *args: str) -> list[Event]:
    endpoints = f"127.0.0.1:{b.config['grpc_port']}"
    return run(python, GRPC_SCRIPT, ["--endpoints", endpoints, "--topic", topic, "--count", "2", *args],
               tmp / "grpc")


def test_grpc_client_with_the_right_key_sends_and_receives(grpc_python: Path, broker: BrokerProcess,
                                                            tmp_path: Path) -> None:
    before = stored(broker)
    events = grpc(grpc_python, broker, tmp_path, "acl-grpc", "--ak", "alice", "--sk", "alice-sk",
                  "--consume-group", "acl-simple")
    assert [e["key"] for e in of(events, "sent")] == ["acl-0", "acl-1"], events
    assert sorted(of(events, "received")[0]["keys"]) == ["acl-0", "acl-1"], events
    assert not of(events, "error"), events
    assert stored(broker)["acl-grpc"] == before["acl-grpc"] + 2


@pytest.mark.parametrize(("topic", "args", "code"), [
    ("acl-orders", ["--ak", "alice", "--sk", "wrong-secret"], UNAUTHORIZED),
    ("acl-orders", ["--ak", "mallory", "--sk", "alice-sk"], UNAUTHORIZED),
    ("acl-secret", ["--ak", "alice", "--sk", "alice-sk"], FORBIDDEN),
    ("acl-other", ["--ak", "alice", "--sk", "alice-sk"], FORBIDDEN),
    ("acl-orders", ["--ak", "alice", "--sk", "alice-sk", "--date-skew-s", str(-2 * 86400)], UNAUTHORIZED),
    ("acl-orders", [], UNAUTHORIZED),
], ids=["wrong-key", "unknown-user", "denied-topic", "no-policy", "expired-date", "no-credentials"])
def test_grpc_client_is_refused_with_the_right_status(grpc_python: Path, broker: BrokerProcess,
                                                      tmp_path: Path, topic: str, args: list[str],
                                                      code: int) -> None:
    before = stored(broker)
    events = grpc(grpc_python, broker, tmp_path, topic, *args)
    errors = [e for e in of(events, "error") if e["stage"] == "send"]
    assert not of(events, "sent") and len(errors) == 2, events
    assert {e["code"] for e in errors} == {code}, errors
    assert {e["type"] for e in errors} == {"UnauthorizedException" if code == UNAUTHORIZED
                                           else "ForbiddenException"}
    assert stored(broker) == before


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
