"""``txmq send`` and ``txmq consume``: a console producer and consumer to try a topic by hand
(mqadmin ``sendMessage`` and ``consumeMessage``), printing one readable line or one JSON object
per message.

Exit codes: 0 done; 1 the broker refused or could not be reached; 2 bad input, with the reason.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from txmq import limits
from txmq.cli._credentials import with_credentials
from txmq.cli._group import parse_timestamp_ms
from txmq.cli._topic import AsJson, Endpoints, NamesrvAddr, bad_input, connect_kw
from txmq.client import Message, Producer, PullConsumer
from txmq.errors import InvalidRequest, TxmqError
from txmq.protocol import MessageExt, check_group, check_send_topic, check_topic

__all__ = ["consume", "message_record", "send"]

_out = Console(highlight=False)
_err = Console(stderr=True)
TopicArg = Annotated[str, typer.Argument(help="Topic.")]


def _valid(check: Any, name: str) -> None:
    try:
        check(name)
    except InvalidRequest as exc:
        raise bad_input(str(exc)) from exc


def _body(body: str | None, body_file: Path | None) -> bytes:
    if (body is None) == (body_file is None):
        raise bad_input("give exactly one of --body and --body-file")
    if body_file is not None:
        try:
            data = body_file.read_bytes()
        except OSError as exc:
            raise bad_input(f"cannot read {body_file}: {exc.strerror}") from exc
    else:
        data = (body or "").encode()
    if len(data) > limits.CONSOLE_BODY_MAX_BYTES:
        raise bad_input(f"body of {len(data)} bytes > {limits.CONSOLE_BODY_MAX_BYTES}")
    return data


@with_credentials
def send(
    topic: TopicArg,
    body: Annotated[str | None, typer.Option(help="Body text (UTF-8).")] = None,
    body_file: Annotated[Path | None, typer.Option(help="Read the body (any bytes) from this file.")] = None,
    key: Annotated[list[str] | None, typer.Option("--key", help="A message key (repeatable).")] = None,
    tag: Annotated[str, typer.Option(help="The message tag.")] = "",
    delay_level: Annotated[int, typer.Option(help="Delay level (1 = 1 s … 18 = 2 h; 0 none).")] = 0,
    count: Annotated[int, typer.Option(help="Send the message this many times.")] = 1,
    group: Annotated[str, typer.Option(help="Producer group.")] = "txmq-console",
    endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "", as_json: AsJson = False,
) -> None:
    """Send a message to TOPIC (COUNT times); one line (or JSON object) per stored message:
    message id, queue, queue offset."""
    _valid(check_send_topic, topic)
    _valid(check_group, group)
    if not 0 < count <= limits.CONSOLE_SEND_COUNT_MAX:
        raise bad_input(f"--count {count} not in 1..{limits.CONSOLE_SEND_COUNT_MAX}")
    if delay_level < 0:
        raise bad_input(f"--delay-level {delay_level} is negative")
    if any(not k or " " in k for k in key or []):
        raise bad_input("a key must be non-empty and without spaces (keys are space-separated)")
    data = _body(body, body_file)
    try:
        with Producer(group, **connect_kw(endpoints, namesrv_addr)) as p:
            for _ in range(count):
                msg = Message(topic=topic, body=data, tags=tag, keys=" ".join(key or []))
                r = p.send(msg, delay_level=delay_level)  # a new Message: a new UNIQ_KEY
                rec = {"status": r.status.name, "msg_id": r.msg_id, "topic": r.topic,
                       "queue_id": r.queue_id, "queue_offset": r.queue_offset}
                if as_json:
                    print(json.dumps(rec))
                else:
                    _out.print(f"{r.status.name} msg_id={r.msg_id} queue={r.queue_id} "
                               f"offset={r.queue_offset}")
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc


class From(StrEnum):
    first = "first"
    last = "last"
    timestamp = "timestamp"


def message_record(m: MessageExt) -> dict[str, Any]:
    """A consumed message as JSON: id, queue, offset, keys, tag, born/store time (ms since the
    epoch), reconsume times, user properties, and the body as UTF-8 text, or base64 when it is
    not UTF-8 (``body_encoding`` says which)."""
    try:
        text, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(m.body).decode(), "base64"
    return {"msg_id": m.msg_id, "topic": m.topic, "queue_id": m.queue_id,
            "queue_offset": m.queue_offset, "keys": m.keys, "tags": m.tags,
            "born_timestamp_ms": m.born_timestamp_ms, "store_timestamp_ms": m.store_timestamp_ms,
            "reconsume_times": m.reconsume_times, "properties": dict(m.properties),
            "body_encoding": encoding, "body": text}


def _line(r: dict[str, Any]) -> str:
    def ts(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000).isoformat(" ", "milliseconds")

    body = r["body"] if r["body_encoding"] == "utf-8" else f"base64:{r['body']}"
    return (f"{r['msg_id']} queue={r['queue_id']} offset={r['queue_offset']} keys={r['keys']!r} "
            f"tags={r['tags']!r} born={ts(r['born_timestamp_ms'])} "
            f"stored={ts(r['store_timestamp_ms'])} reconsume={r['reconsume_times']} "
            f"body={body!r}")


def _start_offsets(pc: PullConsumer, topic: str, start: str) -> dict[int, int]:
    """Queue id → first offset to read: the queue's min (``first``), max (``last``), or the first
    message stored at or after a time (ms since the epoch or ISO 8601)."""
    qids = pc.queue_ids(topic)
    if start == From.first:
        return {q: pc.min_offset(topic, q) for q in qids}
    if start == From.last:
        return {q: pc.max_offset(topic, q) for q in qids}
    ts = parse_timestamp_ms(start)
    return {q: pc.search_offset(topic, q, ts) for q in qids}


def _drain(pc: PullConsumer, topic: str, pos: dict[int, int], count: int, idle_ms: int,
           follow: bool, emit: Any) -> int:
    """Pull every queue round robin from ``pos`` (updated in place), calling ``emit`` per message,
    until ``count`` messages (0: no bound) or, unless ``follow``, ``idle_ms`` without one.
    Returns how many were emitted."""
    seen, idle_since = 0, time.monotonic()
    while True:
        got = 0
        for q in sorted(pos):
            want = limits.CONSOLE_PULL_BATCH if count == 0 else min(limits.CONSOLE_PULL_BATCH,
                                                                     count - seen)
            r = pc.pull(topic, q, pos[q], want)
            for m in r.messages[:want]:
                emit(m)
                seen, got = seen + 1, got + 1
                pos[q] = m.queue_offset + 1
            if not r.messages:
                pos[q] = max(pos[q], r.next_begin_offset) if r.next_begin_offset >= 0 else pos[q]
            if count and seen >= count:
                return seen
        if got:
            idle_since = time.monotonic()
        elif not follow and (time.monotonic() - idle_since) * 1000 >= idle_ms:
            return seen
        else:
            time.sleep(0.1)


@with_credentials
def consume(
    topic: TopicArg,
    group: Annotated[str, typer.Option(help="Consumer group (offsets committed with --commit).")
                     ] = "txmq-console",
    from_: Annotated[str, typer.Option(
        "--from", help="first, last, or a time (ms since the epoch or ISO 8601): start at the "
                       "first message stored at or after it.")] = From.first,
    count: Annotated[int, typer.Option(help="Stop after this many messages (0: no bound).")] = 0,
    idle_ms: Annotated[int, typer.Option(help="Stop after this long without a message (ms).")
                       ] = limits.CONSOLE_CONSUME_IDLE_MS,
    follow: Annotated[bool, typer.Option(help="Keep waiting for messages (until Ctrl-C).")] = False,
    commit: Annotated[bool, typer.Option(help="Commit the group's offsets at the end.")] = False,
    endpoints: Endpoints = None, namesrv_addr: NamesrvAddr = "", as_json: AsJson = False,
) -> None:
    """Read TOPIC's messages and print one line (or, with --json, one JSON object) per message:
    id, queue, offset, keys, tags, born and store time, reconsume times, body (base64 when it is
    not UTF-8)."""
    _valid(check_topic, topic)
    _valid(check_group, group)
    if count < 0 or idle_ms < 0:
        raise bad_input("--count and --idle-ms must not be negative")
    if from_ not in (From.first, From.last):
        try:
            parse_timestamp_ms(from_)
        except typer.BadParameter as exc:
            raise bad_input(f"--from: {exc.message}; give first, last or a time") from exc

    def emit(m: MessageExt) -> None:
        rec = message_record(m)
        if as_json:
            print(json.dumps(rec), flush=True)
        else:
            _out.print(escape(_line(rec)), soft_wrap=True)

    try:
        with PullConsumer(consumer_group=group, **connect_kw(endpoints, namesrv_addr)) as pc:
            pos = _start_offsets(pc, topic, from_)
            try:
                n = _drain(pc, topic, pos, count, idle_ms, follow, emit)
            except KeyboardInterrupt:
                n = -1
            if commit:
                for q, off in pos.items():
                    pc.commit_offset(topic, q, off)
    except TxmqError as exc:
        _err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    if n >= 0:
        _err.print(f"{n} messages")
