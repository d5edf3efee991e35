"""The broker's role as a runtime state (issue #26, controller mode).

:class:`RoleState` is the sans-IO state the broker's request handlers consult: master or slave,
the master epoch, and the fencing of writes (a lease from the controller; docs/replication.md
"Fencing").
"""

from __future__ import annotations

from collections.abc import Callable

from txmq.broker._config import BrokerConfig
from txmq.errors import ResponseCode

__all__ = ["FENCED_REMARK", "IN_SYNC_REPLICAS_REMARK", "LEASE_REMARK", "RoleState"]

FENCED_REMARK = "fenced: no role from the controller yet, or the role was lost"
"""Remark of SERVICE_NOT_AVAILABLE from a fenced broker (RocketMQ ``RunningFlags.makeFenced``
makes ``DefaultMessageStore.checkStoreStatus`` answer SERVICE_NOT_AVAILABLE)."""
LEASE_REMARK = "fenced: lease expired"
"""Remark of SERVICE_NOT_AVAILABLE from a master whose controller lease ran out (txmq)."""
IN_SYNC_REPLICAS_REMARK = "in-sync replicas not enough"
"""Remark of SYSTEM_ERROR when the SyncStateSet is smaller than ``min_in_sync_replicas``
(RocketMQ ``PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH``, which ``SendMessageProcessor``
answers as SYSTEM_ERROR with this remark)."""


class RoleState:
    """Who the broker is now.

    Classic mode: ``broker_role`` / ``broker_id`` of the config, never fenced. Controller mode:
    a fenced SLAVE until the controller names a role; a master writes only while
    ``clock() < lease_until_ms`` (RocketMQ has no lease, #7017).

    Args:
        config: the broker's.
        clock: ``time.monotonic()`` in ms (a parameter: tests move it).
    """

    def __init__(self, config: BrokerConfig, clock: Callable[[], int]) -> None:
        self.controller_mode = config.enable_controller_mode
        self.role: str = "SLAVE" if self.controller_mode else config.broker_role
        """RocketMQ ``brokerRole``: ASYNC_MASTER, SYNC_MASTER or SLAVE (controller mode: a
        master is SYNC_MASTER, as ``ReplicasManager.changeToMaster`` sets it)."""
        self.broker_id = -1 if self.controller_mode else config.broker_id
        """0 on a master; a slave's id (controller mode: the controller's, -1 until known)."""
        self.controller_id = -1
        """Controller mode: this broker's id at the controller (kept while master, when
        :attr:`broker_id` is 0)."""
        self.master_epoch = 0
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = 0
        self.fenced = self.controller_mode
        self.lease_until_ms = 0
        self.min_in_sync_replicas = config.min_in_sync_replicas
        self._clock = clock
        self.next_epoch_start: Callable[[int], int | None] = lambda epoch: None
        """Where the epoch after ``epoch`` began in this log (None: none after it); set by the
        shell from the epoch file."""

    @property
    def slave(self) -> bool:
        return self.role == "SLAVE"

    def now_ms(self) -> int:
        return self._clock()

    def write_refusal(self) -> tuple[ResponseCode, str] | None:
        """Why a write must be refused now, as (code, remark), or None: fenced or lease run out
        (SERVICE_NOT_AVAILABLE), or a SyncStateSet below ``min_in_sync_replicas`` (SYSTEM_ERROR,
        RocketMQ's IN_SYNC_REPLICAS_NOT_ENOUGH). The refusal of a (not fenced) SLAVE is the
        caller's."""
        if not self.controller_mode:
            return None
        if self.fenced:
            return ResponseCode.SERVICE_NOT_AVAILABLE, FENCED_REMARK
        if self.slave:
            return None
        if self._clock() >= self.lease_until_ms:
            return ResponseCode.SERVICE_NOT_AVAILABLE, LEASE_REMARK
        if len(self.sync_state_set) < self.min_in_sync_replicas:
            return ResponseCode.SYSTEM_ERROR, IN_SYNC_REPLICAS_REMARK
        return None

    def end_refusal(self, master_epoch: int | None, commit_log_offset: int,
                    ) -> tuple[ResponseCode, str] | None:
        """Why an END_TRANSACTION carrying ``master_epoch`` (the half's send answer's) for the
        half at ``commit_log_offset`` is refused, or None (design: docs/replication.md
        "Fencing"): a newer epoch than this broker's means this broker is stale
        (SERVICE_NOT_AVAILABLE: the producer retries at the new master); an older one whose
        offset lies at or past the start of the epoch that followed names bytes a truncation
        rewrote (ILLEGAL_OPERATION: the half settles by check-back)."""
        if master_epoch is None or not self.controller_mode:
            return None
        if master_epoch > self.master_epoch:
            return (ResponseCode.SERVICE_NOT_AVAILABLE,
                    f"fenced: stale master epoch {self.master_epoch}, the end names epoch "
                    f"{master_epoch}")
        if master_epoch < self.master_epoch:
            start = self.next_epoch_start(master_epoch)
            if start is not None and commit_log_offset >= start:
                return (ResponseCode.ILLEGAL_OPERATION,
                        f"stale end: offset {commit_log_offset} of epoch {master_epoch} was "
                        f"rewritten from {start} on; the half settles by check-back")
        return None

    def to_master(self, epoch: int, sss: frozenset[int], sss_epoch: int) -> None:
        self.role, self.broker_id, self.master_epoch = "SYNC_MASTER", 0, epoch
        self.sync_state_set, self.sync_state_set_epoch = sss, sss_epoch
        self.fenced = False

    def to_slave(self, epoch: int) -> None:
        self.role, self.master_epoch = "SLAVE", epoch
        self.broker_id = self.controller_id
        self.sync_state_set, self.fenced = frozenset(), False
