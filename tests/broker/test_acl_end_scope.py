"""The needs of an end of a transaction, sans-IO: Pub on the REAL_TOPIC of the half message it
names (looked up in the broker's transaction service), whatever topic the request claims, on both
doors; Pub on the claimed topic only when it names no half message."""

from __future__ import annotations

from txmq.broker.acl import GRPC_RULES, REMOTING_RULES, Need, Scope
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.protocol import (
    Command,
    EndTransactionRequestHeader,
    RequestCode,
    SendMessageResponseHeader,
    decode_offset_msg_id,
    encode_body,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerHarness
from txmq.testing._harness import END_TYPES


def _scope(h: BrokerHarness) -> Scope:
    return Scope("DefaultCluster", h.broker.tx.half_topic)


def _end(sent: SendMessageResponseHeader, topic: str | None) -> EndTransactionRequestHeader:
    return EndTransactionRequestHeader(
        topic=topic, producer_group="pg", tran_state_table_offset=sent.queue_offset,
        commit_log_offset=decode_offset_msg_id(sent.msg_id)[1],
        commit_or_rollback=END_TYPES["COMMIT"], msg_id="m")


def _topics(needs: list[Need]) -> list[str]:
    return [str(n.resource) for n in needs]


def test_remoting_ends_need_pub_on_the_halfs_real_topic() -> None:
    h = BrokerHarness(topics={"a": 1, "b": 1})
    sent = from_ext(h.send(1, "b", b"x", transactional=True).ext, SendMessageResponseHeader)
    needs = REMOTING_RULES[RequestCode.END_TRANSACTION].needs
    assert needs is not None
    for claimed in (None, "a", "b"):
        cmd = Command(RequestCode.END_TRANSACTION, ext=to_ext(_end(sent, claimed)))
        assert _topics(needs(cmd, _scope(h))) == ["Topic:b"]
    batch = REMOTING_RULES[RequestCode.END_TRANSACTION_BATCH].needs
    assert batch is not None
    body = encode_body([to_ext(_end(sent, "a")), to_ext(_end(sent, None)), {"bad": "entry"}])
    cmd = Command(RequestCode.END_TRANSACTION_BATCH, body=body)
    assert _topics(batch(cmd, _scope(h))) == ["Topic:b"]


def test_a_settled_half_still_needs_its_topic_and_no_half_needs_the_claimed_one() -> None:
    h = BrokerHarness(topics={"a": 1, "b": 1})
    half = h.send(1, "b", b"x", transactional=True)
    sent = from_ext(half.ext, SendMessageResponseHeader)
    h.end(1, half, "COMMIT")
    needs = REMOTING_RULES[RequestCode.END_TRANSACTION].needs
    assert needs is not None
    cmd = Command(RequestCode.END_TRANSACTION, ext=to_ext(_end(sent, "a")))
    assert _topics(needs(cmd, _scope(h))) == ["Topic:b"]
    nowhere = EndTransactionRequestHeader(topic="a", producer_group="pg",
                                          tran_state_table_offset=99, commit_log_offset=10**9,
                                          commit_or_rollback=END_TYPES["COMMIT"], msg_id="m")
    cmd = Command(RequestCode.END_TRANSACTION, ext=to_ext(nowhere))
    assert _topics(needs(cmd, _scope(h))) == ["Topic:a"]


def test_grpc_end_needs_pub_on_the_halfs_real_topic() -> None:
    h = BrokerHarness(topics={"a": 1, "b": 1})
    sent = from_ext(h.send(1, "b", b"x", transactional=True).ext, SendMessageResponseHeader)
    needs = GRPC_RULES["EndTransaction"].needs
    assert needs is not None
    req = ps.EndTransactionRequest(topic=pd.Resource(name="a"), transaction_id=sent.msg_id)
    assert _topics(needs(req, _scope(h))) == ["Topic:b"]
    req = ps.EndTransactionRequest(topic=pd.Resource(name="a"), transaction_id="not-an-id")
    assert _topics(needs(req, _scope(h))) == ["Topic:a"]
