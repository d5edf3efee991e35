"""The parts the broker is split into: OffsetTable (the only owner of the consumer offset keys),
TopicTable, and the one send path (``Broker.send``: one store append per call)."""

from __future__ import annotations

import msgspec
import pytest

from txmq.broker import Broker, BrokerConfig, OffsetTable, Reply, SendRequest, TopicTable
from txmq.broker.transaction import HALF_TOPIC
from txmq.errors import DiskFull, InvalidRequest, ResponseCode
from txmq.protocol import (
    Command,
    Message,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    encode_batch,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.store import AppendResult, MemoryStore, Record

NOW = 1_000_000


class CountingStore(MemoryStore):
    """A MemoryStore that counts append calls (and fails them when told)."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0
        self.fail: Exception | None = None

    def append(self, records: list[Record]) -> list[AppendResult]:
        self.appends += 1
        if self.fail is not None:
            raise self.fail
        return super().append(records)


def _broker(store: MemoryStore | None = None, **config: object) -> Broker:
    cfg = msgspec.convert({"topics": {"t": 4, "u": 1}, **config}, BrokerConfig).validate()
    return Broker(cfg, store or CountingStore(), NOW)


# -- OffsetTable -------------------------------------------------------------------------------------
def test_offset_keys_round_trip_with_odd_but_legal_names() -> None:
    table = OffsetTable(MemoryStore())
    assert table.get("g", "t", 0) is None
    names = [("%RETRY%g|x-_", "a|b%c_-1"), ("g", "%DLQ%g"), ("G-1_|", "t")]
    for n, (group, topic) in enumerate(names):
        table.set(group, topic, n, 10 + n)
    assert [table.get(g, t, n) for n, (g, t) in enumerate(names)] == [10, 11, 12]
    assert list(table.items()) == [(g, t, n, 10 + n) for n, (g, t) in enumerate(names)]
    assert table.group_topics() == {"%RETRY%g|x-_": ["a|b%c_-1"], "g": ["%DLQ%g"], "G-1_|": ["t"]}
    assert table.get("%RETRY%g|x-_", "a|b%c_-1", 1) is None  # the queue is part of the key


def test_offsets_persist_and_reload_in_the_consumer_offset_file_format() -> None:
    store = MemoryStore()
    table = OffsetTable(store)
    assert not table.persist()  # nothing changed: nothing written
    table.set("g|1", "t", 3, 7)
    table.set("g|1", "t", 3, 7)
    assert table.dirty and table.persist() and not table.dirty
    assert msgspec.json.decode(store.load_meta("consumerOffset.json") or b"") == {"g|1@t@3": 7}
    again = OffsetTable(store)
    assert again.get("g|1", "t", 3) == 7 and not again.dirty
    assert len(again) == 1


def test_offsets_file_from_elsewhere_group_with_at_sign_and_bad_keys() -> None:
    store = MemoryStore()
    store.save_meta("consumerOffset.json", msgspec.json.encode(
        {"a@b@t@0": 4, "nonsense": 1, "g@t@x": 2, "g@t@1": 9}))
    table = OffsetTable(store)
    assert table.get("a@b", "t", 0) == 4  # topics hold no '@': the key splits from the right
    assert sorted(table.items()) == [("a@b", "t", 0, 4), ("g", "t", 1, 9)]
    table.set("g", "t", 1, 10)
    table.persist()  # keys it cannot read are kept as they were
    saved = msgspec.json.decode(store.load_meta("consumerOffset.json") or b"")
    assert saved == {"a@b@t@0": 4, "nonsense": 1, "g@t@x": 2, "g@t@1": 10}


def test_offsets_reset_of_a_group_on_a_topic() -> None:
    table = OffsetTable(MemoryStore())
    for q in range(3):
        table.set("g", "t", q, q)
    table.set("g", "u", 0, 5)
    table.set("h", "t", 0, 6)
    table.persist()
    assert table.reset("g", "t") == 3 and table.dirty
    assert sorted(table.items()) == [("g", "u", 0, 5), ("h", "t", 0, 6)]


# -- TopicTable --------------------------------------------------------------------------------------
def test_topic_table_system_config_create_widen_and_reload() -> None:
    store = MemoryStore()
    cfg = msgspec.convert({"topics": {"t": 4}}, BrokerConfig).validate()
    topics = TopicTable(cfg, store)
    assert topics.get("t") == 4 and HALF_TOPIC in topics and topics.get("nope") is None
    assert topics.create("n", 2) == 2
    assert topics.create("n", 1) == 2  # never narrowed
    assert topics.create("n", 5) == 5
    assert TopicTable(cfg, store).snapshot() == topics.snapshot()
    with pytest.raises(InvalidRequest) as info:
        topics.queue_nums("missing")
    assert info.value.response_code == ResponseCode.TOPIC_NOT_EXIST
    auto = TopicTable(msgspec.structs.replace(cfg, auto_create_topic_enable=True), store)
    assert auto.queue_nums("fresh") == cfg.default_topic_queue_nums and "fresh" in auto


# -- the one send path -------------------------------------------------------------------------------
def _req(topic: str = "t", body: bytes = b"x", **props: str) -> SendRequest:
    return SendRequest(topic=topic, body=body, properties={"UNIQ_KEY": "U", **props},
                       producer_group="pg")


def test_send_mixed_valid_and_invalid_requests_one_append() -> None:
    store = CountingStore()
    b = _broker(store)
    reqs = [_req(), _req("nope"), _req(body=b"y" * 10_000_000), _req(TRAN_MSG="true"),
            _req(DELAY="2"), _req("u", TAGS="a", KEYS="k")]
    before = store.appends
    out = b.send(1, reqs, NOW)
    assert store.appends == before + 1
    assert [o.code for o in out] == [ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST,
                                     ResponseCode.MESSAGE_ILLEGAL, ResponseCode.SUCCESS,
                                     ResponseCode.SUCCESS, ResponseCode.SUCCESS]
    assert out[1].remark and out[1].queue_offset == -1
    assert out[3].transaction_id == "U" and out[0].transaction_id == ""
    assert len(b.tx.index.pending) == 1
    durable = [o.durable_offset for o in out if o.code == ResponseCode.SUCCESS]
    assert durable == sorted(durable) and len(set(durable)) == 4
    store.flush()
    [m] = store.read_queue("u", 0, 0, 10, 1 << 20)
    assert (m.tags, m.keys) == ("a", "k")


def test_send_append_failure_fails_every_staged_request_alike() -> None:
    store = CountingStore()
    b = _broker(store)
    store.fail = DiskFull("disk full")
    out = b.send(1, [_req(), _req("nope"), _req()], NOW)
    assert [o.code for o in out] == [ResponseCode.SERVICE_NOT_AVAILABLE,
                                     ResponseCode.TOPIC_NOT_EXIST,
                                     ResponseCode.SERVICE_NOT_AVAILABLE]
    assert store.appends == 1 and b.store.write_offset == 0


def test_send_without_queue_hashes_the_sharding_key() -> None:
    b = _broker()
    out = b.send(1, [_req(__SHARDINGKEY="order-7") for _ in range(6)], NOW)
    assert len({o.queue_id for o in out}) == 1
    spread = b.send(1, [_req() for _ in range(8)], NOW)
    assert len({o.queue_id for o in spread}) == 4  # round robin without a key


def _cmd(code: int, opaque: int, body: bytes, queue_id: int = -1, **props: str) -> Command:
    h = SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=queue_id,
                                 properties=encode_properties(props), born_timestamp=NOW)
    if code == RequestCode.SEND_BATCH_MESSAGE:
        return Command(code, opaque, ext=to_ext(SendMessageRequestHeaderV2.from_v1(h)), body=body)
    return Command(code, opaque, ext=to_ext(h), body=body)


def test_handle_sends_run_and_batch_each_append_once() -> None:
    store = CountingStore()
    b = _broker(store)
    run = [_cmd(RequestCode.SEND_MESSAGE, i, b"m", UNIQ_KEY=f"U{i}",
                **({"DELAY": "1"} if i == 3 else {})) for i in range(8)]
    run.append(Command(RequestCode.SEND_MESSAGE, 99, ext={"topic": "t"}))  # malformed header
    before = store.appends
    acts = b.handle_sends(1, run, NOW)
    assert store.appends == before + 1
    assert [a.command.opaque for a in acts if isinstance(a, Reply)] == [*range(8), 99]
    assert [a.command.code for a in acts if isinstance(a, Reply)] == [0] * 8 + [
        ResponseCode.SYSTEM_ERROR]
    batch = encode_batch([Message(topic="t", body=f"b{i}".encode(), properties={"UNIQ_KEY": f"B{i}"})
                          for i in range(5)])
    [reply] = b.handle(1, _cmd(RequestCode.SEND_BATCH_MESSAGE, 100, batch), NOW)
    assert store.appends == before + 2 and isinstance(reply, Reply)
    h = from_ext(reply.command.ext, SendMessageResponseHeader)
    assert len(h.msg_id.split(",")) == 5
    store.flush()
    msgs = store.read_queue("t", h.queue_id, h.queue_offset, 10, 1 << 20)
    assert [m.body for m in msgs[-5:]] == [f"b{i}".encode() for i in range(5)]


def test_batch_is_all_or_nothing() -> None:
    store = CountingStore()
    b = _broker(store, max_message_size=100)
    batch = encode_batch([Message(topic="t", body=b"ok"), Message(topic="t", body=b"z" * 200)])
    before = (store.appends, store.write_offset)
    [reply] = b.handle(1, _cmd(RequestCode.SEND_BATCH_MESSAGE, 1, batch), NOW)
    assert isinstance(reply, Reply) and reply.command.code == ResponseCode.MESSAGE_ILLEGAL
    assert (store.appends, store.write_offset) == before
