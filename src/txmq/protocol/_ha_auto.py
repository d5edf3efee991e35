"""The handshake of RocketMQ 5's AutoSwitch HA protocol (controller mode, issue #26), sans-IO.

In controller mode a slave opens its HA connection (after the ACL challenge and hello, when ACL
is on) with a handshake (RocketMQ ``AutoSwitchHAClient``, ``HAConnectionState.HANDSHAKE`` = 1),
and the master answers with its end, its master epoch and its epoch entries
(``AutoSwitchHAConnection``). The slave truncates its log to the consistent point of the two epoch
files, then reports and receives as in :mod:`txmq.protocol._ha`. Big-endian::

    slave -> master: handshake (HA_AUTO_SLAVE_HANDSHAKE, 16 bytes)    struct ">ihhq"
    +-----------+--------------------+-----------------+---------------------+
    | state i32 | isSyncFromLastFile | isAsyncLearner  | slaveBrokerId  i64  |
    | = 1       | i16                | i16             |                     |
    +-----------+--------------------+-----------------+---------------------+
      0           4                    6                 8                    16

    master -> slave: handshake reply (HA_AUTO_MASTER_HANDSHAKE, 20 bytes + body)  struct ">iiqi"
    +-----------+--------------+----------------------+----------------+----------------------+
    | state i32 | bodySize i32 | maxOffset  i64       | masterEpoch i32| bodySize bytes:      |
    | = 1       |              |                      |                | epoch entries        |
    +-----------+--------------+----------------------+----------------+----------------------+
      0           4              8                      16               20
    each entry (HA_AUTO_EPOCH_ENTRY, 12 bytes, oldest first)          struct ">iq"
    +-------------+----------------------+
    | epoch i32   | startOffset i64      |
    +-------------+----------------------+

txmq's transfer frames stay those of :mod:`txmq.protocol._ha` (RocketMQ adds epoch, epoch start
and confirm offset to each; docs/replication.md "Controller mode" says what is not built).
"""

from __future__ import annotations

import struct

import msgspec

from txmq.errors import HaProtocolError

__all__ = [
    "HA_AUTO_EPOCH_ENTRIES_MAX",
    "HA_AUTO_EPOCH_ENTRY",
    "HA_AUTO_MASTER_HANDSHAKE",
    "HA_AUTO_SLAVE_HANDSHAKE",
    "HA_STATE_HANDSHAKE",
    "AutoHandshake",
    "decode_master_handshake_body",
    "decode_master_handshake_head",
    "decode_slave_handshake",
    "encode_master_handshake",
    "encode_slave_handshake",
]

HA_STATE_HANDSHAKE = 1
"""RocketMQ ``HAConnectionState.HANDSHAKE`` (ordinal: READY 0, HANDSHAKE 1, TRANSFER 2)."""
HA_AUTO_SLAVE_HANDSHAKE = struct.Struct(">ihhq")
HA_AUTO_MASTER_HANDSHAKE = struct.Struct(">iiqi")
HA_AUTO_EPOCH_ENTRY = struct.Struct(">iq")
HA_AUTO_EPOCH_ENTRIES_MAX = 4096
"""Most epoch entries a handshake reply may carry (txmq: one per election; 48 KiB)."""


class AutoHandshake(msgspec.Struct, frozen=True):
    """The master's handshake reply: its log end, master epoch and epoch entries."""

    max_offset: int
    master_epoch: int
    entries: list[tuple[int, int]]


def encode_slave_handshake(slave_broker_id: int) -> bytes:
    return HA_AUTO_SLAVE_HANDSHAKE.pack(HA_STATE_HANDSHAKE, 0, 0, slave_broker_id)


def decode_slave_handshake(data: bytes) -> int:
    """The slave broker id of a 16-byte handshake. Raises HaProtocolError."""
    state, _, _, broker_id = HA_AUTO_SLAVE_HANDSHAKE.unpack(data)
    if state != HA_STATE_HANDSHAKE or broker_id <= 0:
        raise HaProtocolError(f"HA handshake: state {state}, slave broker id {broker_id}")
    return int(broker_id)


def encode_master_handshake(hs: AutoHandshake) -> bytes:
    body = b"".join(HA_AUTO_EPOCH_ENTRY.pack(e, s) for e, s in hs.entries)
    return HA_AUTO_MASTER_HANDSHAKE.pack(HA_STATE_HANDSHAKE, len(body), hs.max_offset,
                                         hs.master_epoch) + body


def decode_master_handshake_head(data: bytes) -> tuple[int, int, int]:
    """(bodySize, maxOffset, masterEpoch) of the 20-byte head. Raises HaProtocolError: wrong
    state, a body that is not whole entries or above HA_AUTO_EPOCH_ENTRIES_MAX, negatives."""
    state, size, max_offset, epoch = HA_AUTO_MASTER_HANDSHAKE.unpack(data)
    if state != HA_STATE_HANDSHAKE or size < 0 or size % HA_AUTO_EPOCH_ENTRY.size \
            or size > HA_AUTO_EPOCH_ENTRIES_MAX * HA_AUTO_EPOCH_ENTRY.size \
            or max_offset < 0 or epoch < 0:
        raise HaProtocolError(f"HA handshake reply: state {state}, body {size}, max offset "
                              f"{max_offset}, epoch {epoch}")
    return size, max_offset, epoch


def decode_master_handshake_body(body: bytes) -> list[tuple[int, int]]:
    """The epoch entries of a reply's body. Raises HaProtocolError for a negative one."""
    out = [(int(e), int(s)) for e, s in HA_AUTO_EPOCH_ENTRY.iter_unpack(body)]
    if any(e < 0 or s < 0 for e, s in out):
        raise HaProtocolError("HA handshake reply: a negative epoch entry")
    return out
