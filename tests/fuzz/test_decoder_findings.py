"""Regressions for what ``txmq fuzz`` found in decoders no other part of issue 11 changes: msgspec
raises UnicodeDecodeError (not DecodeError) for a str that is not UTF-8, which escaped the
documented error types of these decoders, and made the broker answer SYSTEM_ERROR to such bodies."""

from __future__ import annotations

import msgspec
import pytest

from txmq.errors import CorruptRecord, MalformedFrame, ResponseCode
from txmq.protocol import (
    HeartbeatData,
    Message,
    MessageExt,
    RequestCode,
    decode_body,
    decode_message_ext_msgpack,
    decode_messages,
)
from txmq.store.codec import Checkpoint, decode_checkpoint, encode_checkpoint
from txmq.testing import BrokerHarness

BAD = b"\xff\xfe"


def _with_bad_utf8(encoded: bytes, good: bytes) -> bytes:
    assert good in encoded
    return encoded.replace(good, BAD)


def test_decode_messages_raises_decode_error_on_invalid_utf8() -> None:
    data = _with_bad_utf8(msgspec.msgpack.encode([MessageExt(topic="tt", body=b"")]), b"tt")
    for ext in (True, False):
        with pytest.raises(msgspec.DecodeError):
            decode_messages(data, ext=ext)
    one = _with_bad_utf8(msgspec.msgpack.encode(Message(topic="tt", body=b"")), b"tt")
    with pytest.raises(msgspec.DecodeError):
        decode_message_ext_msgpack(one)


def test_decode_body_raises_malformed_frame_on_invalid_utf8() -> None:
    data = _with_bad_utf8(msgspec.msgpack.encode(HeartbeatData(client_id="cc")), b"cc")
    with pytest.raises(MalformedFrame):
        decode_body(data, HeartbeatData)


def test_decode_checkpoint_raises_corrupt_record_on_invalid_utf8() -> None:
    import crc32c

    good = encode_checkpoint(Checkpoint(dispatched=1, last_record=0, queues=[("tt", 0, 0, 1)],
                                        index_files=[]))
    payload = _with_bad_utf8(good[12:], b"tt")
    data = good[:4] + crc32c.crc32c(payload).to_bytes(4, "big") + good[8:12] + payload
    with pytest.raises(CorruptRecord):
        decode_checkpoint(data)


@pytest.mark.parametrize("code", [RequestCode.HEART_BEAT, RequestCode.END_TRANSACTION_BATCH,
                                  RequestCode.COMMIT_SINK_BATCH, RequestCode.SEND_BATCH_MESSAGE])
def test_a_body_with_invalid_utf8_gets_malformed_request(code: RequestCode) -> None:
    """Was SYSTEM_ERROR ("UnicodeDecodeError: ..."): every unparsable body is a malformed request."""
    h = BrokerHarness()
    body = msgspec.msgpack.encode([{"cc": "cc"}]) if code != RequestCode.HEART_BEAT else \
        msgspec.msgpack.encode(HeartbeatData(client_id="cc"))
    if code == RequestCode.COMMIT_SINK_BATCH:
        body = msgspec.msgpack.encode({"cc": 1})
    if code == RequestCode.SEND_BATCH_MESSAGE:
        body = msgspec.msgpack.encode([Message(topic="cc", body=b"")])
    ext = {"producer_group": "pg", "topic": "t", "batch": "b"}
    r = h.request(1, code, ext, _with_bad_utf8(body, b"cc"))
    assert r.code == ResponseCode.INVALID_PARAMETER, r.remark
