"""A real broker process against hostile frames (issue 11): an undecodable header gets
INVALID_PARAMETER and a close, with one warning line and no traceback, and other connections are
served; a refused request leaves its connection usable."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.client import Message, Producer
from txmq.errors import ResponseCode
from txmq.protocol import Command, FrameDecoder, RequestCode, SendMessageRequestHeader, encode_command, to_ext
from txmq.testing import BrokerProcess, run_broker

pytestmark = pytest.mark.slow

_HEAD = bytes([0x96, 10, 1, 0, 1])  # msgpack array of 6: code 10, opaque 1, flags 0, version 1


def _frame(header: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header), len(header)) + header


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("broker"), topics={"t": 1}) as b:
        yield b


def _replies(s: socket.socket, n: int) -> list[Command]:
    d, out = FrameDecoder(), []
    while len(out) < n:
        data = s.recv(65536)
        assert data, "connection closed early"
        out += d.feed(data)
    return out


@pytest.mark.parametrize("header", [
    _HEAD + b"\xa0" + b"\x81\xa1a" + b"\x91" * 60_000 + b"\xc0",
    _HEAD + b"\xa2\xff\xfe" + b"\x80",
], ids=["60000-nested-levels", "invalid-utf8"])
def test_an_undecodable_header_gets_an_error_reply_and_a_close_without_a_traceback(
        broker: BrokerProcess, header: bytes) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as other, \
            socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(_frame(header))
        [reply] = _replies(s, 1)
        assert reply.code == ResponseCode.INVALID_PARAMETER and reply.remark
        assert s.recv(65536) == b""
        ext = to_ext(SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=0))
        other.sendall(encode_command(Command(code=RequestCode.SEND_MESSAGE, opaque=7, ext=ext, body=b"y")))
        assert _replies(other, 1)[0].code == ResponseCode.SUCCESS
    with Producer("p", broker.endpoints) as p:
        assert p.send(Message(topic="t", body=b"still serving")).queue_offset >= 0
    log = Path(broker.log_path).read_text()
    assert "Traceback" not in log and "RecursionError" not in log.replace("MalformedFrame", "")


def test_a_refused_request_leaves_its_connection_usable(broker: BrokerProcess) -> None:
    bad = to_ext(SendMessageRequestHeader(producer_group="pg", topic=".", queue_id=0))
    system = to_ext(SendMessageRequestHeader(producer_group="pg", topic="RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                             queue_id=0, tags="d"))
    delay = to_ext(SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=0,
                                            properties={"DELAY": "abc"}))
    good = to_ext(SendMessageRequestHeader(producer_group="pg", topic="t", queue_id=0))
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(b"".join(encode_command(Command(code=RequestCode.SEND_MESSAGE, opaque=i, ext=e, body=b"z"))
                           for i, e in enumerate((bad, system, delay, good), start=1)))
        codes = {r.opaque: r.code for r in _replies(s, 4)}
    assert codes == {1: ResponseCode.MESSAGE_ILLEGAL, 2: ResponseCode.NO_PERMISSION,
                     3: ResponseCode.INVALID_PARAMETER, 4: ResponseCode.SUCCESS}
