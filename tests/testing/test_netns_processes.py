"""txmq's servers inside test hosts (txmq.testing.Hosts): a name server in one host and a broker in
another, listening on and advertising their hosts' addresses; a producer in the root namespace
finds the broker through the name server, sends, and a consumer there reads it back; a partition
between the broker's host and the root namespace then cuts the client off. Needs root;
``TXMQ_REQUIRE_NETNS=1`` (CI) makes the skip a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txmq.client import Message, Producer, PullConsumer
from txmq.errors import TxmqError
from txmq.testing import ROOT, BrokerProcess, Hosts, NamesrvProcess, netns_unavailable, wait_until

_WHY = netns_unavailable()
if _WHY and os.environ.get("TXMQ_REQUIRE_NETNS") == "1":
    raise RuntimeError(f"TXMQ_REQUIRE_NETNS=1 but {_WHY}")
pytestmark = [pytest.mark.skipif(bool(_WHY), reason=_WHY or ""), pytest.mark.slow,
              pytest.mark.timeout(180)]

TOPIC = "netns-t"


def test_a_broker_and_a_name_server_in_their_own_hosts_serve_a_client_of_the_root_namespace(
        tmp_path: Path) -> None:
    with Hosts(["namesrv", "broker"]) as hosts:
        ns = NamesrvProcess(tmp_path / "namesrv", host=hosts.addr("namesrv"),
                            netns=hosts.netns("namesrv"))
        broker = BrokerProcess(tmp_path / "broker", {
            "host": hosts.addr("broker"), "topics": {TOPIC: 2}, "namesrv_addr": ns.addr},
            netns=hosts.netns("broker"))
        try:
            ns.start()
            broker.config["namesrv_addr"] = ns.addr  # its port is known now
            broker.start()
            assert ns.addr.startswith(hosts.addr("namesrv") + ":")
            assert broker.endpoints.startswith(hosts.addr("broker") + ":")
            with Producer("netns-p", namesrv_addr=ns.addr, timeout_ms=3000) as p:
                sent = []

                def send_one() -> bool:  # the broker registers in its first second
                    try:
                        sent.append(p.send(Message(topic=TOPIC, body=b"over-the-bridge")))
                    except TxmqError:
                        return False
                    return True

                wait_until(send_one, timeout_s=60)
            r = sent[0]
            with PullConsumer(broker.endpoints, "netns-c") as c:
                got = c.pull(TOPIC, r.queue_id, r.queue_offset, 1).messages
            assert [m.body for m in got] == [b"over-the-bridge"]
            hosts.partition(["broker"], [ROOT])
            with pytest.raises(TxmqError), PullConsumer(broker.endpoints, "netns-c2",
                                                         timeout_ms=1000) as c:
                c.pull(TOPIC, r.queue_id, r.queue_offset, 1)
        finally:
            broker.stop()
            ns.stop()
