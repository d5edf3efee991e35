"""Regressions for what ``txmq fuzz`` found in decoders: a str that is not UTF-8 (msgspec and
``bytes.decode`` raise UnicodeDecodeError, which once escaped the documented error types and made
the broker answer SYSTEM_ERROR "UnicodeDecodeError: ..."), here for every decoder of RocketMQ's
remoting protocol: both frame header codecs, JSON bodies, MessageExt records, batch bodies, store
checkpoints; and what the broker answers such bodies."""

from __future__ import annotations

import pytest

from txmq.errors import CorruptRecord, MalformedFrame, MalformedHeader, MalformedMessage, ResponseCode
from txmq.protocol import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    Command,
    FrameDecoder,
    HeartbeatData,
    LockBatchRequestBody,
    Message,
    MessageExt,
    RequestCode,
    SendMessageRequestHeaderV2,
    decode_batch,
    decode_body,
    decode_message_ext,
    decode_message_exts,
    encode_batch,
    encode_body,
    encode_command,
    encode_message_ext,
    to_ext,
)
from txmq.store.codec import Checkpoint, decode_checkpoint, encode_checkpoint
from txmq.testing import BrokerHarness

BAD = b"\xff\xfe"


def _with_bad_utf8(encoded: bytes, good: bytes) -> bytes:
    assert good in encoded
    return encoded.replace(good, BAD)


@pytest.mark.parametrize("kind", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ])
@pytest.mark.parametrize("where", ["ext key", "ext value", "remark"])
def test_a_header_with_invalid_utf8_is_a_malformed_frame(kind: int, where: str) -> None:
    cmd = Command(10, 1, remark="rr" if where == "remark" else None, serialize_type=kind,
                  ext={"kk": "v"} if where == "ext key" else {"k": "vv"})
    good = {"ext key": b"kk", "ext value": b"vv", "remark": b"rr"}[where]
    frame = _with_bad_utf8(encode_command(cmd), good)
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(frame)


def test_message_ext_and_batch_with_invalid_utf8_are_malformed_messages() -> None:
    ext = _with_bad_utf8(encode_message_ext(MessageExt(topic="tt", body=b"")), b"tt")
    with pytest.raises(MalformedMessage):
        decode_message_ext(ext)
    with pytest.raises(MalformedMessage):
        decode_message_exts(ext + ext)
    props = _with_bad_utf8(encode_message_ext(MessageExt(topic="t", body=b"", keys="kk")), b"kk")
    with pytest.raises(MalformedMessage):
        decode_message_ext(props)
    batch = _with_bad_utf8(encode_batch([Message(topic="t", body=b"", tags="cc")]), b"cc")
    with pytest.raises(MalformedMessage):
        decode_batch(batch, topic="t")


def test_decode_body_raises_malformed_header_on_invalid_utf8() -> None:
    data = _with_bad_utf8(encode_body(HeartbeatData(client_id="cc")), b"cc")
    with pytest.raises(MalformedHeader, match="bad HeartbeatData body"):
        decode_body(data, HeartbeatData)


def test_decode_checkpoint_raises_corrupt_record_on_invalid_utf8() -> None:
    import crc32c

    good = encode_checkpoint(Checkpoint(dispatched=1, last_record=0, queues=[("tt", 0, 0, 1)],
                                        index_files=[]))
    payload = _with_bad_utf8(good[12:], b"tt")
    data = good[:4] + crc32c.crc32c(payload).to_bytes(4, "big") + good[8:12] + payload
    with pytest.raises(CorruptRecord):
        decode_checkpoint(data)


_SEND_BATCH = to_ext(SendMessageRequestHeaderV2(producer_group="pg", topic="t", queue_id=0,
                                                born_timestamp=1, batch=True))
# code -> (ext, body with "cc" to spoil, answer): RocketMQ answers a body its processor cannot
# decode SYSTEM_ERROR (NettyRemotingAbstract); txmq's own requests INVALID_PARAMETER; a batch
# body MESSAGE_ILLEGAL
BODIES = {
    RequestCode.HEART_BEAT: ({}, encode_body(HeartbeatData(client_id="cc")), ResponseCode.SYSTEM_ERROR),
    RequestCode.LOCK_BATCH_MQ: ({}, encode_body(LockBatchRequestBody(
        consumer_group="cc", client_id="c", mq_set=[])), ResponseCode.SYSTEM_ERROR),
    RequestCode.END_TRANSACTION_BATCH: ({}, encode_body([{"cc": "cc"}]), ResponseCode.INVALID_PARAMETER),
    RequestCode.COMMIT_SINK_BATCH: ({"batch": "s/1", "producerGroup": "pg"}, encode_body({"cc": 1}),
                                    ResponseCode.INVALID_PARAMETER),
    RequestCode.SEND_BATCH_MESSAGE: (_SEND_BATCH, encode_batch([Message(topic="t", body=b"", tags="cc")]),
                                     ResponseCode.MESSAGE_ILLEGAL),
}


@pytest.mark.parametrize("code", sorted(BODIES))
def test_a_body_with_invalid_utf8_gets_a_documented_answer(code: RequestCode) -> None:
    """Was SYSTEM_ERROR "UnicodeDecodeError: ...": now a remark naming the body, nothing stored."""
    ext, body, answer = BODIES[code]
    h = BrokerHarness()
    end = h.store.write_offset
    r = h.request(1, code, ext, _with_bad_utf8(body, b"cc"))
    assert (r.code, "UnicodeDecodeError" in (r.remark or "")) == (answer, False), r.remark
    assert "utf-8" in (r.remark or "") and h.store.write_offset == end
