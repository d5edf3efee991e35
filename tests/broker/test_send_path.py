"""The send path of a real broker process: many requests in flight on one connection, batch send,
size limits, malformed and oversized input, back-pressure, and retention hooks of the shell."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq import limits
from txmq.broker import Action, BrokerConfig
from txmq.broker.server import BrokerServer
from txmq.client import AsyncConnection, Message, Producer, PullConsumer
from txmq.errors import ResponseCode
from txmq.protocol import (
    Command,
    FrameDecoder,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    encode_batch,
    encode_command,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.store import MemoryStore, Record, StoreConfig
from txmq.testing import BrokerProcess, run_broker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("broker"), topics={"t": 2, "b": 1},
                    max_message_size=4096) as b:
        yield b


def send_ext(topic: str, qid: int, props: dict[str, str] | None = None) -> dict[str, str]:
    return to_ext(SendMessageRequestHeader(producer_group="p", topic=topic, queue_id=qid,
                                           born_timestamp=1_700_000_000_000,
                                           properties=encode_properties(props or {})))


def test_thousands_of_requests_in_flight_on_one_connection(broker: BrokerProcess) -> None:
    async def main() -> list[Command]:
        conn = AsyncConnection(broker.endpoints)
        await conn.connect()
        try:
            return await asyncio.gather(*(conn.request(RequestCode.SEND_MESSAGE, send_ext("t", 1),
                                                       f"{i:05d}".encode()) for i in range(3000)))
        finally:
            await conn.close()

    replies = asyncio.run(main())
    assert all(r.code == ResponseCode.SUCCESS for r in replies)
    offsets = [from_ext(r.ext, SendMessageResponseHeader).queue_offset for r in replies]
    assert offsets == list(range(offsets[0], offsets[0] + 3000))  # answered in order
    with PullConsumer(broker.endpoints) as pc:
        got = pc.pull("t", 1, offsets[0], 1024).messages
    assert [m.body for m in got] == [f"{i:05d}".encode() for i in range(len(got))]


def test_batch_send_is_stored_contiguously_and_refused_whole(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        r = p.send_batch([Message(topic="b", body=f"m{i}".encode()) for i in range(64)])
    with PullConsumer(broker.endpoints) as pc:
        got = pc.pull("b", 0, r.queue_offset, 100).messages
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(64)]

    async def raw(body: bytes) -> Command:
        conn = AsyncConnection(broker.endpoints)
        await conn.connect()
        try:
            v2 = SendMessageRequestHeaderV2(producer_group="p", topic="b", queue_id=0,
                                            born_timestamp=1_700_000_000_000, batch=True)
            return await conn.request(RequestCode.SEND_BATCH_MESSAGE, to_ext(v2), body)
        finally:
            await conn.close()

    max_before = got[-1].queue_offset
    too_big = [Message(topic="b", body=b"ok"), Message(topic="b", body=b"x" * 4097)]
    assert asyncio.run(raw(encode_batch(too_big))).code == ResponseCode.MESSAGE_ILLEGAL
    bad = asyncio.run(raw(b"\xc1not a batch"))
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "batch body" in bad.remark
    assert asyncio.run(raw(encode_batch([]))).code == ResponseCode.MESSAGE_ILLEGAL
    many = [Message(topic="b", body=b"")] * (limits.BATCH_MESSAGES_MAX + 1)
    assert asyncio.run(raw(encode_batch(many))).code == ResponseCode.MESSAGE_ILLEGAL
    with PullConsumer(broker.endpoints) as pc:
        assert pc.max_offset("b", 0) == max_before + 1  # nothing of the refused batches


def test_a_message_over_max_message_size_is_refused(broker: BrokerProcess) -> None:
    async def main() -> tuple[Command, Command]:
        conn = AsyncConnection(broker.endpoints)
        await conn.connect()
        try:
            ok = await conn.request(RequestCode.SEND_MESSAGE, send_ext("t", 0), b"x" * 4096)
            big = await conn.request(RequestCode.SEND_MESSAGE, send_ext("t", 0), b"x" * 4097)
            return ok, big
        finally:
            await conn.close()

    ok, big = asyncio.run(main())
    assert ok.code == ResponseCode.SUCCESS
    assert big.code == ResponseCode.MESSAGE_ILLEGAL and "4097" in big.remark


@pytest.mark.parametrize("frame", [
    struct.pack(">II", limits.FRAME_SIZE_MAX_BYTES + 1, 10),  # declares too large a frame
    struct.pack(">II", 20, 100) + b"x" * 20,  # header longer than the frame
    struct.pack(">II", 12, 8) + b"\xc1" * 8,  # header that does not decode
], ids=["oversized", "inconsistent", "undecodable"])
def test_a_bad_frame_gets_an_error_and_the_connection_is_closed(broker: BrokerProcess,
                                                                 frame: bytes) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as s:
        s.sendall(frame)
        [reply] = FrameDecoder().feed(s.recv(65536))
        assert reply.code == ResponseCode.SYSTEM_ERROR and reply.remark
        assert s.recv(65536) == b""
    with Producer("p", broker.endpoints) as p:
        assert p.send(Message(topic="t", body=b"still serving")).queue_offset >= 0


def test_a_client_that_never_reads_its_replies_is_no_longer_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pull replies pile up unread: the broker stops reading that connection instead of buffering
    without bound, and keeps serving the others."""
    monkeypatch.setattr(limits, "WRITE_BUFFER_HIGH_BYTES", 256 * 1024)
    store = MemoryStore()
    server = BrokerServer(BrokerConfig(port=0, topics={"t": 1}), store)
    store.append([Record(topic="t", queue_id=0, body=b"z" * 1024) for _ in range(100)])
    store.flush()
    handled = 0
    handle = server.broker.handle

    def counting(conn: int, cmd: Command, now: int) -> list[Action]:
        nonlocal handled
        handled += 1
        return handle(conn, cmd, now)

    server.broker.handle = counting  # type: ignore[method-assign]
    pull = encode_command(Command(code=RequestCode.PULL_MESSAGE, opaque=1, ext=to_ext(
        PullMessageRequestHeader(consumer_group="g", topic="t", queue_id=0, queue_offset=0,
                                 max_msg_nums=1000))))

    async def main() -> tuple[int, int]:
        await server.start()
        try:
            _reader, hog = await asyncio.open_connection("127.0.0.1", server.port)
            hog.transport.pause_reading()  # never read a reply
            for _ in range(40):
                hog.write(pull * 1000)  # 40 000 pulls of ~100 KiB replies each (4 GB unbounded)
                await asyncio.sleep(0.02)
            buffered = max(w.transport.get_write_buffer_size() for w in server._writers.values())
            conn = AsyncConnection(f"127.0.0.1:{server.port}")
            await conn.connect()
            r = await conn.request(RequestCode.SEND_MESSAGE, send_ext("t", 0), b"other client")
            assert r.code == ResponseCode.SUCCESS
            await conn.close()
            hog.close()
            return handled, buffered
        finally:
            await server.close()

    n, buffered = asyncio.run(main())
    assert n < 5_000, f"the broker kept reading: {n} requests handled"
    assert buffered < 8 * 1024 * 1024


def test_the_shell_tells_retention_what_groups_transactions_and_delays_need(tmp_path: Path) -> None:
    store = MemoryStore(StoreConfig(mapped_file_size_commit_log=64 * 1024))
    server = BrokerServer(BrokerConfig(topics={"t": 1}), store)
    broker = server.broker
    assert store.retention_needs() == {}
    ext = send_ext("t", 0)
    for i in range(5):
        broker.handle(1, Command(code=RequestCode.SEND_MESSAGE, opaque=i, ext=ext, body=b"x"), 1)
    store.flush()
    broker.handle(1, Command(code=RequestCode.UPDATE_CONSUMER_OFFSET, opaque=9, ext=to_ext(
        UpdateConsumerOffsetRequestHeader(consumer_group="g", topic="t", queue_id=0, commit_offset=2))), 1)
    assert store.retention_needs() == {"consumer groups": store.commit_log_offset_at("t", 0, 2)}
    half = send_ext("t", 0, {"TRAN_MSG": "true", "UNIQ_KEY": "TX1"})
    broker.handle(1, Command(code=RequestCode.SEND_MESSAGE, opaque=10, ext=half, body=b"h"), 1)
    pending = next(iter(broker.tx.index.pending.values()))
    assert store.retention_needs()["pending transactions"] == pending.commit_log_offset
    delayed = send_ext("t", 0, {"DELAY": "3"})
    broker.handle(1, Command(code=RequestCode.SEND_MESSAGE, opaque=11, ext=delayed, body=b"d"), 1)
    assert "delay queues" in store.retention_needs()
