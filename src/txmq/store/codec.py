"""The store's binary record and checkpoint codecs, public for tools that read raw bytes
(``txmq fuzz``, repair tools): see :mod:`txmq.store._codec` for the layouts."""

from txmq.store._codec import (
    RECORD_MAGICS,
    RECORD_SIZE_MAX,
    RECORD_SIZE_MIN,
    Checkpoint,
    check_record,
    decode_checkpoint,
    decode_message,
    decode_record,
    encode_checkpoint,
    encode_record,
    place_record,
    seal,
    unseal,
)

__all__ = [
    "RECORD_MAGICS",
    "RECORD_SIZE_MAX",
    "RECORD_SIZE_MIN",
    "Checkpoint",
    "check_record",
    "decode_checkpoint",
    "decode_message",
    "decode_record",
    "encode_checkpoint",
    "encode_record",
    "place_record",
    "seal",
    "unseal",
]
