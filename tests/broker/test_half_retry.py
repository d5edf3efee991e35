"""A retried half is not a second transaction: a half send (TRAN_MSG=true) whose UNIQ_KEY, producer
group and topic are those of a half still pending on the broker is answered SEND_OK with the stored
half's msgId, queue and offsets, and stores nothing (docs/transactions.md). RocketMQ stores it again:
the first copy becomes an orphan that is checked back and may be committed a second time
(docs/transactions.md, "A retried half is not a second transaction")."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from txmq.broker import Reply
from txmq.broker.transaction import HALF_TOPIC
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    Command,
    FrameDecoder,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    decode_body,
    encode_command,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness, run_broker

TIMEOUT = 6_000


def _sent(reply: Command) -> SendMessageResponseHeader:
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return from_ext(reply.ext, SendMessageResponseHeader)


def _halves(h: BrokerHarness) -> int:
    return h.store.queue_bounds(HALF_TOPIC, 0)[1]


def _retry(h: BrokerHarness, body: bytes = b"order-1", *, uniq: str = "U1", group: str = "pg",
           topic: str = "t", conn: int = 1) -> SendMessageResponseHeader:
    return _sent(h.send(conn, topic, body, group=group, transactional=True,
                        properties={PROPERTY_UNIQ_KEY: uniq}))


def test_a_retried_half_is_answered_with_the_stored_one_and_stores_nothing() -> None:
    h = BrokerHarness(topics={"t": 4})
    h.heartbeat(1, "producer-1", ["pg"])
    first = _retry(h)
    again = _retry(h, conn=2)  # a new connection, as after a lost one
    assert again == first
    assert _halves(h) == 1
    assert h.broker.tx.index.counts()["PENDING"] == 1
    assert h.broker.tx.stats["retried_halves"] == 1
    h.tick(TIMEOUT + 1)
    checks = [s for s in h.sent if s.command.code == RequestCode.CHECK_TRANSACTION_STATE]
    assert len(checks) == 1  # one transaction to check back, not an orphan besides it


def test_the_retry_commits_once() -> None:
    h = BrokerHarness(topics={"t": 4})
    half = h.send(1, "t", b"order-1", transactional=True, properties={PROPERTY_UNIQ_KEY: "U1"})
    retry = h.send(1, "t", b"order-1", transactional=True, properties={PROPERTY_UNIQ_KEY: "U1"})
    assert h.end(1, retry, "COMMIT").code == ResponseCode.SUCCESS
    assert h.end(1, half, "COMMIT").code == ResponseCode.SUCCESS  # the same half: a duplicate end
    assert [m.body for m in h.all_messages("t")] == [b"order-1"]


def test_only_a_pending_half_of_the_same_group_and_topic_is_a_retry() -> None:
    h = BrokerHarness(topics={"t": 4, "u": 1})
    first = h.send(1, "t", b"x", transactional=True, properties={PROPERTY_UNIQ_KEY: "U1"})
    others = [_retry(h, group="other-pg"), _retry(h, topic="u"),
              _sent(h.send(1, "t", b"plain", properties={PROPERTY_UNIQ_KEY: "U1"}))]
    assert len({o.msg_id for o in others} | {_sent(first).msg_id}) == 4
    assert _halves(h) == 3
    h.end(1, first, "COMMIT")
    after = _retry(h)  # settled: a new half, a new transaction
    assert after.msg_id != _sent(first).msg_id
    assert _halves(h) == 4


def test_a_retry_in_the_same_read_is_stored_once() -> None:
    h = BrokerHarness(topics={"t": 4})
    props = encode_properties({PROPERTY_UNIQ_KEY: "U1", PROPERTY_TRANSACTION_PREPARED: "true"})
    ext = to_ext(SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=1,
                                          properties=props, born_timestamp=h.now_ms))
    cmds = [Command(RequestCode.SEND_MESSAGE, opaque, ext=ext, body=b"x") for opaque in (1, 2)]
    replies = [a.command for a in h.broker.handle_sends(1, cmds, h.now_ms) if isinstance(a, Reply)]
    h.store.flush()
    assert [r.opaque for r in replies] == [1, 2]
    a, b = (_sent(r) for r in replies)
    assert a == b and a.queue_id == 1
    assert _halves(h) == 1


def test_a_retry_after_a_restart_is_still_the_same_half() -> None:
    h = BrokerHarness(topics={"t": 4})
    first = _retry(h)
    h2 = BrokerHarness(store=h.store, topics={"t": 4})
    assert _retry(h2) == first
    assert _halves(h2) == 1


def _raw_send(addr: str, ext: dict[str, str], body: bytes) -> Command:
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_command(Command(RequestCode.SEND_MESSAGE, 1, ext=ext, body=body)))
        dec = FrameDecoder()
        while not (got := dec.feed(s.recv(65536))):
            pass
        return got[0]


@pytest.mark.slow
def test_a_retried_half_over_a_real_broker(tmp_path: Path) -> None:
    props = encode_properties({PROPERTY_UNIQ_KEY: "RETRY-1", PROPERTY_TRANSACTION_PREPARED: "true"})
    ext = to_ext(SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=-1,
                                          properties=props, born_timestamp=int(time.time() * 1000)))
    with run_broker(tmp_path / "b", topics={"t": 4}) as b:
        first = _sent(_raw_send(b.endpoints, ext, b"order-1"))
        again = _sent(_raw_send(b.endpoints, ext, b"order-1"))  # a second connection
        assert again == first
        stats = Command(RequestCode.GET_TRANSACTION_STATS, 1)
        host, port = b.endpoints.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(encode_command(stats))
            dec = FrameDecoder()
            while not (got := dec.feed(s.recv(65536))):
                pass
        counts = decode_body(got[0].body, dict[str, int])
        assert counts["PENDING"] == 1 and counts["retried_halves"] == 1
