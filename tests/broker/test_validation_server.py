"""A real broker process against hostile bytes, in both header codecs (JSON and ROCKETMQ), with
RocketMQ's answers (issue 11, issue 12):

- a frame that cannot be trusted (undecodable header, unknown serialize type, lengths that do not
  fit) closes its connection, with one warning line and no traceback; other connections are served;
- a well-framed request whose header fields do not decode gets SYSTEM_ERROR with RocketMQ's remark
  (``the custom field <x> is null``, RocketMQ ``RemotingCommand.decodeCommandCustomHeader``) and the
  connection is kept; an unknown code gets REQUEST_CODE_NOT_SUPPORTED; a refused request too;
- nothing is stored in any of these cases.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.client import Message, Producer
from txmq.errors import ResponseCode
from txmq.protocol import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Command,
    FrameDecoder,
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    RequestCode,
    SendMessageRequestHeaderV2,
    encode_command,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerProcess, run_broker

pytestmark = pytest.mark.slow

KINDS = [SERIALIZE_JSON, SERIALIZE_ROCKETMQ]
KIND_IDS = ["json", "rocketmq"]
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DELAY_ABC = "DELAY\u0001abc\u0002"
BAD_V2 = "bad SendMessageRequestHeaderV2"


def _frame(kind: int, header: bytes, length: int | None = None) -> bytes:
    total = 4 + len(header) if length is None else length
    return struct.pack(">II", total, kind << 24 | len(header)) + header


def _binary(ext: bytes = b"", remark: bytes = b"") -> bytes:
    """A ROCKETMQ header: SEND_MESSAGE_V2, JAVA, version 1, opaque 1, flag 0 (RocketMQ
    ``RocketMQSerializable``)."""
    return struct.pack(">hBhiii", 310, 0, 1, 1, 0, len(remark)) + remark + struct.pack(">i", len(ext)) + ext


BAD_FRAMES = {
    "json-60000-nested-levels": _frame(0, b'{"code":310,"extFields":' + b"[" * 60_000 + b"]" * 60_000 + b"}"),
    "json-invalid-utf8": _frame(0, b'{"code":310,"remark":"\xff\xfe"}'),
    "json-not-json": _frame(0, b"\x96\n\x01\x00\x01\xa0"),  # txmq's old msgpack dialect
    "json-code-not-a-number": _frame(0, b'{"code":"310"}'),
    "rocketmq-truncated": _frame(1, _binary(b"\x00\x01k\x00\x00\x00\x05va")),
    "rocketmq-invalid-utf8": _frame(1, _binary(b"\x00\x01\xff\x00\x00\x00\x01v")),
    "rocketmq-negative-remark": _frame(1, struct.pack(">hBhiii", 310, 0, 1, 1, 0, -1) + bytes(4)),
    "unknown-serialize-type": _frame(2, b"{}"),
    "header-longer-than-frame": struct.pack(">II", 12, 0 << 24 | 200) + bytes(8),
}


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


def _ask(s: socket.socket, cmd: Command) -> Command:
    s.sendall(encode_command(cmd))
    [reply] = _replies(s, 1)
    assert (reply.opaque, reply.serialize_type, reply.is_response) == (cmd.opaque, cmd.serialize_type, True)
    return reply


def _max_offset(port: int, kind: int) -> int:
    ext = to_ext(GetMaxOffsetRequestHeader(topic="t", queue_id=0))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        r = _ask(s, Command(RequestCode.GET_MAX_OFFSET, 99, ext=ext, serialize_type=kind))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return from_ext(r.ext, OffsetResponseHeader).offset


def _send_ext(**fields: str) -> dict[str, str]:
    ext = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic="t", queue_id=0, born_timestamp=1))
    ext.update(fields)
    return {k: v for k, v in ext.items() if v != "<drop>"}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_a_malformed_frame_closes_its_connection_without_a_traceback(broker: BrokerProcess,
                                                                     name: str) -> None:
    kind = SERIALIZE_ROCKETMQ if name.startswith("rocketmq") else SERIALIZE_JSON
    before = _max_offset(broker.port, kind)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as other, \
            socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        data = b""
        try:  # the broker closes the connection (a last word allowed); a frame it refuses from
            s.sendall(BAD_FRAMES[name])  # its prefix is closed while the rest is still on its
            while chunk := s.recv(65536):  # way, which the peer sees as a reset
                data += chunk
        except ConnectionResetError:
            pass
        assert all(r.code == ResponseCode.SYSTEM_ERROR for r in FrameDecoder().feed(data))
        assert _max_offset(broker.port, kind) == before  # nothing stored
        ok = _ask(other, Command(RequestCode.SEND_MESSAGE_V2, 7, ext=_send_ext(), body=b"y",
                                 serialize_type=kind))
        assert ok.code == ResponseCode.SUCCESS, ok.remark
    log = Path(broker.log_path).read_text()
    assert "Traceback" not in log and "RecursionError" not in log.replace("MalformedFrame", "")


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_header_errors_get_rocketmqs_answers_and_keep_the_connection(broker: BrokerProcess,
                                                                     kind: int) -> None:
    pull = to_ext(PullMessageRequestHeader(consumer_group="cg", topic="t", queue_id=0, queue_offset=0,
                                           max_msg_nums=1))
    del pull["queueId"]
    cases = [  # (code, ext, answer, remark)
        (RequestCode.SEND_MESSAGE_V2, _send_ext(b="<drop>"), ResponseCode.SYSTEM_ERROR,
         "the custom field <b> is null"),
        (RequestCode.SEND_MESSAGE_V2, _send_ext(e="abc"), ResponseCode.SYSTEM_ERROR, BAD_V2),
        (RequestCode.SEND_MESSAGE_V2, _send_ext(g="1.5"), ResponseCode.SYSTEM_ERROR, BAD_V2),
        (RequestCode.PULL_MESSAGE, pull, ResponseCode.SYSTEM_ERROR, "the custom field <queueId> is null"),
        (RequestCode.END_TRANSACTION, {"tranStateTableOffset": "0"}, ResponseCode.SYSTEM_ERROR,
         "the custom field <"),
        (9999, {}, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "request code 9999 not supported"),
        (RequestCode.SEND_MESSAGE_V2, _send_ext(b="."), ResponseCode.MESSAGE_ILLEGAL, ""),
        (RequestCode.SEND_MESSAGE_V2, _send_ext(b=OP), ResponseCode.NO_PERMISSION, ""),
        (RequestCode.SEND_MESSAGE_V2, _send_ext(i=DELAY_ABC), ResponseCode.INVALID_PARAMETER, ""),
    ]
    before = _max_offset(broker.port, kind)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        for i, (code, ext, answer, remark) in enumerate(cases, start=1):
            r = _ask(s, Command(code, i, ext=ext, body=b"z", serialize_type=kind))
            assert (r.code, (r.remark or "").startswith(remark)) == (answer, True), (code, r.remark)
        assert _max_offset(broker.port, kind) == before  # nothing stored
        good = _ask(s, Command(RequestCode.SEND_MESSAGE_V2, 100, ext=_send_ext(), body=b"z",
                               serialize_type=kind))
        assert good.code == ResponseCode.SUCCESS  # the same connection, still usable
    assert _max_offset(broker.port, kind) == before + 1


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_pipelined_refused_requests_are_answered_by_opaque(broker: BrokerProcess, kind: int) -> None:
    """Sends that arrive together go through ``Broker.handle_sends`` (one append): each still gets
    its own answer (matched by opaque; an error may overtake a success waiting for its flush)."""
    exts = [_send_ext(b="."), _send_ext(b=OP), _send_ext(e="x"), _send_ext(),
            _send_ext(b="<drop>"), _send_ext()]
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(_pipelined(exts, kind))
        codes = {r.opaque: r.code for r in _replies(s, len(exts))}
    assert codes == {1: ResponseCode.MESSAGE_ILLEGAL, 2: ResponseCode.NO_PERMISSION,
                     3: ResponseCode.SYSTEM_ERROR, 4: ResponseCode.SUCCESS, 5: ResponseCode.SYSTEM_ERROR,
                     6: ResponseCode.SUCCESS}


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_a_pipelined_send_with_an_unparsable_delay_is_refused_alone(broker: BrokerProcess,
                                                                    kind: int) -> None:
    exts = [_send_ext(i=DELAY_ABC), _send_ext()]
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(_pipelined(exts, kind))
        codes = {r.opaque: r.code for r in _replies(s, len(exts))}
    assert codes == {1: ResponseCode.INVALID_PARAMETER, 2: ResponseCode.SUCCESS}


def _pipelined(exts: list[dict[str, str]], kind: int) -> bytes:
    return b"".join(encode_command(Command(RequestCode.SEND_MESSAGE_V2, i, ext=e, body=b"z",
                                           serialize_type=kind)) for i, e in enumerate(exts, start=1))


def test_the_sdk_is_served_after_the_hostile_connections(broker: BrokerProcess) -> None:
    with Producer("p", broker.endpoints) as p:
        assert p.send(Message(topic="t", body=b"still serving")).queue_offset >= 0
