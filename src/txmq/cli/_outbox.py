"""``txmq outbox``: create the local message table, look at it, purge it, run a relay."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from txmq.errors import ConfigError, MissingExtra, TxmqError

if TYPE_CHECKING:
    from collections.abc import Callable

    import sqlalchemy as sa

    from txmq.outbox import Sender

outbox_app = typer.Typer(help="The local message table (outbox and inbox): init-db, status, purge, relay.",
                         no_args_is_help=True)

_URL_HELP = "SQLAlchemy database URL, e.g. sqlite:///app.db, postgresql+psycopg://u@host/db, " \
            "mysql+pymysql://root@host/db."
Url = Annotated[str, typer.Argument(help=_URL_HELP)]
Prefix = Annotated[str, typer.Option(help="Table name prefix (tables <prefix>outbox, <prefix>inbox).")]
_DRIVER_EXTRAS = {"psycopg": "postgresql", "pymysql": "mysql"}
"""The database drivers of the URLs the help names → the extra that installs each."""


def _engine(url: str) -> sa.Engine:
    import sqlalchemy as sa

    from txmq.outbox import create_sqlite_engine

    if url.startswith("sqlite:///") and "?" not in url:
        return create_sqlite_engine(url[len("sqlite:///"):])
    try:
        return sa.create_engine(url)
    except ModuleNotFoundError as exc:
        if exc.name in _DRIVER_EXTRAS:  # the driver of a database txmq has an extra for
            raise MissingExtra(_DRIVER_EXTRAS[exc.name], f"database URL {url!r}", exc.name) from exc
        raise ConfigError(f"cannot use database URL {url!r}: {exc}") from exc
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise ConfigError(f"cannot use database URL {url!r}: {exc}") from exc


def _duration_ms(text: str) -> int:
    from txmq.broker import parse_delay_levels

    (ms,) = parse_delay_levels(text)
    return ms


def _fail(exc: Exception) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")  # (a MissingExtra says txmq[…])
    return typer.Exit(2)


@outbox_app.command("init-db")
def init_db(url: Url, prefix: Prefix = "txmq_") -> None:
    """Create the outbox and inbox tables and indexes if missing (SQLAlchemy create_all)."""
    import sqlalchemy as sa

    from txmq import outbox

    tables = outbox.make_tables(prefix)
    try:
        engine = _engine(url)
        try:
            outbox.init_db(engine, tables)
        finally:
            engine.dispose()
    except (TxmqError, sa.exc.SQLAlchemyError) as exc:
        raise _fail(exc) from exc
    Console().print(f"tables {tables.outbox.name} and {tables.inbox.name} are ready")


@outbox_app.command("status")
def status(url: Url, prefix: Prefix = "txmq_",
           as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Events by tx type and status, inbox rows, and the unsent backlog (count, oldest age)."""
    import sqlalchemy as sa

    from txmq import outbox

    tables = outbox.make_tables(prefix)
    try:
        engine = _engine(url)
        try:
            with engine.connect() as conn:
                st = outbox.outbox_status(conn, tables)
        finally:
            engine.dispose()
    except (TxmqError, sa.exc.SQLAlchemyError) as exc:
        raise _fail(exc) from exc
    if as_json:
        print(json.dumps(st.as_dict(), indent=2))
        return
    table = Table("table", "tx type", "status", "rows", title=f"outbox {url}")
    for name, counts in ((st.outbox_table, st.events), (st.inbox_table, st.inbox)):
        for tx, by_status in sorted(counts.items()):
            for s, n in sorted(by_status.items()):
                table.add_row(name, tx, s, str(n))
    b = st.backlog
    age = "-" if b.oldest_age_ms is None else f"{b.oldest_age_ms / 1000:.1f} s"
    table.caption = (f"backlog {b.total} (oldest {age}, expired leases {b.expired_leases}, "
                     f"most attempts {b.attempts_max})")
    Console().print(table)


@outbox_app.command("purge")
def purge_cmd(url: Url, prefix: Prefix = "txmq_",
              older_than: Annotated[str, typer.Option(help="Age like 7d, 12h, 30m.")] = "7d") -> None:
    """Delete sent events and inbox rows older than --older-than (unsent events are kept)."""
    import sqlalchemy as sa

    from txmq import outbox

    try:
        engine = _engine(url)
        try:
            r = outbox.purge(engine, outbox.make_tables(prefix), older_than_ms=_duration_ms(older_than))
        finally:
            engine.dispose()
    except (TxmqError, sa.exc.SQLAlchemyError, ValueError) as exc:
        raise _fail(exc) from exc
    Console().print(f"purged {r.events} events and {r.inbox} inbox rows")


def _relay_sender(transport: str | None, endpoints: str,
                  group: str) -> tuple[Sender, Callable[[], None], str]:
    """``(sender, close, where)``: the transport of ``--transport URL``, or a txmq Producer of
    ``group`` at ``endpoints``. Raises ConfigError (bad URL)."""
    from txmq import outbox
    from txmq.client import Producer

    if transport:
        kw = {"producer_group": group} if outbox.parse_transport_url(transport)[0] == "txmq" else {}
        t = outbox.open_transport(transport, **kw)
        return t, t.close, _without_password(transport)
    producer = Producer(group, endpoints)
    producer.start()
    return producer, producer.shutdown, endpoints


def _without_password(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return url if parts.password is None else url.replace(f":{parts.password}@", ":***@", 1)


@outbox_app.command("relay")
def relay_cmd(
    url: Url,
    endpoints: Annotated[str, typer.Option(
        help="Broker host:port (txmq; see --transport).")] = "127.0.0.1:10911",
    transport: Annotated[str | None, typer.Option(
        help="Send over this transport instead: txmq://host:port, amqp://user:pass@host:port/vhost "
             "(RabbitMQ) or nats://host:port (JetStream).")] = None,
    group: Annotated[str, typer.Option(help="Producer group of the relay (txmq).")] = "txmq-outbox-relay",
    prefix: Prefix = "txmq_",
    period_ms: Annotated[int, typer.Option(help="Idle poll period (tranMessageSendPeriod).")] = 1000,
    batch_size: Annotated[int, typer.Option(help="Events claimed per poll.")] = 50,
    pool_size: Annotated[int, typer.Option(help="Worker threads (tranMessageSendCorePoolSize).")] = 1,
    initial_delay_ms: Annotated[int, typer.Option(help="Wait before the first poll.")] = 0,
    retention: Annotated[str | None, typer.Option(help="Purge processed rows older than this.")] = None,
    metrics_port: Annotated[int, typer.Option(help="Prometheus /metrics port; 0 = off.")] = 0,
) -> None:
    """Run a relay until SIGINT/SIGTERM: send the outbox's events to the broker (txmq at
    --endpoints, or RabbitMQ / NATS JetStream / txmq by --transport URL). A bad URL exits with 2."""
    from prometheus_client import start_http_server

    from txmq import outbox

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = outbox.RelayConfig(period_ms=period_ms, batch_size=batch_size, pool_size=pool_size,
                                 initial_delay_ms=initial_delay_ms,
                                 retention_ms=_duration_ms(retention) if retention else None)
        engine = _engine(url)
        sender, close, where = _relay_sender(transport, endpoints, group)
    except TxmqError as exc:
        raise _fail(exc) from exc
    if metrics_port:
        start_http_server(metrics_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    relay = outbox.Relay(engine, sender, tables=outbox.make_tables(prefix), config=cfg)
    relay.start()
    Console(stderr=True).print(f"relay {relay.relay_id}: {url} → {where}")
    try:
        stop.wait()
    finally:
        relay.stop()
        close()
        engine.dispose()
