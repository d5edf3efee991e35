"""Free loopback ports for processes a test starts with a fixed port (see :func:`free_port`)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

PORT_RANGE_LOW = 10_000
"""Lowest port :func:`free_port` hands out (txmq: above the well-known and common service ports)."""

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux keeps the range it assigns ``bind(port 0)`` and outgoing connections from."""

EPHEMERAL_LOW_DEFAULT = 32_768
"""Linux's default start of that range (``net.ipv4.ip_local_port_range`` = 32768 60999)."""

_ATTEMPTS = 200


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def free_port(rng: random.Random | None = None) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server a test starts later.

    Chosen at random *below* the kernel's ephemeral range, so that no ``bind(0)`` and no outgoing
    connection of any process can take it between this call and the server's own bind (a port
    taken from ``bind(0)`` is in that range, and was seen taken by another process before the
    broker bound it). ``rng`` (default: a new ``random.Random()``) makes the choice replayable.

    Returns an int in ``[PORT_RANGE_LOW, ephemeral low)``.

    Raises:
        OSError: no free port found in ``_ATTEMPTS`` tries.
    """
    rng = rng or random.Random()
    high = max(_ephemeral_low(), PORT_RANGE_LOW + 1)
    for _ in range(_ATTEMPTS):
        port = rng.randrange(PORT_RANGE_LOW, high)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in [{PORT_RANGE_LOW}, {high}) after {_ATTEMPTS} tries")
