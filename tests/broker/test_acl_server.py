"""ACL on real broker processes over TCP with txmq's SDK: the right key works; a wrong key, a wrong
signature, a denied topic, a missing permission and no credentials are answered NO_PERMISSION (16)
with a remark saying why, and nothing is stored or changed; the accounts file is reloaded without a
restart (a bad file keeps the old policies); binding beyond loopback with ACL off warns."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.broker import BrokerConfig
from txmq.broker.acl import (
    Accounts,
    Action,
    Decision,
    PolicyEntry,
    Resource,
    User,
    UserType,
    save_accounts,
)
from txmq.client import Admin, Message, Producer, PullConsumer
from txmq.errors import ConfigError, RemoteError, ResponseCode
from txmq.protocol import (
    Command,
    FrameDecoder,
    RequestCode,
    SendMessageRequestHeaderV2,
    encode_command,
    sign_remoting,
    to_ext,
)
from txmq.testing import BrokerProcess, run_broker, wait_until

pytestmark = pytest.mark.slow

TOPICS = {"orders": 2, "secret": 1, "other": 1}
ROOT = {"access_key": "root", "secret_key": "root-sk"}
ALICE = {"access_key": "alice", "secret_key": "alice-sk"}


def _accounts(*extra: PolicyEntry) -> Accounts:
    t, g = Resource.parse, Resource.parse
    alice = (PolicyEntry(t("Topic:orders"), (Action.PUB, Action.SUB)),
             PolicyEntry(g("Group:ledger*"), (Action.SUB,)),
             PolicyEntry(t("Topic:secret"), (Action.ALL,), Decision.DENY), *extra)
    return Accounts({"alice": User("alice", "alice-sk", UserType.NORMAL, alice),
                     "root": User("root", "root-sk", UserType.SUPER)})


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "acl.toml"
    save_accounts(path, _accounts())
    return path


@pytest.fixture
def broker(tmp_path: Path, acl_file: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "b", topics=TOPICS, acl_enable=True, acl_file=str(acl_file)) as b:
        yield b


def stored(b: BrokerProcess) -> dict[str, int]:
    """Messages stored per topic (max offsets summed), read as the super user."""
    with Admin(b.endpoints, **ROOT) as a:
        return {t: sum(q.max_offset for q in a.topic_stats(t).offset_table) for t in TOPICS}


def refused(fn: object, *args: object, **kw: object) -> str:
    with pytest.raises(RemoteError) as info:
        fn(*args, **kw)  # type: ignore[operator]
    assert info.value.response_code == ResponseCode.NO_PERMISSION, info.value
    return str(info.value)


def raw(b: BrokerProcess, cmd: Command) -> Command:
    """One request on a plain socket (no SDK), its response."""
    host, port = b.endpoints.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_command(cmd))
        dec = FrameDecoder()
        while not (got := dec.feed(s.recv(65536))):
            pass
        return got[0]


def send_cmd(topic: str, body: bytes) -> tuple[dict[str, str], bytes]:
    ext = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic=topic, queue_id=0,
                                            born_timestamp=int(time.time() * 1000)))
    return ext, body


def test_the_right_key_works(broker: BrokerProcess) -> None:
    with Producer("pg", broker.endpoints, **ALICE) as p:
        r = p.send(Message(topic="orders", body=b"hello", keys="k1"), queue_id=0)
    assert r.queue_offset == 0
    with PullConsumer(broker.endpoints, "ledger-1", **ALICE) as c:
        got = c.pull("orders", 0, 0)
    assert [m.body for m in got.messages] == [b"hello"]
    assert stored(broker)["orders"] == 1


def test_refusals_are_no_permission_and_store_nothing(broker: BrokerProcess) -> None:
    why = refused(Producer("pg", broker.endpoints, access_key="alice", secret_key="wrong").start)
    assert "signature check failed" in why
    why = refused(Producer("pg", broker.endpoints, access_key="mallory", secret_key="x").start)
    assert "unknown access key" in why
    assert "no credentials" in refused(Producer("pg", broker.endpoints).start)
    with Producer("pg", broker.endpoints, **ALICE) as p:
        assert "denied Pub on Topic:secret" in refused(p.send, Message(topic="secret", body=b"x"))
        assert "no policy allowing Pub on Topic:other" in refused(p.send, Message(topic="other", body=b"x"))
    assert stored(broker) == dict.fromkeys(TOPICS, 0)


def test_a_tampered_request_is_refused(broker: BrokerProcess) -> None:
    ext, body = send_cmd("orders", b"paid 10")
    signed = sign_remoting(ext, body, "alice", "alice-sk")
    ok = raw(broker, Command(RequestCode.SEND_MESSAGE_V2, 1, ext=signed, body=body))
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    bad = raw(broker, Command(RequestCode.SEND_MESSAGE_V2, 2, ext=signed, body=b"paid 1000"))
    assert bad.code == ResponseCode.NO_PERMISSION and "signature check failed" in (bad.remark or "")
    moved = raw(broker, Command(RequestCode.SEND_MESSAGE_V2, 3, ext={**signed, "b": "other"}, body=body))
    assert moved.code == ResponseCode.NO_PERMISSION
    assert stored(broker) == {"orders": 1, "secret": 0, "other": 0}


def test_admin_actions_need_their_own_permission(broker: BrokerProcess, acl_file: Path) -> None:
    with Producer("pg", broker.endpoints, **ALICE) as p:
        p.send(Message(topic="orders", body=b"x"), queue_id=0)
    with PullConsumer(broker.endpoints, "ledger-1", **ALICE) as c:
        c.commit_offset("orders", 0, 1)
    with Admin(broker.endpoints, **ALICE) as a:
        assert "ResetOffset on Group:ledger-1" in refused(a.reset_offset, "ledger-1", "orders", offset=0)
        assert "TxAdmin on Cluster:DefaultCluster" in refused(a.operator_end, "half:0", "COMMIT", "ops")
        assert "Create|Update on Topic:new" in refused(a.create_topic, "new", 1)
    with Admin(broker.endpoints, **ROOT) as a:
        assert [s.consumer_offset for s in a.consume_stats("ledger-1", "orders") if s.queue_id == 0] == [1]
        assert "new" not in a.topic_configs().topic_config_table


def test_the_file_is_reloaded_without_a_restart(broker: BrokerProcess, acl_file: Path) -> None:
    with Admin(broker.endpoints, **ALICE) as a:
        refused(a.reset_offset, "ledger-1", "orders", offset=0)
        save_accounts(acl_file, _accounts(PolicyEntry(Resource.parse("Group:ledger-1"),
                                                      (Action.RESET_OFFSET,))))
        wait_until(lambda: _resets(a), 10)
        acl_file.write_text("[users.alice]\nsecret_key = \n")  # broken: the old policies stay
        time.sleep(2.5)
        assert _resets(a)
    assert "ACL file" in broker.log_path.read_text() and "keeping the previous" in broker.log_path.read_text()


def _resets(a: Admin) -> bool:
    try:
        a.reset_offset("ledger-1", "orders", offset=0)
    except RemoteError:
        return False
    return True


def test_binding_beyond_loopback_without_acl_warns(tmp_path: Path, acl_file: Path) -> None:
    with run_broker(tmp_path / "open", host="0.0.0.0") as b:
        assert "with ACL off" in b.log_path.read_text()
    with run_broker(tmp_path / "closed", host="0.0.0.0", acl_enable=True, acl_file=str(acl_file)) as b:
        assert "with ACL off" not in b.log_path.read_text()
    with run_broker(tmp_path / "local") as b:
        assert "with ACL off" not in b.log_path.read_text()


def test_acl_needs_a_file() -> None:
    with pytest.raises(ConfigError, match="acl_file"):
        BrokerConfig(acl_enable=True).validate()
