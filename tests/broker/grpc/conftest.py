"""A real broker process with its gRPC door, and a small client over txmq's own generated stubs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from txmq.broker.grpc.pb import definition_pb2 as pd
from txmq.broker.grpc.pb import service_pb2 as ps
from txmq.broker.grpc.pb import service_pb2_grpc as psg
from txmq.client import PullConsumer
from txmq.testing import BrokerProcess, free_port, run_broker

FAST_TX = {"transaction_timeout_ms": 300, "transaction_check_interval_ms": 300}


class Client:
    """One gRPC client (one ``x-mq-client-id``) of a broker's gRPC door, over txmq's stubs."""

    def __init__(self, target: str, client_id: str | None = None) -> None:
        self.client_id = client_id if client_id is not None else f"test@{uuid.uuid4().hex[:12]}"
        self.channel = grpc.insecure_channel(target)
        self.stub = psg.MessagingServiceStub(self.channel)

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", self.client_id),) if self.client_id else ()

    def call(self, rpc: str, request: Any, timeout: float = 10.0) -> Any:
        return getattr(self.stub, rpc)(request, metadata=self.md, timeout=timeout)

    def route(self, topic: str) -> ps.QueryRouteResponse:
        return self.call("QueryRoute", ps.QueryRouteRequest(topic=pd.Resource(name=topic)))

    def telemetry(self, settings: pd.Settings) -> tuple[Any, ps.TelemetryCommand]:
        """Open a Telemetry stream, write settings, return (the stream, the first answer)."""
        call = TelemetryCall(self)
        call.write(ps.TelemetryCommand(settings=settings))
        return call, call.read()

    def producer(self, *topics: str) -> tuple[TelemetryCall, ps.TelemetryCommand]:
        s = pd.Settings(client_type=pd.PRODUCER,
                        publishing=pd.Publishing(topics=[pd.Resource(name=t) for t in topics]))
        return self.telemetry(s)

    def send(self, topic: str, body: bytes, *, message_id: str | None = None,
             mtype: int = pd.NORMAL, **sys: Any) -> ps.SendMessageResponse:
        return self.call("SendMessage", ps.SendMessageRequest(messages=[
            message(topic, body, message_id=message_id, mtype=mtype, **sys)]))

    def end(self, topic: str, message_id: str, transaction_id: str, resolution: int,
            source: int = pd.SOURCE_CLIENT) -> ps.EndTransactionResponse:
        return self.call("EndTransaction", ps.EndTransactionRequest(
            topic=pd.Resource(name=topic), message_id=message_id, transaction_id=transaction_id,
            resolution=resolution, source=source))  # type: ignore[arg-type]

    def close(self) -> None:
        self.channel.close()


class TelemetryCall:
    """A Telemetry stream written from a queue (the stub's request iterator) and read by ``read``."""

    def __init__(self, client: Client) -> None:
        import queue

        self._q: queue.Queue[ps.TelemetryCommand | None] = queue.Queue()
        self._call = client.stub.Telemetry(iter(self._q.get, None), metadata=client.md)

    def write(self, cmd: ps.TelemetryCommand) -> None:
        self._q.put(cmd)

    def read(self, timeout: float = 10.0) -> ps.TelemetryCommand:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(next, self._call).result(timeout)

    @property
    def raw(self) -> Any:
        return self._call

    def close(self) -> None:
        self._q.put(None)
        self._call.cancel()


def message(topic: str, body: bytes, *, message_id: str | None = None, mtype: int = pd.NORMAL,
            **sys: Any) -> pd.Message:
    sp = pd.SystemProperties(message_id=message_id or uuid.uuid4().hex.upper(),
                             body_encoding=pd.IDENTITY, message_type=mtype, **sys)  # type: ignore[arg-type]
    return pd.Message(topic=pd.Resource(name=topic), body=body, system_properties=sp)


def pull_bodies(broker: BrokerProcess, topic: str, queues: int, group: str = "g-pull") -> list[bytes]:
    """Every message body in ``topic`` (read with the remoting SDK from offset 0)."""
    with PullConsumer(broker.endpoints, group) as c:
        return [m.body for q in range(queues) for m in c.pull(topic, q, 0, 32).messages]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path / "broker", topics={"t": 2, "tx": 1}, grpc_port=free_port(),
                    message_delay_level="100ms 200ms 300ms 1s", **FAST_TX) as b:
        yield b


@pytest.fixture
def target(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.config['grpc_port']}"


@pytest.fixture
def client(target: str) -> Iterator[Client]:
    c = Client(target)
    yield c
    c.close()
