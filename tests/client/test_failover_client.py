"""Clients across a failover (issue #26 items 4 and 5, client half): the route is fetched again on
the first failure that says the master moved, the send and the end request go to the new master,
ends carry the half's master epoch. Sans-IO pieces directly; the producer against fake name
servers and brokers on real sockets (tests/client/test_cluster_defects.py's FakeServer)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from test_cluster_defects import Committing, FakeServer, route_body, serve

from txmq.client import AsyncTransactionProducer, LocalTransactionState, Message
from txmq.client._core import send_result
from txmq.client._route import RouteRefreshGate, master_may_have_moved
from txmq.client._transaction import TransactionCore
from txmq.errors import (
    BrokerUnavailable,
    ConnectTimeout,
    RemoteError,
    RequestTimeout,
    ResponseCode,
)
from txmq.protocol import (
    TRANSACTION_COMMIT_TYPE,
    BrokerData,
    Command,
    QueueData,
    RequestCode,
    TopicRouteData,
    decode_body,
    encode_body,
    encode_route,
    offset_msg_id,
)


# -- sans-IO ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("exc", "moved"), [
    (BrokerUnavailable("connection refused"), True),
    (ConnectTimeout("connect timed out"), True),
    (RequestTimeout("no answer"), True),
    (RemoteError.of(ResponseCode.SERVICE_NOT_AVAILABLE, "messages are put to the slave"), True),
    (RemoteError.of(ResponseCode.SLAVE_NOT_AVAILABLE, "store is slave mode"), True),
    (RemoteError.of(ResponseCode.SYSTEM_ERROR, "[IN_SYNC_REPLICAS_NOT_ENOUGH] 1 < 2"), True),
    (RemoteError.of(ResponseCode.SYSTEM_BUSY, "broker fenced: controller lease expired"), True),
    (RemoteError.of(ResponseCode.SYSTEM_ERROR, "not master"), True),
    (RemoteError.of(ResponseCode.SYSTEM_ERROR, "end of master epoch 3 refused at epoch 4"), True),
    (RemoteError.of(ResponseCode.SYSTEM_BUSY, "[PC_SYNCHRONIZED] broker busy, please retry"), False),
    (RemoteError.of(ResponseCode.MESSAGE_ILLEGAL, "body too large"), False),
    (RemoteError.of(ResponseCode.TRANSACTION_NOT_FOUND, "no half"), False),
    (ValueError("x"), False),
    (None, False),
])
def test_which_failures_say_the_master_may_have_moved(exc: BaseException | None,
                                                      moved: bool) -> None:
    assert master_may_have_moved(exc) is moved


def test_the_refresh_gate_allows_one_lookup_in_flight_and_one_per_interval() -> None:
    gate = RouteRefreshGate(200)
    assert gate.begin("t", 1_000)
    assert gate.in_flight("t") and not gate.begin("t", 1_000), "one in flight"
    assert gate.begin("u", 1_000), "per topic"
    gate.end("t")
    assert not gate.begin("t", 1_199), "at most one per 200 ms"
    assert gate.begin("t", 1_200)


def test_the_send_answer_s_master_epoch_goes_on_the_end_request() -> None:
    resp = Command(ResponseCode.SUCCESS, 1, ext={
        "msgId": offset_msg_id("127.0.0.1:10911", 4096), "queueId": "1", "queueOffset": "7",
        "masterEpoch": "3"})
    half = send_result("t", "ID", resp, "g")
    assert half.master_epoch == 3 and half.commit_log_offset == 4096
    core = TransactionCore("pg", None)  # type: ignore[arg-type]
    h = core.end_request(half, LocalTransactionState.COMMIT_MESSAGE)
    assert h.master_epoch == 3
    classic = send_result("t", "ID", Command(0, 1, ext={k: v for k, v in resp.ext.items()
                                                        if k != "masterEpoch"}), "g")
    assert classic.master_epoch is None
    assert core.end_request(classic, LocalTransactionState.COMMIT_MESSAGE).master_epoch is None


# -- the producer against fakes --------------------------------------------------------------------
class Group:
    """A name server whose route of broker group "g" names ``master`` (moved by the test), and two
    fake brokers: each answers sends (with ``masterEpoch``) or refuses them, and batch ends."""

    def __init__(self, a: FakeServer, b: FakeServer, ns: FakeServer) -> None:
        self.a, self.b, self.ns = a, b, ns
        self.master = a.addr
        self.refuse: set[str] = set()  # addresses that answer as a slave
        self.ends: dict[str, list[dict[str, str]]] = {a.addr: [], b.addr: []}
        self.sends: dict[str, int] = {a.addr: 0, b.addr: 0}

    def namesrv(self, cmd: Command) -> Command | None:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.response(0, body=route_body([("g", self.master, 2)]))
        return cmd.response(0)

    def broker(self, addr: str, epoch: int) -> Callable[[Command], Command | None]:
        def handle(cmd: Command) -> Command | None:
            if cmd.code == RequestCode.SEND_MESSAGE_V2:
                self.sends[addr] += 1
                if addr in self.refuse:
                    return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                        "service not available now: messages are put to the slave")
                return cmd.response(0, ext={
                    "msgId": offset_msg_id(addr, 100 * self.sends[addr]), "queueId": "0",
                    "queueOffset": str(self.sends[addr]), "masterEpoch": str(epoch)})
            if cmd.code == RequestCode.END_TRANSACTION_BATCH:
                items = decode_body(cmd.body, list[dict[str, str]])
                self.ends[addr].extend(items)
                code = ResponseCode.SLAVE_NOT_AVAILABLE if addr in self.refuse else 0
                return cmd.response(0, body=encode_body(
                    [{"code": int(code), "remark": "store is slave mode", "outcome": "COMMIT"}
                     for _ in items]))
            return cmd.response(0)
        return handle


def with_group(body: Callable[[Group], None]) -> None:
    holder: list[Group] = []
    with serve(lambda c: holder[0].broker(holder[0].a.addr, 1)(c)) as a, \
            serve(lambda c: holder[0].broker(holder[0].b.addr, 2)(c)) as b, \
            serve(lambda c: holder[0].namesrv(c)) as ns:
        holder.append(Group(a, b, ns))
        body(holder[0])


def producer(g: Group) -> AsyncTransactionProducer:
    return AsyncTransactionProducer("pg", "", Committing(), namesrv_addr=g.ns.addr,
                                    timeout_ms=3_000, poll_name_server_interval_ms=600_000)


def test_a_send_refused_by_a_slave_refreshes_the_route_and_reaches_the_new_master() -> None:
    def body(g: Group) -> None:
        async def main() -> None:
            p = producer(g)
            try:
                assert (await p.send(Message(topic="t", body=b"1"))).master_epoch == 1
                g.refuse.add(g.a.addr)  # the old master became a slave...
                g.master = g.b.addr     # ...and the name server names the new one
                r = await p.send(Message(topic="t", body=b"2"))
                assert r.master_epoch == 2 and r.broker_name == "g"
                assert g.sends == {g.a.addr: 2, g.b.addr: 1}, "one failed attempt, then the new master"
                now = time.time_ns() // 1_000_000
                p.faults.update("g", 0, now, failed=True)  # as a connection to the old master
                g.master = g.a.addr
                await p.route("t", refresh=True)  # moves back: a new master for "g"
                assert p.faults.available("g", now) and p.faults.reachable("g"), \
                    "a new master is not avoided for its predecessor's failures"
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_a_send_to_a_dead_master_refreshes_at_once_and_lookups_are_rate_limited() -> None:
    def body(g: Group) -> None:
        async def main() -> None:
            p = producer(g)
            try:
                await p.send(Message(topic="t", body=b"1"))
                lookups = g.ns.codes().count(RequestCode.GET_ROUTEINFO_BY_TOPIC)
                g.a.close()  # SIGKILL: connections reset, connects refused
                g.master = g.b.addr
                results = await asyncio.gather(*(p.send(Message(topic="t", body=b"x"))
                                                 for _ in range(20)))
                assert {r.master_epoch for r in results} == {2}
                more = g.ns.codes().count(RequestCode.GET_ROUTEINFO_BY_TOPIC) - lookups
                assert 1 <= more <= 2, f"{more} lookups for 20 concurrent failures"
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_an_end_refused_by_the_old_master_is_retried_once_at_the_new_master() -> None:
    def body(g: Group) -> None:
        async def main() -> None:
            p = producer(g)
            try:
                half = await p.send_half(Message(topic="t", body=b"h"))
                assert half.master_epoch == 1
                g.refuse.add(g.a.addr)
                g.master = g.b.addr
                outcome = await p.end_transaction(half, LocalTransactionState.COMMIT_MESSAGE)
                assert outcome == "COMMIT" and p.end_failures == 0
                (first,), (retry,) = g.ends[g.a.addr], g.ends[g.b.addr]
                assert first == retry, "the same request: one outcome, the half's epoch"
                assert first["masterEpoch"] == "1"
                assert int(first["commitOrRollback"]) == TRANSACTION_COMMIT_TYPE
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_an_end_that_fails_twice_is_left_to_check_back(caplog: pytest.LogCaptureFixture) -> None:
    def body(g: Group) -> None:
        async def main() -> None:
            p = producer(g)
            try:
                half = await p.send_half(Message(topic="t", body=b"h"))
                g.refuse.update({g.a.addr, g.b.addr})  # no master took over yet
                g.master = g.b.addr
                with caplog.at_level("INFO", "txmq.client"):
                    outcome = await p.end_transaction(half, LocalTransactionState.ROLLBACK_MESSAGE)
                assert outcome == "UNKNOWN_END" and p.end_failures == 1
                assert len(g.ends[g.a.addr]) == 1 and len(g.ends[g.b.addr]) == 1, "retried once"
                assert any("check-back" in r.message for r in caplog.records)
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_an_end_refused_for_another_reason_is_not_retried() -> None:
    def body(g: Group) -> None:
        async def main() -> None:
            p = producer(g)
            try:
                half = await p.send_half(Message(topic="t", body=b"h"))
                g.a.handler = lambda c: c.response(0, body=encode_body([{
                    "code": int(ResponseCode.TRANSACTION_NOT_FOUND), "remark": "no half",
                    "outcome": ""}])) if c.code == RequestCode.END_TRANSACTION_BATCH else \
                    c.response(0)
                outcome = await p.end_transaction(half, LocalTransactionState.COMMIT_MESSAGE)
                assert outcome == "UNKNOWN_END"
                assert g.a.codes().count(RequestCode.END_TRANSACTION_BATCH) == 1
                assert g.ends[g.b.addr] == []
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def slave_only_when_no_master(g: Group) -> Callable[[Command], Command | None]:
    """A name server whose route of "g" names ``g.master``, or only the slave ``g.b`` while
    ``g.master`` is ""."""
    def namesrv(cmd: Command) -> Command | None:
        if cmd.code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.response(0)
        return cmd.response(0, body=encode_route(TopicRouteData(
            queue_datas=[QueueData(broker_name="g", read_queue_nums=2, write_queue_nums=2,
                                   perm=6)],
            broker_datas=[BrokerData(cluster="c", broker_name="g",
                                     broker_addrs={0: g.master} if g.master else
                                     {1: g.b.addr})])))
    return namesrv


def test_sends_while_the_group_has_no_master_ask_the_name_server_a_few_times_a_second() -> None:
    """Between the old master's departure and the new one's registration the route names a slave
    only: sends fail with BrokerUnavailable, looking the route up at most once per
    NAMESRV_REFRESH_MIN_INTERVAL_MS, and the first send after the new master registers goes
    there."""
    def body(g: Group) -> None:
        g.ns.handler = slave_only_when_no_master(g)

        async def main() -> None:
            p = producer(g)
            try:
                await p.send(Message(topic="t", body=b"1"))
                g.master = ""
                await p.route("t", refresh=True)
                lookups = g.ns.codes().count(RequestCode.GET_ROUTEINFO_BY_TOPIC)
                for _ in range(20):
                    with pytest.raises(BrokerUnavailable, match="no writable queue"):
                        await p.send(Message(topic="t", body=b"x"))
                assert g.ns.codes().count(RequestCode.GET_ROUTEINFO_BY_TOPIC) - lookups <= 1
                g.master = g.b.addr
                await asyncio.sleep(0.25)  # NAMESRV_REFRESH_MIN_INTERVAL_MS
                assert (await p.send(Message(topic="t", body=b"y"))).master_epoch == 2
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_a_send_lost_with_its_master_while_the_route_has_none_raises_broker_unavailable() -> None:
    """A send in flight when its master dies (connection reset: it may be stored) and a route
    fetched again that names no master yet: the send fails with BrokerUnavailable (TxmqError), not
    ValueError from the queue selector (found by benchmarks/failover.py)."""
    def body(g: Group) -> None:
        def dying_master(cmd: Command) -> Command | None:
            if cmd.code != RequestCode.SEND_MESSAGE_V2:
                return cmd.response(0)
            g.master = ""  # the name server lists the slave only
            g.a.close()    # SIGKILL with the request in flight
            return None

        g.ns.handler = slave_only_when_no_master(g)

        async def main() -> None:
            p = producer(g)
            try:
                await p.send(Message(topic="t", body=b"1"))
                g.a.handler = dying_master
                with pytest.raises(BrokerUnavailable):
                    await p.send(Message(topic="t", body=b"x"))
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)



def test_a_group_without_a_master_is_looked_up_again_while_sends_go_to_the_other_group() -> None:
    """Two groups; g2's master dies and the route names only its slave: sends go to g1 and fail
    nowhere, so no failure asks for the route again. The producer still looks it up in the
    background (as the refresh gate allows) and its sends reach g2's new master well before its
    30 s timer (here 600 s). The chaos failover run found this: 12–26 s without sends to the group
    whose master was killed."""
    def body(g: Group) -> None:
        g2_master: list[str] = [g.b.addr]

        def namesrv(cmd: Command) -> Command | None:
            if cmd.code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
                return cmd.response(0)
            return cmd.response(0, body=encode_route(TopicRouteData(
                queue_datas=[QueueData(broker_name=n, read_queue_nums=1, write_queue_nums=1, perm=6)
                             for n in ("g1", "g2")],
                broker_datas=[BrokerData(cluster="c", broker_name="g1", broker_addrs={0: g.a.addr}),
                              BrokerData(cluster="c", broker_name="g2",
                                         broker_addrs={0: g2_master[0]} if g2_master[0]
                                         else {1: g.b.addr})])))
        g.ns.handler = namesrv

        async def main() -> None:
            p = producer(g)
            try:
                names = {(await p.send(Message(topic="t", body=b"1"))).broker_name for _ in range(4)}
                assert names == {"g1", "g2"}
                g2_master[0] = ""
                await p.route("t", refresh=True)
                names = {(await p.send(Message(topic="t", body=b"2"))).broker_name for _ in range(4)}
                assert names == {"g1"}
                g2_master[0] = g.b.addr  # the new master registers
                await asyncio.sleep(0.25)  # NAMESRV_REFRESH_MIN_INTERVAL_MS
                await p.send(Message(topic="t", body=b"3"))  # starts the lookup
                await asyncio.sleep(0.3)
                names = {(await p.send(Message(topic="t", body=b"4"))).broker_name for _ in range(4)}
                assert "g2" in names, "g2's new master not seen without a failed send"
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_a_new_master_after_a_gap_without_one_is_not_avoided_for_the_old_one_s_failures() -> None:
    """Old master a fails (isolated 10 s by the fault strategy), the route names no master for a
    while, then b: b is chosen at once. The chaos failover run found every failover taking
    10 s: the gap hid the move from a to b, so the group stayed avoided."""
    def body(g: Group) -> None:
        def namesrv(cmd: Command) -> Command | None:
            if cmd.code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
                return cmd.response(0)
            return cmd.response(0, body=encode_route(TopicRouteData(
                queue_datas=[QueueData(broker_name="g", read_queue_nums=2, write_queue_nums=2,
                                       perm=6)],
                broker_datas=[BrokerData(cluster="c", broker_name="g",
                                         broker_addrs={0: g.master} if g.master else
                                         {1: g.b.addr})])))
        g.ns.handler = namesrv

        async def main() -> None:
            p = producer(g)
            try:
                await p.send(Message(topic="t", body=b"1"))
                now = time.time_ns() // 1_000_000
                p.faults.update("g", 0, now, failed=True)  # as a connection to the old master
                assert not p.faults.available("g", now)
                g.master = ""
                await p.route("t", refresh=True)
                g.master = g.b.addr
                await p.route("t", refresh=True)
                assert p.faults.available("g", now), "the new master avoided for a's failure"
            finally:
                await p.shutdown()
        asyncio.run(main())
    with_group(body)


def test_a_group_avoided_after_a_failure_is_looked_up_again_in_the_background() -> None:
    """Two groups; sends to group "g" failed (its master died) and the fault strategy avoids it
    for FAULT_ISOLATION_LATENCY_MS (10 s), so every send goes to "h" and none fails to ask for
    the route. The producer still looks the route up every UNREACHABLE_ROUTE_REFRESH_MS while a
    group is avoided, finds g's new master, and sends reach it within about a second, not 10 s
    (found by the 200-fault failover run: group writes resumed 10-19 s after a kill)."""
    def body(g: Group) -> None:
        with serve(lambda c: g.broker(g.a.addr, 1)(c)) as other:  # (counted as a's)

            def namesrv(cmd: Command) -> Command | None:
                if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                    return cmd.response(0, body=route_body([("g", g.master, 2),
                                                            ("h", other.addr, 2)]))
                return cmd.response(0)
            g.ns.handler = namesrv

            async def main() -> None:
                p = producer(g)
                try:
                    await p.send(Message(topic="t", body=b"1"))
                    p.faults.update("g", 0, time.time_ns() // 1_000_000, failed=True)
                    g.a.close()
                    g.master = g.b.addr  # elected; the cached route still names a
                    t0 = time.monotonic()
                    while g.sends[g.b.addr] == 0:
                        assert time.monotonic() - t0 < 3.0, "group g never found its new master"
                        await p.send(Message(topic="t", body=b"x"))
                        await asyncio.sleep(0.05)
                    lookups = g.ns.codes().count(RequestCode.GET_ROUTEINFO_BY_TOPIC)
                    assert lookups <= 4, f"{lookups} route lookups in {time.monotonic() - t0:.1f} s"
                finally:
                    await p.shutdown()
            asyncio.run(main())
    with_group(body)
