"""A userspace delay line for one test host's outgoing packets: a TUN device the host's routes send
its subnet traffic to; each packet read is dropped with probability ``loss_pct`` or written back
after ``delay_ms``, and the kernel forwards it out of the host's real interface.

Linux's ``netem`` qdisc does this in the kernel, but kernels built without ``CONFIG_NET_SCH_NETEM``
(Firecracker guests, this project's CI) lack it; a TUN device is always there. Run as
``python -m txmq.testing._tundelay DEV DELAY_MS LOSS_PCT SEED`` inside the host's namespace
(:meth:`txmq.testing.Hosts.delay` does); it prints ``ready`` once the device exists.

:class:`DelayLine` is the sans-IO core (packets in with ``now``, due packets out).
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import os
import random
import select
import struct
import sys
import time

__all__ = ["DelayLine", "main"]

TUNSETIFF = 0x400454CA
"""ioctl that attaches the fd to a TUN/TAP device (linux/if_tun.h)."""
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
PACKET_MAX_BYTES = 65_535
"""Largest IP packet a read can return (IPv4 total length is 16 bits)."""
QUEUE_MAX = 100_000
"""Packets held at once; beyond that the newest are dropped (a delay line is a finite queue)."""


class DelayLine:
    """Packets held for ``delay_ms``; each one dropped on arrival with probability ``loss_pct`` %.

    ``push(packet, now_ms)`` takes a packet; ``due(now_ms)`` returns the packets whose time has
    come, in arrival order; ``next_due_ms()`` is when the next one is due (None: empty).
    """

    def __init__(self, delay_ms: int, loss_pct: float, rng: random.Random) -> None:
        if delay_ms < 0 or not 0 <= loss_pct <= 100:
            raise ValueError(f"delay_ms {delay_ms} must be >= 0 and loss_pct {loss_pct} in [0, 100]")
        self.delay_ms, self.loss_pct, self._rng = delay_ms, loss_pct, rng
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = itertools.count()
        self.dropped = 0

    def push(self, packet: bytes, now_ms: float) -> None:
        if self._rng.random() * 100 < self.loss_pct or len(self._heap) >= QUEUE_MAX:
            self.dropped += 1
            return
        heapq.heappush(self._heap, (now_ms + self.delay_ms, next(self._seq), packet))

    def due(self, now_ms: float) -> list[bytes]:
        out = []
        while self._heap and self._heap[0][0] <= now_ms:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def next_due_ms(self) -> float | None:
        return self._heap[0][0] if self._heap else None


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main(argv: list[str]) -> None:
    """``DEV DELAY_MS LOSS_PCT SEED``: open TUN device DEV and run the delay line until killed."""
    name, delay_ms, loss_pct, seed = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    line = DelayLine(delay_ms, loss_pct, random.Random(seed))
    fd = _open_tun(name)
    print("ready", flush=True)
    while True:
        now = time.monotonic() * 1000
        nxt = line.next_due_ms()
        timeout = None if nxt is None else max(0.0, (nxt - now) / 1000)
        readable, _, _ = select.select([fd], [], [], timeout)
        now = time.monotonic() * 1000
        if readable:
            line.push(os.read(fd, PACKET_MAX_BYTES), now)
        for packet in line.due(now):
            with contextlib.suppress(OSError):  # the kernel refused it (healing): a lost packet
                os.write(fd, packet)


if __name__ == "__main__":
    main(sys.argv[1:])
