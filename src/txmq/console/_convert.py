"""Broker answers (``MessageExt``, ``describe`` rows) as the console's models."""

from __future__ import annotations

import base64
import csv
import io
import json
from typing import Any

from txmq import limits
from txmq.console._models import MessageDetail, MessageSummary
from txmq.protocol import PROPERTY_REAL_TOPIC, PROPERTY_RETRY_TOPIC, MessageExt

__all__ = ["body_text", "export_csv", "export_json", "message_detail", "message_summary", "origin_topic"]


def body_text(body: bytes) -> tuple[str, str]:
    """``(text, encoding)``: the body as UTF-8 text when it is, else base64."""
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"


def origin_topic(m: MessageExt) -> str:
    """The topic a retry, DLQ or half copy stands for (``RETRY_TOPIC``, ``REAL_TOPIC``), else its own."""
    return m.properties.get(PROPERTY_RETRY_TOPIC) or m.properties.get(PROPERTY_REAL_TOPIC) or m.topic


def message_summary(m: MessageExt) -> MessageSummary:
    """A list row: ids, keys, times and the first ``CONSOLE_BODY_PREVIEW_CHARS`` of the body."""
    text, enc = body_text(m.body[: limits.CONSOLE_BODY_PREVIEW_CHARS * 4])
    preview = text[: limits.CONSOLE_BODY_PREVIEW_CHARS] if enc == "utf-8" else f"({len(m.body)} bytes)"
    return MessageSummary(msg_id=m.msg_id, topic=m.topic, keys=m.keys, tags=m.tags,
                          reconsume_times=m.reconsume_times, born_ms=m.born_timestamp_ms,
                          stored_ms=m.store_timestamp_ms, body_preview=preview,
                          origin_topic=origin_topic(m))


def message_detail(m: MessageExt) -> MessageDetail:
    """The whole message, body as text or base64."""
    text, enc = body_text(m.body)
    return MessageDetail(msg_id=m.msg_id, topic=m.topic, queue_id=m.queue_id,
                         queue_offset=m.queue_offset, commit_log_offset=m.commit_log_offset,
                         keys=m.keys, tags=m.tags, reconsume_times=m.reconsume_times,
                         born_ms=m.born_timestamp_ms, stored_ms=m.store_timestamp_ms,
                         born_host=m.born_host, store_host=m.store_host,
                         properties=dict(m.properties), body=text,
                         body_encoding="utf-8" if enc == "utf-8" else "base64", body_bytes=len(m.body))


def _record(m: MessageExt) -> dict[str, Any]:
    return message_detail(m).model_dump() | {"origin_topic": origin_topic(m)}


def export_json(msgs: list[MessageExt]) -> bytes:
    """A JSON list of whole messages (``MessageDetail`` fields and ``origin_topic``)."""
    return (json.dumps([_record(m) for m in msgs], indent=2) + "\n").encode()


def export_csv(msgs: list[MessageExt]) -> bytes:
    """The same records as CSV, properties as a JSON column."""
    buf = io.StringIO()
    fields = [*list(MessageDetail.model_fields), "origin_topic"]
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for m in msgs:
        r = _record(m)
        w.writerow(r | {"properties": json.dumps(r["properties"], sort_keys=True)})
    return buf.getvalue().encode()
