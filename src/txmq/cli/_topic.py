"""``txmq topic create|update|delete|list|route|status``: mqadmin's ``updateTopic``,
``deleteTopic``, ``topicList``, ``topicRoute`` and ``topicStatus`` over the Admin API.

Exit codes: 0 done; 1 the broker refused or could not be reached (the reason is printed);
2 bad input (illegal topic name, queue count out of range), with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from txmq import limits
from txmq.cli._credentials import credential_kw, with_credentials
from txmq.client import Admin
from txmq.errors import InvalidRequest, TxmqError
from txmq.protocol import DEFAULT_TOPIC, TopicConfig, check_send_topic, check_topic, is_broker_topic

__all__ = ["AsJson", "Endpoints", "NamesrvAddr", "bad_input", "connect_kw", "topic_app"]

topic_app = typer.Typer(help="Topics: create, update, delete, list, route, per-queue status.",
                        no_args_is_help=True)

Endpoints = Annotated[str | None, typer.Option(
    "--endpoints", "--broker", help="Broker host:port (default 127.0.0.1:10911 without a name server).")]
NamesrvAddr = Annotated[str, typer.Option(
    help="Name servers host:port[;host:port] (RocketMQ namesrvAddr); the broker is found there.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
TopicArg = Annotated[str, typer.Argument(help="Topic name.")]
Queues = Annotated[int, typer.Option("--queues", "-q", help="Queue count (read = write queues).")]
_out = Console()
_err = Console(stderr=True)
T = TypeVar("T")


def bad_input(reason: str) -> typer.Exit:
    """Print ``reason`` and return the exit (code 2) to raise."""
    _err.print(f"[red]error:[/red] {reason}")
    return typer.Exit(2)


def connect_kw(endpoints: str | None, namesrv_addr: str) -> dict[str, Any]:
    """Client keyword arguments: ``endpoints`` (the broker; 127.0.0.1:10911 when neither it nor a
    name server is given), ``namesrv_addr``, and the running command's ACL credentials
    (``access_key``, ``secret_key``; see :func:`txmq.cli._credentials.with_credentials`)."""
    return {"endpoints": endpoints or ("" if namesrv_addr else "127.0.0.1:10911"),
            "namesrv_addr": namesrv_addr, **credential_kw()}


@contextmanager
def _admin(endpoints: str | None, namesrv_addr: str) -> Iterator[Admin]:
    try:
        with Admin(**connect_kw(endpoints, namesrv_addr)) as adm:
            yield adm
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


def _run(endpoints: str | None, namesrv_addr: str, fn: Callable[[Admin], T]) -> T:
    with _admin(endpoints, namesrv_addr) as adm:
        return fn(adm)


def _check_name(topic: str, *, send: bool = True) -> None:
    try:
        (check_send_topic if send else check_topic)(topic)
    except InvalidRequest as exc:
        raise bad_input(str(exc)) from exc
    if send and topic == DEFAULT_TOPIC:
        raise bad_input(f"{DEFAULT_TOPIC} is the broker's default topic")


def _check_queues(queues: int) -> None:
    if not 0 < queues <= limits.QUEUE_NUMS_MAX:
        raise bad_input(f"queue count {queues} not in 1..{limits.QUEUE_NUMS_MAX}")


def _print(data: Any, as_json: bool, table: Callable[[], None]) -> None:
    if as_json:
        print(json.dumps(msgspec.to_builtins(data), indent=2))
    else:
        table()


def _existing(adm: Admin, topic: str) -> int | None:
    cfg = adm.topic_configs().topic_config_table.get(topic)
    return None if cfg is None else cfg.write_queue_nums


@topic_app.command("create")
@with_credentials
def topic_create(topic: TopicArg, queues: Queues = limits.DEFAULT_QUEUE_NUMS,
                 endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "") -> None:
    """Create TOPIC with QUEUES queues (UPDATE_AND_CREATE_TOPIC). Exit 1 if it exists."""
    _check_name(topic)
    _check_queues(queues)

    def create(adm: Admin) -> int:
        if (n := _existing(adm, topic)) is not None:
            _err.print(f"[red]error:[/red] topic {topic} exists ({n} queues); "
                       f"use `txmq topic update` to widen it")
            raise typer.Exit(1)
        return adm.update_topic(topic, queues)

    _out.print(f"topic {topic} created with {_run(endpoints, namesrv_addr, create)} queues")


@topic_app.command("update")
@with_credentials
def topic_update(topic: TopicArg, queues: Queues, endpoints: Endpoints = None,
                 namesrv_addr: NamesrvAddr = "") -> None:
    """Widen TOPIC to QUEUES queues (UPDATE_AND_CREATE_TOPIC). txmq cannot take queues away (their
    messages and consumer offsets would be stranded): fewer queues than now is refused (exit 2);
    an unknown topic is an error (exit 1; use create)."""
    _check_name(topic)
    _check_queues(queues)

    def update(adm: Admin) -> tuple[int, int]:
        n = _existing(adm, topic)
        if n is None:
            _err.print(f"[red]error:[/red] topic {topic} does not exist; use `txmq topic create`")
            raise typer.Exit(1)
        if queues < n:
            raise bad_input(f"topic {topic} has {n} queues; txmq cannot shrink a topic")
        return n, adm.update_topic(topic, queues)

    before, after = _run(endpoints, namesrv_addr, update)
    _out.print(f"topic {topic}: {before} → {after} queues")


@topic_app.command("delete")
@with_credentials
def topic_delete(topic: TopicArg,
                 yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
                 endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "") -> None:
    """Delete TOPIC from the broker (DELETE_TOPIC_IN_BROKER) and, with --namesrv-addr, from the name
    server's routes (DELETE_TOPIC_IN_NAMESRV), as mqadmin deleteTopic: it leaves the topic table,
    and every group's consumer offsets of it are dropped. Its stored messages stay in the commit
    log until retention removes them, and a topic created again under the same name reads them
    again. Broker and system topics are refused (exit 2); so are (exit 1) topics of the broker's
    configuration and topics with pending transactions."""
    _check_name(topic)
    if not yes:
        typer.confirm(f"delete topic {topic} and every consumer offset of it?", abort=True)
    remark = _run(endpoints, namesrv_addr, lambda a: a.delete_topic(topic))
    _out.print(remark)


@topic_app.command("list")
@with_credentials
def topic_list(
    all_: Annotated[bool, typer.Option("--all", help="Include broker and system topics.")] = False,
    endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "", as_json: AsJson = False,
) -> None:
    """Topics with queue counts and perm: the broker's (GET_ALL_TOPIC_CONFIG), or with
    --namesrv-addr every topic the name server routes (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), with
    the queue counts the broker found there knows (-1 for topics of other brokers)."""
    def fetch(adm: Admin) -> list[TopicConfig]:
        table = adm.topic_configs().topic_config_table
        names = adm.topic_names() if namesrv_addr else sorted(table)
        unknown = TopicConfig(topic_name="", read_queue_nums=-1, write_queue_nums=-1)
        shown = [t for t in names if all_ or not (is_broker_topic(t) or t.startswith("%"))]
        return [table.get(t) or msgspec.structs.replace(unknown, topic_name=t) for t in shown]

    rows = _run(endpoints, namesrv_addr, fetch)

    def show() -> None:
        t = Table("topic", "queues", "perm", title=f"topics ({len(rows)})")
        for c in rows:
            t.add_row(c.topic_name, str(c.write_queue_nums), _perm(c.perm))
        _out.print(t)

    _print(rows, as_json, show)


def _perm(perm: int) -> str:
    return "".join(ch if perm & bit else "-" for ch, bit in (("r", 4), ("w", 2), ("x", 1)))


@topic_app.command("route")
@with_credentials
def topic_route(topic: TopicArg, endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "",
                as_json: AsJson = False) -> None:
    """TOPIC's route (GET_ROUTEINFO_BY_TOPIC): brokers, addresses, queue counts, perm."""
    _check_name(topic, send=False)
    route = _run(endpoints, namesrv_addr, lambda a: a.topic_route(topic))

    def show() -> None:
        t = Table("broker", "cluster", "addresses", "read queues", "write queues", "perm",
                  title=f"route of {topic}")
        brokers = {b.broker_name: b for b in route.broker_datas}
        for q in route.queue_datas:
            b = brokers.get(q.broker_name)
            addrs = ", ".join(f"{k}={v}" for k, v in sorted(b.broker_addrs.items())) if b else ""
            t.add_row(q.broker_name, (b.cluster or "") if b else "", addrs, str(q.read_queue_nums),
                      str(q.write_queue_nums), _perm(q.perm))
        _out.print(t)

    _print(route, as_json, show)


@topic_app.command("status")
@with_credentials
def topic_status(topic: TopicArg, endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "",
                 as_json: AsJson = False) -> None:
    """Per queue of TOPIC: min and max offset, messages held, last update (GET_TOPIC_STATS_INFO)."""
    _check_name(topic, send=False)
    stats = _run(endpoints, namesrv_addr, lambda a: a.topic_stats(topic))

    def show() -> None:
        t = Table("queue", "min offset", "max offset", "messages", "last update",
                  title=f"status of {topic}")
        for q in stats.offset_table:
            last = (datetime.fromtimestamp(q.last_update_timestamp / 1000).isoformat(" ", "milliseconds")
                    if q.last_update_timestamp else "-")
            t.add_row(str(q.queue_id), str(q.min_offset), str(q.max_offset),
                      str(q.max_offset - q.min_offset), last)
        _out.print(t)

    _print(stats, as_json, show)
