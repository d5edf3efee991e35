"""``txmq message``: look messages up through the broker's index (RocketMQ ``queryMsgByKey`` and
``queryMsgById``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

from txmq.cli._credentials import with_credentials
from txmq.cli._group import AsJson, Endpoints, dlq_row, parse_timestamp_ms, print_rows, run_admin
from txmq.protocol import MessageExt

__all__ = ["message_app"]

message_app = typer.Typer(help="Messages by key (in a time range) or by id, through the index.",
                          no_args_is_help=True)


def _rows(msgs: list[MessageExt], as_json: bool) -> list[dict[str, Any]]:
    if as_json:
        return [dlq_row(m) | {"topic": m.topic, "queue_id": m.queue_id,
                              "commit_log_offset": m.commit_log_offset, "born_host": m.born_host,
                              "store_host": m.store_host} for m in msgs]
    return [{"msg_id": m.msg_id, "topic": m.topic, "queue": m.queue_id, "queue_offset": m.queue_offset,
             "commit_log_offset": m.commit_log_offset, "keys": m.keys, "tags": m.tags,
             "born_host": m.born_host,
             "stored": datetime.fromtimestamp(m.store_timestamp_ms / 1000).isoformat(" ", "milliseconds"),
             "body_bytes": len(m.body)} for m in msgs]


@message_app.command("query")
@with_credentials
def message_query(
    topic: Annotated[str, typer.Argument(help="Topic.")],
    key: Annotated[str, typer.Argument(help="One of the message's keys.")],
    begin: Annotated[str | None, typer.Option(help="Stored at or after (ms or ISO 8601).")] = None,
    end: Annotated[str | None, typer.Option(help="Stored at or before (ms or ISO 8601).")] = None,
    max_num: Annotated[int, typer.Option(min=1, help="Most messages (the broker caps it at 64).")] = 32,
    endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False,
) -> None:
    """Messages of TOPIC whose keys include KEY, newest first. Exit 1 if there are none."""
    b = parse_timestamp_ms(begin) if begin else 0
    e = parse_timestamp_ms(end) if end else 2**63 - 1
    msgs = run_admin(endpoints, lambda a: a.query_messages(topic, key, begin_ms=b, end_ms=e, max_num=max_num))
    print_rows(_rows(msgs, as_json), f"{topic} key {key}", as_json)


@message_app.command("show")
@with_credentials
def message_show(
    msg_id: Annotated[str | None, typer.Argument(help="Message id (UNIQ_KEY).")] = None,
    offset: Annotated[int | None, typer.Option(help="Commit log offset instead of an id.")] = None,
    endpoints: Endpoints = "127.0.0.1:10911", as_json: AsJson = False,
) -> None:
    """One message by id (with its half, retry and DLQ copies) or by commit log offset."""
    if (msg_id is None) == (offset is None):
        raise typer.BadParameter("give a message id or --offset, not both")
    at = -1 if offset is None else offset
    msgs = run_admin(endpoints, lambda a: a.view_message(msg_id or "", offset=at))
    print_rows(_rows(msgs, as_json), f"message {msg_id or offset}", as_json)
