"""Broker.handle_sends (SEND_MESSAGE requests that arrived together, one append) answers and stores
exactly what one handle() per request does, errors included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from txmq.broker import Reply
from txmq.errors import ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    Command,
    RequestCode,
    SendMessageRequestHeader,
    ViewMessageByUniqKeyRequestHeader,
    decode_message_exts,
    encode_properties,
    to_ext,
)
from txmq.store import FileStore, MemoryStore, Store
from txmq.testing import BrokerHarness


def _send(i: int, topic: str = "t", body: bytes = b"x", qid: int = -1, flags: int = 0,
          **props: str) -> Command:
    props = {"UNIQ_KEY": f"U{i:04d}", "KEYS": f"k{i}", **props}
    h = SendMessageRequestHeader(producer_group="pg", topic=topic, queue_id=qid,
                                 properties=encode_properties(props), born_timestamp=5)
    return Command(code=RequestCode.SEND_MESSAGE, opaque=i, flag=flags, ext=to_ext(h), body=body)


def _requests() -> list[Command]:
    bad_header = Command(code=RequestCode.SEND_MESSAGE, opaque=90, ext={"topic": "t"}, body=b"?")
    return [
        _send(1), _send(2, "u"), _send(3, TRAN_MSG="true"),  # plain, other topic, half message
        _send(4, body=b"y" * 5000),  # over max_message_size: refused alone
        _send(5, "nope"),  # unknown topic: refused alone
        bad_header,  # malformed header: refused alone
        _send(6, DELAY="1"),  # a delay message: handled on its own, in order
        _send(7, qid=1), _send(8, flags=FLAG_ONEWAY), _send(9, TRAN_MSG="true", qid=1),
    ]


def _harness(kind: str, tmp: Path, **cfg: Any) -> BrokerHarness:
    store: Store = MemoryStore() if kind == "memory" else FileStore(tmp)
    h = BrokerHarness(store=store, topics={"t": 2, "u": 1}, max_message_size=4096, **cfg)
    h.heartbeat(1, "p1", ["pg"])
    return h


def _replies(actions: list[Any]) -> list[tuple[int, int, dict[str, Any]]]:
    return [(a.command.opaque, a.command.code, a.command.ext) for a in actions if isinstance(a, Reply)]


def _stored(h: BrokerHarness) -> list[tuple[str, int, int, bytes, str]]:
    h.store.flush()
    return [(m.topic, m.queue_id, m.queue_offset, m.body, m.properties.get("UNIQ_KEY", ""))
            for topic in ("t", "u", "RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX")
            for qid in h.store.queue_ids(topic) for m in h.pull(topic, qid)]


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_one_append_answers_like_one_handle_each(kind: str, tmp_path: Path) -> None:
    one, many = _harness(kind, tmp_path / "a"), _harness(kind, tmp_path / "b")
    expected = [a for cmd in _requests() for a in one.broker.handle(1, cmd, one.now_ms)]
    got = many.broker.handle_sends(1, _requests(), many.now_ms)
    assert _replies(got) == _replies(expected)
    codes = {opaque: code for opaque, code, _ in _replies(got)}
    assert codes == {1: 0, 2: 0, 3: 0, 4: ResponseCode.MESSAGE_ILLEGAL, 5: ResponseCode.TOPIC_NOT_EXIST,
                     90: ResponseCode.SYSTEM_ERROR, 6: 0, 7: 0, 9: 0}  # 8 is one-way
    assert _stored(many) == _stored(one)
    assert set(many.broker.tx.index.pending) == set(one.broker.tx.index.pending) != set()
    by_key = to_ext(ViewMessageByUniqKeyRequestHeader(msg_id="U0008"))
    assert [m.body for m in decode_message_exts(many.request(1, RequestCode.VIEW_MESSAGE_BY_UNIQ_KEY,
                                                             by_key).body)] == [b"x"]


def test_a_failed_append_fails_every_send_of_the_run_and_stores_nothing(tmp_path: Path) -> None:
    usage = [0.1]
    h = BrokerHarness(store=FileStore(tmp_path, disk_usage=lambda: usage[0]), topics={"t": 2})
    before = h.store.write_offset
    usage[0] = 0.99
    h.store.check_disk()
    got = _replies(h.broker.handle_sends(1, [_send(1), _send(2), _send(3, "nope")], h.now_ms))
    unavailable = ResponseCode.SERVICE_NOT_AVAILABLE
    assert [(o, c) for o, c, _ in got] == [(1, unavailable), (2, unavailable),
                                           (3, ResponseCode.TOPIC_NOT_EXIST)]
    assert h.store.write_offset == before
