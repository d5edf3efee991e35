"""``txmq group`` and ``txmq dlq``: consumer groups, lag, offset reset, dead-letter queues."""

from __future__ import annotations

import base64
import csv
import io
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from txmq.cli._cluster import ClusterName, on_each
from txmq.cli._credentials import credential_kw, with_credentials
from txmq.cli._topic import NamesrvAddr, masters_or_exit
from txmq.client import Admin
from txmq.errors import RemoteError, ResponseCode, TxmqError
from txmq.protocol import PROPERTY_RETRY_TOPIC, MessageExt, QueueConsumeStats, dlq_topic

__all__ = ["BrokerQueueLag", "dlq_app", "dlq_row", "group_app", "parse_timestamp_ms", "print_rows",
           "run_admin"]

group_app = typer.Typer(help="Consumer groups: members, lag per queue, offset reset.",
                        no_args_is_help=True)
dlq_app = typer.Typer(help="Dead-letter queues (%DLQ%<group>): list, show, resend, export.",
                      no_args_is_help=True)

Endpoints = Annotated[str, typer.Option(help="Broker host:port.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
Group = Annotated[str, typer.Argument(help="Consumer group.")]
_out = Console()
_err = Console(stderr=True)
T = TypeVar("T")


@contextmanager
def _admin(endpoints: str) -> Iterator[Admin]:
    try:
        with Admin(endpoints, **credential_kw()) as adm:
            yield adm
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


def run_admin(endpoints: str, fn: Callable[[Admin], T]) -> T:
    """``fn`` applied to an :class:`Admin` of the brokers at ``endpoints`` (``host:port[;...]``),
    closed afterwards; a failure to connect or a refusal exits the command with status 1."""
    with _admin(endpoints) as adm:
        return fn(adm)


def print_rows(rows: list[dict[str, Any]], title: str, as_json: bool) -> None:
    """Print ``rows`` (dicts sharing keys, in order) as a Rich table titled ``title``, or as one
    JSON array when ``as_json``."""
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        _out.print(f"{title}: none")
        return
    table = Table(*rows[0].keys(), title=title)
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    _out.print(table)


def parse_timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 date-time (local time when it has no zone).

    Raises:
        typer.BadParameter: neither.
    """
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r} is neither ms since the epoch nor ISO 8601") from exc


# -- group ------------------------------------------------------------------------------------------
@group_app.command("list")
@with_credentials
def group_list(endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False) -> None:
    """Every consumer group the broker knows: model, online members, topics."""
    groups = run_admin(endpoints, lambda a: a.groups())
    rows = [{"group": g.group, "model": g.message_model or "-", "members": len(g.client_ids),
             "subscriptions": ", ".join(f"{t} ({e})" for t, e in sorted(g.subscriptions.items())),
             "offset_topics": ", ".join(g.offset_topics)} for g in groups]
    if as_json:
        rows = [msgspec.to_builtins(g) for g in groups]
    print_rows(rows, "consumer groups", as_json)


class BrokerQueueLag(QueueConsumeStats, kw_only=True):
    """One row of ``group lag`` on a cluster: a queue's :class:`QueueConsumeStats` and the name of
    the broker it is on."""

    broker: str


@group_app.command("lag")
@with_credentials
def group_lag(group: Group, topic: Annotated[str, typer.Option(help="Only this topic.")] = "",
              endpoints: Annotated[str | None, typer.Option(
                  "--endpoints", "--broker", "-b",
                  help="Broker host:port (default 127.0.0.1:10911 without a name server).")] = None,
              namesrv_addr: NamesrvAddr = "", cluster: ClusterName = "",
              as_json: AsJson = False) -> None:
    """Per queue: broker offset, consumer offset, lag (and the orderly lock holder). With
    --namesrv-addr and no --broker: a row per broker and queue (the `broker` column) and the lag
    summed over every master broker of the cluster; a broker that is down is reported by name
    (exit 1) after the others' rows."""
    brokers = masters_or_exit(endpoints, namesrv_addr, cluster)
    if brokers is None:
        stats = run_admin(endpoints or "127.0.0.1:10911", lambda a: a.consume_stats(group, topic))
        rows: list[dict[str, Any]] = [msgspec.to_builtins(s) for s in stats]
        if not as_json and rows:
            rows.append({k: "" for k in rows[0]} | {"topic": "total", "lag": sum(s.lag for s in stats)})
        print_rows(rows, f"lag of {group}", as_json)
        return
    per = on_each(brokers, lambda name, adm: _lag_or_empty(adm, group, topic))
    lags = [BrokerQueueLag(broker=name, **msgspec.structs.asdict(s))
            for name, stats in per.done.items() for s in stats]
    rows = [msgspec.to_builtins(s) for s in lags]
    if not as_json and rows:
        rows.append({k: "" for k in rows[0]} | {"broker": "total", "lag": sum(s.lag for s in lags)})
    print_rows(rows, f"lag of {group}", as_json)
    per.report()
    raise typer.Exit(per.exit_code())


def _lag_or_empty(adm: Admin, group: str, topic: str) -> list[QueueConsumeStats]:
    """The group's stats on one broker; [] when that broker does not have ``topic``."""
    try:
        return adm.consume_stats(group, topic)
    except RemoteError as exc:
        if exc.response_code == ResponseCode.TOPIC_NOT_EXIST:
            return []
        raise


@group_app.command("reset-offset")
@with_credentials
def group_reset_offset(
    group: Group,
    topic: Annotated[str, typer.Option(help="Topic whose offsets move.")],
    to_timestamp: Annotated[str | None, typer.Option(
        help="First message stored at or after this time (ms since the epoch or ISO 8601).")] = None,
    to_offset: Annotated[int | None, typer.Option(help="This queue offset (clamped per queue).")] = None,
    queue: Annotated[int | None, typer.Option(help="Only this queue id.")] = None,
    endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False,
) -> None:
    """Move a group's offsets; online members restart the queues there."""
    if (to_timestamp is None) == (to_offset is None):
        raise typer.BadParameter("give exactly one of --to-timestamp and --to-offset")
    ts = parse_timestamp_ms(to_timestamp) if to_timestamp is not None else None
    entries = run_admin(endpoints, lambda a: a.reset_offset(group, topic, timestamp_ms=ts, offset=to_offset,
                                                        queue_id=queue))
    print_rows([msgspec.to_builtins(e) for e in entries], f"offsets of {group} on {topic}", as_json)


# -- dlq --------------------------------------------------------------------------------------------
def dlq_row(m: MessageExt) -> dict[str, Any]:
    """One DLQ message as a flat record (export, ``--json``): the body as UTF-8 text when it is,
    else base64 (``body_encoding`` says which)."""
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode(), "base64"
    return {"msg_id": m.msg_id, "dlq_queue_offset": m.queue_offset,
            "original_topic": m.properties.get(PROPERTY_RETRY_TOPIC, ""), "tags": m.tags,
            "keys": m.keys, "reconsume_times": m.reconsume_times,
            "born_timestamp_ms": m.born_timestamp_ms, "dlq_timestamp_ms": m.store_timestamp_ms,
            "properties": dict(m.properties), "body_encoding": encoding, "body": body}


@dlq_app.command("list")
@with_credentials
def dlq_list(group: Group, limit: Annotated[int, typer.Option(help="Most messages shown.")] = 1000,
             endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False) -> None:
    """Messages in the group's DLQ, oldest first (the DLQ is append-only)."""
    msgs = run_admin(endpoints, lambda a: a.dlq_messages(group, limit))
    if as_json:
        print_rows([dlq_row(m) for m in msgs], "", True)
        return
    rows = [{"offset": m.queue_offset, "msg_id": m.msg_id,
             "original_topic": m.properties.get(PROPERTY_RETRY_TOPIC, ""), "keys": m.keys,
             "tags": m.tags, "reconsume_times": m.reconsume_times,
             "dlq_time": datetime.fromtimestamp(m.store_timestamp_ms / 1000).isoformat(" ", "seconds"),
             "bytes": len(m.body)} for m in msgs]
    print_rows(rows, dlq_topic(group), False)


@dlq_app.command("show")
@with_credentials
def dlq_show(group: Group, msg_id: Annotated[str, typer.Argument(help="Message id (UNIQ_KEY).")],
             endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False) -> None:
    """Every DLQ entry of one message id, with properties and body."""
    found = [dlq_row(m) for m in run_admin(endpoints, lambda a: a.dlq_messages(group)) if m.msg_id == msg_id]
    if not found:
        _err.print(f"[red]{msg_id} is not in %DLQ%{group}[/red]")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(found, indent=2))
        return
    for row in found:
        table = Table("field", "value", title=f"{msg_id} (DLQ offset {row['dlq_queue_offset']})")
        for k, v in row.items():
            table.add_row(k, json.dumps(v) if isinstance(v, dict) else str(v))
        _out.print(table)


@dlq_app.command("resend")
@with_credentials
def dlq_resend(
    group: Group,
    msg_id: Annotated[list[str] | None, typer.Option("--msg-id", help="Resend this id (repeatable).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Resend every message id in the DLQ.")] = False,
    endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False,
) -> None:
    """Put messages back in %RETRY%<group> with a fresh retry count; one result per message.
    Exits 1 when any message was not found or not resent."""
    if bool(msg_id) == all_:
        raise typer.BadParameter("give --msg-id (one or more) or --all")
    results = run_admin(endpoints, lambda a: a.resend_dlq(group, None if all_ else list(msg_id or [])))
    print_rows([msgspec.to_builtins(r) for r in results], f"resend from %DLQ%{group}", as_json)
    if any(r.status != "OK" for r in results):
        raise typer.Exit(1)


class ExportFormat(StrEnum):
    json = "json"
    csv = "csv"


@dlq_app.command("export")
@with_credentials
def dlq_export(
    group: Group,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="json or csv.")] = ExportFormat.json,
    output: Annotated[Path | None, typer.Option(help="File to write; stdout when omitted.")] = None,
    limit: Annotated[int, typer.Option(help="Most messages exported.")] = 100_000,
    endpoints: Endpoints = "127.0.0.1:10911",
) -> None:
    """Write the group's DLQ as JSON (a list of records) or CSV (properties as a JSON column)."""
    rows = [dlq_row(m) for m in run_admin(endpoints, lambda a: a.dlq_messages(group, limit))]
    text = json.dumps(rows, indent=2) + "\n" if fmt is ExportFormat.json else _csv(rows)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        _err.print(f"{len(rows)} messages written to {output}")


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    fields = list(dlq_row(MessageExt(topic="", body=b"")))
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for r in rows:
        w.writerow({**r, "properties": json.dumps(r["properties"], sort_keys=True)})
    return buf.getvalue()
