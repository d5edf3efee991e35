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

When ACL is on (txmq's improvement: RocketMQ's link has no handshake, so any TCP peer can report a
fake offset and make a SYNC_MASTER acknowledge early, RocketMQ issue #3015), the connection opens
with a handshake before the first report; with ACL off the stream above is byte for byte
RocketMQ's::

    master -> slave: challenge (HA_CHALLENGE, 20 bytes)        struct ">4s16s"
    +------------------+----------------------------------------------------+
    | magic "TXHA"     | nonce  16 random bytes, new for every connection   |
    +------------------+----------------------------------------------------+
      0                  4                                                   20

    slave -> master: hello (HA_HELLO_HEADER, 18 bytes + the three fields)  struct ">4sqHHH"
    +--------------+-------------+----------+--------+---------+------------+-----------+-----------+
    | magic "TXHA" | brokerId i64| nameLen  | akLen  | sigLen  | brokerName | accessKey | Signature |
    |              |             | u16      | u16    | u16     | UTF-8      | UTF-8     | ASCII     |
    +--------------+-------------+----------+--------+---------+------------+-----------+-----------+
      0              4             12         14       16        18
    Signature = base64(HmacSHA1(secret key, content)): the remoting door's ACL signature
    (:func:`~txmq.protocol.sign_remoting`) over the fields brokerId, brokerName, haNonce (the
    nonce in lower-case hex) and AccessKey, as if they were a request's ext fields with no body.

The master checks the hello (:meth:`txmq.broker.acl.AclGuard.check_fields`); a bad or missing one
closes the connection before any report counts. Then the slave reports as above.

In controller mode (after the AutoSwitch handshake of :mod:`txmq.protocol._ha_auto`) the frames
are RocketMQ 5's ``AutoSwitchHAClient`` / ``AutoSwitchHAConnection`` ones (``auto=True``)::

    slave -> master: report (HA_AUTO_REPORT, 12 bytes)          struct ">iq"
    +-----------+-----------------------------+
    | state i32 | slaveMaxOffset  i64         |   state 2 (TRANSFER)
    +-----------+-----------------------------+
      0           4                           12

    master -> slave: transfer (HA_AUTO_TRANSFER_HEADER, 36 bytes)  struct ">iiqiqq"
    +-----------+--------------+---------------+----------------+------------------+----------------+-------+
    | state i32 | bodySize i32 | phyOffset i64 | masterEpoch i32| epochStartOffset | confirmOffset  | body  |
    | = 2       |              |               |                | i64              | i64            |       |
    +-----------+--------------+---------------+----------------+------------------+----------------+-------+
      0           4              8               16               20                 28               36
    masterEpoch / epochStartOffset: the epoch that wrote the body (a frame never spans two
    epochs); confirmOffset: what every SyncStateSet member has. bodySize 0 is a heartbeat.

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
from txmq.protocol._acl_sign import SIGNATURE, sign_remoting

__all__ = [
    "HA_AUTO_REPORT",
    "HA_AUTO_TRANSFER_HEADER",
    "HA_CHALLENGE",
    "HA_HELLO_FIELD_MAX_BYTES",
    "HA_HELLO_HEADER",
    "HA_MAGIC",
    "HA_NONCE_BYTES",
    "HA_REPORT",
    "HA_TRANSFER_HEADER",
    "HaHeartbeat",
    "HaHello",
    "HaTransfer",
    "HelloDecoder",
    "ReportDecoder",
    "TransferDecoder",
    "decode_challenge",
    "encode_auto_report",
    "encode_auto_transfer",
    "encode_challenge",
    "encode_heartbeat",
    "encode_hello",
    "encode_report",
    "encode_transfer",
    "ha_hello_fields",
]

HA_REPORT = struct.Struct(">q")
"""The slave's report: its max commit-log offset (RocketMQ ``REPORT_HEADER_SIZE`` = 8)."""

HA_TRANSFER_HEADER = struct.Struct(">qi")
"""A transfer frame's header: physical offset, body size (RocketMQ ``TRANSFER_HEADER_SIZE`` = 12)."""

HA_AUTO_REPORT = struct.Struct(">iq")
"""A controller-mode slave's report: state (2, TRANSFER), max offset (RocketMQ
``AutoSwitchHAClient``'s 12-byte ack)."""

HA_AUTO_TRANSFER_HEADER = struct.Struct(">iiqiqq")
"""A controller-mode transfer header: state, body size, offset, master epoch, epoch start offset,
confirm offset (RocketMQ ``AutoSwitchHAConnection``, 36 bytes)."""

_STATE_TRANSFER = 2
"""RocketMQ ``HAConnectionState.TRANSFER``."""

HA_MAGIC = b"TXHA"
"""First bytes of the handshake frames (txmq's; as the high half of a transfer's phyOffset they
would put it beyond 6 EiB, so a slave without credentials recognises a challenge)."""

HA_NONCE_BYTES = 16
"""Random bytes of a challenge (128 bits: a nonce never repeats, so a recorded hello is useless)."""

HA_CHALLENGE = struct.Struct(">4s16s")
"""The master's challenge: magic, nonce."""

HA_HELLO_HEADER = struct.Struct(">4sqHHH")
"""The slave's hello before its three fields: magic, brokerId, and the fields' byte lengths."""

HA_HELLO_FIELD_MAX_BYTES = 255
"""Longest brokerName, accessKey or Signature of a hello (txmq; a broker name is at most 127
characters, RocketMQ ``Validators.CHARACTER_MAX_LENGTH`` for names, and a signature 28)."""

_OFFSET_MAX = 2**63 - 1
_F_NAME, _F_ID, _F_NONCE, _F_AK = "brokerName", "brokerId", "haNonce", "AccessKey"


class HaTransfer(msgspec.Struct, frozen=True):
    """Commit-log bytes ``data`` that belong at physical offset ``offset`` (controller mode: of
    master epoch ``epoch``, which began at ``epoch_start``; ``confirm``: the master's confirm
    offset; -1 in the plain protocol)."""

    offset: int
    data: bytes
    epoch: int = -1
    epoch_start: int = -1
    confirm: int = -1


class HaHeartbeat(msgspec.Struct, frozen=True):
    """An empty transfer frame: the master is alive, and its next transfer starts at ``offset``
    (controller mode: with the epoch fields of :class:`HaTransfer`)."""

    offset: int
    epoch: int = -1
    epoch_start: int = -1
    confirm: int = -1


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


def encode_auto_report(max_offset: int) -> bytes:
    """A controller-mode report (12 bytes). Raises HaProtocolError for a negative offset."""
    if not 0 <= max_offset <= _OFFSET_MAX:
        raise HaProtocolError(f"HA report offset {max_offset} out of range")
    return HA_AUTO_REPORT.pack(_STATE_TRANSFER, max_offset)


def encode_auto_transfer(offset: int, data: bytes | memoryview, epoch: int, epoch_start: int,
                         confirm: int) -> bytes:
    """A controller-mode transfer frame (``data`` empty: a heartbeat); the caller keeps ``data``
    within one epoch. Raises HaProtocolError as :func:`encode_transfer`."""
    if not 0 <= offset <= _OFFSET_MAX - len(data) or len(data) > limits.HA_TRANSFER_BATCH_BYTES:
        raise HaProtocolError(f"HA transfer of {len(data)} bytes at {offset} out of range")
    return HA_AUTO_TRANSFER_HEADER.pack(_STATE_TRANSFER, len(data), offset, epoch, epoch_start,
                                        confirm) + bytes(data)


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

    def __init__(self, auto: bool = False) -> None:
        self._b = _Buffer()
        self.last = -1
        """The last offset reported (-1: none yet)."""
        self._auto = auto
        self._size = HA_AUTO_REPORT.size if auto else HA_REPORT.size

    def feed(self, data: bytes | memoryview) -> list[int]:
        """The complete reports in what arrived so far (partial ones wait for more bytes).

        Raises:
            HaProtocolError: a negative offset, one below the previous report, or too many
                undecoded bytes.
        """
        b = self._b
        b.add(data)
        out: list[int] = []
        while b.available >= self._size:
            if self._auto:
                state, offset = HA_AUTO_REPORT.unpack_from(b.buf, b.pos)
                if state != _STATE_TRANSFER:
                    raise HaProtocolError(f"slave report in state {state}, not TRANSFER")
            else:
                (offset,) = HA_REPORT.unpack_from(b.buf, b.pos)
            b.pos += self._size
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

    def __init__(self, expected: int, auto: bool = False) -> None:
        if expected < 0:
            raise HaProtocolError(f"HA stream cannot start at offset {expected}")
        self._b = _Buffer()
        self.expected = expected
        self._auto = auto
        self._head = HA_AUTO_TRANSFER_HEADER if auto else HA_TRANSFER_HEADER

    def feed(self, data: bytes | memoryview) -> list[HaTransfer | HaHeartbeat]:
        """The complete frames in what arrived so far (a partial frame waits for more bytes).

        Raises:
            HaProtocolError: a negative size, a size above ``limits.HA_TRANSFER_BATCH_BYTES``, an
                offset other than :attr:`expected`, or too many undecoded bytes.
        """
        b = self._b
        b.add(data)
        out: list[HaTransfer | HaHeartbeat] = []
        head = self._head
        while b.available >= head.size:
            if self._auto:
                state, size, offset, epoch, start, confirm = head.unpack_from(b.buf, b.pos)
                if state != _STATE_TRANSFER or epoch < 0 or not 0 <= start <= offset:
                    raise HaProtocolError(f"HA transfer state {state}, epoch {epoch} from {start}")
            else:
                (offset, size), epoch, start, confirm = head.unpack_from(b.buf, b.pos), -1, -1, -1
            if offset != self.expected or not 0 <= size <= limits.HA_TRANSFER_BATCH_BYTES:
                raise self._refusal(b, offset, size)
            end = b.pos + head.size + size
            if len(b.buf) < end:
                break
            if size:
                out.append(HaTransfer(offset, bytes(b.buf[end - size : end]), epoch, start,
                                      confirm))
                self.expected += size
            else:
                out.append(HaHeartbeat(offset, epoch, start, confirm))
            b.pos = end
        return out

    def _refusal(self, b: _Buffer, offset: int, size: int) -> HaProtocolError:
        """Why a frame header at ``b.pos`` is refused (a challenge: the master has ACL on)."""
        if b.buf[b.pos : b.pos + len(HA_MAGIC)] == HA_MAGIC:
            return HaProtocolError("the master sent an HA challenge: ACL is on there, set "
                                   "ha_access_key and ha_secret_key on this slave")
        if not 0 <= size <= limits.HA_TRANSFER_BATCH_BYTES:
            return HaProtocolError(f"HA transfer size {size} not in "
                                   f"0..{limits.HA_TRANSFER_BATCH_BYTES}")
        return HaProtocolError(f"master pushed offset {offset}, the slave expects {self.expected}")


# -- the handshake (ACL on) -----------------------------------------------------------------------
class HaHello(msgspec.Struct, frozen=True):
    """A slave's hello: who it is, the account it signs with, and the signature (base64)."""

    broker_name: str
    broker_id: int
    access_key: str
    signature: str


def encode_challenge(nonce: bytes) -> bytes:
    """The master's 20-byte challenge. Raises HaProtocolError unless ``nonce`` has
    ``HA_NONCE_BYTES`` bytes."""
    if len(nonce) != HA_NONCE_BYTES:
        raise HaProtocolError(f"HA nonce of {len(nonce)} bytes, not {HA_NONCE_BYTES}")
    return HA_CHALLENGE.pack(HA_MAGIC, nonce)


def decode_challenge(data: bytes) -> bytes:
    """The nonce of a 20-byte challenge. Raises HaProtocolError: not a challenge (the master
    may have ACL off: it sends no challenge, the slave waits in vain)."""
    if len(data) != HA_CHALLENGE.size:
        raise HaProtocolError(f"HA challenge of {len(data)} bytes, not {HA_CHALLENGE.size}")
    magic, nonce = HA_CHALLENGE.unpack(data)
    if magic != HA_MAGIC:
        raise HaProtocolError(f"HA challenge starts {magic!r}, not {HA_MAGIC!r}")
    return bytes(nonce)


def _signed_fields(broker_name: str, broker_id: int, access_key: str, nonce: bytes) -> dict[str, str]:
    return {_F_NAME: broker_name, _F_ID: str(broker_id), _F_NONCE: nonce.hex(), _F_AK: access_key}


def ha_hello_fields(hello: HaHello, nonce: bytes) -> dict[str, str]:
    """The hello as the ext fields of a signed remoting request (``AccessKey``, ``Signature``
    and the signed fields), for the ACL's signature check against the connection's ``nonce``."""
    fields = _signed_fields(hello.broker_name, hello.broker_id, hello.access_key, nonce)
    fields[SIGNATURE] = hello.signature
    return fields


def encode_hello(broker_name: str, broker_id: int, access_key: str, secret_key: str,
                 nonce: bytes) -> bytes:
    """A slave's hello answering the challenge ``nonce``, signed with ``secret_key`` as the
    remoting door signs a request (RocketMQ ``AclClientRPCHook``).

    Raises:
        HaProtocolError: a field longer than ``HA_HELLO_FIELD_MAX_BYTES``, or a broker id
            outside i64.
    """
    fields = sign_remoting(_signed_fields(broker_name, broker_id, "", nonce), b"", access_key,
                           secret_key)
    parts = [broker_name.encode(), access_key.encode(), fields[SIGNATURE].encode()]
    if any(len(p) > HA_HELLO_FIELD_MAX_BYTES for p in parts):
        raise HaProtocolError(f"HA hello field longer than {HA_HELLO_FIELD_MAX_BYTES} bytes")
    if not -_OFFSET_MAX - 1 <= broker_id <= _OFFSET_MAX:
        raise HaProtocolError(f"broker id {broker_id} does not fit an i64")
    return HA_HELLO_HEADER.pack(HA_MAGIC, broker_id, *map(len, parts)) + b"".join(parts)


class HelloDecoder:
    """The master's side of the handshake: bytes from the slave in, its :class:`HaHello` out.
    Bytes after the hello (the first report, sent at once) stay in :attr:`rest`."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.rest = b""

    def feed(self, data: bytes | memoryview) -> HaHello | None:
        """The hello once complete (None: more bytes needed).

        Raises:
            HaProtocolError: not a hello (a slave without credentials sends its 8-byte report
                first), a field longer than ``HA_HELLO_FIELD_MAX_BYTES`` or not UTF-8.
        """
        self._buf += data
        buf = self._buf
        if len(buf) >= len(HA_MAGIC) and buf[: len(HA_MAGIC)] != HA_MAGIC:
            raise HaProtocolError("no HA handshake: ACL is on and the peer did not send a hello "
                                  "(a slave needs ha_access_key and ha_secret_key)")
        if len(buf) < HA_HELLO_HEADER.size:
            return None
        _, broker_id, *lens = HA_HELLO_HEADER.unpack_from(buf)
        if any(n > HA_HELLO_FIELD_MAX_BYTES for n in lens):
            raise HaProtocolError(f"HA hello field longer than {HA_HELLO_FIELD_MAX_BYTES} bytes")
        end = HA_HELLO_HEADER.size + sum(lens)
        if len(buf) < end:
            return None
        at, texts = HA_HELLO_HEADER.size, []
        try:
            for n in lens:
                texts.append(bytes(buf[at : at + n]).decode())
                at += n
        except UnicodeDecodeError as exc:
            raise HaProtocolError(f"HA hello field is not UTF-8: {exc}") from exc
        self.rest = bytes(buf[end:])
        return HaHello(texts[0], broker_id, texts[1], texts[2])
