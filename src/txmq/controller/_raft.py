"""The controller's state replicated over Raft with pysyncobj (consensus from a library, never
written here).

:class:`ControllerRaft` owns a ``pysyncobj.SyncObj`` whose one replicated method applies a
:class:`~txmq.controller.ControllerEvent` (msgpack bytes) to every replica's
:class:`~txmq.controller.ControllerState` in log order. pysyncobj runs its own thread (``autoTick``);
every callback into the caller (a proposal's result, a Raft role change) goes through
``on_thread`` callables the asyncio shell turns into ``loop.call_soon_threadsafe``.

Persistence under ``store_dir``: ``raft.journal`` (pysyncobj's log, one mmap'd file),
``raft.dump`` (its snapshot after log compaction) and ``raft.journal.meta`` (term, vote). pysyncobj
acknowledges entries without fsync; :meth:`_apply` fsyncs the journal after every applied event,
so an event a client saw succeed is on disk on the leader. A SIGKILL loses nothing (the page cache
survives the process); a power loss of a majority within one entry's round trip could (see
docs/controller.md).

Each controller also publishes its remoting address under its Raft address (replicated), so any
controller can name the leader's remoting address (CONTROLLER_GET_METADATA_INFO).
"""

from __future__ import annotations

import _socket
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import _RAFT_STATE

from txmq.controller._state import ControllerEvent, ControllerState, GroupView, Outcome

socket.inet_ntop = _socket.inet_ntop
"""pysyncobj 0.3.17's ``win_inet_pton`` (imported with it) replaces ``socket.inet_ntop`` on every
OS with a Windows-only one that raises TypeError: every process that imported the controller (the
``txmq`` CLI registers it) could then decode no message's hosts, and a slave refused every record."""

__all__ = ["LEADER_FALLBACK_MS", "RAFT_MAX_TIMEOUT_MS", "RAFT_MIN_TIMEOUT_MS", "ControllerRaft"]

RAFT_MIN_TIMEOUT_MS = 400
"""A follower that hears no leader for a random time in [min, max] starts an election
(pysyncobj ``raftMinTimeout`` / ``raftMaxTimeout`` defaults, 0.4-1.4 s)."""
RAFT_MAX_TIMEOUT_MS = 1400
APPEND_ENTRIES_PERIOD_MS = 100
"""The leader's heartbeat to followers (pysyncobj ``appendEntriesPeriod`` default)."""
AUTO_TICK_PERIOD_MS = 50
"""pysyncobj's poll period (``autoTickPeriod`` default): its thread's wake-ups when idle."""
LEADER_FALLBACK_MS = 2000
"""A leader that hears from no majority this long steps down (pysyncobj ``leaderFallbackTimeout``,
default 30 s: shortened so that a lone old leader stops granting master leases soon; a new leader
waits this plus one lease before electing, docs/controller.md)."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ControllerEvent)


class _Replica(SyncObjConsumer):  # type: ignore[misc]
    """The replicated part: what pysyncobj snapshots is this object's ``state`` and
    ``controllers`` (attributes made before ``SyncObjConsumer.__init__`` are not snapshotted)."""

    def __init__(self, journal_path: Path | None) -> None:
        self.lock = threading.Lock()
        self.journal_path = journal_path
        self.journal_fd: int | None = None
        super().__init__()
        self.state = ControllerState()
        self.controllers: dict[str, str] = {}

    @replicated  # type: ignore[untyped-decorator]
    def apply_event(self, raw: bytes) -> Outcome:
        event = _decoder.decode(raw)
        with self.lock:
            outcome = self.state.apply(event)
        self._fsync()
        return outcome

    @replicated  # type: ignore[untyped-decorator]
    def set_controller(self, raft_address: str, remoting_address: str) -> None:
        with self.lock:
            self.controllers[raft_address] = remoting_address

    def _fsync(self) -> None:
        if self.journal_path is None:
            return
        if self.journal_fd is None:
            with contextlib.suppress(OSError):
                self.journal_fd = os.open(self.journal_path, os.O_RDONLY)
        if self.journal_fd is not None:
            os.fsync(self.journal_fd)


class ControllerRaft:
    """One controller's Raft replica.

    Args:
        raft_address: this controller's Raft ``host:port`` (pysyncobj listens on it).
        peers: the other controllers' Raft addresses.
        store_dir: where the journal, snapshot and vote live; None keeps them in memory (tests).
        on_role: called on pysyncobj's thread with ``is_leader`` at every Raft role change.
    """

    def __init__(self, raft_address: str, peers: list[str], store_dir: Path | None,
                 on_role: Callable[[bool], object]) -> None:
        journal = None if store_dir is None else store_dir / "raft.journal"
        self._replica = _Replica(journal)
        self.raft_address = raft_address
        conf = SyncObjConf(
            journalFile=None if journal is None else str(journal),
            fullDumpFile=None if store_dir is None else str(store_dir / "raft.dump"),
            raftMinTimeout=RAFT_MIN_TIMEOUT_MS / 1000, raftMaxTimeout=RAFT_MAX_TIMEOUT_MS / 1000,
            appendEntriesPeriod=APPEND_ENTRIES_PERIOD_MS / 1000,
            autoTickPeriod=AUTO_TICK_PERIOD_MS / 1000,
            leaderFallbackTimeout=LEADER_FALLBACK_MS / 1000,
            useFork=False,  # no fork() of a process with an asyncio loop and threads
            commandsWaitLeader=False,
            onStateChanged=lambda _old, new: on_role(new == _RAFT_STATE.LEADER))
        self._obj = SyncObj(raft_address, peers, conf, consumers=[self._replica])

    def is_leader(self) -> bool:
        return bool(self._obj._isLeader())

    def leader_raft_address(self) -> str | None:
        """The Raft address of the last known leader (None while there is none)."""
        leader = self._obj._getLeader()
        return None if leader is None else str(leader.address)

    def leader_remoting_address(self) -> str | None:
        """The remoting address the leader published (None while unknown)."""
        raft = self.leader_raft_address()
        with self._replica.lock:
            return None if raft is None else self._replica.controllers.get(raft)

    def published_address(self) -> str | None:
        with self._replica.lock:
            return self._replica.controllers.get(self.raft_address)

    def peers(self) -> str:
        """Every Raft address, ``;``-separated (RocketMQ ``controllerDLegerPeers`` style)."""
        nodes = [self.raft_address, *(str(n.address) for n in self._obj.otherNodes)]
        return ";".join(sorted(nodes))

    def group(self, broker_name: str) -> GroupView | None:
        with self._replica.lock:
            return self._replica.state.group(broker_name)

    def groups(self) -> list[GroupView]:
        with self._replica.lock:
            return self._replica.state.groups()

    def propose(self, event: ControllerEvent,
                done: Callable[[Outcome | None, int], object]) -> None:
        """Replicate ``event``; ``done(outcome, 0)`` once applied here, or ``done(None, reason)``
        (a pysyncobj ``FAIL_REASON``) on pysyncobj's thread."""
        self._replica.apply_event(_encoder.encode(event), callback=done)

    def publish(self, remoting_address: str, done: Callable[[Any, int], object]) -> None:
        """Replicate this controller's remoting address under its Raft address."""
        self._replica.set_controller(self.raft_address, remoting_address, callback=done)

    def close(self) -> None:
        self._obj.destroy()
        if self._replica.journal_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._replica.journal_fd)
