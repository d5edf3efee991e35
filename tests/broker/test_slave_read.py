"""The pull answer's suggestWhichBrokerId (RocketMQ PullMessageProcessor's rule; real-process
tests are in test_replication_reads.py)."""

from __future__ import annotations

from txmq import limits
from txmq.broker import BrokerConfig
from txmq.broker._slave_read import SlaveRead, physical_memory_bytes


def test_a_lagging_pull_is_sent_to_the_slave_and_one_that_keeps_up_to_the_master() -> None:
    for role, bid in (("ASYNC_MASTER", 0), ("SYNC_MASTER", 0), ("SLAVE", 1)):
        sr = SlaveRead(BrokerConfig(broker_role=role, broker_id=bid, access_message_in_memory_max_bytes=1000))
        assert not sr.refuses
        assert sr.suggest(1001) == limits.WHICH_BROKER_WHEN_CONSUME_SLOWLY
        assert sr.suggest(1000) == 0 and sr.suggest(0) == 0


def test_without_slave_reads_everything_goes_to_the_master() -> None:
    master = SlaveRead(BrokerConfig(slave_read_enable=False, access_message_in_memory_max_bytes=1))
    assert master.suggest(10**12) == 0 and not master.refuses
    slave = SlaveRead(BrokerConfig(broker_role="SLAVE", broker_id=1, slave_read_enable=False))
    assert slave.refuses and slave.suggest(10**12) == 0


def test_the_default_limit_is_rocketmqs_share_of_physical_memory() -> None:
    sr = SlaveRead(BrokerConfig())
    assert sr.max_lag_bytes == physical_memory_bytes() * 40 // 100 > 0
