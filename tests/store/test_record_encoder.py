"""The store's one-pass record encoder (``encode_record`` + ``place_record``) writes exactly the
bytes of the protocol's MessageExt encoder with the CRC reserve (``encode_message_ext_reserved`` +
``fill_prop_crc``) for the same message, and refuses what does not fit the layout."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    MessageExt,
    encode_message_ext_reserved,
    fill_prop_crc,
    reset_transaction_type,
    transaction_type,
)
from txmq.store import Record
from txmq.store.codec import check_record, encode_record, place_record

HOSTS = ["", "10.0.0.2:4567", "[::1]:10911", "[2001:db8::7]:1", "[::ffff:10.1.2.3]:9",
         "not-a-host", "10.0.0.1:99999", "example.com:80"]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
               max_size=12)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def _protocol_bytes(rec: Record, store_host: str, offset: int) -> bytes:
    """The same record through the protocol's MessageExt encoder (what the store used before)."""
    props = {k: v for k, v in rec.properties.items() if k != "__CRC32#"}
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        tx = TRANSACTION_NOT_TYPE
    elif PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET in props:
        tx = TRANSACTION_COMMIT_TYPE
    else:
        tx = transaction_type(rec.sys_flag)

    def wire(host: str) -> str:
        return host if host in HOSTS[:5] else ""

    msg = MessageExt(topic=rec.topic, body=rec.body, tags=rec.tags, keys=rec.keys, properties=props,
                     flag=rec.flag, queue_id=rec.queue_id, queue_offset=rec.queue_offset,
                     commit_log_offset=offset, born_timestamp_ms=rec.born_timestamp_ms,
                     store_timestamp_ms=rec.store_timestamp_ms, reconsume_times=rec.reconsume_times,
                     born_host=wire(rec.born_host), store_host=wire(store_host),
                     sys_flag=reset_transaction_type(rec.sys_flag, tx),
                     prepared_transaction_offset=rec.prepared_transaction_offset)
    buf = encode_message_ext_reserved(msg)
    fill_prop_crc(buf, 0, len(buf))
    return bytes(buf)


def _store_bytes(rec: Record, store_host: str, offset: int) -> bytes:
    buf = encode_record(rec, store_host)
    place_record(buf, 0, len(buf), offset)
    return bytes(buf)


@st.composite
def records(draw: st.DrawFn) -> Record:
    props = draw(st.dictionaries(TEXT.filter(bool), TEXT, max_size=4))
    extra = draw(st.sampled_from([{}, {"TRAN_MSG": "true"}, {"TRAN_PREPARED_QUEUE_OFFSET": "3"},
                                  {"__CRC32#": "0123456789"}, {"TRAN_MSG": "false", "WAIT": ""}]))
    return Record(topic=draw(st.sampled_from(["t", "orders", "T" * 127, "T" * 128, "ü" * 70,
                                              "%RETRY%g"])),
                  queue_id=draw(INT32), body=draw(st.binary(max_size=300)), tags=draw(TEXT),
                  keys=draw(TEXT), properties={**props, **extra}, flag=draw(INT32),
                  queue_offset=draw(INT64), born_timestamp_ms=draw(INT64),
                  store_timestamp_ms=draw(INT64), reconsume_times=draw(INT32),
                  born_host=draw(st.sampled_from(HOSTS)), sys_flag=draw(st.integers(0, 2**10 - 1)),
                  prepared_transaction_offset=draw(INT64))


@settings(max_examples=300, deadline=None)
@given(records(), st.sampled_from(HOSTS), st.integers(0, 2**40))
def test_the_store_encoder_writes_the_protocol_encoders_bytes(rec: Record, host: str,
                                                              offset: int) -> None:
    data = _store_bytes(rec, host, offset)
    assert data == _protocol_bytes(rec, host, offset)
    assert check_record(data, 0, offset) == len(data)


def test_a_record_placed_inside_a_larger_buffer_gets_the_same_bytes() -> None:
    rec = Record(topic="t", queue_id=0, body=b"b" * 100, properties={"UNIQ_KEY": "u"})
    alone = _store_bytes(rec, "10.0.0.1:10911", 4096)
    buf = bytearray(b"x" * 10) + encode_record(rec, "10.0.0.1:10911") + bytearray(b"y" * 5)
    place_record(buf, 10, len(alone), 4096)
    assert bytes(buf[10:-5]) == alone and buf[:10] == b"x" * 10 and buf[-5:] == b"y" * 5


def test_a_large_record_gets_the_same_bytes() -> None:  # place_record CRCs a view past 64 KiB
    rec = Record(topic="t", queue_id=0, body=bytes(range(256)) * 1024, keys="k")
    assert _store_bytes(rec, "", 77) == _protocol_bytes(rec, "", 77)


@pytest.mark.parametrize(("change", "message"), [
    ({"topic": "T" * 32_768}, "topic of 32768 bytes"),
    ({"topic": "\ud800"}, "encode"),
    ({"properties": {"a\x01": "b"}}, "separators"),
    ({"properties": {"": "b"}}, "names must be non-empty"),
    ({"tags": "x\x02y"}, "separators"),
    ({"properties": {"big": "v" * 32_760}}, "exceed 32767"),
    ({"queue_id": 2**31}, "out of range"),
    ({"born_timestamp_ms": 2**63}, "out of range"),
])
def test_what_does_not_fit_the_layout_is_a_value_error(change: dict[str, object],
                                                       message: str) -> None:
    fields: dict[str, object] = {"topic": "t", "queue_id": 0, "body": b"x", **change}
    with pytest.raises(ValueError, match=message):
        encode_record(Record(**fields), "")  # type: ignore[arg-type]
