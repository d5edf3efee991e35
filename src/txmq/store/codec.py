"""The store's binary record and checkpoint codecs, public for tools that read raw bytes
(``txmq fuzz``, repair tools): see :mod:`txmq.store._codec` for the layouts."""

from txmq.store._codec import (
    RECORD_HEAD,
    RECORD_HEAD_SIZE,
    RECORD_MAGIC,
    Checkpoint,
    decode_checkpoint,
    decode_message,
    decode_record,
    encode_checkpoint,
    encode_record,
    host_bytes,
    seal,
    unseal,
)

__all__ = [
    "RECORD_HEAD",
    "RECORD_HEAD_SIZE",
    "RECORD_MAGIC",
    "Checkpoint",
    "decode_checkpoint",
    "decode_message",
    "decode_record",
    "encode_checkpoint",
    "encode_record",
    "host_bytes",
    "seal",
    "unseal",
]
