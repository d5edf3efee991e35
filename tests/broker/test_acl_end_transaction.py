"""ACL on END_TRANSACTION, over a real broker process: an end of a transaction needs Pub on the
*half message's* topic (its REAL_TOPIC), whatever topic the request claims. User A may publish to
``a`` only, user B to ``b`` only; A knows B's producer group and the offsets of B's half messages
(both are in every check-back and msgId) and still cannot commit or roll them back: not without a
topic header, not with its own topic ``a`` in it, not as a check-back answer, not in a batch. B can.
Before the fix an end without a topic header needed no permission at all."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.broker.acl import Accounts, Action, PolicyEntry, Resource, User, save_accounts
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    Command,
    EndTransactionRequestHeader,
    EndTransactionResponseHeader,
    FrameDecoder,
    RequestCode,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    decode_body,
    decode_offset_msg_id,
    encode_body,
    encode_command,
    encode_properties,
    from_ext,
    sign_remoting,
    to_ext,
)
from txmq.testing import BrokerProcess, run_broker
from txmq.testing._harness import END_TYPES

pytestmark = pytest.mark.slow

A = ("user-a", "a-sk")
B = ("user-b", "b-sk")
GROUP_B = "pg-b"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("acl-end")
    acl = root / "acl.toml"
    pub = (Action.PUB,)
    save_accounts(acl, Accounts({
        A[0]: User(A[0], A[1], policy=(PolicyEntry(Resource.parse("Topic:a"), pub),)),
        B[0]: User(B[0], B[1], policy=(PolicyEntry(Resource.parse("Topic:b"), pub),)),
    }))
    with run_broker(Path(root / "b"), topics={"a": 1, "b": 1}, acl_enable=True,
                    acl_file=str(acl)) as b:
        yield b


class _Conn:
    """One plain socket to the broker, signing each request as ``user``."""

    def __init__(self, b: BrokerProcess, user: tuple[str, str]) -> None:
        host, port = b.endpoints.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.user, self.opaque, self.dec = user, 0, FrameDecoder()

    def call(self, code: int, ext: dict[str, str], body: bytes = b"") -> Command:
        self.opaque += 1
        signed = sign_remoting(ext, body, *self.user)
        self.sock.sendall(encode_command(Command(code, self.opaque, ext=signed, body=body)))
        while not (got := self.dec.feed(self.sock.recv(65536))):
            pass
        return got[0]

    def half(self, topic: str, group: str, body: bytes) -> SendMessageResponseHeader:
        props = {PROPERTY_UNIQ_KEY: f"U{time.time_ns():x}", PROPERTY_TRANSACTION_PREPARED: "true"}
        ext = to_ext(SendMessageRequestHeaderV2(
            producer_group=group, topic=topic, queue_id=0, properties=encode_properties(props),
            born_timestamp=int(time.time() * 1000)))
        r = self.call(RequestCode.SEND_MESSAGE_V2, ext, body)
        assert r.code == ResponseCode.SUCCESS, r.remark
        return from_ext(r.ext, SendMessageResponseHeader)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def conns(broker: BrokerProcess) -> Iterator[tuple[_Conn, _Conn]]:
    a, b = _Conn(broker, A), _Conn(broker, B)
    yield a, b
    a.close()
    b.close()


def _end(half: SendMessageResponseHeader, outcome: str, topic: str | None, *,
         group: str = GROUP_B, from_check: bool = False) -> dict[str, str]:
    return to_ext(EndTransactionRequestHeader(
        topic=topic, producer_group=group, tran_state_table_offset=half.queue_offset,
        commit_log_offset=decode_offset_msg_id(half.msg_id)[1],
        commit_or_rollback=END_TYPES[outcome], from_transaction_check=from_check,
        msg_id=half.transaction_id or "", transaction_id=half.transaction_id))


@pytest.mark.parametrize("topic", [None, "", "a", "b"])
@pytest.mark.parametrize(("outcome", "from_check"),
                         [("COMMIT", False), ("ROLLBACK", False), ("COMMIT", True)])
def test_a_cannot_end_a_half_of_b(conns: tuple[_Conn, _Conn], topic: str | None, outcome: str,
                                  from_check: bool) -> None:
    a, b = conns
    half = b.half("b", GROUP_B, b"b's order")
    r = a.call(RequestCode.END_TRANSACTION, _end(half, outcome, topic, from_check=from_check))
    assert r.code == ResponseCode.NO_PERMISSION, (r.code, r.remark)
    assert "Pub on Topic:b" in (r.remark or "")
    mine = b.call(RequestCode.END_TRANSACTION, _end(half, "ROLLBACK", "b"))  # still B's to end
    assert mine.code == ResponseCode.SUCCESS, mine.remark
    assert from_ext(mine.ext, EndTransactionResponseHeader) == EndTransactionResponseHeader(
        outcome="ROLLBACK", duplicate=False)


def test_a_cannot_end_a_half_of_b_in_a_batch(conns: tuple[_Conn, _Conn]) -> None:
    a, b = conns
    own = a.half("a", "pg-a", b"a's order")
    theirs = b.half("b", GROUP_B, b"b's order")
    entries = [_end(own, "COMMIT", "a", group="pg-a"), _end(theirs, "COMMIT", "a"),
               _end(theirs, "ROLLBACK", None)]
    r = a.call(RequestCode.END_TRANSACTION_BATCH, {}, encode_body(entries))
    assert r.code == ResponseCode.NO_PERMISSION, (r.code, r.remark)
    assert "Pub on Topic:b" in (r.remark or "")
    ok = b.call(RequestCode.END_TRANSACTION_BATCH, {}, encode_body([_end(theirs, "COMMIT", None)]))
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    [item] = decode_body(ok.body, list[dict[str, object]])
    assert (item["outcome"], item["duplicate"]) == ("COMMIT", False)
    mine = a.call(RequestCode.END_TRANSACTION_BATCH, {},
                  encode_body([_end(own, "COMMIT", None, group="pg-a")]))
    assert mine.code == ResponseCode.SUCCESS, mine.remark


def test_a_claimed_topic_does_not_stand_in_for_the_real_one(conns: tuple[_Conn, _Conn]) -> None:
    """A's own half of ``a`` ends whatever topic the request names; B may not end it by naming
    ``b``, the topic B may publish to."""
    a, b = conns
    own = a.half("a", "pg-a", b"a's order")
    r = b.call(RequestCode.END_TRANSACTION, _end(own, "COMMIT", "b", group="pg-a"))
    assert r.code == ResponseCode.NO_PERMISSION and "Pub on Topic:a" in (r.remark or "")
    r = a.call(RequestCode.END_TRANSACTION, _end(own, "COMMIT", "b", group="pg-a"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert from_ext(r.ext, EndTransactionResponseHeader).outcome == "COMMIT"
