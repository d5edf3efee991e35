"""What every fuzz target shares: the :class:`Target` record, :class:`Source` (typed choices read
from the input bytes), and :func:`wire_round_trip` (a command through RocketMQ's remoting frame in
either serialize type)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

import txmq.protocol as _protocol
from txmq.errors import (
    FrameTooLarge,
    MalformedFrame,
)
from txmq.protocol import (
    SERIALIZE_JSON,
    Command,
    FrameDecoder,
    encode_command,
)

__all__ = ["Source", "Target", "json_frame", "wire_round_trip"]


@dataclass
class Target:
    """One fuzz target: ``run(data)`` may raise only ``expected``; ``seeds()`` are valid inputs."""

    name: str
    run: Callable[[bytes], None]
    expected: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    doc: str = ""


class Source:
    """Reads typed choices from the input bytes; an exhausted input reads as zeros."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def num(self, nbytes: int = 1) -> int:
        chunk = self.data[self.pos : self.pos + nbytes]
        self.pos += nbytes
        return int.from_bytes(chunk, "big") if chunk else 0

    def pick(self, seq: list[Any]) -> Any:
        return seq[self.num() % len(seq)]

    def blob(self, nmax: int) -> bytes:
        n = self.num() % (nmax + 1)
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk


def _as_sent(cmd: Command, serialize_type: int) -> Command:
    """``cmd`` as a decoder reads it back after it is encoded in ``serialize_type``: the ROCKETMQ
    header carries a language as its code (an unknown name goes as OTHER) and no remark as "" ."""
    if serialize_type == SERIALIZE_JSON:
        return msgspec.structs.replace(cmd, serialize_type=serialize_type)
    return msgspec.structs.replace(
        cmd, serialize_type=serialize_type, remark=cmd.remark or None,
        language=cmd.language if cmd.language in _protocol.LANGUAGE_CODES else "OTHER")


def wire_round_trip(cmd: Command, serialize_type: int | None = None) -> Command | None:
    """Encode ``cmd`` in ``serialize_type`` (default its own), decode it, check it is the same
    command (see :func:`_as_sent`), and return it; None when it is too large for a frame or (in
    the other serialize type only) has a field out of the binary header's range.

    Raises:
        AssertionError: the decoded command differs, or not exactly one came back.
        MalformedFrame: ``cmd`` does not encode in its own serialize type.
    """
    own = serialize_type is None or serialize_type == cmd.serialize_type
    kind = cmd.serialize_type if serialize_type is None else serialize_type
    want = _as_sent(cmd, kind)
    try:
        frame = encode_command(want)
    except FrameTooLarge:
        return None
    except MalformedFrame:
        if own:
            raise
        return None
    got = FrameDecoder().feed(frame)
    assert got == [want], (got, want)
    return got[0]


def json_frame(header: bytes, body: bytes = b"") -> bytes:
    return (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + \
        header + body


