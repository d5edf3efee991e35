"""The stored record's CRC property (RocketMQ 5 ``enabledAppendPropCRC``) and the SDK hiding it."""

from __future__ import annotations

import zlib

from txmq.protocol import (
    CRC32_RESERVED_LEN,
    MessageExt,
    decode_message_ext,
    decode_message_exts,
    encode_message_ext,
    encode_message_ext_reserved,
    fill_prop_crc,
    prop_crc,
)
from txmq.spark._arrow import pull_body_to_record_batch


def _msg(i: int) -> MessageExt:
    return MessageExt(topic="t", body=b"b%d" % i, tags="tg", keys="k", properties={"UNIQ_KEY": f"u{i}"},
                      queue_id=0, queue_offset=i, store_host="127.0.0.1:10911",
                      born_host="127.0.0.1:1")


def test_the_reserve_is_counted_and_filled_in_rocketmqs_digit_order() -> None:
    plain = encode_message_ext(_msg(1))
    buf = encode_message_ext_reserved(_msg(1))
    assert len(buf) == len(plain) + CRC32_RESERVED_LEN and buf.endswith(bytes(CRC32_RESERVED_LEN))
    assert prop_crc(buf, 0, len(buf)) is None  # not filled in yet
    fill_prop_crc(buf, 0, len(buf))
    crc = zlib.crc32(bytes(buf[:-CRC32_RESERVED_LEN])) & 0x7FFFFFFF
    assert prop_crc(buf, 0, len(buf)) == (crc, crc)
    # MessageDecoder.createCrc32 writes crc % 10 first; CommitLog reads the digits back reversed
    digits = bytes(buf[-11:-1]).decode()
    assert int(digits[::-1]) == crc and len(digits) == 10


def test_sdk_decoders_hide_the_crc_property() -> None:
    records = []
    for i in range(3):
        buf = encode_message_ext_reserved(_msg(i))
        fill_prop_crc(buf, 0, len(buf))
        records.append(bytes(buf))
    body = b"".join(records)
    assert all("__CRC32#" not in m.properties for m in decode_message_exts(body))
    assert decode_message_ext(records[0]).properties == {"UNIQ_KEY": "u0"}
    batch = pull_body_to_record_batch(body)
    assert batch.batch.column("properties").to_pylist()[0] == [("UNIQ_KEY", "u0")]
    assert batch.batch.column("tags").to_pylist() == ["tg"] * 3
