"""``txmq bench console``: how long each console page takes to load on a busy broker.

One real broker process with ``--topics`` topics (4 queues each, a few messages in each), ``--groups``
consumer groups with committed offsets on two topics each (so every group lags), one group with dead
letters, and ``--pending`` pending transactions: half messages of a producer group whose producer is
gone, so check-backs find no live producer and they stay pending. A ``txmq console`` process over
it. Then each page is loaded ``--loads`` times:

- **server**: the page's HTML response, fetched with httpx (time to the last byte), after one
  warm-up request;
- **browser**: headless Chromium (Playwright): navigation start until the ``load`` event, or until
  the API fetches the page started by then have finished, whichever is later (the browser's own
  Navigation and Resource Timing clocks), after two warm-up loads (static files cached and their
  JavaScript compiled, as for an operator who keeps the console open); for the pages with a chart
  also until the chart is drawn.

The table gives per page the median and p95 of each, in ms; the goal is every page under
``limits.BENCH_CONSOLE_PAGE_BUDGET_MS`` (500 ms).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from txmq import limits
from txmq.client import (
    AsyncAdmin,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
)
from txmq.testing import BrokerProcess
from txmq.testing.browser import chromium, run_console

__all__ = ["bench_console", "console", "populate"]

log = logging.getLogger(__name__)

_QUEUES = 4
_MESSAGES_PER_QUEUE = 10
_HALF_BATCH = 500
_HALF_SENDERS = 8
_DLQ_GROUP = "bench-dlq-group"
_DLQ_TOPIC = "bench-dlq-topic"
_DLQ_MESSAGES = 60
_DLQ_WAIT_S = 60
_GONE_GROUP = "bench-gone-producer"


class _NeverDecided:
    """A local transaction that never answers: every half stays pending."""

    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def topic_name(i: int) -> str:
    return f"bench-topic-{i:03d}"


async def _fill_topics(endpoints: str, topics: int) -> str:
    """A few keyed messages in every queue of every topic; returns one message's id."""
    p = AsyncProducer("bench-console-fill", endpoints)
    await p.start()
    try:
        first = ""
        for i in range(topics):
            for q in range(_QUEUES):
                msgs = [Message(topic=topic_name(i), body=f'{{"order": {n}}}'.encode(),
                                keys=f"order-{i}-{q}-{n}", tags="created")
                        for n in range(_MESSAGES_PER_QUEUE)]
                r = await p.send_batch(msgs, q)
                first = first or r.msg_id
        return first
    finally:
        await p.shutdown()


async def _commit_groups(endpoints: str, groups: int, topics: int) -> None:
    """Group g has committed offsets on two topics, half way through each queue (so it lags)."""
    for g in range(groups):
        c = AsyncPullConsumer(endpoints, consumer_group=f"bench-group-{g:02d}")
        try:
            for t in (2 * g % topics, (2 * g + 1) % topics):
                for q in range(_QUEUES):
                    await c.commit_offset(topic_name(t), q, _MESSAGES_PER_QUEUE // 2)
        finally:
            await c.shutdown()


async def _send_halves(endpoints: str, pending: int, topics: int) -> float:
    """``pending`` half messages, never ended, from a producer that then goes away; returns their
    rate (messages/s)."""
    p = AsyncTransactionProducer(_GONE_GROUP, endpoints, _NeverDecided())
    await p.start()
    sem = asyncio.Semaphore(_HALF_SENDERS)

    async def batch(first: int) -> None:
        n = min(_HALF_BATCH, pending - first)
        topic = topic_name(first // _HALF_BATCH % topics)
        async with sem:
            await p.send_half_batch([Message(topic=topic, body=b'{"payment": "authorized"}',
                                             keys=f"payment-{first + k}") for k in range(n)])

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(batch(f) for f in range(0, pending, _HALF_BATCH)))
    finally:
        await p.shutdown()
    return pending / (time.perf_counter() - t0)


async def _dead_letters(endpoints: str) -> None:
    """``_DLQ_MESSAGES`` messages that a consumer refuses, into ``%DLQ%bench-dlq-group``."""
    p = AsyncProducer("bench-console-dlq", endpoints)
    await p.start()
    try:
        await p.send_batch([Message(topic=_DLQ_TOPIC, body=f'{{"bad": {n}}}'.encode(), keys=f"bad-{n}")
                            for n in range(_DLQ_MESSAGES)])
    finally:
        await p.shutdown()

    def refuse(msgs: list[MessageExt]) -> ConsumeStatus:
        return ConsumeStatus.RECONSUME_LATER

    c = AsyncPushConsumer(_DLQ_GROUP, endpoints, refuse, max_reconsume_times=0,
                          consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(_DLQ_TOPIC)
    await c.start()
    adm = AsyncAdmin(endpoints)
    try:
        deadline = time.monotonic() + _DLQ_WAIT_S
        while len(await adm.dlq_messages(_DLQ_GROUP)) < _DLQ_MESSAGES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"dead letters did not arrive in {_DLQ_WAIT_S} s")
            await asyncio.sleep(0.2)
    finally:
        await c.shutdown()
        await adm.shutdown()


async def populate(endpoints: str, topics: int, groups: int, pending: int) -> dict[str, Any]:
    """Fill a broker whose config created ``topics`` topics (see :func:`topic_name`, 4 queues
    each). Returns timings (s) and what the pages need: a message id for the trace page."""
    t0 = time.perf_counter()
    msg_id = await _fill_topics(endpoints, topics)
    await _commit_groups(endpoints, groups, topics)
    await _dead_letters(endpoints)
    t1 = time.perf_counter()
    rate = await _send_halves(endpoints, pending, topics)
    adm = AsyncAdmin(endpoints)
    try:
        stats = await adm.transaction_stats()
    finally:
        await adm.shutdown()
    return {"msg_id": msg_id, "fill_s": round(t1 - t0, 1), "halves_per_s": round(rate),
            "populate_s": round(time.perf_counter() - t0, 1), "transaction_stats": stats}


CHARTS = {"overview": "#overview-chart[data-points]", "group": "#group-lag-chart[data-points]"}
"""Pages with a plotly chart: the selector that exists once it is drawn."""


def pages(msg_id: str) -> list[tuple[str, str]]:
    """(name, path) of every page measured."""
    return [("overview", "/"), ("topics", "/topics"), ("topic", f"/topics/{topic_name(0)}"),
            ("groups", "/groups"), ("group", "/groups/bench-group-00"),
            ("transactions", "/transactions"), ("dlq", "/dlq"), ("dlq group", f"/dlq/{_DLQ_GROUP}"),
            ("messages", f"/messages?topic={topic_name(0)}&key=order-0-0-1"),
            ("message trace", f"/messages/{msg_id}")]


def _summary(ms: list[float], prefix: str = "") -> dict[str, float]:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {f"{prefix}median_ms": round(statistics.median(ordered), 1), f"{prefix}p95_ms": round(p95, 1)}


def measure_server(base: str, paths: list[tuple[str, str]], loads: int) -> dict[str, dict[str, float]]:
    """Per page: the HTML response time (httpx, to the last byte), ``loads`` times after a warm-up.

    Raises:
        RuntimeError: a page answered other than 200.
    """
    import httpx

    out: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, path in paths:
            times = []
            for i in range(loads + 1):
                t0 = time.perf_counter()
                r = client.get(path)
                if r.status_code != 200:
                    raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:200]}")
                if i:
                    times.append((time.perf_counter() - t0) * 1000)
            out[name] = _summary(times)
    return out


_LOADED_JS = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const fetched = performance.getEntriesByType("resource")
    .filter(e => (e.initiatorType === "fetch" || e.initiatorType === "xmlhttprequest")
                 && e.startTime <= nav.loadEventEnd)
    .map(e => e.responseEnd);
  return Math.max(nav.loadEventEnd, ...fetched);
}"""
"""Milliseconds from navigation start to the ``load`` event's end, or to the end of the last API
fetch the page started before it, whichever is later (the browser's own Navigation and Resource
Timing clocks, so the driver's overhead is not counted)."""

_WARM_UPS = 2
"""Loads of each page before timing: the static files are cached and Chromium has compiled their
JavaScript (its code cache keeps compiled scripts from the third load on), as for an operator who has
the console open."""


def measure_browser(base: str, paths: list[tuple[str, str]], loads: int) -> dict[str, dict[str, float]]:
    """Per page: headless Chromium's load (navigation start until ``load``, or until the API fetches
    started by then have finished, see :data:`_LOADED_JS`), ``loads`` times after
    :data:`_WARM_UPS` warm-up loads; for the pages of :data:`CHARTS` also until the chart is drawn
    (``chart_median_ms``, ``chart_p95_ms``)."""
    from playwright.sync_api import Request

    out: dict[str, dict[str, float]] = {}
    with chromium() as browser:
        context = browser.new_context()
        page = context.new_page()
        fetches: list[Request] = []
        page.on("request", lambda r: fetches.append(r) if r.resource_type in ("fetch", "xhr") else None)
        for name, path in paths:
            times, charts = [], []
            for i in range(_WARM_UPS + loads):
                page.goto("about:blank")
                fetches.clear()
                page.goto(base + path, wait_until="load")
                for r in list(fetches):  # the first API fetches: wait for them to end
                    resp = r.response()
                    if resp is not None:
                        resp.finished()
                if i >= _WARM_UPS:
                    times.append(float(page.evaluate(_LOADED_JS)))
                if name in CHARTS:
                    page.wait_for_selector(CHARTS[name], state="attached", timeout=60_000)
                    charts.append(float(page.evaluate("() => performance.now()")))
            out[name] = _summary(times) | (_summary(charts[_WARM_UPS:], "chart_") if charts else {})
        context.close()
    return out


def bench_console(topics: int = 100, groups: int = 50, pending: int = 100_000, loads: int = 20,
                  browser: bool = True, work_dir: Path | None = None) -> dict[str, Any]:
    """Populate a broker process, start ``txmq console`` on it, measure every page; returns the
    figures (``pages``: name -> path, server and browser median/p95 in ms)."""
    with tempfile.TemporaryDirectory(prefix="txmq-bench-console-") as tmp:
        d = work_dir or Path(tmp)
        cfg = {"topics": {**{topic_name(i): _QUEUES for i in range(topics)}, _DLQ_TOPIC: 1}}
        bp = BrokerProcess(d / "broker", cfg)
        bp.start()
        try:
            filled = asyncio.run(populate(bp.endpoints, topics, groups, pending))
            with run_console([bp.endpoints], d / "console.log") as con:
                paths = pages(filled["msg_id"])
                load_before = os.getloadavg()[0]
                server = measure_server(con.url, paths, loads)
                shown = measure_browser(con.url, paths, loads) if browser else {}
                load_after = os.getloadavg()[0]
        finally:
            bp.stop()
    rows = {name: {"path": path, "server": server[name], "browser": shown.get(name)}
            for name, path in paths}
    return {"topics": topics, "groups": groups, "pending": pending, "loads": loads,
            "populate": filled, "budget_ms": limits.BENCH_CONSOLE_PAGE_BUDGET_MS,
            "load_average_1m": [load_before, load_after], "pages": rows}


def _table(figures: dict[str, Any]) -> Table:
    budget = figures["budget_ms"]
    table = Table("page", "server median", "server p95", "browser median", "browser p95",
                  "chart drawn median", "chart drawn p95",
                  title=f"txmq bench console ({figures['topics']} topics, {figures['groups']} groups, "
                        f"{figures['pending']:,} pending; ms, goal < {budget}; load average "
                        f"{figures['load_average_1m'][0]:.1f} → {figures['load_average_1m'][1]:.1f})")

    def cell(v: float | None) -> str:
        if v is None:
            return "-"
        return f"[red]{v:.0f}[/red]" if v >= budget else f"{v:.0f}"

    for name, row in figures["pages"].items():
        b = row["browser"] or {}
        table.add_row(name, cell(row["server"]["median_ms"]), cell(row["server"]["p95_ms"]),
                      *(cell(b.get(k)) for k in ("median_ms", "p95_ms", "chart_median_ms",
                                                  "chart_p95_ms")))
    return table


def console(json_path: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
            topics: Annotated[int, typer.Option(min=1, help="Topics (4 queues each).")] = 100,
            groups: Annotated[int, typer.Option(min=1, help="Consumer groups with offsets.")] = 50,
            pending: Annotated[int, typer.Option(min=0, help="Pending transactions.")] = 100_000,
            loads: Annotated[int, typer.Option(min=1, help="Loads of each page (after a warm-up).")] = 20,
            browser: Annotated[bool, typer.Option(help="Also load each page in headless Chromium.")] = True,
            ) -> None:
    """Console page load times (server HTML and full browser load) on a busy broker."""
    logging.disable(logging.WARNING)
    figures = bench_console(topics, groups, pending, loads, browser)
    Console(width=120).print(_table(figures))
    print(json.dumps(figures))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n")
