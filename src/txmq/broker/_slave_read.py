"""Which member of its broker group a consumer should pull from next: the ``suggestWhichBrokerId``
of a PULL_MESSAGE answer (docs/replication.md, "Reads from the slave").

RocketMQ's rule (4.9.7 ``DefaultMessageStore.getMessage`` and ``PullMessageProcessor``): a pull
that found messages is *slow* when the bytes of commit log behind what it read
(``maxOffsetPy - maxPhyOffsetPulling``) exceed what memory holds (``accessMessageInMemoryMaxRatio``
40 % of physical memory); with ``slaveReadEnable`` a slow consumer is sent to
``whichBrokerWhenConsumeSlowly`` (1, the first slave) and any other to the group's ``brokerId``
(0, the master), which is how a slave sends a consumer that caught up back to its master. Without
``slaveReadEnable`` every answer suggests the master, and a slave answers PULL_RETRY_IMMEDIATELY.
txmq keeps no page-cache accounting: the limit is a byte count, ``access_message_in_memory_max_bytes``,
defaulting to RocketMQ's share of this machine's physical memory. Unlike RocketMQ (whose
``slaveReadEnable`` defaults to false), ``slave_read_enable`` is on by default.
"""

from __future__ import annotations

import os

from txmq import limits
from txmq.broker._config import BrokerConfig
from txmq.broker._role_state import RoleState
from txmq.protocol import MASTER_ID

__all__ = ["SlaveRead", "physical_memory_bytes"]


def physical_memory_bytes() -> int:
    """This machine's physical memory in bytes (RocketMQ ``StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE``);
    0 when the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


class SlaveRead:
    """The pull suggestion of one broker.

    Args:
        config: ``slave_read_enable`` and ``access_message_in_memory_max_bytes``
            (0: ``ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO_PERCENT`` of physical memory).
        role: the broker's role now (None: the config's ``broker_role``).
    """

    def __init__(self, config: BrokerConfig, role: RoleState | None = None) -> None:
        self.enabled = config.slave_read_enable
        self._role = role if role is not None else RoleState(config, lambda: 0)
        self.max_lag_bytes = config.access_message_in_memory_max_bytes or (
            physical_memory_bytes() * limits.ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO_PERCENT // 100
        )

    @property
    def refuses(self) -> bool:
        """A slave that does not serve reads: it answers PULL_RETRY_IMMEDIATELY, suggesting 0."""
        return self._role.slave and not self.enabled

    def suggest(self, lag_bytes: int) -> int:
        """The broker id to suggest after a pull that found messages, with ``lag_bytes`` of commit
        log past the last one it read: ``WHICH_BROKER_WHEN_CONSUME_SLOWLY`` when that exceeds
        :attr:`max_lag_bytes` and slave reads are on, else the master."""
        if self.enabled and self.max_lag_bytes > 0 and lag_bytes > self.max_lag_bytes:
            return limits.WHICH_BROKER_WHEN_CONSUME_SLOWLY
        return MASTER_ID
