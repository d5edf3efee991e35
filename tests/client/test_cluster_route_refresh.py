"""A send that cannot reach its broker fetches the route again at once (issue #23 item 1), so a
broker group that registered after the producer's last lookup is used without waiting for the
30 s route timer. Real name server and broker processes."""

from __future__ import annotations

import logging
import time

import pytest

from txmq.client import Message, Producer
from txmq.testing import run_cluster, wait_until

pytestmark = pytest.mark.slow

_SEND_AFTER_KILL_MAX_S = 5.0
"""Well under the 30 s route timer the old client waited for."""


def test_a_failed_send_refreshes_the_route_and_reaches_a_new_broker() -> None:
    logging.getLogger("txmq").setLevel(logging.ERROR)
    with run_cluster(2, topics={"t": 2}) as c:
        c.kill("broker-a")
        p = Producer("g", namesrv_addr=c.namesrv_addr, timeout_ms=2_000,
                     poll_name_server_interval_ms=600_000)
        p.start()
        try:
            wait_until(lambda: p.send(Message(topic="t", body=b"x")).broker_name == "broker-b",
                       timeout_s=30)
            assert {p.send(Message(topic="t", body=b"x")).broker_name for _ in range(4)} == {
                "broker-b"}, "the route lists broker-b only"
            c.restart("broker-a")
            time.sleep(2)  # broker-a registers with the name server at start
            c.kill("broker-b")
            t0 = time.monotonic()
            sent_to = ""
            while time.monotonic() - t0 < _SEND_AFTER_KILL_MAX_S and not sent_to:
                try:
                    sent_to = p.send(Message(topic="t", body=b"y")).broker_name
                except Exception:
                    time.sleep(0.2)
            assert sent_to == "broker-a", "no send reached broker-a before the route timer"
        finally:
            p.shutdown()
