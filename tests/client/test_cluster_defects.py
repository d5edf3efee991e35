"""Regression tests of issue #23's client defects 1, 3-8, at unit level: the clients against fake
brokers and name servers on real sockets (frames decoded and answered by a handler), so each
broker's answer is chosen by the test. Each fails on the client before the cluster core (183b95f).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from txmq.client import (
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    TransactionProducer,
)
from txmq.client._core import SendStatus
from txmq.errors import BrokerUnavailable, ConfigError, ConnectTimeout, ResponseCode
from txmq.protocol import (
    FLAG_ONEWAY,
    TRANSACTION_ROLLBACK_TYPE,
    BrokerData,
    ClusterInfo,
    Command,
    FrameDecoder,
    QueueData,
    RequestCode,
    TopicRouteData,
    decode_body,
    encode_body,
    encode_cluster_info,
    encode_command,
    encode_route,
    offset_msg_id,
)

Handler = Callable[[Command], Command | None]
PERM_RW = 6


class FakeServer:
    """A remoting server on 127.0.0.1: every request frame goes to ``handler``; what it returns is
    sent back. Threads only (no event loop), so sync and async clients can both use it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Command] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        dec = FrameDecoder()
        with contextlib.suppress(OSError):
            while data := c.recv(65536):
                for cmd in dec.feed(data):
                    self.requests.append(cmd)
                    resp = self.handler(cmd)
                    if resp is not None:
                        c.sendall(encode_command(resp))

    def codes(self) -> list[int]:
        return [r.code for r in self.requests]

    def close(self) -> None:
        self._sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


@contextlib.contextmanager
def serve(handler: Handler) -> Iterator[FakeServer]:
    s = FakeServer(handler)
    try:
        yield s
    finally:
        s.close()


def route_body(topic_queues: list[tuple[str, str, int]]) -> bytes:
    """GET_ROUTEINFO_BY_TOPIC body: (broker name, master address, queues) per broker group."""
    return encode_route(TopicRouteData(
        queue_datas=[QueueData(broker_name=n, read_queue_nums=q, write_queue_nums=q, perm=PERM_RW)
                     for n, _, q in topic_queues],
        broker_datas=[BrokerData(cluster="c", broker_name=n, broker_addrs={0: a})
                      for n, a, _ in topic_queues]))


class FakeBroker:
    """Answers heartbeats, its own route (``queues`` of every topic), sends (``send_code``) and
    batch ends (``end_code`` for the whole request, or each end answered ``end_item_code``)."""

    def __init__(self, name: str = "broker-x", queues: int = 2,
                 send_code: int = ResponseCode.SUCCESS, end_code: int = ResponseCode.SUCCESS,
                 end_item_code: int = ResponseCode.SUCCESS) -> None:
        self.name, self.queues = name, queues
        self.send_code, self.end_code, self.end_item_code = send_code, end_code, end_item_code
        self.offset = 0
        self.server = FakeServer(self)
        self.addr = self.server.addr
        self.sent: list[Command] = []
        self.ends: list[dict[str, str]] = []

    def __call__(self, cmd: Command) -> Command | None:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.response(0, body=route_body([(self.name, self.addr, self.queues)]))
        if cmd.code == RequestCode.SEND_MESSAGE_V2:
            self.sent.append(cmd)
            self.offset += 1
            qid = cmd.ext.get("e", cmd.ext.get("queueId", "0"))
            return cmd.response(self.send_code, ext={
                "msgId": offset_msg_id("127.0.0.1:10911", 1000 + self.offset),
                "queueId": qid, "queueOffset": str(self.offset)})
        if cmd.code == RequestCode.END_TRANSACTION_BATCH:
            items = decode_body(cmd.body, list[dict[str, str]])
            self.ends.extend(items)
            if self.end_code != ResponseCode.SUCCESS:
                return cmd.response(self.end_code, remark="end refused")
            return cmd.response(0, body=encode_body(
                [{"code": self.end_item_code, "remark": "no", "outcome": "COMMIT"}
                 for _ in items]))
        if cmd.flag & FLAG_ONEWAY:
            return None
        return cmd.response(0)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def fake() -> Iterator[Callable[..., FakeBroker]]:
    made: list[FakeBroker] = []

    def make(**kw: Any) -> FakeBroker:
        made.append(FakeBroker(**kw))
        return made[-1]
    yield make
    for b in made:
        b.close()


class Committing:
    def __init__(self) -> None:
        self.calls = 0

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.calls += 1
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


# -- defect 1: an end refused by the broker does not raise after the local commit ------------------
@pytest.mark.parametrize("refusal", ["request", "item"])
def test_end_refused_by_the_broker_is_unconfirmed_not_raised(
        fake: Callable[..., FakeBroker], refusal: str) -> None:
    kw = ({"end_code": ResponseCode.SYSTEM_ERROR} if refusal == "request"
          else {"end_item_code": ResponseCode.TRANSACTION_STATE_GROUP_WRONG})
    b = fake(**kw)
    listener = Committing()
    with TransactionProducer("g1", b.addr, listener) as tp:
        r = tp.send_message_in_transaction(Message(topic="t", body=b"x"))
        assert listener.calls == 1
        assert r.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
        assert r.end_confirmed is False and r.outcome == "UNKNOWN_END"
        assert tp._a.end_failures == 1
    assert len(b.ends) == 1


# -- defect 8: weaker send statuses are statuses; such a half is rolled back without running -------
@pytest.mark.parametrize("status", ["FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT",
                                    "SLAVE_NOT_AVAILABLE"])
def test_weaker_send_statuses(fake: Callable[..., FakeBroker], status: str) -> None:
    b = fake(send_code=ResponseCode[status])
    with Producer("g8", b.addr) as p:
        r = p.send(Message(topic="t", body=b"x"))
    assert r.status is SendStatus[status] and len(b.sent) == 1  # not retried: it is stored
    listener = Committing()
    with TransactionProducer("g8t", b.addr, listener) as tp:
        tr = tp.send_message_in_transaction(Message(topic="t", body=b"y"))
    assert listener.calls == 0
    assert tr.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
    assert [int(e["commitOrRollback"]) for e in b.ends] == [TRANSACTION_ROLLBACK_TYPE]


# -- defect 3: each topic to its own broker per its route; the second name server is used ----------
def test_topics_go_to_the_brokers_of_their_routes_via_the_second_name_server(
        fake: Callable[..., FakeBroker]) -> None:
    a, b = fake(name="broker-a", queues=2), fake(name="broker-b", queues=2)
    routes = {"ta": [("broker-a", a.addr, 2)], "tb": [("broker-b", b.addr, 2)]}

    def namesrv(cmd: Command) -> Command:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.response(0, body=route_body(routes[cmd.ext["topic"]]))
        if cmd.code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return cmd.response(0, body=encode_cluster_info(ClusterInfo(broker_addr_table={
                "broker-a": BrokerData(cluster="c", broker_name="broker-a",
                                       broker_addrs={0: a.addr}),
                "broker-b": BrokerData(cluster="c", broker_name="broker-b",
                                       broker_addrs={0: b.addr})})))
        return cmd.response(0)

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, not listening: refused
    dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
    try:
        with serve(namesrv) as ns, Producer("g3", namesrv_addr=f"{dead_addr};{ns.addr}") as p:
            ra = [p.send(Message(topic="ta", body=b"%d" % i)) for i in range(4)]
            rb = [p.send(Message(topic="tb", body=b"%d" % i)) for i in range(4)]
    finally:
        dead.close()
    assert {r.broker_name for r in ra} == {"broker-a"} and len(a.sent) == 4
    assert {r.broker_name for r in rb} == {"broker-b"} and len(b.sent) == 4


def test_a_route_without_a_master_is_broker_unavailable_not_a_value_error(
        fake: Callable[..., FakeBroker]) -> None:
    b = fake(name="broker-a")

    def namesrv(cmd: Command) -> Command:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:  # only a slave (id 1) left
            return cmd.response(0, body=encode_route(TopicRouteData(
                queue_datas=[QueueData(broker_name="broker-a", read_queue_nums=2,
                                       write_queue_nums=2, perm=PERM_RW)],
                broker_datas=[BrokerData(cluster="c", broker_name="broker-a",
                                         broker_addrs={1: b.addr})])))
        return cmd.response(0, body=encode_cluster_info(ClusterInfo()))

    with (serve(namesrv) as ns, Producer("g3m", namesrv_addr=ns.addr) as p,
          pytest.raises(BrokerUnavailable, match="no writable queue")):
        p.send(Message(topic="tm", body=b"x"))
    assert b.sent == []


# -- defect 4: routes are refreshed: widened topics use new queues, shrunk ones do not fail -------
def test_a_widened_then_shrunk_topic_after_route_refresh(fake: Callable[..., FakeBroker]) -> None:
    b = fake(name="broker-a", queues=2)
    nums = {"n": 2}

    def namesrv(cmd: Command) -> Command:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.response(0, body=route_body([("broker-a", b.addr, nums["n"])]))
        return cmd.response(0, body=encode_cluster_info(ClusterInfo()))

    def queues_of(p: Producer, n: int) -> set[int]:
        return {p.send(Message(topic="tw", body=b"x")).queue_id for _ in range(n)}

    with serve(namesrv) as ns, Producer("g4", namesrv_addr=ns.addr,
                                        poll_name_server_interval_ms=200) as p:
        assert queues_of(p, 8) == {0, 1}
        nums["n"] = 4
        deadline = time.monotonic() + 5
        while p.queue_nums("tw") != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queues_of(p, 8) == {0, 1, 2, 3}
        nums["n"] = 1
        deadline = time.monotonic() + 5
        while p.queue_nums("tw") != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queues_of(p, 4) == {0}


# -- defect 5: connects time out ------------------------------------------------------------------
@contextlib.contextmanager
def unreachable() -> Iterator[str]:
    """An address whose SYNs are dropped: a listener with a full accept backlog (Linux drops SYNs
    to a socket whose accept queue is full, so connect() hangs)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    addr = srv.getsockname()
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):
            c = socket.socket()
            c.settimeout(0.3)
            fillers.append(c)
            try:
                c.connect(addr)
            except TimeoutError:
                break
        else:
            pytest.skip("the kernel did not drop SYNs to a full backlog")
        yield f"127.0.0.1:{addr[1]}"
    finally:
        for c in fillers:
            c.close()
        srv.close()


def test_start_against_an_unreachable_host_fails_within_the_connect_timeout() -> None:
    with unreachable() as addr:
        p = Producer("g5", addr)
        t0 = time.monotonic()
        with pytest.raises(ConnectTimeout):
            p.start()
        assert time.monotonic() - t0 < 4.5  # RocketMQ's 3 s, not the kernel's ~127 s
        p.shutdown()


# -- defect 6: a plain-def local transaction runs off the event loop ------------------------------
def test_async_producer_runs_a_plain_local_transaction_off_the_loop(
        fake: Callable[..., FakeBroker]) -> None:
    b = fake()

    class Sleepy:
        def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            time.sleep(1.0)
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    async def main() -> tuple[int, str]:
        ticks = 0
        p = AsyncTransactionProducer("g6", b.addr, Sleepy())
        await p.start()

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1
        t = asyncio.create_task(ticker())
        try:
            r = await p.send_message_in_transaction(Message(topic="t", body=b"x"))
        finally:
            t.cancel()
            await p.shutdown()
        return ticks, r.outcome

    ticks, outcome = asyncio.run(main())
    assert outcome == "COMMIT"
    assert ticks >= 10  # the loop kept serving while the listener slept 1 s


# -- defect 7: a failed constructor or start() leaks no thread, loop or socket --------------------
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_failed_sync_constructor_and_start_leak_nothing() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    addr = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
    try:
        Producer("warm-up", addr).shutdown()  # imports and lazy initialisation out of the count
        threads, fds = threading.active_count(), _fds()
        for _ in range(5):
            with pytest.raises(ConfigError):
                Producer("", addr)
            with pytest.raises(ConfigError):
                TransactionProducer("g7", addr, None)
            p = Producer("g7", addr)
            with pytest.raises(BrokerUnavailable):
                p.start()
        deadline = time.monotonic() + 3
        while threading.active_count() > threads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() == threads
        assert _fds() <= fds
    finally:
        closed.close()


def test_a_group_without_a_master_is_looked_up_at_most_once_per_interval_not_per_request() -> None:
    """A route whose broker group has only a slave: each request to its master fails with
    BrokerUnavailable, and the route is fetched again at most once per
    NAMESRV_REFRESH_MIN_INTERVAL_MS (not once per request, which hammered the name server)."""
    def namesrv(cmd: Command) -> Command | None:
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return cmd.response(0, body=encode_route(TopicRouteData(
                queue_datas=[QueueData(broker_name="b", read_queue_nums=1, write_queue_nums=1,
                                       perm=PERM_RW)],
                broker_datas=[BrokerData(cluster="c", broker_name="b",
                                         broker_addrs={1: "127.0.0.1:1"})])))
        return cmd.response(0)

    async def main(ns: FakeServer) -> int:
        p = AsyncTransactionProducer("g", "", Committing(), namesrv_addr=ns.addr)
        try:
            await p.route("t")
            for _ in range(20):
                with pytest.raises(BrokerUnavailable, match="no master"):
                    await p.master_address("b", "t")
            return ns.codes().count(RequestCode.GET_ROUTEINFO_BY_TOPIC)
        finally:
            await p.shutdown()

    with serve(namesrv) as ns:
        assert asyncio.run(main(ns)) == 2  # the first lookup, then one refresh for 20 requests
