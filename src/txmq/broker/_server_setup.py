"""What the broker's asyncio shell (:mod:`txmq.broker.server`) reads off its config and its
requests before it serves: the wall clock (with the chaos runs' clock hook), the store settings and
host, the connection cap, and how one read's requests split into runs handled at once."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import time

import msgspec

from txmq import limits
from txmq.broker._config import BrokerConfig
from txmq.protocol import Command, RequestCode
from txmq.store import StoreConfig

__all__ = ["END", "ip_of", "max_connections", "now_ms", "request_runs", "store_config"]

# Test hook (txmq.testing.chaos): a file named by this variable holds a clock offset in ms that
# the chaos nemesis writes to jump the broker's clock forward or back; read at most every
# CHAOS_CLOCK_POLL_MS. Unset (always, outside chaos runs) it costs one test per call.
_CLOCK_FILE = os.environ.get("TXMQ_TEST_CLOCK_OFFSET_FILE", "")
_clock_skew = [0, 0]  # [offset ms, next read at (monotonic ms)]


def now_ms() -> int:
    """The broker's wall clock, ms since the epoch (moved by the chaos clock hook, if set)."""
    now = time.time_ns() // 1_000_000
    if _CLOCK_FILE:
        mono = time.monotonic_ns() // 1_000_000
        if mono >= _clock_skew[1]:
            with contextlib.suppress(OSError, ValueError), open(_CLOCK_FILE) as f:
                _clock_skew[0] = int(f.read() or 0)
            _clock_skew[1] = mono + limits.CHAOS_CLOCK_POLL_MS
        now += _clock_skew[0]
    return now


END = RequestCode.END_TRANSACTION
_RUN_KIND: dict[int, int] = {RequestCode.SEND_MESSAGE: 1, RequestCode.SEND_MESSAGE_V2: 1, END: 2}
"""Request codes handled in runs (:func:`request_runs`): 1 sends, 2 ends of transactions."""


def request_runs(cmds: list[Command]) -> list[list[Command]]:
    """The requests of one read in runs, each handled at once: consecutive requests of one run
    kind grouped together (SEND_MESSAGE / SEND_MESSAGE_V2; two-way END_TRANSACTION), every other
    command on its own, in order; the one-way END_TRANSACTION requests (RocketMQ producers send
    one per transaction) all in one last run, so sends between them still form one run. Nothing
    can depend on a one-way end being handled before a later request of the same read: it has
    no answer, and the half it names was stored by an earlier read (the producer had its
    answer). Responses never join a run."""
    out: list[list[Command]] = []
    oneway_ends: list[Command] = []
    kind = 0  # the run kind of out[-1] (0: none)
    for cmd in cmds:
        k = 0 if cmd.is_response else _RUN_KIND.get(cmd.code, 0)
        if k == 2 and cmd.is_oneway:
            oneway_ends.append(cmd)
        elif k and k == kind:
            out[-1].append(cmd)
        else:
            out.append([cmd])
            kind = k
    if oneway_ends:
        out.append(oneway_ends)
    return out


def store_config(config: BrokerConfig) -> StoreConfig:
    """The store settings of a broker: its ``[store]`` table, with the top-level
    ``file_reserved_time_ms`` and, unless the table sets one, the listen address as store host."""
    host = config.store.store_host or f"{ip_of(config.host)}:{config.port}"
    return msgspec.structs.replace(config.store, file_reserved_time_ms=config.file_reserved_time_ms,
                                   store_host=host).validate()


def ip_of(host: str) -> str:
    """The IP literal a store host (and every offset message id) names for listen address
    ``host``: a name is resolved once, at start; the wildcard ``0.0.0.0`` / ``::`` becomes the
    loopback address (RocketMQ takes ``brokerIP1``, the first local address, instead)."""
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def max_connections(config: BrokerConfig) -> int:
    """``config.max_connections``, or when 0 the file-descriptor limit (``RLIMIT_NOFILE``, read
    now) less ``limits.CONNECTION_FD_RESERVE`` (half the limit when it is small), at most
    ``limits.CONNECTIONS_MAX``."""
    if config.max_connections:
        return config.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.CONNECTIONS_MAX
    return max(1, min(limits.CONNECTIONS_MAX, soft - min(limits.CONNECTION_FD_RESERVE, soft // 2)))
