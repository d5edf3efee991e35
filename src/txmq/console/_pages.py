"""The console's HTML pages: Jinja2 templates rendered from the same :class:`Backend` calls as the
JSON API, plus ``/static`` (``console.css``, ``console.js`` and plotly's own ``plotly.min.js``).

Pages render their first view on the server; every action (create, update and delete a topic,
reset an offset, resume, commit or roll back a transaction, resend dead letters, search) is a
``fetch`` of the JSON API from ``static/console.js``, which shows the API's ``detail`` on error.
The overview and group pages poll ``/api/overview`` and ``/api/groups/{g}`` every
``CONSOLE_SAMPLE_INTERVAL_MS`` and update their plotly charts. Times on every page are UTC, and
time inputs without a zone are read as UTC.

Stable element ids and ``data-testid`` values (for the browser tests; ``#x`` is ``id="x"``,
``[x]`` is ``data-testid="x"``; rows also carry ``data-*`` keys as listed):

every page
    ``#nav-overview`` ``#nav-topics`` ``#nav-groups`` ``#nav-transactions`` ``#nav-dlq``
    ``#nav-messages`` ``#nav-outbox`` (nav links; the current one has class ``active``),
    ``[page-title]`` (the h1), ``#flash`` (the last action's message after a reload).
    Every action's outcome goes to a status element whose ``data-state`` is ``busy``, ``ok`` or
    ``error`` and whose text is the message or the API's ``detail``.
error pages (400/404/409/502)
    ``[page-error]`` with ``data-status``; ``#not-found`` on a 404; ``[error-detail]``.
``/`` overview
    ``#kpi-in`` ``#kpi-out`` ``#kpi-half`` ``#kpi-discarded`` ``#kpi-parked`` (numbers, updated every 2 s),
    ``#overview-chart`` (plotly; ``data-points`` = samples shown), ``#brokers-table`` with
    ``[broker-row]`` (``data-broker``).
``/topics``
    ``#topics-table`` with ``[topic-row]`` (``data-topic``) and ``[topic-link]``;
    ``#topics-show-system`` / ``#topics-hide-system``;
    create form ``#topic-create-form``: ``#topic-create-name``, ``#topic-create-queues``,
    ``#topic-create-submit``, ``#topic-create-status`` (on success the page reloads and
    ``#flash`` says "Topic T created with N queues").
``/topics/{t}``
    ``#topic-queues-table`` (``[topic-queue-row]``, ``data-queue-id``), ``#topic-route``,
    ``#topic-update-form``: ``#topic-update-queues`` ``#topic-update-submit``
    ``#topic-update-status``; ``#topic-delete-form``: ``#topic-delete-button``
    ``#topic-delete-status`` (asks ``confirm()`` first: accept the dialog; on success it goes to
    ``/topics``).
``/groups``
    ``#groups-table`` with ``[group-row]`` (``data-group``) and ``[group-link]``.
``/groups/{g}``
    ``#group-lag-total`` (text and ``data-lag``, updated every 2 s), ``#group-lag-chart``
    (plotly; ``data-points`` = points drawn, ``data-last-lag`` = the newest point's lag; a point
    is added per History sample), ``#group-queues-table`` (``[group-queue-row]`` with
    ``data-topic`` ``data-queue-id``; cell ``[group-queue-lag]``), ``#group-members-table``
    (``[group-member-row]``), ``#group-subscriptions-table``; reset form ``#group-reset-form``:
    ``#group-reset-topic``, ``#group-reset-timestamp`` (ms or ISO 8601), ``#group-reset-submit``
    (asks ``confirm()``), ``#group-reset-status``, ``#group-reset-results``
    (``[group-reset-row]``).
``/transactions`` (``?page=&size=`` pages the pending list)
    ``#tx-pending-total``, ``#tx-parked-total``, ``#tx-pending-table`` with ``[tx-pending-row]``
    (``data-tx-id``), ``[tx-pending-pager]`` with ``[pager-prev]`` ``[pager-next]``
    ``[pager-position]``; ``#tx-parked-table`` with ``[tx-parked-row]`` (``data-tx-id``), in it
    ``[tx-resume-button]`` and ``[tx-resume-status]`` (a resume also fills ``#tx-decide-id``);
    ``[tx-decide-button]`` on every row fills ``#tx-decide-id``; decision form
    ``#tx-decide-form``: ``#tx-decide-id``, ``#tx-decide-operator``, ``#tx-decide-reason``,
    ``#tx-commit-button``, ``#tx-rollback-button``, ``#tx-decide-status``; ``#tx-audit-table``
    with ``[tx-audit-row]`` (``data-tx-id``; refreshed after a decision), ``#tx-audit-empty``.
``/dlq``
    ``#dlq-groups-table`` with ``[dlq-group-row]`` (``data-group``) and ``[dlq-group-link]``.
``/dlq/{g}`` (``?page=&size=``)
    ``#dlq-total``, ``#dlq-table`` with ``[dlq-row]`` (``data-msg-id``), in it ``[dlq-select]``
    (checkbox, value = msg id), ``[dlq-body-preview]``, ``[dlq-show-button]`` (opens a row
    ``[dlq-detail]`` with ``[dlq-detail-body]``); ``#dlq-select-all``, ``#dlq-resend-selected``,
    ``#dlq-resend-all`` (asks ``confirm()``), ``#dlq-resend-status``, ``#dlq-resend-results``
    with ``[dlq-result-row]`` (``data-msg-id``, ``data-ok`` = ``true``/``false``),
    ``#dlq-export-json``, ``#dlq-export-csv``, ``[dlq-pager]``.
``/messages`` (``?topic=&key=&begin_ms=&end_ms=``, ``?msg_id=`` or ``?trace_id=`` renders results
    server-side)
    ``#msg-search-form``: ``#msg-search-topic``, ``#msg-search-key``, ``#msg-search-begin``,
    ``#msg-search-end`` (datetime-local, UTC), ``#msg-search-id``, ``#msg-search-trace-id``,
    ``#msg-search-submit``,
    ``#msg-search-status``; ``#msg-results-table`` with ``[msg-result-row]`` (``data-msg-id``)
    and ``[msg-link]``; ``#msg-results-empty``.
``/messages/{id}`` (``?trace_topic=T`` also reads custom trace topic T)
    ``#msg-id``, ``#msg-trace-id`` (a link to ``/messages?trace_id=``; absent without a trace
    id), ``#msg-trace`` with ``[trace-row]`` (``data-kind`` = half, answer, check-back, commit,
    rollback, stored, delivered, retry, dlq; ``[trace-by]``, ``[trace-operator]``,
    ``[trace-client]``), ``#msg-fields``, ``#msg-properties``, ``#msg-body``; the RocketMQ
    message trace ``#msg-trace-records`` with ``[msgtrace-row]`` (``data-type`` = Pub,
    EndTransaction, SubBefore, SubAfter, Recall, ``data-group``; cells ``[msgtrace-group]``
    ``[msgtrace-host]`` ``[msgtrace-cost]`` ``[msgtrace-status]`` ``[msgtrace-retry]``
    ``[msgtrace-by]``), ``#msg-trace-empty``, ``#msg-trace-error``, ``#msg-trace-topics``.
``/outbox``
    ``#outbox-statuses`` (``[outbox-status-row]``, ``data-status``), ``#outbox-leases``
    (``[outbox-lease-row]``), ``#outbox-inbox``; without ``--outbox-url``: ``#outbox-unavailable``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException

from txmq import limits
from txmq.console._api import error_status
from txmq.console._backend import Backend
from txmq.console._models import MessageTrace, TopicDetail
from txmq.console._msgtrace import msg_trace_context
from txmq.console._user import acting_user
from txmq.errors import ConfigError, InvalidRequest, RemoteError, ResponseCode, TxmqError

__all__ = ["mount_pages"]

_HERE = Path(__file__).parent
TEMPLATES_DIR = _HERE / "templates"
STATIC_DIR = _HERE / "static"

NAV: tuple[tuple[str, str, str], ...] = (
    ("overview", "/", "Overview"),
    ("topics", "/topics", "Topics"),
    ("groups", "/groups", "Consumer groups"),
    ("transactions", "/transactions", "Transactions"),
    ("dlq", "/dlq", "Dead letters"),
    ("messages", "/messages", "Messages"),
    ("outbox", "/outbox", "Outbox"),
)

_TRACE_BADGES = {"half": "info", "answer": "warn", "check-back": "info", "commit": "ok",
                 "delivered": "ok", "stored": "",
                 "rollback": "bad", "dlq": "bad", "retry": "warn"}

Handler = Callable[[Request], Awaitable[Response]]


def mount_pages(app: FastAPI, backend: Backend) -> _Pages:
    """Add the HTML pages, ``/static`` and an HTML 404 for unknown non-API paths to ``app``; the
    pages' renderer (for the login page).

    Raises:
        ConfigError: the installed plotly package has no ``package_data/plotly.min.js``.
    """
    plotly_js = plotly_js_path()
    pages = _Pages(backend, _environment(backend))

    async def plotly(request: Request) -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript", headers=_cache_headers())

    app.add_api_route("/static/plotly.min.js", plotly, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(pages.router())
    _install_not_found(app, pages)
    return pages


def plotly_js_path() -> Path:
    """Where the installed plotly package keeps its ``plotly.min.js`` (served, never fetched from a
    CDN).

    Raises:
        ConfigError: not there.
    """
    spec = importlib.util.find_spec("plotly")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for base in locations:
        path = Path(base) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    raise ConfigError("the plotly package has no package_data/plotly.min.js (is plotly installed?)")


def _cache_headers() -> dict[str, str]:
    return {"Cache-Control": f"public, max-age={limits.CONSOLE_STATIC_MAX_AGE_S}"}


def _install_not_found(app: FastAPI, pages: _Pages) -> None:
    """Unknown paths outside ``/api`` get the HTML 404 page; the API keeps FastAPI's JSON."""

    previous = app.exception_handlers.get(StarletteHTTPException, http_exception_handler)

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if request.url.path.startswith("/api") or exc.status_code != 404:
            answer = previous(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        return pages.error(request, 404, f"no page at {request.url.path}")

    app.add_exception_handler(StarletteHTTPException, handle)


# -- template environment and filters --------------------------------------------------------------
def _environment(backend: Backend) -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=fmt_num, bytes=fmt_bytes, duration=fmt_duration, time=fmt_time,
                       perm=fmt_perm)
    brokers = list(backend.config.brokers) or [f"name server {backend.config.namesrv_addr}"]
    env.globals.update(nav=NAV, brokers=brokers, trace_badge=lambda k: _TRACE_BADGES.get(k, ""),
                       sample_s=round(backend.config.sample_interval_ms / 1000, 1),
                       current_user=acting_user)
    return env


def fmt_num(value: Any, digits: int = 0) -> str:
    """``12345.6`` → ``"12,346"`` (``digits`` decimals); ``None`` → ``"-"``."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if digits else f"{round(value):,}"


def fmt_bytes(value: int | None) -> str:
    """Bytes in binary units: ``1536`` → ``"1.5 KiB"``."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop always returns


def fmt_duration(ms: int | None) -> str:
    """Milliseconds as the two largest units: ``93_000`` → ``"1 min 33 s"``."""
    if ms is None or ms < 0:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    s = ms // 1000
    parts = [(s // 86400, "d"), (s // 3600 % 24, "h"), (s // 60 % 60, "min"), (s % 60, "s")]
    shown = [f"{n} {u}" for n, u in parts if n][:2]
    return " ".join(shown) or "0 s"


def fmt_time(ms: int | None) -> str:
    """Ms since the epoch as ``YYYY-MM-DD HH:MM:SS`` UTC; 0 or ``None`` → ``"-"``."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_perm(perm: int) -> str:
    """RocketMQ ``PermName`` bits as ``rwx``: ``6`` → ``"rw-"``."""
    return "".join(ch if perm & bit else "-" for ch, bit in (("r", 4), ("w", 2), ("x", 1)))


def error_detail(exc: TxmqError) -> str:
    """The reason an error page shows: the broker's remark for a broker's answer (as the API's
    ``detail``), else the exception's message."""
    if isinstance(exc, RemoteError) and exc.remark:
        return exc.remark
    return str(exc) or type(exc).__name__


# -- query parameters ----------------------------------------------------------------------------
def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """Query parameter ``name`` as an int in ``lo..hi`` (``default`` when absent).

    Raises:
        InvalidRequest: not a whole number, or out of range.
    """
    text = request.query_params.get(name, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequest(ResponseCode.INVALID_PARAMETER,
                             f"{name}={text!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise InvalidRequest(ResponseCode.INVALID_PARAMETER, f"{name}={value} not in {lo}..{hi}")
    return value


def time_param(request: Request, name: str) -> int:
    """Query parameter ``<name>_ms`` (ms since the epoch) or ``<name>`` (ISO 8601, UTC unless it
    names a zone) as ms; 0 when neither is given.

    Raises:
        InvalidRequest: neither form parses.
    """
    ms = request.query_params.get(f"{name}_ms", "")
    if ms:
        return int_param(request, f"{name}_ms", 0, 0, 2**63 - 1)
    text = request.query_params.get(name, "").strip()
    if not text:
        return 0
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(ResponseCode.INVALID_PARAMETER, f"{name}={text!r} is not ISO 8601") from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


def iso_input(ms: int) -> str:
    """Ms as a ``datetime-local`` input value (UTC, seconds); 0 → ``""``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") if ms else ""


def route_rows(detail: TopicDetail) -> list[dict[str, Any]]:
    """The topic's route as one row per broker: addresses, queue counts and perm (the route dict
    may use RocketMQ's camelCase names or snake_case)."""
    route = detail.route

    def pick(d: dict[str, Any], snake: str, camel: str, default: Any) -> Any:
        return d.get(snake, d.get(camel, default))

    brokers = {pick(b, "broker_name", "brokerName", ""): b
               for b in pick(route, "broker_datas", "brokerDatas", [])}
    rows = []
    for q in pick(route, "queue_datas", "queueDatas", []):
        name = pick(q, "broker_name", "brokerName", "")
        addrs = pick(brokers.get(name, {}), "broker_addrs", "brokerAddrs", {})
        rows.append({"broker": name, "addrs": ", ".join(f"{k}={v}" for k, v in sorted(addrs.items())),
                     "read": pick(q, "read_queue_nums", "readQueueNums", 0),
                     "write": pick(q, "write_queue_nums", "writeQueueNums", 0),
                     "perm": q.get("perm", 0)})
    return rows


def message_context(trace: MessageTrace) -> dict[str, Any]:
    """What ``message.html`` shows of a :class:`MessageTrace`: scalar fields (times formatted),
    properties sorted by name, the body."""
    m = trace.message
    skip = {"properties", "body", "body_encoding", "body_bytes", "msg_id"}
    fields = [(k, fmt_time(v) if k.endswith("_ms") else v)
              for k, v in m.model_dump().items() if k not in skip]
    return {"msg_id": m.msg_id, "fields": fields, "properties": sorted(m.properties.items()),
            "body": m.body, "body_encoding": m.body_encoding, "body_bytes": m.body_bytes,
            "trace": trace.trace, "trace_id": trace.trace_id}


# -- the pages ---------------------------------------------------------------------------------------
class _Pages:
    """Every HTML route; each one renders a template from Backend calls."""

    def __init__(self, backend: Backend, env: Environment) -> None:
        self.backend = backend
        self.env = env

    def render(self, request: Request, name: str, section: str, title: str, status_code: int = 200,
               **ctx: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(request=request, section=section, title=title, **ctx)
        return HTMLResponse(html, status_code=status_code)

    def error(self, request: Request, status_code: int, detail: str, section: str = "",
              back: tuple[str, str] | None = None) -> HTMLResponse:
        headline = {400: "Bad request", 403: "Forbidden", 404: "Not found", 409: "Conflict",
                    502: "Broker unreachable"}.get(status_code, "Error")
        return self.render(request, "error.html", section, headline, status_code=status_code,
                           code=status_code, headline=headline, detail=detail, back=back)

    def router(self) -> APIRouter:
        r = APIRouter(include_in_schema=False)
        routes: list[tuple[str, Handler, str, tuple[str, str] | None]] = [
            ("/", self.overview, "overview", None),
            ("/topics", self.topics, "topics", None),
            ("/topics/{topic}", self.topic, "topics", ("/topics", "all topics")),
            ("/groups", self.groups, "groups", None),
            ("/groups/{group}", self.group, "groups", ("/groups", "all consumer groups")),
            ("/transactions", self.transactions, "transactions", None),
            ("/dlq", self.dlqs, "dlq", None),
            ("/dlq/{group}", self.dlq, "dlq", ("/dlq", "all dead-letter queues")),
            ("/messages", self.messages, "messages", None),
            ("/messages/{msg_id}", self.message, "messages", ("/messages", "message search")),
            ("/outbox", self.outbox, "outbox", None),
        ]
        for path, handler, section, back in routes:
            r.add_api_route(path, self._guard(handler, section, back), methods=["GET"],
                            response_class=HTMLResponse)
        return r

    def _guard(self, handler: Handler, section: str, back: tuple[str, str] | None) -> Handler:
        """``handler`` with ``txmq.errors`` exceptions rendered as the error page (the API's
        status and ``detail``)."""

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except TxmqError as exc:
                return self.error(request, error_status(exc), error_detail(exc), section, back)

        page.__name__ = f"page_{handler.__name__}"
        return page

    async def overview(self, request: Request) -> Response:
        o = await self.backend.overview()
        return self.render(request, "overview.html", "overview", "Overview", o=o,
                           o_json=o.model_dump(mode="json"))

    async def topics(self, request: Request) -> Response:
        system = request.query_params.get("system", "") in ("1", "true")
        topics = await self.backend.topics(system)
        return self.render(request, "topics.html", "topics", "Topics", topics=topics, system=system,
                           default_queues=limits.DEFAULT_QUEUE_NUMS, max_queues=limits.QUEUE_NUMS_MAX)

    async def topic(self, request: Request) -> Response:
        t = await self.backend.topic(request.path_params["topic"])
        held = sum(q.max_offset - q.min_offset for q in t.queues)
        return self.render(request, "topic.html", "topics", f"Topic {t.topic}", t=t,
                           route_rows=route_rows(t), total_messages=held,
                           max_queues=limits.QUEUE_NUMS_MAX)

    async def groups(self, request: Request) -> Response:
        groups = await self.backend.groups()
        return self.render(request, "groups.html", "groups", "Consumer groups", groups=groups)

    async def group(self, request: Request) -> Response:
        g = await self.backend.group(request.path_params["group"])
        topics = list(dict.fromkeys([s.topic for s in g.subscriptions] + [q.topic for q in g.queues]))
        return self.render(request, "group.html", "groups", f"Group {g.group}", g=g,
                           g_json=g.model_dump(mode="json"), reset_topics=topics)

    async def transactions(self, request: Request) -> Response:
        size = int_param(request, "size", limits.CONSOLE_PAGE_ROWS, 1, limits.CONSOLE_PAGE_SIZE_MAX)
        last_page = max(0, (limits.CONSOLE_PENDING_WINDOW_MAX - size) // size)
        page = int_param(request, "page", 0, 0, last_page)
        pending, parked, audit = await asyncio.gather(
            self.backend.tx.transactions(size, page * size),
            self.backend.tx.parked(limits.CONSOLE_PAGE_ROWS),
            self.backend.tx.audit(limits.CONSOLE_AUDIT_PAGE_ROWS))
        browsable = min(pending.pending_total, (last_page + 1) * size)
        return self.render(request, "transactions.html", "transactions", "Transactions",
                           pending=pending, parked=parked, audit=audit, page=page, size=size,
                           browsable=browsable)

    async def dlqs(self, request: Request) -> Response:
        dlqs = await self.backend.dlqs()
        return self.render(request, "dlq_groups.html", "dlq", "Dead letters", dlqs=dlqs)

    async def dlq(self, request: Request) -> Response:
        size = int_param(request, "size", limits.CONSOLE_DLQ_PAGE_ROWS, 1, limits.CONSOLE_PAGE_SIZE_MAX)
        page = int_param(request, "page", 0, 0, 2**31)
        d = await self.backend.dlq(request.path_params["group"], page, size)
        return self.render(request, "dlq.html", "dlq", f"Dead letters of {d.group}", d=d, page=page,
                           size=size)

    async def messages(self, request: Request) -> Response:
        p = request.query_params
        q = {"topic": p.get("topic", "").strip(), "key": p.get("key", "").strip(),
             "msg_id": p.get("msg_id", "").strip(), "trace_id": p.get("trace_id", "").strip()}
        begin, end = time_param(request, "begin"), time_param(request, "end")
        q |= {"begin": iso_input(begin), "end": iso_input(end)}
        searched = bool(q["msg_id"] or q["trace_id"] or (q["topic"] and q["key"]))
        results: list[Any] = []
        error = ""
        if searched:
            try:
                found = await self.backend.messages(q["topic"], q["key"], begin, end, q["msg_id"],
                                                    q["trace_id"])
                results = list(found.items)
            except TxmqError as exc:
                error = error_detail(exc)
        names = [t.topic for t in await self.backend.topics(False)]
        return self.render(request, "messages.html", "messages", "Messages", q=q, results=results,
                           searched=searched, error=error, topic_names=names)

    async def message(self, request: Request) -> Response:
        trace = await self.backend.message(request.path_params["msg_id"])
        records = await msg_trace_context(self.backend, trace.message.msg_id,
                                          request.query_params.getlist("trace_topic"))
        return self.render(request, "message.html", "messages", f"Message {trace.message.msg_id}",
                           **message_context(trace), **records)

    async def outbox(self, request: Request) -> Response:
        try:
            ob = await self.backend.outbox()
        except TxmqError as exc:
            if error_status(exc) != 404:
                raise
            return self.render(request, "outbox.html", "outbox", "Outbox", ob=None,
                               unavailable=error_detail(exc))
        return self.render(request, "outbox.html", "outbox", "Outbox", ob=ob, unavailable="")
