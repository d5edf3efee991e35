"""Shared fixtures of the console tests (api, pages, browser): a real broker process and the
console app bound to it, served by a real uvicorn server.

Fixtures
--------
``console_broker`` (session)
    A :class:`~txmq.testing.BrokerProcess` with 100 ms retry delays (a retried message reaches the
    DLQ within a second) and a 60 s transaction timeout (a half message stays pending, unchecked,
    for the length of a test). Tests share it: name topics and groups with :func:`unique`.
``console_server`` (session)
    :class:`ConsoleServer`: the app of :func:`txmq.console.create_app` over ``console_broker``
    (History sampled every 200 ms), served by uvicorn on a free 127.0.0.1 port in a thread;
    ``.url`` (``http://127.0.0.1:<port>``), ``.app``, ``.backend``. Its lifespan ran: the Backend
    is open and the History sampler runs.
``api`` (function)
    An ``httpx.Client`` on ``console_server.url`` (30 s timeout). ``api.get("/api/topics")``.

Helper fixtures (each returns a function; importing from ``conftest`` is fragile with several
conftest files, so take them as fixtures):

``unique`` → ``unique(prefix)``: a fresh name (``prefix-<8 hex>``) for a topic or group.
``serve_console`` → ``serve(config)``: context manager, a :class:`ConsoleServer` over any
    ``ConsoleConfig`` (e.g. a dedicated broker with other settings), stopped on exit.
``asgi_client`` → ``asgi_client(app)``: async context manager, an ``httpx.AsyncClient`` over
    ``httpx.ASGITransport(app)`` with the app's lifespan run around it (ASGITransport does not
    run it), base URL ``http://console``.
``create_topic`` → ``create_topic(api, topic, queues=4)``: create a topic through the API
    (brokers here do not auto-create topics).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from txmq.console import Backend, ConsoleConfig, create_app
from txmq.testing import BrokerProcess, run_broker, wait_until

SAMPLE_INTERVAL_MS = 200
"""History sampling period of the test servers (the product default is 2 s)."""


def unique(prefix: str) -> str:
    """A fresh topic or group name."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class ConsoleServer:
    """A console served by uvicorn in a background thread."""

    url: str
    app: FastAPI
    backend: Backend


@contextlib.contextmanager
def serve(config: ConsoleConfig) -> Iterator[ConsoleServer]:
    """Serve ``create_app(config)`` on a free loopback port until the block ends."""
    app = create_app(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True,
                              name="console-server")
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout_s=30)
    assert server.started, "the console server did not start"
    try:
        yield ConsoleServer(f"http://127.0.0.1:{port}", app, app.state.backend)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An AsyncClient calling ``app`` in-process, its lifespan (Backend, History) run around it."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            yield client


def create_topic(api: httpx.Client, topic: str, queues: int = 4) -> None:
    """Create ``topic`` through the API (asserting it worked)."""
    r = api.post("/api/topics", json={"topic": topic, "queues": queues})
    assert r.status_code == 201, r.text


@pytest.fixture(scope="session")
def console_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with run_broker(tmp_path_factory.mktemp("console-broker"),
                    message_delay_level=" ".join(["100ms"] * 18),
                    transaction_timeout_ms=60_000) as b:
        yield b


@pytest.fixture(scope="session")
def console_server(console_broker: BrokerProcess) -> Iterator[ConsoleServer]:
    cfg = ConsoleConfig(brokers=[console_broker.endpoints], sample_interval_ms=SAMPLE_INTERVAL_MS)
    with serve(cfg) as s:
        yield s


@pytest.fixture
def api(console_server: ConsoleServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console_server.url, timeout=30) as client:
        yield client


@pytest.fixture(name="unique", scope="session")
def unique_fixture() -> Callable[[str], str]:
    return unique


@pytest.fixture(name="serve_console", scope="session")
def serve_fixture() -> Callable[[ConsoleConfig], contextlib.AbstractContextManager[ConsoleServer]]:
    return serve


@pytest.fixture(name="asgi_client", scope="session")
def asgi_client_fixture() -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[httpx.AsyncClient]]:
    return asgi_client


@pytest.fixture(name="create_topic", scope="session")
def create_topic_fixture() -> Callable[..., None]:
    return create_topic
