"""Controller mode serves reads only up to the confirm offset (issue #26's long-run defect): a
message the master stored but its SyncStateSet does not hold yet is invisible to pulls and to
GET_MAX_OFFSET, so that no consumer reads past what a failover may truncate; a pull held at the
end is woken as soon as the slave's acknowledgement makes it visible. Real processes: a
controller, a master and a slave of one group; the slave is paused (SIGSTOP) to stall its acks."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from txmq.client import AsyncConnection
from txmq.errors import ResponseCode
from txmq.protocol import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    GetMaxOffsetRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    RequestCode,
    SendMessageRequestHeader,
    from_ext,
    to_ext,
)
from txmq.testing import BrokerProcess, ControllerProcess, free_port, wait_until

TOPIC = "t"
SUSPEND_MS = 20_000


def _broker(root: Path, name: str, ctl: ControllerProcess) -> BrokerProcess:
    # A single queue; acks of the SyncStateSet wait for the slave (all_ack_in_sync_state_set);
    # the slave stays in the SyncStateSet for 60 s without catching up (it is paused for less).
    return BrokerProcess(root / name, {"enable_controller_mode": True, "controller_addr": ctl.addr,
                                       "topics": {TOPIC: 1}, "sync_flush_timeout_ms": 1000,
                                       "ha_max_time_slave_not_catchup_ms": 60_000})


async def _request(addr: str, code: RequestCode, ext: dict[str, str],
                   timeout_ms: int = 10_000, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    conn = AsyncConnection(addr, timeout_ms=timeout_ms)
    await conn.connect()
    try:
        r = await conn.request(code, ext, body)
        return r.code, r.ext, r.body or b""
    finally:
        await conn.close()


def _send(addr: str, body: bytes) -> int:
    """One send to queue 0; its response code (FLUSH_SLAVE_TIMEOUT while the slave is paused)."""
    h = SendMessageRequestHeader(producer_group="pg", topic=TOPIC, default_topic="TBW102",
                                 default_topic_queue_nums=4, queue_id=0, sys_flag=0,
                                 born_timestamp=int(time.time() * 1000), flag=0, properties="")
    return asyncio.run(_request(addr, RequestCode.SEND_MESSAGE, to_ext(h), body=body))[0]


def _max_offset(addr: str) -> int:
    h = GetMaxOffsetRequestHeader(topic=TOPIC, queue_id=0)
    code, ext, _ = asyncio.run(_request(addr, RequestCode.GET_MAX_OFFSET, to_ext(h)))
    assert code == ResponseCode.SUCCESS
    return int(from_ext(ext, OffsetResponseHeader).offset)


async def _held_pull(addr: str, offset: int) -> tuple[int, int, bytes, float]:
    """A long-poll pull of queue 0 from ``offset``: (code, next offset, body, answered at)."""
    h = PullMessageRequestHeader(consumer_group="g", topic=TOPIC, queue_id=0, queue_offset=offset,
                                 max_msg_nums=32, sys_flag=PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION,
                                 suspend_timeout_millis=SUSPEND_MS, subscription="*")
    code, ext, body = await _request(addr, RequestCode.PULL_MESSAGE, to_ext(h), SUSPEND_MS + 10_000)
    return code, from_ext(ext, PullMessageResponseHeader).next_begin_offset, body, time.monotonic()


def test_pulls_see_only_what_the_sync_state_set_holds(tmp_path: Path) -> None:
    ctl = ControllerProcess(tmp_path / "ctl", "127.0.0.1", 0, f"127.0.0.1:{free_port()}", [])
    ctl.start()
    a, b = _broker(tmp_path, "a", ctl), _broker(tmp_path, "b", ctl)
    try:
        a.start()
        wait_until(lambda: _send(a.endpoints, b"first") == ResponseCode.SUCCESS, 30)
        b.start()
        assert b.proc is not None
        wait_until(lambda: _slave_holds_sends(a, b), 60)  # b is in the SyncStateSet
        wait_until(lambda: _send(a.endpoints, b"caught up") == ResponseCode.SUCCESS, 30)
        end = _max_offset(a.endpoints)  # all acknowledged by b: all visible

        b.proc.send_signal(signal.SIGSTOP)
        try:
            assert _send(a.endpoints, b"unconfirmed") == ResponseCode.FLUSH_SLAVE_TIMEOUT

            async def scenario() -> tuple[int, int, bytes, float, float]:
                pull = asyncio.create_task(_held_pull(a.endpoints, end))
                await asyncio.sleep(1.5)
                # stored on the master, not on the slave: not visible, the pull is held
                assert not pull.done()
                assert await asyncio.to_thread(_max_offset, a.endpoints) == end
                resumed_at = time.monotonic()
                b.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
                code, nxt, body, answered_at = await pull
                return code, nxt, body, resumed_at, answered_at

            code, nxt, body, resumed_at, answered_at = asyncio.run(scenario())
        finally:
            b.proc.send_signal(signal.SIGCONT)
        assert code == ResponseCode.SUCCESS and nxt == end + 1
        assert b"unconfirmed" in body
        assert answered_at - resumed_at < 5.0  # woken by the slave's ack, not the poll timeout
        assert _max_offset(a.endpoints) == end + 1
    finally:
        for p in (a, b, ctl):
            p.kill()


def _slave_holds_sends(a: BrokerProcess, b: BrokerProcess) -> bool:
    """Whether a send to ``a`` waits for ``b`` (b is in the SyncStateSet): with ``b`` paused it
    times out (FLUSH_SLAVE_TIMEOUT) instead of succeeding."""
    assert b.proc is not None
    b.proc.send_signal(signal.SIGSTOP)
    try:
        return _send(a.endpoints, b"probe") == ResponseCode.FLUSH_SLAVE_TIMEOUT
    finally:
        b.proc.send_signal(signal.SIGCONT)
