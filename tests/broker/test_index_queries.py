"""QUERY_MESSAGE (by key in a time range) and VIEW_MESSAGE_BY_ID (by id or commit log offset)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from txmq.client import Admin, Message, Producer
from txmq.errors import RemoteError, ResponseCode
from txmq.protocol import (
    MessageExt,
    QueryMessageRequestHeader,
    RequestCode,
    SendMessageResponseHeader,
    ViewMessageByUniqKeyRequestHeader,
    ViewMessageRequestHeader,
    decode_message_exts,
    from_ext,
    to_ext,
)
from txmq.store import FileStore, MemoryStore, Store
from txmq.testing import BrokerHarness, run_broker


@pytest.fixture(params=["memory", "file"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerHarness:
    store: Store = MemoryStore() if request.param == "memory" else FileStore(tmp_path / "s")
    harness = BrokerHarness(store=store, topics={"t": 2, "u": 1})
    harness.heartbeat(1, "p1", ["pg"])
    return harness


def _query(h: BrokerHarness, **fields: object) -> tuple[int, list[str]]:
    r = h.request(1, RequestCode.QUERY_MESSAGE, to_ext(QueryMessageRequestHeader(**fields)))  # type: ignore[arg-type]
    return r.code, [m.body.decode() for m in decode_message_exts(r.body)] if r.body else []


def _by_key(h: BrokerHarness, msg_id: str) -> tuple[int, list[MessageExt]]:
    r = h.request(1, RequestCode.VIEW_MESSAGE_BY_UNIQ_KEY,
                  to_ext(ViewMessageByUniqKeyRequestHeader(msg_id=msg_id)))
    return r.code, decode_message_exts(r.body) if r.body else []


def _by_offset(h: BrokerHarness, offset: int) -> tuple[int, list[MessageExt]]:
    r = h.request(1, RequestCode.VIEW_MESSAGE_BY_ID, to_ext(ViewMessageRequestHeader(offset=offset)))
    return r.code, decode_message_exts(r.body) if r.body else []


def test_query_by_key_within_a_time_range_newest_first(h: BrokerHarness) -> None:
    for i, t0 in enumerate((1_000, 2_000, 3_000)):
        h.now_ms = t0
        h.send(1, "t", f"order-{i}".encode(), keys="ORDER-7 shop-1", queue_id=i % 2)
    h.send(1, "u", b"other topic", keys="ORDER-7")
    h.send(1, "t", b"other key", keys="ORDER-8")
    assert _query(h, topic="t", key="ORDER-7") == (ResponseCode.SUCCESS, ["order-2", "order-1", "order-0"])
    assert _query(h, topic="t", key="shop-1", begin_timestamp=1_500, end_timestamp=2_500) == (
        ResponseCode.SUCCESS, ["order-1"])
    assert _query(h, topic="t", key="ORDER-7", max_num=2)[1] == ["order-2", "order-1"]
    assert _query(h, topic="t", key="nope")[0] == ResponseCode.QUERY_NOT_FOUND
    assert _query(h, topic="zzz", key="ORDER-7")[0] == ResponseCode.TOPIC_NOT_EXIST
    assert _query(h, topic="t", key="ORDER-7", begin_timestamp=5, end_timestamp=1)[0] == \
        ResponseCode.MESSAGE_ILLEGAL
    r = h.request(1, RequestCode.QUERY_MESSAGE, {"topic": "t"})
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "the custom field <key> is null")


def test_view_by_id_finds_the_half_and_the_committed_copy_and_by_offset(h: BrokerHarness) -> None:
    half = h.send(1, "t", b"paid", transactional=True, keys="K1")
    msg_id = from_ext(half.ext, SendMessageResponseHeader).transaction_id
    assert msg_id
    code, found = _by_key(h, msg_id)
    assert (code, [m.topic for m in found]) == (ResponseCode.SUCCESS, ["RMQ_SYS_TRANS_HALF_TOPIC"])
    h.end(1, half, "COMMIT")
    copies = _by_key(h, msg_id)[1]
    assert [m.topic for m in copies] == ["t", "RMQ_SYS_TRANS_HALF_TOPIC"]  # newest first
    real = copies[0]
    code, by_offset = _by_offset(h, real.commit_log_offset)
    assert [(m.body, m.keys) for m in by_offset] == [(b"paid", "K1")]
    for bad in (real.commit_log_offset + 1, h.store.write_offset + 100, -5):
        assert _by_offset(h, bad)[0] == ResponseCode.QUERY_NOT_FOUND
    assert _by_key(h, "nope")[0] == ResponseCode.QUERY_NOT_FOUND


def test_admin_client_and_cli_over_tcp(tmp_path: Path) -> None:
    with run_broker(tmp_path / "b", topics={"orders": 2}) as b:
        with Producer("pg", b.endpoints) as p:
            sent = [p.send(Message(topic="orders", body=f"o{i}".encode(), keys=f"ORDER-{i % 2}"))
                    for i in range(6)]
        with Admin(b.endpoints) as adm:
            assert [m.body for m in adm.query_messages("orders", "ORDER-1")] == [b"o5", b"o3", b"o1"]
            [viewed] = adm.view_message(sent[2].msg_id)
            assert viewed.body == b"o2"
            assert viewed.store_host == f"127.0.0.1:{b.port}"  # the broker's listen address
            host, port = viewed.born_host.split(":")  # the producer's end of its connection
            assert host == "127.0.0.1" and int(port) not in (0, b.port)
            with pytest.raises(RemoteError) as exc:
                adm.query_messages("orders", "ORDER-9")
            assert exc.value.code == "QUERY_NOT_FOUND"

        def txmq(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "txmq", "message", *args, "--endpoints",
                                   b.endpoints], capture_output=True, text=True, timeout=60)

        out = txmq("query", "orders", "ORDER-0", "--json")
        assert out.returncode == 0, out.stderr
        assert [r["body"] for r in json.loads(out.stdout)] == ["o4", "o2", "o0"]
        out = txmq("show", sent[3].msg_id)
        assert out.returncode == 0 and sent[3].msg_id in out.stdout
        missing = txmq("show", "--offset", "7")
        assert missing.returncode == 1 and "QUERY_NOT_FOUND" in missing.stderr + missing.stdout
