"""The broker's role interface for controller mode (docs/controller.md)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["RoleTarget"]


class RoleTarget(Protocol):
    """The broker as the replicas manager drives it (RocketMQ ReplicasManager -> BrokerController)."""
    def max_phy_offset(self) -> int: ...      # end of the durable commit log, bytes
    def confirm_offset(self) -> int: ...      # bytes acknowledged by every SyncStateSet member
    def last_epoch(self) -> int: ...          # newest master epoch in the epoch file, 0 if none
    async def become_master(self, master_epoch: int, sync_state_set: frozenset[int],
                            sync_state_set_epoch: int) -> None: ...
    async def become_slave(self, master_epoch: int, master_broker_id: int,
                           master_addr: str) -> None: ...
    def set_sync_state_set(self, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None: ...
    def in_sync_slaves(self, now_ms: int) -> frozenset[int]: ...  # slave broker ids caught up now
    def set_lease(self, expires_mono_ms: int) -> None: ...  # a master refuses writes from this time.monotonic() ms on  # noqa: E501
    def fence(self) -> None: ...               # refuse writes now (start-up, lost role, unknown state)
