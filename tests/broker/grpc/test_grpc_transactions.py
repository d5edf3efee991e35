"""Transactions across gRPC clients, doors and broker restarts."""

from __future__ import annotations

import time

from conftest import Client, pull_bodies
from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from txmq.testing import BrokerProcess


def test_check_back_goes_to_another_producer_of_the_topic(target: str, broker: BrokerProcess) -> None:
    a, b = Client(target), Client(target)
    try:
        stream_a, _ = a.producer("tx")
        stream_b, _ = b.producer("tx")
        e = a.send("tx", b"orphan", message_id="TX-O", mtype=pd.TRANSACTION).entries[0]
        assert e.status.code == pd.OK
        stream_a.close()  # the sender goes away (as a SIGKILLed process's stream ends)
        a.close()
        cmd = stream_b.read(timeout=15)
        rec = cmd.recover_orphaned_transaction_command
        assert rec.transaction_id == e.transaction_id and rec.message.body == b"orphan"
        r = b.end("tx", "TX-O", rec.transaction_id, pd.ROLLBACK, source=pd.SOURCE_SERVER_CHECK)
        assert r.status.code == pd.OK
        time.sleep(1)
        assert pull_bodies(broker, "tx", 1) == []
        stream_b.close()
    finally:
        b.close()


def test_grpc_half_is_checked_back_on_a_remoting_producer(client: Client,
                                                          broker: BrokerProcess) -> None:
    checked: list[bytes] = []

    class Commit:
        def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOWN

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            checked.append(msg.body)
            return LocalTransactionState.COMMIT_MESSAGE

    with TransactionProducer("tx", broker.endpoints, Commit()):  # producer group == the topic
        e = client.send("tx", b"from-grpc", message_id="TX-G", mtype=pd.TRANSACTION).entries[0]
        assert e.status.code == pd.OK
        deadline = time.monotonic() + 15
        while not pull_bodies(broker, "tx", 1) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert checked[:1] == [b"from-grpc"]
    assert pull_bodies(broker, "tx", 1) == [b"from-grpc"]


def test_commit_after_a_broker_restart(target: str, broker: BrokerProcess) -> None:
    c = Client(target)
    e = c.send("tx", b"survives", message_id="TX-R", mtype=pd.TRANSACTION).entries[0]
    c.close()
    broker.restart()
    c = Client(target)
    try:
        r = c.end("tx", "TX-R", e.transaction_id, pd.COMMIT)
        assert r.status.code == pd.OK, r.status
        assert pull_bodies(broker, "tx", 1) == [b"survives"]
        again = c.end("tx", "TX-R", e.transaction_id, pd.ROLLBACK)  # the first decision stands
        assert again.status.code == pd.OK
        assert pull_bodies(broker, "tx", 1) == [b"survives"]
    finally:
        c.close()
