"""Runtime role changes of a broker in controller mode (issue #26): the :class:`RoleTarget` the
controller client drives (RocketMQ ``ReplicasManager.changeToMaster`` / ``changeToSlave``).

- :meth:`RoleSwitch.become_master`: stop following; make the log durable; drop epoch entries
  that begin at or past its end (epochs that wrote nothing here) and any of this epoch or later;
  append ``<epoch, end>`` to the epoch file; serve slaves (AutoSwitch handshake); system records
  written here from now on; the transaction index rebuilt and every pending half checked back at
  the next tick; re-register with the name servers as broker id 0 with ``masterEpoch``.
- :meth:`RoleSwitch.become_slave`: fenced while switching; stop serving slaves and master-only
  services; ask the master its HA address (EXCHANGE_BROKER_HA_INFO, 906); follow it. At each
  connection the slave truncates its log, crash-safe (:meth:`~txmq.store.FileStore.truncate_log`),
  to the consistent point of its epoch file and the master's, then takes the master's entries.
- :meth:`RoleSwitch.set_lease` / :meth:`RoleSwitch.fence`: a master refuses writes once
  ``time.monotonic()`` passes its lease, or at once (docs/replication.md "Fencing").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from txmq.broker._broker import Broker
from txmq.broker.ha._shell import AutoSwitchMaster, AutoSwitchSlave, Replication
from txmq.errors import HaProtocolError, RemoteError, ResponseCode
from txmq.protocol import (
    AutoHandshake,
    ExchangeHaInfoRequestHeader,
    ExchangeHaInfoResponseHeader,
    RequestCode,
    from_ext,
    to_ext,
)
from txmq.store import EpochCache, FileStore

__all__ = ["RoleSwitch", "exchange_ha_info"]

log = logging.getLogger("txmq.broker.ha")

_OPEN_END = 2**63 - 1
"""The end of an epoch that has none yet (RocketMQ ``Long.MAX_VALUE``, ``EpochEntry``'s default)."""

EXCHANGE_HA_INFO_TIMEOUT_MS = 3_000
"""Longest a slave waits for its master's EXCHANGE_BROKER_HA_INFO answer (RocketMQ
``BrokerOuterAPI.retrieveBrokerHaInfo`` uses 3 s)."""


async def exchange_ha_info(master_addr: str, access_key: str = "",
                           secret_key: str = "") -> ExchangeHaInfoResponseHeader:
    """Ask the broker at ``master_addr`` (remoting ``host:port``) its HA address with
    EXCHANGE_BROKER_HA_INFO, signed with the HA account when given (ACL: All on the cluster).
    Raises TransportError, RemoteError (a non-SUCCESS answer)."""
    from txmq.client import AsyncConnection  # here: a broker without replicas needs no client

    conn = AsyncConnection(master_addr, timeout_ms=EXCHANGE_HA_INFO_TIMEOUT_MS,
                           access_key=access_key, secret_key=secret_key)
    await conn.connect()
    try:
        got = await conn.request(RequestCode.EXCHANGE_BROKER_HA_INFO,
                                 to_ext(ExchangeHaInfoRequestHeader()))
    finally:
        await conn.close()
    if got.code != ResponseCode.SUCCESS:
        raise RemoteError.of(got.code, got.remark or "")
    return from_ext(got.ext, ExchangeHaInfoResponseHeader)


class RoleSwitch:
    """The broker's :class:`~txmq.broker._roles.RoleTarget` (controller mode).

    Args:
        broker: the broker core (its ``role`` is changed here).
        store: its FileStore (epoch file, crash-safe truncation).
        repl: the HA shell.
        flush: makes the log durable (the server's flusher thread); returns the flushed end.
        reregister: registers with the name servers now as (broker id, master epoch); None when
            there are no name servers.
        ask_ha_info: how the master's HA address is asked (:func:`exchange_ha_info`).
        wall_ms: the wall clock (check-back times).
    """

    def __init__(self, broker: Broker, store: FileStore, repl: Replication,
                 flush: Callable[[], Awaitable[int]],
                 reregister: Callable[[int, int | None], Awaitable[None]] | None = None,
                 ask_ha_info: Callable[[str, str, str], Awaitable[ExchangeHaInfoResponseHeader]]
                 = exchange_ha_info,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.broker, self.store, self.repl = broker, store, repl
        self.role = broker.role
        self._flush, self._reregister, self._ask = flush, reregister, ask_ha_info
        self._wall_ms = wall_ms
        self._lock = asyncio.Lock()
        self.role.next_epoch_start = self._next_epoch_start
        self.role.master_epoch = store.epochs.last_epoch()  # (a restart: older roles ignored)

    def _next_epoch_start(self, epoch: int) -> int | None:
        nxt = self.store.epochs.cache.next_entry(epoch)
        return nxt.start_offset if nxt is not None else None

    controller_id: Callable[[], int] | None = None
    """Where this broker's id at the controller comes from (the replicas manager's
    ``.broker.meta``); read at each role change (:meth:`set_controller_id` sets it directly)."""

    def set_controller_id(self, broker_id: int) -> None:
        """This broker's id at the controller: a slave names it in its HA handshake and its
        registration, and a master leaves it out of the SyncStateSet members it waits for."""
        self.role.controller_id = broker_id
        if self.role.slave:
            self.role.broker_id = broker_id

    def _learn_id(self) -> None:
        if self.controller_id is not None and (bid := self.controller_id()) > 0:
            self.set_controller_id(bid)

    # -- RoleTarget -------------------------------------------------------------------------------
    def max_phy_offset(self) -> int:
        return self.store.flushed_offset

    def confirm_offset(self) -> int:
        end = self.store.flushed_offset
        if self.role.slave:
            return end
        limit = self.repl.read_limit()
        return end if limit is None else limit

    def last_epoch(self) -> int:
        return self.store.epochs.last_epoch()

    async def become_master(self, master_epoch: int, sync_state_set: frozenset[int],
                            sync_state_set_epoch: int) -> None:
        """Take the master role of ``master_epoch`` (module docstring). An epoch older than the
        current one is ignored; the current one again only updates the SyncStateSet."""
        async with self._lock:
            self._learn_id()
            r = self.role
            if master_epoch < r.master_epoch or (master_epoch == r.master_epoch and not r.slave):
                if master_epoch == r.master_epoch:
                    self.set_sync_state_set(sync_state_set, sync_state_set_epoch)
                return
            r.fenced = True
            await self.repl.stop_slave()
            end = await self._flush()
            epochs = self.store.epochs
            last = epochs.cache.last_entry()
            torn_from = last.start_offset if last is not None else 0
            if last is not None and last.epoch == master_epoch and last.start_offset <= end:
                pass  # its own epoch again after a restart: the entry stands
            elif not self._new_epoch(master_epoch, end):
                return  # (stays fenced: the controller elects again or the operator looks)
            r.to_master(master_epoch, sync_state_set, sync_state_set_epoch)
            self.repl.on_confirm()
            pending = self.broker.take_master_role(self._wall_ms(), torn_from)
            await self.repl.start_master(AutoSwitchMaster(self._handshake, self._frame))
            log.warning("became master of %s, epoch %d, log end %d, SyncStateSet %s; %d pending "
                        "halves to check back", self.broker.config.broker_name, master_epoch, end,
                        sorted(sync_state_set), pending)
        if self._reregister is not None:
            await self._reregister(0, master_epoch)

    def _new_epoch(self, master_epoch: int, end: int) -> bool:
        """Append ``<master_epoch, end>`` after dropping entries that begin at or past ``end``
        (epochs that wrote nothing here) and any of ``master_epoch`` or later."""
        epochs = self.store.epochs
        epochs.truncate_suffix_by_offset(end)
        epochs.truncate_suffix_by_epoch(master_epoch)
        if epochs.append(master_epoch, end):
            return True
        log.error("epoch %d at %d does not follow the epoch file %s", master_epoch, end,
                  epochs.cache.pairs())
        return False

    async def become_slave(self, master_epoch: int, master_broker_id: int,
                           master_addr: str) -> None:
        """Follow ``master_addr`` (remoting address) as a slave of ``master_epoch``. Raises
        TransportError / RemoteError when the master cannot tell its HA address (the broker
        stays a fenced slave; the controller client retries)."""
        async with self._lock:
            self._learn_id()
            r = self.role
            if master_epoch < r.master_epoch or (
                    master_epoch == r.master_epoch and r.slave and not r.fenced
                    and self.repl.slave is not None and self.broker.master_addr == master_addr):
                return  # (older, or the same role again)
            r.fenced = True
            r.to_slave(master_epoch)
            self.broker.take_slave_role()
            await self.repl.stop_master()
            await self.repl.stop_slave()
            self.broker.master_addr = self.repl.master_addr = master_addr
            c = self.broker.config
            info = await self._ask(master_addr, c.ha_access_key, c.ha_secret_key)
            if not info.master_ha_address:
                raise HaProtocolError(f"master {master_addr} has no HA listener")
            self.repl.start_slave(info.master_ha_address, AutoSwitchSlave(
                r.controller_id, self._truncate, self.store.epochs.last_epoch, self._received))
            log.warning("became slave (id %d) of %s (id %d, HA %s), epoch %d", r.controller_id,
                        master_addr, master_broker_id, info.master_ha_address, master_epoch)
        if self._reregister is not None:
            await self._reregister(r.controller_id, None)

    def set_sync_state_set(self, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None:
        r = self.role
        if sync_state_set_epoch >= r.sync_state_set_epoch:
            r.sync_state_set, r.sync_state_set_epoch = sync_state_set, sync_state_set_epoch
            if self.repl.sync is not None:
                self.repl.sync.acked()  # a smaller set may release waiting sends
            self.repl.on_confirm()  # (and make more visible to readers)

    def in_sync_slaves(self, now_ms: int) -> frozenset[int]:
        """Slave ids caught up within ``ha_max_time_slave_not_catchup_ms`` (``now_ms``:
        ``time.monotonic()`` ms)."""
        master = self.repl.master
        if self.role.slave or master is None:
            return frozenset()
        return master.caught_up_brokers(now_ms, self.broker.config.ha_max_time_slave_not_catchup_ms)

    def set_lease(self, expires_mono_ms: int) -> None:
        self.role.lease_until_ms = expires_mono_ms

    def fence(self) -> None:
        self.role.fenced = True

    # -- the AutoSwitch handshake -------------------------------------------------------------------
    def _handshake(self) -> AutoHandshake:
        """This master's handshake reply: end, epoch, epoch entries."""
        return AutoHandshake(self.store.write_offset, self.role.master_epoch,
                             self.store.epochs.cache.pairs())

    def _frame(self, offset: int) -> tuple[int, int, int, int]:
        """A master's transfer frame at ``offset``: (epoch, its start, its end, confirm offset)."""
        entry = self.store.epochs.cache.find_by_offset(offset)
        if entry is None:  # below the first entry: written before controller mode, "epoch 0"
            entries = self.store.epochs.cache.entries()
            return 0, 0, entries[0].start_offset if entries else _OPEN_END, self.confirm_offset()
        return entry.epoch, entry.start_offset, entry.end_offset, self.confirm_offset()

    def _received(self, epochs: list[tuple[int, int]]) -> None:
        """A slave met newer epochs in transfer frames: into the epoch file, before their bytes."""
        for epoch, start in epochs:
            if not self.store.epochs.append(epoch, start):
                raise HaProtocolError(f"epoch {epoch} from {start} does not follow the epoch file "
                                      f"{self.store.epochs.cache.pairs()}")

    async def _truncate(self, hs: AutoHandshake) -> None:
        """A slave got its master's handshake: cut its log to the consistent point (crash-safe;
        the epoch file's entries after it go too: transfer frames bring the master's). Raises
        HaProtocolError when the logs share no epoch and this one is not empty (RocketMQ: no
        consistent point is an error), or when the master's epoch is older than this slave's."""
        if hs.master_epoch < self.role.master_epoch:
            raise HaProtocolError(f"master epoch {hs.master_epoch} is older than "
                                  f"{self.role.master_epoch}")
        mine, theirs = self.store.epochs.cache, EpochCache(hs.entries)
        end = self.store.write_offset
        point = mine.find_consistent_point(theirs, end)
        if point < 0 and end > self.store.min_offset and len(mine):
            raise HaProtocolError(f"no consistent point with the master's epochs {hs.entries}")
        point = end if point < 0 else min(point, end, hs.max_offset)
        if point < end:
            log.warning("truncating the commit log from %d to %d, the consistent point with the "
                        "master (epochs %s, its %s)", end, point, mine.pairs(), hs.entries)
            self.store.truncate_log(point)  # (on the loop: no checkpoint runs meanwhile)
        else:  # (epochs that began at the end and wrote nothing: the master's frames decide)
            self.store.epochs.truncate_suffix_by_offset(point)
