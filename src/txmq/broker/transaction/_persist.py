"""Saving and loading the transaction index snapshot, and trimming the index by retention: the
part of :class:`~txmq.broker.transaction.TransactionService` that deals with its files
(``meta/transactionIndex.snapshot``, ``meta/transactionState.table``; see :mod:`._snapshot`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from txmq import limits
from txmq.broker._meta import load_json_meta
from txmq.broker.transaction._index import TransactionIndex
from txmq.broker.transaction._sink import SinkBatches
from txmq.broker.transaction._snapshot import TxSnapshot, decode_snapshot, snapshot_parts
from txmq.errors import CorruptRecord, StoreError
from txmq.protocol import HALF_TOPIC
from txmq.store import StateTable, Store

__all__ = ["SnapshotKeeper", "open_state_table"]

log = logging.getLogger("txmq.broker.transaction")

_SNAPSHOT_META = "transactionIndex.snapshot"
_LEGACY_SNAPSHOT_META = "transactionIndex.json"
_STATE_TABLE = "transactionState"


def _no_pause() -> None:
    return None


def open_state_table(store: Store) -> StateTable:
    """The store's transaction state table; one that cannot be opened is quarantined (the index is
    then rebuilt from the log), or as a last resort kept in memory. Never raises."""
    for _ in range(2):
        try:
            return store.state_table(_STATE_TABLE)
        except StoreError as exc:
            store.quarantine_meta(f"{_STATE_TABLE}.table", f"state table unusable: {exc}")
            store.quarantine_meta(_SNAPSHOT_META, "its state table was quarantined")
    log.error("transaction state table kept in memory: decided outcomes are rebuilt at each start")
    return StateTable()


class SnapshotKeeper:
    """The snapshot and retention methods of the transaction service (a base class: the
    service owns the attributes below)."""

    store: Store
    index: TransactionIndex
    sinks: SinkBatches
    stats: dict[str, int]
    _torn: dict[str, tuple[dict[str, int], dict[str, list[int]]]]
    _saved_sig: tuple[int, ...]
    _legacy_counts: dict[str, int]

    def load_snapshot(self) -> int:
        """Load the index snapshot; return the commit log offset from which stored transaction
        records must still be replayed with :meth:`recover` (0: no usable snapshot, replay all,
        with the state table cleared). A snapshot that does not parse, or is ahead of the log, is
        quarantined and logged. Never raises."""
        try:
            raw = self.store.load_meta(_SNAPSHOT_META)
            snap = decode_snapshot(raw) if raw is not None else None
            if snap is not None and snap.log_offset > self.store.write_offset:
                raise CorruptRecord(f"it reflects the log up to offset {snap.log_offset}, but the "
                                    f"log ends at {self.store.write_offset} (cut by recovery)")
        except (StoreError, CorruptRecord) as exc:
            where = self.store.quarantine_meta(_SNAPSHOT_META, f"unusable: {exc}")
            log.warning("transaction index snapshot unusable (%s)%s; rebuilding the index from "
                        "the whole log", exc, f", moved to {where}" if where else "")
            snap = None
        if snap is None:
            self._legacy_counts = load_json_meta(
                self.store, _LEGACY_SNAPSHOT_META, dict[str, int],
                "check counts of pending transactions restart at 0") or {}
            self.index.settled.reset()
            return 0
        self._apply_snapshot(snap)
        return snap.log_offset

    def _apply_snapshot(self, snap: TxSnapshot) -> None:
        for entry in snap.pending:
            self.index.add(entry)
            if entry.sink_batch:
                self.sinks.add(entry.sink_batch, entry.sink_task, entry.half_offset)
        self.index.discarded.update(snap.discarded)
        self.index.by_msg_id.update(snap.discarded_ids)
        self.index.discarded_ids.update(snap.discarded_ids)
        self.index.resumed.update(snap.resumed)
        self.index.settled.counts = {o: snap.settled_counts.get(o.value, 0)
                                     for o in self.index.settled.counts}
        self.sinks.committed.update(snap.sink_committed)
        self._torn.update(snap.torn)
        self._saved_sig = self._signature()

    def _signature(self) -> tuple[int, ...]:
        return (self.index.version, self.stats["checks_sent"], len(self.index.resumed),
                len(self.index.discarded), len(self._torn), len(self.sinks.committed))

    def save_snapshot(self) -> None:
        """Persist the index now, on this thread (at shutdown, and in tests):
        :meth:`prepare_snapshot`'s step run at once. Never raises."""
        step = self.prepare_snapshot()
        if step is not None:
            step()

    def prepare_snapshot(self, pause: Callable[[], None] = _no_pause) -> Callable[[], None] | None:
        """Copy what the index snapshot holds (on the event loop: references and dict copies,
        O(pending) pointer copies, no encoding) and return the step that saves it, for the
        broker shell's writer thread: fsync the state table of outcomes, encode the snapshot
        (the pending halves in chunks of ``limits.TX_SNAPSHOT_ENCODE_CHUNK``, calling ``pause``
        between them so the event loop gets the GIL), and replace the file (temp, fsync, rename:
        a crash at any point leaves the old or the new snapshot, both CRC-checked). None when
        nothing changed since the last save. A failing save (a full disk) is logged and tried
        again next time (a restart then replays more of the log); the step never raises. One
        step at a time."""
        sig = self._signature()
        if sig == self._saved_sig:
            return None
        idx = self.index
        by_id = idx.by_msg_id
        snap = TxSnapshot(
            version=limits.TX_SNAPSHOT_VERSION, log_offset=self.store.write_offset,
            pending=list(idx.pending.values()), discarded=dict(idx.discarded),
            discarded_ids={m: o for m, o in idx.discarded_ids.items() if by_id.get(m) == o},
            resumed=sorted(idx.resumed),
            settled_counts={o.value: n for o, n in idx.settled.counts.items()},
            sink_committed=dict(self.sinks.committed), torn=dict(self._torn))
        sync_table = idx.settled.table.prepare_sync()

        def step() -> None:
            try:
                sync_table()
                self.store.save_meta(_SNAPSHOT_META, snapshot_parts(snap, pause))
            except (OSError, StoreError) as exc:
                log.error("transaction index snapshot not saved (%s); a restart replays more of "
                          "the log", exc)
                return
            self._saved_sig = sig

        return step

    def trim(self, log_low: int) -> None:
        """Retention moved the commit log's first offset to ``log_low``: forget the outcomes of
        the halves it deleted and the discarded transactions whose copies it deleted
        (:meth:`TransactionIndex.trim`; the half queue's first offset is the store's). Logged
        when something went."""
        half_low = self.store.queue_bounds(HALF_TOPIC, 0)[0]
        moved, gone = self.index.trim(half_low, log_low)
        if moved or gone:
            log.info("retention: transaction outcomes below half offset %d and %d discarded "
                     "transactions forgotten", half_low, gone)
