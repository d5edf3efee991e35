"""``create_app``: the console's FastAPI application (API under ``/api``, pages at ``/``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from txmq.console._api import api_router, install_error_handlers
from txmq.console._auth import AuthMiddleware, Sessions, login_router
from txmq.console._backend import Backend, ConsoleConfig
from txmq.console._pages import mount_pages

__all__ = ["create_app"]


def create_app(config: ConsoleConfig) -> FastAPI:
    """The console app over the brokers of ``config``.

    With ``config.acl`` every request but ``/login`` and ``/static/`` needs a login (a session
    cookie, or HTTP Basic ``access key:secret key``) and is made with the user's keys
    (``app.state.sessions``; docs/console.md "Login").

    Its lifespan opens the :class:`Backend` (``app.state.backend``) and starts its History
    sampler, and closes both at shutdown. Without a lifespan run (e.g. ``httpx.ASGITransport``)
    call ``await app.state.backend.open()`` / ``close()`` yourself.
    """
    backend = Backend(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await backend.open()
        await backend.history.start()
        try:
            yield
        finally:
            await backend.history.stop()
            await backend.close()

    app = FastAPI(title="txmq console", version="1", lifespan=lifespan,
                  openapi_url="/api/openapi.json", docs_url="/api/docs", redoc_url=None)
    app.state.backend = backend
    install_error_handlers(app)
    if config.acl:
        sessions = Sessions()
        app.state.sessions = sessions
        app.add_middleware(AuthMiddleware, sessions=sessions, backend=backend)
    app.include_router(api_router(), prefix="/api")
    pages = mount_pages(app, backend)
    if config.acl:
        app.include_router(login_router(sessions, backend, pages))
    return app
