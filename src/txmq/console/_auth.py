"""The console's login when it runs with ACL (``txmq console --acl``; docs/console.md "Login").

The console keeps no copy of the users: a login is checked by the brokers themselves (a request
signed with the user's keys that needs nothing but valid credentials, a producer-less
``HEART_BEAT``), and every later request is made with the user's keys (:data:`current_credentials`),
so each broker authorizes each action with that user's policies.

A session is held in memory (user name and secret key); the browser gets only a cookie naming it,
``<id>.<expiry ms>.<HMAC-SHA256>`` under a random per-process key (HttpOnly, SameSite=Strict, and
Secure when served over HTTPS). Scripts may send HTTP Basic ``access key:secret key`` instead.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from txmq import limits
from txmq.client import AsyncConnection
from txmq.console._backend import Backend
from txmq.console._pages import _Pages
from txmq.console._user import Credentials, acting_user, current_credentials
from txmq.errors import BrokerUnavailable, RequestTimeout, ResponseCode
from txmq.protocol import HeartbeatData, RequestCode, encode_body

__all__ = ["COOKIE", "AuthMiddleware", "LoginRefused", "Sessions", "audit_log", "check_login",
           "login_router"]

audit_log = logging.getLogger("txmq.console.audit")
"""Every changing request of a logged-in user (method other than GET/HEAD/OPTIONS), at INFO:
``user alice: POST /api/topics -> 201``. Operators' commit / rollback decisions are also recorded by
the broker (the transactions audit log) under the user's name."""

COOKIE = "txmq_session"
"""The session cookie's name."""
_PUBLIC = ("/login", "/logout", "/static/")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class LoginRefused(Exception):
    """The brokers refused the user's keys (the reason is the broker's remark)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Session:
    creds: Credentials
    expires_ms: int


class Sessions:
    """Logged-in sessions, signed with a random per-process key: a restart logs everyone out.

    At most ``CONSOLE_SESSIONS_MAX`` sessions (the oldest is dropped), each for
    ``CONSOLE_SESSION_TTL_MS``.
    """

    def __init__(self, ttl_ms: int = limits.CONSOLE_SESSION_TTL_MS) -> None:
        self._key = secrets.token_bytes(32)
        self._ttl_ms = ttl_ms
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._basic: dict[tuple[str, bytes], int] = {}

    @property
    def ttl_ms(self) -> int:
        """How long a session lasts (ms)."""
        return self._ttl_ms

    def _mac(self, sid: str, expires_ms: int) -> str:
        return hmac.new(self._key, f"{sid}.{expires_ms}".encode(), hashlib.sha256).hexdigest()

    def create(self, creds: Credentials) -> str:
        """A new session of ``creds``; the cookie value naming it."""
        sid, expires = secrets.token_urlsafe(24), _now_ms() + self._ttl_ms
        self._sessions[sid] = _Session(creds, expires)
        while len(self._sessions) > limits.CONSOLE_SESSIONS_MAX:
            self._sessions.popitem(last=False)
        return f"{sid}.{expires}.{self._mac(sid, expires)}"

    def lookup(self, cookie: str) -> Credentials | None:
        """The credentials of the session ``cookie`` names; None when the cookie is forged, expired
        or logged out."""
        sid, _, rest = cookie.partition(".")
        expires, _, mac = rest.partition(".")
        if not expires.isdigit() or not hmac.compare_digest(mac, self._mac(sid, int(expires))):
            return None
        session = self._sessions.get(sid)
        if session is None or session.expires_ms <= _now_ms():
            self._sessions.pop(sid, None)
            return None
        return session.creds

    def drop(self, cookie: str) -> None:
        """Log the session ``cookie`` names out (a forged or unknown cookie: nothing)."""
        if self.lookup(cookie) is not None:
            self._sessions.pop(cookie.partition(".")[0], None)

    def basic_ok(self, creds: Credentials) -> bool:
        """Whether the brokers accepted these Basic credentials less than
        ``CONSOLE_BASIC_AUTH_CACHE_MS`` ago."""
        return self._basic.get(self._basic_key(creds), 0) > _now_ms()

    def basic_accepted(self, creds: Credentials) -> None:
        """Remember that the brokers accepted ``creds`` (see :meth:`basic_ok`)."""
        if len(self._basic) >= limits.CONSOLE_SESSIONS_MAX:
            self._basic.clear()
        self._basic[self._basic_key(creds)] = _now_ms() + limits.CONSOLE_BASIC_AUTH_CACHE_MS

    def _basic_key(self, creds: Credentials) -> tuple[str, bytes]:
        return creds.user, hmac.new(self._key, creds.secret_key.encode(), hashlib.sha256).digest()


async def check_login(backend: Backend, creds: Credentials) -> None:
    """Ask every broker whether ``creds`` are a valid user's (a producer-less HEART_BEAT signed
    with them: it needs valid credentials and no permission).

    Raises:
        LoginRefused: a broker refused them (NO_PERMISSION; its reason).
        BrokerUnavailable, RequestTimeout: a broker could not be asked.
    """
    if not creds.user or not creds.secret_key:
        raise LoginRefused("give a user name and a secret key")
    body = encode_body(HeartbeatData(client_id=f"txmq-console-login@{secrets.token_hex(4)}"))
    for addr in await backend.addresses():
        conn = AsyncConnection(addr, None, limits.REQUEST_TIMEOUT_MS, access_key=creds.user,
                               secret_key=creds.secret_key)
        try:
            await conn.connect()
            r = await conn.request(RequestCode.HEART_BEAT, body=body)
        finally:
            await conn.close()
        if r.code == ResponseCode.NO_PERMISSION:
            raise LoginRefused(r.remark or "refused by the broker")
        if r.code != ResponseCode.SUCCESS:
            raise BrokerUnavailable(f"broker {addr} answered the login check with code {r.code}: "
                                    f"{r.remark}")


def _basic(header: str) -> Credentials | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, secret = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return Credentials(user, secret) if sep and user and secret else None


class AuthMiddleware:
    """ASGI middleware: every request but ``/login`` and ``/static/`` needs a session cookie or
    HTTP Basic credentials; the request is then served with :data:`current_credentials` set.
    Without them the API answers 401 ``{"detail": …}`` and a page redirects to ``/login``."""

    def __init__(self, app: ASGIApp, sessions: Sessions, backend: Backend) -> None:
        self.app = app
        self.sessions = sessions
        self.backend = backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(_PUBLIC):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        creds, refusal = await self._credentials(request)
        if creds is None:
            await _unauthorized(request, refusal)(scope, receive, send)
            return
        token = current_credentials.set(creds)
        status: list[int] = []

        async def send_noting_status(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            current_credentials.reset(token)
            if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
                audit_log.info("user %s: %s %s -> %s", creds.user, scope["method"], scope["path"],
                               status[0] if status else "no answer")

    async def _credentials(self, request: Request) -> tuple[Credentials | None, str]:
        if (cookie := request.cookies.get(COOKIE)) and (creds := self.sessions.lookup(cookie)):
            return creds, ""
        basic = _basic(request.headers.get("authorization", ""))
        if basic is None:
            return None, "login required"
        if self.sessions.basic_ok(basic):
            return basic, ""
        try:
            await check_login(self.backend, basic)
        except LoginRefused as exc:
            return None, str(exc)
        except (BrokerUnavailable, RequestTimeout, OSError) as exc:
            return None, f"the broker could not check the credentials: {exc}"
        self.sessions.basic_accepted(basic)
        return basic, ""


def _unauthorized(request: Request, reason: str) -> Response:
    if request.url.path.startswith("/api"):
        # the pages' own fetch calls say who they are: no Basic challenge (a browser dialog) there
        from_pages = request.headers.get("x-requested-with") == "txmq-console"
        challenge = {} if from_pages else {"WWW-Authenticate": 'Basic realm="txmq console"'}
        return JSONResponse({"detail": reason}, status_code=401, headers=challenge)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


async def form_fields(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body's fields (the first value of each)."""
    parsed = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def safe_next(target: str) -> str:
    """``target`` if it is a path of this console, else ``/`` (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def login_router(sessions: Sessions, backend: Backend, pages: _Pages) -> APIRouter:
    """``GET/POST /login`` (the form; a good login sets the cookie and goes to ``next``),
    ``POST /logout``, and ``GET /api/session`` (``{"user": …}`` of the caller)."""
    r = APIRouter()

    @r.get("/login", include_in_schema=False, response_class=HTMLResponse)
    async def login_page(request: Request, next: str = "/") -> Response:
        cookie = request.cookies.get(COOKIE)
        if cookie and sessions.lookup(cookie) is not None:
            return RedirectResponse(safe_next(next), status_code=303)
        return pages.render(request, "login.html", "", "Log in", next=safe_next(next), user="",
                            error="")

    @r.post("/login", include_in_schema=False, response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        form = await form_fields(request)
        creds = Credentials(form.get("user", "").strip(), form.get("secret_key", ""))
        target = safe_next(form.get("next", "/"))
        try:
            await check_login(backend, creds)
        except LoginRefused as exc:
            return pages.render(request, "login.html", "", "Log in", status_code=401, next=target,
                                user=creds.user, error=f"login refused: {exc}")
        except (BrokerUnavailable, RequestTimeout, OSError) as exc:
            return pages.render(request, "login.html", "", "Log in", status_code=502, next=target,
                                user=creds.user, error=f"the broker could not be asked: {exc}")
        answer = RedirectResponse(target, status_code=303)
        answer.set_cookie(COOKIE, sessions.create(creds), max_age=sessions.ttl_ms // 1000,
                          path="/", httponly=True, samesite="strict",
                          secure=request.url.scheme == "https")
        return answer

    @r.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        if cookie := request.cookies.get(COOKIE):
            sessions.drop(cookie)
        answer = RedirectResponse("/login", status_code=303)
        answer.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return answer

    @r.get("/api/session", tags=["session"])
    async def session() -> dict[str, str]:
        """The logged-in user: ``{"user": name}``."""
        return {"user": acting_user()}

    return r
