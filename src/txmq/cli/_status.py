"""``txmq broker status`` (the health check) and ``txmq parked``: messages the schedulers parked."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from txmq import limits
from txmq.cli._credentials import credential_kw, with_credentials
from txmq.errors import TxmqError
from txmq.protocol import (
    BROKER_TIMERS,
    PARKED_TOPIC,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TXMQ_PARK_REASON,
    PROPERTY_TXMQ_PARK_SOURCE,
    BrokerRuntimeInfo,
    HaMember,
    HaRuntimeInfo,
    MessageExt,
    park_source_kind,
)

__all__ = ["parked_app", "parked_id", "store_row", "timer_rows"]

parked_app = typer.Typer(help="Messages the broker's schedulers could not deliver: list, show, resend.",
                         no_args_is_help=True)

BrokerAddr = Annotated[str, typer.Option("--broker", "--endpoints", help="Broker host:port.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
_out = Console()
_err = Console(stderr=True)


def _admin_call(endpoints: str, fn: Any, namesrv_addr: str = "") -> Any:
    from txmq.client import Admin  # here: `txmq broker` loads this module and needs no client

    try:
        with Admin(endpoints, namesrv_addr=namesrv_addr, **credential_kw()) as adm:
            return fn(adm)
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


def timer_rows(info: BrokerRuntimeInfo, stale_ms: int) -> list[dict[str, Any]]:
    """One row per timer: last successful tick, its age by the broker's clock, failures, and
    whether it is stale (no successful tick for more than ``stale_ms``; a timer that never ticked
    counts from the broker's start)."""
    rows = []
    for name in sorted(set(BROKER_TIMERS) | set(info.timers)):
        last = info.timers.get(name)
        age_ms = info.now_ms - (info.boot_ms if last is None else last)
        rows.append({"timer": name, "last_tick_ms": last, "age_s": round(age_ms / 1000, 1),
                     "errors": info.timer_errors.get(name, 0), "stale": age_ms > stale_ms})
    return rows


def store_row(info: BrokerRuntimeInfo) -> dict[str, Any]:
    """The store part of the status: commit log bounds (bytes), size held (max - min) and the disk's
    used ratio."""
    return {"commit_log_min_offset": info.commit_log_min_offset,
            "commit_log_max_offset": info.commit_log_max_offset,
            "store_size_bytes": info.commit_log_max_offset - info.commit_log_min_offset,
            "disk_ratio": round(info.commit_log_disk_ratio, 4)}


def _print_ha(ha: HaRuntimeInfo, rows: list[HaMember]) -> None:
    table = Table("member", "role", "id", "address", "offset", "lag (bytes)", "lag (s)", "in sync",
                  title=f"broker group {ha.broker_name} ({ha.in_sync_slave_nums} slave(s) in sync)")
    for r in rows:
        table.add_row(r.member, r.role, str(r.broker_id), r.address,
                      *("" if v is None else str(v) for v in (r.offset, r.lag_bytes, r.lag_s)),
                      "yes" if r.in_sync else "[red]no[/red]")
    _out.print(table)
    client = ha.ha_client_runtime_info
    if not ha.master and client.last_read_timestamp:
        _out.print(f"last bytes from the master: {_time(client.last_read_timestamp)}")


@with_credentials
def status(
    endpoints: BrokerAddr = "127.0.0.1:10911",
    namesrv_addr: Annotated[str, typer.Option(
        help="Name servers host:port[;host:port]; asks the master broker found there.")] = "",
    stale_ms: Annotated[int, typer.Option(help="A timer is stale after this long without a "
                                               "successful tick (ms).")] = limits.BROKER_TIMER_STALE_MS,
    as_json: AsJson = False,
) -> None:
    """Each timer's last tick (stale ones flagged), task restarts, parked messages, pending
    transactions, the store (commit log bounds, size, disk ratio) and the broker group
    (replication: members, roles, offsets, lag in bytes and seconds). Exits 1 when a timer is
    stale."""
    addr = "" if namesrv_addr and endpoints == "127.0.0.1:10911" else endpoints
    info, ha = _admin_call(addr, lambda a: (a.runtime_info(), a.ha_status()), namesrv_addr)
    rows = timer_rows(info, stale_ms)
    stale = [r["timer"] for r in rows if r["stale"]]
    group = ha.members(endpoints)
    if as_json:
        print(json.dumps({**msgspec.to_builtins(info), "store": store_row(info), "timer_rows": rows,
                          "stale": stale, "ha": msgspec.to_builtins(ha),
                          "group": msgspec.to_builtins(group)},
                         indent=2))
    else:
        table = Table("timer", "last tick", "age (s)", "errors", "stale",
                      title=f"broker {endpoints} (up {(info.now_ms - info.boot_ms) / 1000:.0f} s)")
        for r in rows:
            last = "never" if r["last_tick_ms"] is None else _time(r["last_tick_ms"])
            table.add_row(r["timer"], last, str(r["age_s"]), str(r["errors"]),
                          "[red]STALE[/red]" if r["stale"] else "ok")
        _out.print(table)
        counts = Table("parked by", "since start", title=f"parked ({info.parked_stored} stored "
                                                         f"in {PARKED_TOPIC})")
        for source, n in sorted(info.parked.items()):
            counts.add_row(source, str(n))
        _out.print(counts)
        restarts = ", ".join(f"{k} {v}" for k, v in sorted(info.task_restarts.items())) or "none"
        _out.print(f"timer task restarts: {restarts}; pending transactions: "
                   f"{info.pending_transactions}")
        st = store_row(info)
        _out.print(f"store: {st['store_size_bytes']} bytes of commit log (offsets "
                   f"{st['commit_log_min_offset']}..{st['commit_log_max_offset']}), disk "
                   f"{st['disk_ratio']:.1%} used")
        _print_ha(ha, group)
    if stale:
        _err.print(f"[red]stale timers (no tick for > {stale_ms} ms): {', '.join(stale)}[/red]")
        raise typer.Exit(1)


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(" ", "milliseconds")


# -- parked -----------------------------------------------------------------------------------------
def parked_id(m: MessageExt) -> str:
    """How ``txmq parked`` names a parked message: ``parked:<queue offset>`` in the parked topic,
    ``discarded:<queue offset>`` for a half message in TRANS_CHECK_MAX_TIME_TOPIC."""
    return f"{'parked' if m.topic == PARKED_TOPIC else 'discarded'}:{m.queue_offset}"


def _find(endpoints: str, ident: str) -> MessageExt:
    msgs: list[MessageExt] = _admin_call(endpoints, lambda a: a.parked_messages())
    found = [m for m in msgs if ident in (parked_id(m), m.msg_id)]
    if not found:
        _err.print(f"[red]{ident} is not a parked message[/red]")
        raise typer.Exit(1)
    return found[-1]


@parked_app.command("list")
@with_credentials
def parked_list(
    endpoints: BrokerAddr = "127.0.0.1:10911",
    source: Annotated[str | None, typer.Option(help="Only schedule, retry or transaction.")] = None,
    limit: Annotated[int, typer.Option(help="Most messages shown.")] = 1000,
    as_json: AsJson = False,
) -> None:
    """Parked messages, oldest first: id, source, reason, real topic, message id."""
    msgs: list[MessageExt] = _admin_call(endpoints, lambda a: a.parked_messages(limit))
    if source:
        msgs = [m for m in msgs
                if park_source_kind(m.properties.get(PROPERTY_TXMQ_PARK_SOURCE, "")) == source]
    if as_json:
        print(json.dumps([{"id": parked_id(m), **_dlq_row(m)} for m in msgs], indent=2))
        return
    if not msgs:
        _out.print("parked messages: none")
        return
    table = Table("id", "source", "reason", "real topic", "msg_id", "parked at", "bytes",
                  title="parked messages")
    for m in msgs:
        p = m.properties
        table.add_row(parked_id(m), p.get(PROPERTY_TXMQ_PARK_SOURCE, ""),
                      p.get(PROPERTY_TXMQ_PARK_REASON, "")[:80], p.get(PROPERTY_REAL_TOPIC, "")[:40],
                      m.msg_id, _time(m.store_timestamp_ms), str(len(m.body)))
    _out.print(table)


def _dlq_row(m: MessageExt) -> dict[str, Any]:
    """``txmq dlq``'s row for ``m``; imported here so that ``txmq broker`` (which registers
    ``broker status``) does not import the group and DLQ commands."""
    from txmq.cli._group import dlq_row

    return dlq_row(m)


@parked_app.command("show")
@with_credentials
def parked_show(ident: Annotated[str, typer.Argument(help="parked:<n>, discarded:<n> or a msg id.")],
                endpoints: BrokerAddr = "127.0.0.1:10911", as_json: AsJson = False) -> None:
    """One parked message with its properties and body."""
    m = _find(endpoints, ident)
    row = {"id": parked_id(m), **_dlq_row(m)}
    if as_json:
        print(json.dumps(row, indent=2))
        return
    table = Table("field", "value", title=row["id"])
    for k, v in row.items():
        table.add_row(k, json.dumps(v) if isinstance(v, dict) else str(v))
    _out.print(table)


@parked_app.command("resend")
@with_credentials
def parked_resend(
    ident: Annotated[str, typer.Argument(help="parked:<n>, discarded:<n> or a msg id.")],
    topic: Annotated[str, typer.Option(help="Valid topic to send it to.")],
    queue: Annotated[int, typer.Option(help="Queue id (-1: the broker picks).")] = -1,
    endpoints: BrokerAddr = "127.0.0.1:10911",
) -> None:
    """Send a parked message to a chosen topic as a new message (delivered at once). The parked
    copy stays where it is (the parked topic is append-only)."""
    m = _find(endpoints, ident)
    off = _admin_call(endpoints, lambda a: a.resend_parked(m, topic, queue))
    _out.print(f"{ident}: sent to {topic} (queue offset {off})")
