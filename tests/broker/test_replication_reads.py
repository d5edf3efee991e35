"""Reads from a slave, with real broker processes (issue #25): a slave wakes its held long-poll
pulls as soon as replicated data reaches a consume queue; a master tells a consumer that lags to
read from the slave (suggestWhichBrokerId), the SDK does, the slave sends it back once it caught
up, and the SDK falls back to the master when the slave is gone. Transaction ends go to masters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from test_replication import log_bytes, send

from txmq.client import (
    AsyncConnection,
    LocalTransactionState,
    Message,
    MessageExt,
    PullConsumer,
    TransactionProducer,
)
from txmq.errors import ResponseCode
from txmq.protocol import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    RequestCode,
    from_ext,
    to_ext,
)
from txmq.protocol import PullMessageResponseHeader as PullAnswer
from txmq.testing import BrokerProcess, NamesrvProcess, free_port, wait_until

TOPIC = "rep"
SUSPEND_MS = 15_000


def _group(tmp_path: Path, **common: Any) -> tuple[BrokerProcess, BrokerProcess]:
    ha = free_port()
    topics = {TOPIC: 2, "probe": 1, "tx": 1}
    master = BrokerProcess(tmp_path / "master", {"ha_listen_port": ha, "topics": topics, **common})
    slave = BrokerProcess(
        tmp_path / "slave",
        {
            "broker_role": "SLAVE",
            "broker_id": 1,
            "topics": topics,
            "ha_master_address": f"127.0.0.1:{ha}",
            **common,
        },
    )
    return master, slave


async def _held_pull(addr: str, offset: int, started: asyncio.Event) -> tuple[int, int, float]:
    """A long-poll pull of queue 0 from ``offset``: (response code, next offset, answered at)."""
    conn = AsyncConnection(addr, timeout_ms=SUSPEND_MS + 10_000)
    await conn.connect()
    try:
        h = PullMessageRequestHeader(
            consumer_group="g-held",
            topic=TOPIC,
            queue_id=0,
            queue_offset=offset,
            max_msg_nums=32,
            sys_flag=PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION,
            suspend_timeout_millis=SUSPEND_MS,
            subscription="*",
        )
        pending = asyncio.ensure_future(conn.request(RequestCode.PULL_MESSAGE, to_ext(h)))
        started.set()
        r = await pending
        return r.code, from_ext(r.ext, PullAnswer).next_begin_offset, time.monotonic()
    finally:
        await conn.close()


async def _max_offset(addr: str, queue_id: int) -> int:
    conn = AsyncConnection(addr, timeout_ms=10_000)
    await conn.connect()
    try:
        r = await conn.request(RequestCode.GET_MAX_OFFSET,
                               to_ext(GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=queue_id)))
        return int(from_ext(r.ext, OffsetResponseHeader).offset)
    finally:
        await conn.close()


def test_a_slave_wakes_its_held_pulls_when_replicated_data_arrives(tmp_path: Path) -> None:
    master, slave = _group(tmp_path)
    try:
        master.start()
        slave.start()
        send(master, {"first": b"x"})  # (queue 0) reaches the slave: the HA link is up
        wait_until(lambda: log_bytes(slave) == log_bytes(master) != b"", 30)
        # ...and its consume queue (dispatched after the flush that made the bytes durable)
        wait_until(lambda: asyncio.run(_max_offset(slave.endpoints, 0)) == 1, 30)

        async def scenario() -> tuple[int, int, float, float]:
            started = asyncio.Event()
            pull = asyncio.create_task(_held_pull(slave.endpoints, 1, started))
            await started.wait()
            await asyncio.sleep(1.0)  # the pull is held on the slave: nothing past offset 1
            assert not pull.done()
            sent_at = time.monotonic()
            await asyncio.to_thread(send, master, {"second": b"y"})  # queue 0 again
            code, nxt, answered_at = await pull
            return code, nxt, sent_at, answered_at

        code, nxt, sent_at, answered_at = asyncio.run(scenario())
        assert code == ResponseCode.SUCCESS and nxt == 2
        assert answered_at - sent_at < 3.0  # woken by the data, not at the 15 s poll timeout
    finally:
        slave.stop()
        master.stop()


def _metric(bp: BrokerProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{bp.config['metrics_port']}/metrics", timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _rpc_seen(bp: BrokerProcess, part: str) -> bool:
    """Whether ``bp`` answered a request whose code's name contains ``part`` (its rpc metrics)."""
    text = httpx.get(f"http://127.0.0.1:{bp.config['metrics_port']}/metrics", timeout=10).text
    return any(
        part in s.labels.get("request_code", "")
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    )


def test_a_lagging_consumer_reads_from_the_slave_and_ends_go_to_the_master(tmp_path: Path) -> None:
    ns = NamesrvProcess(tmp_path / "ns")
    ns.start()
    lag_limit = 64 * 1024
    master, slave = _group(tmp_path, namesrv_addr=ns.addr, access_message_in_memory_max_bytes=lag_limit)
    master.config["metrics_port"], slave.config["metrics_port"] = free_port(), free_port()
    sent = {f"M{i:05d}": bytes([i % 251]) * 1024 for i in range(600)}  # ~650 KiB, 10x the limit
    try:
        master.start()
        slave.start()
        assert {c for c, _ in send(master, sent).values()} == {ResponseCode.SUCCESS}

        class Commit:
            def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
                return LocalTransactionState.COMMIT_MESSAGE

            def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
                return LocalTransactionState.COMMIT_MESSAGE

        with TransactionProducer(
            "tx",
            namesrv_addr=ns.addr,
            listener=Commit(),
            oneway_end=False,  # ends are timed
        ) as tp:
            wait_until(lambda: 1 in tp.broker_addresses("broker-a"), 30)  # the route lists the slave
            r = tp.send_message_in_transaction(Message(topic=TOPIC, body=b"committed"))
            assert r.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        wait_until(lambda: log_bytes(slave) == log_bytes(master), 30)

        got: list[bytes] = []
        with PullConsumer(consumer_group="g-slow", namesrv_addr=ns.addr) as pc:
            wait_until(lambda: 1 in pc.broker_addresses("broker-a"), 30)
            for qid in range(2):
                off = 0
                while (res := pc.pull(TOPIC, qid, off, 32)).messages:
                    got += [m.body for m in res.messages]
                    off = res.messages[-1].queue_offset + 1
        assert sorted(got) == sorted([*sent.values(), b"committed"])  # every one, once
        on_slave = _metric(slave, "rocketmq_messages_out_total", consumer_group="g-slow")
        on_master = _metric(master, "rocketmq_messages_out_total", consumer_group="g-slow")
        assert on_slave > 0  # told to read from the slave, the SDK did
        assert on_master > 0  # the first pulls, and the tail once the slave sent it back
        assert on_slave + on_master == len(got)
        assert on_slave > len(got) // 2  # most of a 10x-the-limit backlog is read on the slave
        assert not _rpc_seen(slave, "end_transaction")  # ends go to masters only
        assert _rpc_seen(master, "end_transaction")

        with PullConsumer(consumer_group="g-fallback", namesrv_addr=ns.addr) as pc:
            wait_until(lambda: 1 in pc.broker_addresses("broker-a"), 30)
            first = pc.pull(TOPIC, 0, 0, 32)  # from the master, which suggests the slave
            slave.kill()
            again = pc.pull(TOPIC, 0, first.next_begin_offset, 32)  # the slave is gone: the master
            assert [m.queue_offset for m in again.messages][:1] == [first.next_begin_offset]
    finally:
        slave.stop()
        master.stop()
        ns.stop()
