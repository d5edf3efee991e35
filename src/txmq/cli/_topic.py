"""``txmq topic create|update|delete|list|route|status``: mqadmin's ``updateTopic``,
``deleteTopic``, ``topicList``, ``topicRoute`` and ``topicStatus`` over the Admin API.

With ``--namesrv-addr`` and no ``--broker``, ``create``, ``update``, ``delete`` and ``status`` act
on every master broker the name server lists (``-c CLUSTER``: those of one cluster), as mqadmin's
``updateTopic -c`` / ``deleteTopic -c`` do; each broker is asked on its own
(:mod:`txmq.cli._cluster`), and one that is down or refuses is reported by name while the others
are still done. ``--broker H:P`` (or ``--endpoints``) acts on that broker only.

Exit codes: 0 done; 1 a broker refused or could not be reached (the reason is printed, per
broker); 2 bad input (illegal topic name, queue count out of range), with the reason.
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
from txmq.cli._cluster import ClusterName, PerBroker, cluster_masters, delete_in_namesrv, on_each
from txmq.cli._credentials import credential_kw, with_credentials
from txmq.client import Admin
from txmq.errors import BrokerUnavailable, InvalidRequest, RemoteError, ResponseCode, TxmqError
from txmq.protocol import (
    DEFAULT_TOPIC,
    TopicConfig,
    TopicStatsTable,
    check_send_topic,
    check_topic,
    is_broker_topic,
)

__all__ = ["AsJson", "Endpoints", "NamesrvAddr", "bad_input", "connect_kw", "masters_or_exit",
           "topic_app"]

topic_app = typer.Typer(help="Topics: create, update, delete, list, route, per-queue status.",
                        no_args_is_help=True)

Endpoints = Annotated[str | None, typer.Option(
    "--endpoints", "--broker", "-b",
    help="Broker host:port (default 127.0.0.1:10911 without a name server); only this broker.")]
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


def masters_or_exit(endpoints: str | None, namesrv_addr: str, cluster: str) -> dict[str, str] | None:
    """The brokers to act on, name → address: with a name server and no ``endpoints``, the
    masters it lists (of ``cluster`` if given); None to act on one broker as before. Exit 1 when
    the name server cannot be asked or lists none; exit 2 when ``cluster`` is given without a
    name server or is unknown."""
    if endpoints or not namesrv_addr:
        if cluster:
            raise bad_input("--cluster needs --namesrv-addr (and no --broker)")
        return None
    try:
        brokers = cluster_masters(namesrv_addr, cluster)
    except (RemoteError, BrokerUnavailable) as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    except TxmqError as exc:  # ConfigError: no such cluster
        raise bad_input(str(exc)) from exc
    if not brokers:
        _err.print(f"[red]error:[/red] the name server {namesrv_addr} lists no master broker"
                   + (f" of cluster {cluster}" if cluster else ""))
        raise typer.Exit(1)
    return brokers


def _finish(result: PerBroker[Any], lines: Callable[[str, Any], str]) -> None:
    """Print one line per broker done, report the failed ones; exit 1 if any failed."""
    for name, value in result.done.items():
        _out.print(lines(name, value))
    result.report()
    if result.failed:
        raise typer.Exit(1)


@topic_app.command("create")
@with_credentials
def topic_create(topic: TopicArg, queues: Queues = limits.DEFAULT_QUEUE_NUMS,
                 endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "",
                 cluster: ClusterName = "") -> None:
    """Create TOPIC with QUEUES queues (UPDATE_AND_CREATE_TOPIC). Exit 1 if it exists. With
    --namesrv-addr: on every master broker of the cluster (mqadmin updateTopic -c); a broker
    where it exists, or that is down, is reported and the others are still done (exit 1)."""
    _check_name(topic)
    _check_queues(queues)

    def create(adm: Admin) -> int:
        if (n := _existing(adm, topic)) is not None:
            raise RemoteError(ResponseCode.TOPIC_EXIST_ALREADY,
                              f"topic {topic} exists ({n} queues); use `txmq topic update` to widen it")
        return adm.update_topic(topic, queues)

    if (brokers := masters_or_exit(endpoints, namesrv_addr, cluster)) is not None:
        done = on_each(brokers, lambda name, adm: create(adm))
        _finish(done, lambda name, n: f"topic {topic} created with {n} queues on {name} ({brokers[name]})")
        return
    _out.print(f"topic {topic} created with {_run(endpoints, namesrv_addr, create)} queues")


@topic_app.command("update")
@with_credentials
def topic_update(topic: TopicArg, queues: Queues, endpoints: Endpoints = None,
                 namesrv_addr: NamesrvAddr = "", cluster: ClusterName = "") -> None:
    """Widen TOPIC to QUEUES queues (UPDATE_AND_CREATE_TOPIC). txmq cannot take queues away (their
    messages and consumer offsets would be stranded): fewer queues than now is refused (exit 2);
    an unknown topic is an error (exit 1; use create). With --namesrv-addr: on every master broker
    of the cluster, creating it on those that lack it (mqadmin updateTopic -c)."""
    _check_name(topic)
    _check_queues(queues)
    if (brokers := masters_or_exit(endpoints, namesrv_addr, cluster)) is not None:
        _update_cluster(topic, queues, brokers)
        return

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


def _update_cluster(topic: str, queues: int, brokers: dict[str, str]) -> None:
    """``topic update`` on ``brokers``: every broker's queue count first (none may exceed
    ``queues``: exit 2; the topic must exist on one: exit 1), then widen or create on each."""
    now = on_each(brokers, lambda name, adm: _existing(adm, topic))
    if all(n is None for n in now.done.values()):
        now.report()
        _err.print(f"[red]error:[/red] topic {topic} does not exist; use `txmq topic create`")
        raise typer.Exit(1)
    if wider := {b: n for b, n in now.done.items() if n is not None and n > queues}:
        raise bad_input(f"topic {topic} has more queues than {queues} on "
                        f"{', '.join(f'{b} ({n})' for b, n in wider.items())}; txmq cannot shrink "
                        f"a topic")
    done = on_each({b: brokers[b] for b in now.done}, lambda name, adm: adm.update_topic(topic, queues))
    done.failed = {**now.failed, **done.failed}

    def line(name: str, after: int) -> str:
        before = now.done[name]
        return (f"topic {topic} on {name}: {before} → {after} queues" if before is not None
                else f"topic {topic} created on {name} with {after} queues")
    _finish(done, line)


@topic_app.command("delete")
@with_credentials
def topic_delete(topic: TopicArg,
                 yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
                 endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "",
                 cluster: ClusterName = "") -> None:
    """Delete TOPIC from the broker (DELETE_TOPIC_IN_BROKER) and, with --namesrv-addr, from the name
    server's routes (DELETE_TOPIC_IN_NAMESRV), as mqadmin deleteTopic: it leaves the topic table,
    and every group's consumer offsets of it are dropped. Its stored messages stay in the commit
    log until retention removes them, and a topic created again under the same name reads them
    again. Broker and system topics are refused (exit 2); so are (exit 1) topics of the broker's
    configuration and topics with pending transactions. With --namesrv-addr and no --broker: on
    every master broker of the cluster, then from the name server if every broker deleted it
    (a broker that is down keeps it, and so does the name server's route: exit 1)."""
    _check_name(topic)
    if not yes:
        typer.confirm(f"delete topic {topic} and every consumer offset of it?", abort=True)
    if (brokers := masters_or_exit(endpoints, namesrv_addr, cluster)) is not None:
        _delete_cluster(topic, brokers, namesrv_addr, cluster)
        return
    remark = _run(endpoints, namesrv_addr, lambda a: a.delete_topic(topic))
    _out.print(remark)


def _delete_cluster(topic: str, brokers: dict[str, str], namesrv_addr: str, cluster: str) -> None:
    """``topic delete`` on ``brokers`` (a broker without the topic counts as done), then on the
    name server when none failed."""
    def delete(adm: Admin) -> str:
        try:
            return adm.delete_topic(topic)
        except RemoteError as exc:
            if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            return f"no topic {topic} there"

    done = on_each(brokers, lambda name, adm: delete(adm))
    for name, remark in done.done.items():
        _out.print(f"{name} ({brokers[name]}): {remark}")
    done.report()
    if done.failed:
        _err.print(f"the name server keeps the route of {topic} until every broker deleted it")
        raise typer.Exit(1)
    try:
        delete_in_namesrv(namesrv_addr, topic, cluster)
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] name server {namesrv_addr}: {exc}")
        raise typer.Exit(1) from exc
    _out.print(f"route of {topic} deleted on the name server")


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
                 as_json: AsJson = False, cluster: ClusterName = "") -> None:
    """Per queue of TOPIC: min and max offset, messages held, last update (GET_TOPIC_STATS_INFO).
    With --namesrv-addr and no --broker: a row per broker and queue (the `broker` column, JSON
    `brokerName`) and the messages summed over every broker; a broker that is down is reported
    (exit 1) after the others' rows."""
    _check_name(topic, send=False)
    if (brokers := masters_or_exit(endpoints, namesrv_addr, cluster)) is not None:
        per = on_each(brokers, lambda name, adm: _stats_or_none(adm, topic))
        if not per.failed and all(t is None for t in per.done.values()):
            _err.print(f"[red]error:[/red] no broker has topic {topic}")
            raise typer.Exit(1)
        stats = TopicStatsTable(offset_table=[
            msgspec.structs.replace(q, broker_name=q.broker_name or name)
            for name, t in per.done.items() if t is not None for q in t.offset_table])
        _print(stats, as_json, lambda: _status_table(topic, stats, cluster=True))
        per.report()
        raise typer.Exit(per.exit_code())
    stats = _run(endpoints, namesrv_addr, lambda a: a.topic_stats(topic))
    _print(stats, as_json, lambda: _status_table(topic, stats, cluster=False))


def _stats_or_none(adm: Admin, topic: str) -> TopicStatsTable | None:
    """The broker's stats of ``topic``; None when it does not have the topic."""
    try:
        return adm.topic_stats(topic)
    except RemoteError as exc:
        if exc.response_code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        raise


def _status_table(topic: str, stats: TopicStatsTable, *, cluster: bool) -> None:
    head = ("broker",) if cluster else ()
    t = Table(*head, "queue", "min offset", "max offset", "messages", "last update",
              title=f"status of {topic}")
    for q in stats.offset_table:
        last = (datetime.fromtimestamp(q.last_update_timestamp / 1000).isoformat(" ", "milliseconds")
                if q.last_update_timestamp else "-")
        t.add_row(*((q.broker_name,) if cluster else ()), str(q.queue_id), str(q.min_offset),
                  str(q.max_offset), str(q.max_offset - q.min_offset), last)
    if cluster:
        total = sum(q.max_offset - q.min_offset for q in stats.offset_table)
        t.add_row("total", "", "", "", str(total), "")
    _out.print(t)
