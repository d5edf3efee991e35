"""Master-slave replication with real broker processes over TCP (issue #25): a SYNC_MASTER answers
a send only once its slave has it, every acknowledged message survives the master's SIGKILL on the
slave byte for byte, slaves catch up (from empty, after a restart), and a slave refuses writes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from txmq.client import AsyncConnection, PullConsumer
from txmq.errors import ResponseCode
from txmq.protocol import (
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    RequestCode,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_offset_msg_id,
    encode_properties,
    from_ext,
    to_ext,
)
from txmq.store import FileStore, Record, StoreConfig, read_commit_log
from txmq.testing import BrokerProcess, NamesrvProcess, free_port, wait_until

TOPIC = "rep"
QUEUES = 2


def pair(tmp_path: Path, role: str = "SYNC_MASTER", **master_cfg: Any) -> tuple[BrokerProcess, BrokerProcess]:
    """A master (not started) and its slave (not started), fixed HA port."""
    ha = free_port()
    master = BrokerProcess(tmp_path / "master", {"broker_role": role, "ha_listen_port": ha,
                                                 "topics": {TOPIC: QUEUES, "probe": 1}, **master_cfg})
    slave = BrokerProcess(tmp_path / "slave", {"broker_role": "SLAVE", "broker_id": 1,
                                               "ha_master_address": f"127.0.0.1:{ha}",
                                               "topics": {TOPIC: QUEUES, "probe": 1}})
    return master, slave


def log_bytes(bp: BrokerProcess) -> bytes:
    return read_commit_log(bp.data_dir / "store")


async def _send(addr: str, bodies: dict[str, bytes], *, half: bool = False,
                topic: str = TOPIC) -> dict[str, tuple[int, Any]]:
    """Send each body (pipelined); return {id: (response code, SendMessageResponseHeader | None)}."""
    conn = AsyncConnection(addr, timeout_ms=20_000)
    await conn.connect()
    out: dict[str, tuple[int, Any]] = {}

    async def one(i: int, mid: str, body: bytes) -> None:
        props = {PROPERTY_UNIQ_KEY: mid, **({PROPERTY_TRANSACTION_PREPARED: "true"} if half else {})}
        h = SendMessageRequestHeader(producer_group="pg", topic=topic, queue_id=i % QUEUES,
                                     properties=encode_properties(props),
                                     born_timestamp=int(time.time() * 1000))
        r = await conn.request(RequestCode.SEND_MESSAGE, to_ext(h), body)
        stored = r.code in (ResponseCode.SUCCESS, ResponseCode.SLAVE_NOT_AVAILABLE,
                            ResponseCode.FLUSH_SLAVE_TIMEOUT)  # (RocketMQ: sendOK all three)
        out[mid] = (r.code, from_ext(r.ext, SendMessageResponseHeader) if stored else r.remark)

    sem = asyncio.Semaphore(16)

    async def gated(i: int, mid: str, body: bytes) -> None:
        async with sem:
            await one(i, mid, body)

    try:
        await asyncio.gather(*(gated(i, m, b) for i, (m, b) in enumerate(bodies.items())))
    finally:
        await conn.close()
    return out


def send(bp: BrokerProcess, bodies: dict[str, bytes], **kw: Any) -> dict[str, tuple[int, Any]]:
    return asyncio.run(_send(bp.endpoints, bodies, **kw))


def in_sync(master: BrokerProcess) -> None:
    """Wait until the SYNC_MASTER's slave is connected: a probe send is acknowledged SUCCESS."""
    def probe() -> bool:
        [(code, _)] = send(master, {"probe": b"p"}, topic="probe").values()
        return code == ResponseCode.SUCCESS
    wait_until(probe, 30)


def bodies(prefix: str, n: int) -> dict[str, bytes]:
    return {f"{prefix}{i:05d}": os.urandom(16) + f"{prefix}-{i}".encode() * (1 + i % 50) for i in range(n)}


def pulled(bp: BrokerProcess) -> dict[str, tuple[int, int, bytes]]:
    """Every message of TOPIC on ``bp``: {UNIQ_KEY: (queue id, queue offset, body)}."""
    out: dict[str, tuple[int, int, bytes]] = {}
    with PullConsumer(bp.endpoints) as pc:
        for qid in range(QUEUES):
            off = 0
            while (r := pc.pull(TOPIC, qid, off, 256)).messages:
                for m in r.messages:
                    out[m.properties[PROPERTY_UNIQ_KEY]] = (m.queue_id, m.queue_offset, m.body)
                off = r.messages[-1].queue_offset + 1
    return out


def test_sync_master_acknowledged_messages_survive_its_sigkill_on_the_slave(tmp_path: Path) -> None:
    master, slave = pair(tmp_path)
    try:
        master.start()
        slave.start()
        in_sync(master)
        sent = bodies("A", 300)
        acks = send(master, sent)
        assert {c for c, _ in acks.values()} == {ResponseCode.SUCCESS}
        halves = send(master, bodies("X", 20), half=True)
        assert {c for c, _ in halves.values()} == {ResponseCode.SUCCESS}
        for i, (_, h) in enumerate(halves.values()):
            end = TRANSACTION_COMMIT_TYPE if i % 2 == 0 else TRANSACTION_ROLLBACK_TYPE
            assert asyncio.run(_end(master.endpoints, h, end)).code == ResponseCode.SUCCESS
        master.kill()
        on_slave = pulled(slave)
        committed = {m for i, m in enumerate(halves) if i % 2 == 0}
        assert {m for m in on_slave if m.startswith("X")} == committed  # rolled back: not there
        for mid, (_, h) in acks.items():  # every acknowledged message, where its ack said
            assert on_slave[mid] == (h.queue_id, h.queue_offset, sent[mid])
        replica, original = log_bytes(slave), log_bytes(master)
        assert replica and original.startswith(replica)  # byte for byte, offsets included
    finally:
        master.kill()
        slave.stop()


async def _end(addr: str, half: SendMessageResponseHeader, commit_or_rollback: int) -> Any:
    conn = AsyncConnection(addr)
    await conn.connect()
    try:
        h = EndTransactionRequestHeader(
            producer_group="pg", tran_state_table_offset=half.queue_offset,
            commit_log_offset=decode_offset_msg_id(half.msg_id)[1],
            commit_or_rollback=commit_or_rollback, msg_id=half.transaction_id or "")
        return await conn.request(RequestCode.END_TRANSACTION, to_ext(h))
    finally:
        await conn.close()


def test_sync_master_without_a_slave_answers_slave_not_available(tmp_path: Path) -> None:
    master, _ = pair(tmp_path)
    try:
        master.start()
        [(code, _)] = send(master, bodies("B", 1)).values()
        assert code == ResponseCode.SLAVE_NOT_AVAILABLE
        assert len(pulled(master)) == 1  # stored on the master all the same (RocketMQ: sendOK)
        [(code, half)] = send(master, bodies("T", 1), half=True).values()
        assert code == ResponseCode.SLAVE_NOT_AVAILABLE
        ended = asyncio.run(_end(master.endpoints, half, TRANSACTION_COMMIT_TYPE))
        assert ended.code == ResponseCode.SLAVE_NOT_AVAILABLE  # the commit record waits too
        assert "T00000" in pulled(master)  # committed on the master all the same
    finally:
        master.stop()


def test_sync_master_answers_flush_slave_timeout_when_its_slave_stalls(tmp_path: Path) -> None:
    master, slave = pair(tmp_path, sync_flush_timeout_ms=500)
    try:
        master.start()
        slave.start()
        in_sync(master)
        assert {c for c, _ in send(master, bodies("C", 5)).values()} == {ResponseCode.SUCCESS}
        assert slave.proc is not None
        os.kill(slave.proc.pid, signal.SIGSTOP)
        try:
            [(code, _)] = send(master, bodies("D", 1)).values()
        finally:
            os.kill(slave.proc.pid, signal.SIGCONT)
        assert code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        wait_until(lambda: "D00000" in pulled(slave), 20)  # the slave gets it once it runs again
    finally:
        master.stop()
        slave.stop()


def test_an_empty_slave_catches_up_from_zero_and_again_after_a_restart(tmp_path: Path) -> None:
    master, slave = pair(tmp_path, role="ASYNC_MASTER")
    try:
        master.start()
        first = send(master, bodies("E", 400))
        assert {c for c, _ in first.values()} == {ResponseCode.SUCCESS}
        slave.start()  # empty: follows from offset 0
        wait_until(lambda: log_bytes(slave) == log_bytes(master), 30)
        slave.kill()
        send(master, bodies("F", 200))
        slave.start()  # recovers its log after SIGKILL, then follows from where it is
        wait_until(lambda: log_bytes(slave) == log_bytes(master), 30)
        assert pulled(slave) == pulled(master)
        assert len(pulled(slave)) == 600
    finally:
        master.stop()
        slave.stop()


def test_a_slave_refuses_sends_and_end_transaction(tmp_path: Path) -> None:
    master, slave = pair(tmp_path, role="ASYNC_MASTER")
    try:
        master.start()
        slave.start()
        [(code, remark)] = send(slave, bodies("G", 1)).values()
        assert code == ResponseCode.SERVICE_NOT_AVAILABLE and "slave" in remark
        [(code, _)] = send(slave, bodies("H", 1), half=True).values()
        assert code == ResponseCode.SERVICE_NOT_AVAILABLE

        async def end() -> Any:
            conn = AsyncConnection(slave.endpoints)
            await conn.connect()
            try:
                h = EndTransactionRequestHeader(producer_group="pg", tran_state_table_offset=0,
                                                commit_log_offset=0, commit_or_rollback=8, msg_id="M")
                return await conn.request(RequestCode.END_TRANSACTION, to_ext(h))
            finally:
                await conn.close()

        r = asyncio.run(end())
        assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE
        assert slave.config["ha_master_address"] in r.remark
        assert log_bytes(slave) == b""
    finally:
        master.stop()
        slave.stop()


def test_a_slave_learns_its_master_from_the_name_server(tmp_path: Path) -> None:
    ns = NamesrvProcess(tmp_path / "ns")
    ns.start()
    master = BrokerProcess(tmp_path / "master", {"ha_listen_port": free_port(),
                                                 "namesrv_addr": ns.addr, "topics": {TOPIC: QUEUES}})
    slave = BrokerProcess(tmp_path / "slave", {"broker_role": "SLAVE", "broker_id": 1,
                                               "namesrv_addr": ns.addr, "topics": {TOPIC: QUEUES}})
    try:
        master.start()
        assert {c for c, _ in send(master, bodies("N", 50)).values()} == {ResponseCode.SUCCESS}
        slave.start()  # no ha_master_address: its registration's answer names the master
        wait_until(lambda: log_bytes(slave) == log_bytes(master), 30)
        r = asyncio.run(_end(slave.endpoints, SendMessageResponseHeader(
            msg_id="7F00000100002A9F0000000000000000", queue_id=0, queue_offset=0,
            transaction_id="M"), TRANSACTION_COMMIT_TYPE))
        assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE and master.endpoints in r.remark
    finally:
        slave.stop()
        master.stop()
        ns.stop()


# -- metadata through the replicated log (issue #25 item 4) -------------------------------------
async def _call(addr: str, code: int, header: Any) -> Any:
    conn = AsyncConnection(addr, timeout_ms=20_000)
    await conn.connect()
    try:
        return await conn.request(code, to_ext(header))
    finally:
        await conn.close()


def commit_offset(bp: BrokerProcess, group: str, qid: int, offset: int, topic: str = TOPIC) -> None:
    h = UpdateConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=qid,
                                          commit_offset=offset)
    assert asyncio.run(_call(bp.endpoints, RequestCode.UPDATE_CONSUMER_OFFSET, h)).code == 0


def query_offset(bp: BrokerProcess, group: str, qid: int, topic: str = TOPIC) -> int | None:
    h = QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=qid,
                                         set_zero_if_not_found=False)
    r = asyncio.run(_call(bp.endpoints, RequestCode.QUERY_CONSUMER_OFFSET, h))
    return from_ext(r.ext, OffsetResponseHeader).offset if r.code == 0 else None


def test_offsets_and_a_topic_of_the_master_reach_the_slave_through_the_log(tmp_path: Path) -> None:
    master, slave = pair(tmp_path, role="ASYNC_MASTER")
    try:
        master.start()
        slave.start()
        send(master, bodies("O", 50))
        t0 = time.monotonic()
        for i in range(200):  # a commit storm: coalesced into one record a second at most
            commit_offset(master, "cg", i % QUEUES, i)
        storm_s = time.monotonic() - t0
        h = CreateTopicRequestHeader(topic="fresh", read_queue_nums=3, write_queue_nums=3)
        assert asyncio.run(_call(master.endpoints, RequestCode.UPDATE_AND_CREATE_TOPIC, h)).code == 0
        send(master, {"f1": b"fresh-body"}, topic="fresh")
        wait_until(lambda: (query_offset(slave, "cg", 0), query_offset(slave, "cg", 1)) == (198, 199), 30)
        assert query_offset(master, "cg", 0) == 198
        with PullConsumer(slave.endpoints) as pc:
            got = [m.body for q in range(3) for m in pc.pull("fresh", q, 0, 32).messages]
        assert got == [b"fresh-body"]
        assert "fresh" not in slave.config["topics"]  # the slave learned it from the log only
        h2 = GetMaxOffsetRequestHeader(topic="rmq_sys_CONSUMER_OFFSET", queue_id=0)
        r = asyncio.run(_call(master.endpoints, RequestCode.GET_MAX_OFFSET, h2))
        records = from_ext(r.ext, OffsetResponseHeader).offset
        assert 1 <= records <= storm_s + 2, (records, storm_s)
    finally:
        master.stop()
        slave.stop()


def test_a_slave_killed_and_restarted_keeps_offsets_not_older_than_before(tmp_path: Path) -> None:
    master, slave = pair(tmp_path, role="ASYNC_MASTER")
    try:
        master.start()
        slave.start()
        for q in range(QUEUES):
            commit_offset(master, "kg", q, 40 + q)
        wait_until(lambda: query_offset(slave, "kg", 1) == 41, 30)
        before = [query_offset(slave, "kg", q) for q in range(QUEUES)]
        slave.kill()  # SIGKILL: its offset file may be older than what it served
        commit_offset(master, "kg", 0, 50)
        slave.start()
        after = [query_offset(slave, "kg", q) for q in range(QUEUES)]
        assert all(a is not None and b is not None and a >= b for a, b in zip(after, before, strict=True))
        wait_until(lambda: query_offset(slave, "kg", 0) == 50, 30)
    finally:
        master.stop()
        slave.stop()


def test_a_hostile_system_record_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    master, slave = pair(tmp_path, role="ASYNC_MASTER")
    store = FileStore(master.data_dir / "store", StoreConfig())
    store.append([Record(topic="rmq_sys_CONSUMER_OFFSET", queue_id=0,
                         body=b'{"e": [["cg", "rep", 0, -7]]}')])  # valid CRC, illegal value
    store.flush()
    store.close()
    try:
        master.start()
        slave.start()
        commit_offset(master, "cg", 0, 3)
        wait_until(lambda: query_offset(slave, "cg", 0) == 3, 30)
        for bp in (master, slave):
            text = bp.log_path.read_text()
            assert "system record rmq_sys_CONSUMER_OFFSET queue offset 0 refused" in text, text[-2000:]
        assert query_offset(master, "cg", 0) == 3
    finally:
        master.stop()
        slave.stop()
