"""RocketMQ's HA (master-slave replication) wire protocol as a sans-IO codec.

One TCP connection per slave; the slave connects to the master's ``ha_listen_port``. All integers
are big-endian (``java.nio.ByteBuffer``'s default). Layout of RocketMQ 4.9.7 ``HAService`` /
``HAConnection`` and 5.x ``DefaultHAClient`` / ``DefaultHAConnection`` (default mode, no handshake)::

    slave -> master: report (REPORT_HEADER_SIZE = 8)           struct ">q"
    +-----------------------------------------+
    | slaveMaxOffset  i64                     |   the end of the slave's commit log
    +-----------------------------------------+
      0                                       8

    master -> slave: transfer (TRANSFER_HEADER_SIZE = 12)      struct ">qi"
    +-----------------------------------------+------------------+-----------------------+
    | phyOffset  i64                          | bodySize  i32    | bodySize bytes        |
    +-----------------------------------------+------------------+-----------------------+
      0                                       8                 12            12 + bodySize
    raw commit-log bytes [phyOffset, phyOffset + bodySize); bodySize 0 is a heartbeat.

The master sends at most ``limits.HA_TRANSFER_BATCH_BYTES`` (RocketMQ ``haTransferBatchSize``)
per frame, contiguous from the slave's reported offset. A frame's bytes need not end on a record
boundary: the slave joins them (:class:`txmq.broker.ha.SlaveCore`).

Decoders raise :class:`~txmq.errors.HaProtocolError` on bad input: a negative offset or size, a
size above the batch limit, an offset that does not continue the stream (RocketMQ's slave logs
"master pushed offset not equal the max phy offset in slave" and drops the connection), or more
than ``limits.HA_READ_BUFFER_BYTES`` undecoded.
"""

from __future__ import annotations

import struct

import msgspec

from txmq import limits
from txmq.errors import HaProtocolError

__all__ = [
    "HA_REPORT",
    "HA_TRANSFER_HEADER",
    "HaHeartbeat",
    "HaTransfer",
    "ReportDecoder",
    "TransferDecoder",
    "encode_heartbeat",
    "encode_report",
    "encode_transfer",
]

HA_REPORT = struct.Struct(">q")
"""The slave's report: its max commit-log offset (RocketMQ ``REPORT_HEADER_SIZE`` = 8)."""

HA_TRANSFER_HEADER = struct.Struct(">qi")
"""A transfer frame's header: physical offset, body size (RocketMQ ``TRANSFER_HEADER_SIZE`` = 12)."""

_OFFSET_MAX = 2**63 - 1


class HaTransfer(msgspec.Struct, frozen=True):
    """Commit-log bytes ``data`` that belong at physical offset ``offset``."""

    offset: int
    data: bytes


class HaHeartbeat(msgspec.Struct, frozen=True):
    """An empty transfer frame: the master is alive, and its next transfer starts at ``offset``."""

    offset: int


def encode_report(max_offset: int) -> bytes:
    """The 8-byte report of a slave whose commit log ends at ``max_offset``.

    Raises:
        HaProtocolError: ``max_offset`` is negative or does not fit an i64.
    """
    if not 0 <= max_offset <= _OFFSET_MAX:
        raise HaProtocolError(f"HA report offset {max_offset} out of range")
    return HA_REPORT.pack(max_offset)


def encode_transfer(offset: int, data: bytes | memoryview) -> bytes:
    """A transfer frame carrying ``data`` (at most ``limits.HA_TRANSFER_BATCH_BYTES``) that
    belongs at commit-log offset ``offset``.

    Raises:
        HaProtocolError: a negative offset, or ``data`` larger than the batch limit.
    """
    if not 0 <= offset <= _OFFSET_MAX - len(data):
        raise HaProtocolError(f"HA transfer offset {offset} out of range")
    if len(data) > limits.HA_TRANSFER_BATCH_BYTES:
        raise HaProtocolError(f"HA transfer of {len(data)} bytes is above "
                              f"HA_TRANSFER_BATCH_BYTES {limits.HA_TRANSFER_BATCH_BYTES}")
    return HA_TRANSFER_HEADER.pack(offset, len(data)) + bytes(data)


def encode_heartbeat(offset: int) -> bytes:
    """An empty transfer frame (RocketMQ's heartbeat, sent after ``haSendHeartbeatInterval``).
    Raises HaProtocolError for a negative offset."""
    return encode_transfer(offset, b"")


class _Buffer:
    """Undecoded bytes, bounded by ``limits.HA_READ_BUFFER_BYTES``."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0

    def add(self, data: bytes | memoryview) -> None:
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        if len(self.buf) + len(data) > limits.HA_READ_BUFFER_BYTES:
            raise HaProtocolError(f"more than HA_READ_BUFFER_BYTES "
                                  f"({limits.HA_READ_BUFFER_BYTES}) undecoded HA bytes")
        self.buf += data

    @property
    def available(self) -> int:
        return len(self.buf) - self.pos


class ReportDecoder:
    """The master's side: bytes from a slave in, its reported offsets out.

    Offsets never go backwards on one connection (a slave never truncates in default mode); the
    caller acts on the last one, like RocketMQ's ``ReadSocketService``.
    """

    def __init__(self) -> None:
        self._b = _Buffer()
        self.last = -1
        """The last offset reported (-1: none yet)."""

    def feed(self, data: bytes | memoryview) -> list[int]:
        """The complete reports in what arrived so far (partial ones wait for more bytes).

        Raises:
            HaProtocolError: a negative offset, one below the previous report, or too many
                undecoded bytes.
        """
        b = self._b
        b.add(data)
        out: list[int] = []
        while b.available >= HA_REPORT.size:
            (offset,) = HA_REPORT.unpack_from(b.buf, b.pos)
            b.pos += HA_REPORT.size
            if offset < 0 or offset < self.last:
                raise HaProtocolError(f"slave reported offset {offset} after {self.last}")
            self.last = offset
            out.append(offset)
        return out


class TransferDecoder:
    """The slave's side: bytes from the master in, :class:`HaTransfer` / :class:`HaHeartbeat`
    events out.

    Args:
        expected: the offset the first frame must carry (the slave's reported max offset); each
            transfer moves it on by its size.
    """

    def __init__(self, expected: int) -> None:
        if expected < 0:
            raise HaProtocolError(f"HA stream cannot start at offset {expected}")
        self._b = _Buffer()
        self.expected = expected

    def feed(self, data: bytes | memoryview) -> list[HaTransfer | HaHeartbeat]:
        """The complete frames in what arrived so far (a partial frame waits for more bytes).

        Raises:
            HaProtocolError: a negative size, a size above ``limits.HA_TRANSFER_BATCH_BYTES``, an
                offset other than :attr:`expected`, or too many undecoded bytes.
        """
        b = self._b
        b.add(data)
        out: list[HaTransfer | HaHeartbeat] = []
        while b.available >= HA_TRANSFER_HEADER.size:
            offset, size = HA_TRANSFER_HEADER.unpack_from(b.buf, b.pos)
            if not 0 <= size <= limits.HA_TRANSFER_BATCH_BYTES:
                raise HaProtocolError(f"HA transfer size {size} not in "
                                      f"0..{limits.HA_TRANSFER_BATCH_BYTES}")
            if offset != self.expected:
                raise HaProtocolError(f"master pushed offset {offset}, the slave expects "
                                      f"{self.expected}")
            end = b.pos + HA_TRANSFER_HEADER.size + size
            if len(b.buf) < end:
                break
            if size:
                out.append(HaTransfer(offset, bytes(b.buf[end - size : end])))
                self.expected += size
            else:
                out.append(HaHeartbeat(offset))
            b.pos = end
        return out
