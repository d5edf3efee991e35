"""Three real ``txmq controller`` processes on loopback, driven over TCP with a raw remoting
client: registration, election, leader SIGKILL (the new leader has the same state), re-election
when a master's heartbeats stop, a lone minority refuses changes, and idle CPU."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from txmq.errors import ResponseCode
from txmq.protocol import (
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    BrokerReplicasInfo,
    Command,
    ElectMasterRequestHeader,
    FrameDecoder,
    GetMetaDataResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    RequestCode,
    SyncStateSet,
    decode_controller_body,
    encode_command,
    encode_controller_body,
    from_ext,
    parse_address,
    to_ext,
)
from txmq.testing import ControllerProcess, free_port, process_cpu_s, wait_until

B = "broker-a"


class Raw:
    """One blocking remoting connection."""

    def __init__(self, addr: str) -> None:
        self.sock = socket.create_connection(parse_address(addr), timeout=10)
        self.decoder = FrameDecoder()
        self.opaque = 0

    def call(self, code: int, header: object = None, body: bytes = b"") -> Command:
        self.opaque += 1
        ext = {} if header is None else to_ext(header)  # type: ignore[arg-type]
        self.sock.sendall(encode_command(Command(code, self.opaque, ext=ext, body=body)))
        while True:
            data = self.sock.recv(65536)
            assert data, "controller closed the connection"
            for cmd in self.decoder.feed(data):
                if cmd.is_response and cmd.opaque == self.opaque:
                    return cmd

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def controllers(tmp_path: Path) -> Iterator[list[ControllerProcess]]:
    rafts = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    procs = [ControllerProcess(tmp_path / f"c{i}", "127.0.0.1", 0, r,
                               [p for p in rafts if p != r]) for i, r in enumerate(rafts)]
    try:
        with ThreadPoolExecutor(3) as pool:  # start together: each takes seconds to import
            list(pool.map(ControllerProcess.start, procs))
        yield procs
    finally:
        for p in procs:
            p.kill()


def metadata(p: ControllerProcess) -> GetMetaDataResponseHeader | None:
    try:
        c = Raw(p.addr)
    except OSError:
        return None
    try:
        return from_ext(c.call(RequestCode.CONTROLLER_GET_METADATA_INFO).ext,
                        GetMetaDataResponseHeader)
    finally:
        c.close()


def leader_of(procs: list[ControllerProcess]) -> ControllerProcess:
    found: list[ControllerProcess] = []

    def agreed() -> bool:
        metas = [(p, metadata(p)) for p in procs]
        leaders = [p for p, m in metas if m is not None and m.is_leader]
        addrs = {m.controller_leader_address for _, m in metas if m is not None}
        if len(leaders) == 1 and addrs == {leaders[0].addr}:
            found[:] = leaders
            return True
        return False

    wait_until(agreed, timeout_s=30)
    return found[0]


def heartbeat(c: Raw, bid: int, epoch: int = 0, offset: int = 0) -> Command:
    return c.call(RequestCode.BROKER_HEARTBEAT, BrokerHeartbeatRequestHeader(
        cluster_name="c", broker_addr=f"127.0.0.1:{1000 + bid}", broker_name=B, broker_id=bid,
        epoch=epoch, max_offset=offset, heartbeat_timeout_mills=2000))


def replica_info(c: Raw) -> tuple[GetReplicaInfoResponseHeader, SyncStateSet]:
    r = c.call(RequestCode.CONTROLLER_GET_REPLICA_INFO, GetReplicaInfoRequestHeader(broker_name=B))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return (from_ext(r.ext, GetReplicaInfoResponseHeader),
            decode_controller_body(r.body, SyncStateSet))


def join(c: Raw, bid: int) -> None:
    r = c.call(RequestCode.CONTROLLER_APPLY_BROKER_ID, ApplyBrokerIdRequestHeader(
        cluster_name="c", broker_name=B, applied_broker_id=bid, register_check_code=f"k{bid}"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = c.call(RequestCode.CONTROLLER_REGISTER_BROKER, RegisterBrokerToControllerRequestHeader(
        cluster_name="c", broker_name=B, broker_id=bid, broker_address=f"127.0.0.1:{1000 + bid}"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert heartbeat(c, bid).code == ResponseCode.SUCCESS


def idle_cpu_share(procs: list[ControllerProcess], seconds: float) -> float:
    pids = [p.proc.pid for p in procs if p.proc is not None]
    before = sum(process_cpu_s(pid) for pid in pids)
    time.sleep(seconds)
    return (sum(process_cpu_s(pid) for pid in pids) - before) / seconds


def test_failover_of_controllers_and_masters(controllers: list[ControllerProcess]) -> None:
    leader = leader_of(controllers)
    share = idle_cpu_share(controllers, 5)
    assert share < 0.03, f"3 idle controllers used {share:.1%} of a core"
    follower = next(p for p in controllers if p is not leader)
    f = Raw(follower.addr)
    r = f.call(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID)
    assert r.code == ResponseCode.CONTROLLER_NOT_LEADER and leader.addr in (r.remark or "")
    f.close()

    c1, c2 = Raw(leader.addr), Raw(leader.addr)  # one connection per broker
    join(c1, 1)
    join(c2, 2)
    r = c1.call(RequestCode.CONTROLLER_ELECT_MASTER, ElectMasterRequestHeader(
        cluster_name="c", broker_name=B, broker_id=1))
    assert r.code == ResponseCode.SUCCESS, r.remark
    info, sss = replica_info(c1)
    assert (info.master_broker_id, info.master_epoch, sss.sync_state_set) == (1, 1, [1])
    r = c1.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, AlterSyncStateSetRequestHeader(
        broker_name=B, master_broker_id=1, master_epoch=1),
        encode_controller_body(SyncStateSet(sync_state_set=[1, 2], sync_state_set_epoch=1)))
    assert r.code == ResponseCode.SUCCESS, r.remark

    leader.kill()  # the Raft leader dies; the survivors elect one with the same state
    rest = [p for p in controllers if p is not leader]
    leader = leader_of(rest)
    c1, c2 = Raw(leader.addr), Raw(leader.addr)
    info, sss = replica_info(c1)
    assert (info.master_broker_id, info.master_epoch, sss.sync_state_set) == (1, 1, [1, 2])
    assert heartbeat(c1, 1, epoch=1, offset=10).code == ResponseCode.SUCCESS
    assert heartbeat(c2, 2, epoch=1, offset=10).code == ResponseCode.SUCCESS

    # the master's channel closes: after its lease (and the new leader's wait), broker 2 of the
    # SyncStateSet is elected with a new epoch
    c1.close()
    t0 = time.monotonic()
    wait_until(lambda: heartbeat(c2, 2, 1, 10).code == 0
               and replica_info(c2)[0].master_epoch == 2, timeout_s=20)
    print(f"new master {time.monotonic() - t0:.1f} s after the old one's channel closed")
    info, sss = replica_info(c2)
    assert (info.master_broker_id, sss.sync_state_set) == (2, [2])

    # master 2 stops too; broker 1 is alive but not in the SyncStateSet {2}: no unclean
    # election, the group has no master until broker 2 returns
    c1 = Raw(leader.addr)
    c2.close()
    wait_until(lambda: heartbeat(c1, 1).code == 0 and replica_info(c1)[0].master_broker_id
               is None, timeout_s=20)
    assert replica_info(c1)[0].master_epoch == 2
    c2 = Raw(leader.addr)
    wait_until(lambda: heartbeat(c2, 2, 2, 10).code == 0 and replica_info(c2)[0].master_epoch == 3,
               timeout_s=10)
    assert replica_info(c2)[0].master_broker_id == 2

    # a lone minority refuses changes
    for p in rest:
        if p is not leader:
            p.kill()
    lone = Raw(leader.addr)

    def refused() -> bool:
        r = lone.call(RequestCode.CONTROLLER_APPLY_BROKER_ID, ApplyBrokerIdRequestHeader(
            cluster_name="c", broker_name=B, applied_broker_id=3, register_check_code="k3"))
        assert r.code != ResponseCode.SUCCESS
        return r.code == ResponseCode.CONTROLLER_NOT_LEADER

    wait_until(refused, timeout_s=20)


def test_state_survives_sigkill_and_bad_input_is_answered(tmp_path: Path) -> None:
    p = ControllerProcess(tmp_path / "solo", "127.0.0.1", 0, f"127.0.0.1:{free_port()}", [])
    try:
        p.start()
        leader_of([p])
        c = Raw(p.addr)
        join(c, 1)
        r = c.call(RequestCode.CONTROLLER_ELECT_MASTER, ElectMasterRequestHeader(
            cluster_name="c", broker_name=B, broker_id=1))
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = c.call(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None, b'["broker-a","nope"]')
        data = decode_controller_body(r.body, BrokerReplicasInfo).replicas_info_table
        assert list(data) == [B] and data[B].master_broker_id == 1
        assert [(x.broker_id, x.alive) for x in data[B].in_sync_replicas] == [(1, True)]
        # a header without a required field, a body that is not JSON: answered, nothing lost
        r = c.call(RequestCode.CONTROLLER_APPLY_BROKER_ID)
        assert r.code == ResponseCode.CONTROLLER_INVALID_REQUEST
        r = c.call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, AlterSyncStateSetRequestHeader(
            broker_name=B, master_broker_id=1, master_epoch=1), b"{not json")
        assert r.code == ResponseCode.CONTROLLER_INVALID_REQUEST
        junk = socket.create_connection(parse_address(p.addr), timeout=5)
        junk.sendall(b"\x00\x00\x00\x08\xff\xff\xff\xffjunk")
        assert junk.recv(10) == b""  # a frame that cannot be trusted closes that connection
        junk.close()
        c.close()
        p.kill()
        p.start()  # same port, same store
        leader_of([p])
        c = Raw(p.addr)
        info, sss = replica_info(c)
        assert (info.master_broker_id, info.master_epoch, sss.sync_state_set) == (1, 1, [1])
        c.close()
    finally:
        p.kill()
